"""Reading a suite run's folder: what changed around the engine between two runs (no engine)."""
import json

from labkit.suite import runs

from test_baseline import ENV, make_run


def test_environment_diff_names_what_changed(tmp_path):
    base = make_run(tmp_path / "base", {}, env=ENV)
    changed = {**ENV, "driver": "590", "packages": {"vllm": "0.27.0"}, "tuning_variables": {"VLLM_X": "1"},
               "cpu_signature": "family 6 model 173 stepping 1"}
    run = make_run(tmp_path / "run", {}, env=changed)
    diff = runs.environment_diff(run, base).set_index("what")
    assert diff.loc["cpu_signature", "run"] == "family 6 model 173 stepping 1"
    assert diff.loc["driver", "run"] == "590" and diff.loc["package vllm", "baseline"] == "0.26.0"
    assert diff.loc["variable VLLM_X", "run"] == "1" and "gpus" not in diff.index


def test_environment_diff_names_the_override(tmp_path):
    env = {"gpus": ["NVIDIA H200"], "packages": {}, "tuning_variables": {}}
    for name, overrides in (("base", {}), ("run", {"enforce_eager": True})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "suite.json").write_text(json.dumps({"hardware_key": "h200", "environment": env,
                                                                "overrides": overrides}))
    diff = runs.environment_diff(tmp_path / "run", tmp_path / "base")
    assert diff.to_dict("records") == [{"what": "launch override enforce_eager", "baseline": None, "run": True}]
