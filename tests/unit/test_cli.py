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
