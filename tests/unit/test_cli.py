"""The command line: parameter values from text, and exit statuses with one meaning each (0 clean, 1 a regression,
2 bad input or unusable data, 3 a notebook failed), each error one line unless --debug."""
import pytest

from labkit import cli


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("0.5", 0.5), ("-2", -2), ("abc", "abc"), ('{"a": 1}', {"a": 1}), ("[1, 2]", [1, 2]),
    ('"quoted"', "quoted"), ("tiny-llama", "tiny-llama"), ("", ""),
])
def test_value(text, value):
    assert cli._value(text) == value
    assert type(cli._value(text)) is type(value)


@pytest.mark.parametrize("text, value", [("True", True), ("true", True), ("False", False), ("false", False),
                                         ("None", None), ("null", None)])
def test_value_singletons(text, value):
    assert cli._value(text) is value


def test_run_missing_notebook_is_a_clear_error(capsys, tmp_path):
    code = cli.main(["run", "does/not/exist.ipynb", "-o", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit: ") and "does/not/exist.ipynb" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing created for a notebook that is not there


def test_run_missing_notebook_default_output(capsys):
    assert cli.main(["run", "does/not/exist.ipynb"]) == 2
    assert "no notebook" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2


def test_run_writes_where_the_suite_does_stamped_in_utc(tmp_path, monkeypatch):
    """`labkit run` without -o goes under LABKIT_RUNS_DIR, in a folder named by the suite's UTC clock."""
    import re

    import nbformat

    notebook = tmp_path / "tiny.ipynb"
    cell = nbformat.v4.new_code_cell("x: int = 1  # a parameter")
    cell.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell("assert x == 2")])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, notebook)
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["run", str(notebook), "-p", "x", "2"]) == 0
    [run] = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"\d{8}T\d{6}Z-.+", run.name), run.name
    assert (run / "tiny.ipynb").exists()


def _tiny_notebook(path, body: str):
    import nbformat

    cell = nbformat.v4.new_code_cell("x: int = 1  # a parameter")
    cell.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, path)
    return path


def test_a_failing_notebook_exits_3_naming_the_cell_and_the_executed_copy(tmp_path, capsys):
    notebook = _tiny_notebook(tmp_path / "fails.ipynb", "raise ValueError('the check failed')")
    assert cli.main(["run", str(notebook), "-o", str(tmp_path / "out")]) == cli.EXIT_NOTEBOOK_FAILED
    err = capsys.readouterr().err
    assert "fails.ipynb failed in cell 1: ValueError: the check failed" in err and "Traceback" not in err
    assert (tmp_path / "out" / "fails.ipynb").exists()


def test_unusable_data_is_one_line_and_exit_2_and_debug_shows_the_traceback(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "suite.json").write_text('{"profile": "cpu-smoke", "hardware')  # cut short
    assert cli.main(["compare", str(run)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "suite.json cannot be read" in err and "Traceback" not in err
    with pytest.raises(Exception, match="suite.json cannot be read"):
        cli.main(["compare", str(run), "--debug"])


def test_an_error_the_lab_does_not_explain_is_still_one_line_and_not_a_regression(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("something the lab did not foresee")

    monkeypatch.setattr("labkit.measure.environment.fingerprint", broken)
    assert cli.main(["env"]) == cli.EXIT_BAD_INPUT != cli.EXIT_REGRESSION
    err = capsys.readouterr().err
    assert err.startswith("labkit: KeyError:") and "--debug" in err and err.count("\n") == 1


def test_a_baseline_pointer_cannot_lead_outside_its_folder(tmp_path, capsys, monkeypatch):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "pinned.json").write_text('{"run": "../../elsewhere", "replicates": []}')
    from labkit.errors import DamagedStore
    from labkit.suite import baseline

    with pytest.raises(DamagedStore, match="not a run folder"):
        baseline.baseline_runs("h200", tmp_path)


def test_diagnose_refuses_a_bad_launch_slo_or_metric_before_any_engine(capsys, tmp_path):
    assert cli.main(["diagnose", "python -m vllm.entrypoints.openai.api_server"]) == 2
    assert "a launch is a `vllm serve MODEL [flags]` command line" in capsys.readouterr().err
    assert cli.main(["diagnose", "vllm serve m", "--slo", "tpot_p50_ms<40"]) == 2
    assert "METRIC=LIMIT" in capsys.readouterr().err
    assert cli.main(["diagnose", "vllm serve m", "--target", "speed"]) == 2
    assert "unknown metric 'speed'" in capsys.readouterr().err
    assert cli.main(["diagnose", "vllm serve m", "--prompt-log", str(tmp_path / "absent.txt")]) == 2
    assert "cannot read the length log" in capsys.readouterr().err
    assert cli.main(["diagnose", "vllm serve m", "--rate", "-1"]) == 2
    assert "--rate must be a finite number >= 0" in capsys.readouterr().err
