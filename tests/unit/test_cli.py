"""The command line: parameter values from text, and a clear error for a missing notebook."""
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
