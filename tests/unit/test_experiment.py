"""Experiment planning without an engine: launch overrides (one deliberate change forced onto every arm) and
the length checks that run before any engine starts."""
import json
import os
from pathlib import Path

import pytest

from labkit.suite import baseline, notebooks as suite
from labkit.errors import BadParameter
from labkit import settings
from labkit.experiment import Experiment, launch_overrides
from labkit.measure.platform import Platform
from labkit.spec.workload import Concurrency, Fixed, Workload

LAUNCH_OVERRIDES_VARIABLE = settings.VARIABLES["launch_overrides"]

H200 = Platform("cuda", (0, 26, 0), ("NVIDIA H200",))
LOAD = Workload(8, Fixed(32), Fixed(16), Concurrency(2))


def experiment(tmp_path, overrides):
    return Experiment("graphs", arms={"default": {}, "eager": {"enforce_eager": True},
                                      "narrow": {"cudagraph_capture_sizes": [1, 2, 4]}},
                      workload=LOAD, model="llama3-8b", overrides=overrides, results_dir=tmp_path, platform=H200)


def test_override_wins_over_every_arm(tmp_path):
    plans = experiment(tmp_path, {"enforce_eager": True, "max_num_seqs": 8}).plans()
    assert plans["default"].engine_args == {"enforce_eager": True, "max_num_seqs": 8}
    assert plans["eager"].engine_args == {"enforce_eager": True, "max_num_seqs": 8}


def test_override_contradicting_an_arm_makes_only_that_arm_not_applicable(tmp_path):
    plans = experiment(tmp_path, {"enforce_eager": True}).plans()
    assert "launch override" in plans["narrow"].not_applicable
    assert "cudagraph_capture_sizes" in plans["narrow"].not_applicable
    assert plans["default"].not_applicable is None


def test_no_override_leaves_arms_alone(tmp_path):
    plans = experiment(tmp_path, {}).plans()
    assert plans["default"].engine_args == {}
    assert plans["narrow"].engine_args == {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}}


def test_overrides_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, '{"enforce_eager": true}')
    assert launch_overrides() == {"enforce_eager": True}
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, "")
    assert launch_overrides() == {}


@pytest.mark.parametrize("text, words", [("enforce_eager=true", "JSON object"),
                                         ('{"enforce_eagre": true}', "unknown knob"),
                                         ('{"max_num_seqs": 0}', "positive integer")])
def test_bad_environment_override_is_a_clear_error(monkeypatch, text, words):
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, text)
    with pytest.raises(BadParameter, match=words):
        launch_overrides()


def test_parse_overrides():
    assert suite.parse_overrides(["enforce_eager=true", "max_num_seqs=64", "attention_backend=TRITON_ATTN"]) == {
        "enforce_eager": True, "max_num_seqs": 64, "attention_backend": "TRITON_ATTN"}
    assert suite.parse_overrides([]) == {}
    assert suite.parse_overrides(["L3_kernel/profile_hotspots:enforce_eager=true"]) == {
        "L3_kernel/profile_hotspots:enforce_eager": True}


def test_a_scoped_override_reaches_only_the_notebooks_it_names(tmp_path, monkeypatch):
    overrides = {"L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8}
    hotspots, quickstart = suite.discover(["L3_kernel/profile_hotspots"])[0], suite.discover(["00_quickstart"])[0]
    assert suite.overrides_for(overrides, hotspots) == {"enforce_eager": True, "max_num_seqs": 8}
    assert suite.overrides_for(overrides, quickstart) == {"max_num_seqs": 8}
    # a scope outside the run's selection would change nothing: refused before any run folder exists
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    with pytest.raises(BadParameter, match="names none of this run's notebooks"):
        suite.run_suite(["00_quickstart"], "cpu-smoke", overrides=overrides, progress=False)
    with pytest.raises(BadParameter, match="unknown knob"):
        suite.run_suite(["L3_kernel/profile_hotspots"], "cpu-smoke", progress=False,
                        overrides={"L3_kernel/profile_hotspots:eager": True})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("items", [["enforce_eager"], ["=1"], ["L3:=1"]])
def test_an_override_without_a_value_is_a_clear_error(items):
    with pytest.raises(BadParameter, match="KNOB=VALUE"):
        suite.parse_overrides(items)


@pytest.mark.parametrize("items, words", [(["eager=true"], "unknown knob"), (["max_num_seqs=-1"], "positive")])
def test_bad_override_fails_before_anything_runs(tmp_path, monkeypatch, items, words):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    with pytest.raises(BadParameter, match=words):
        suite.run_suite(["00_quickstart"], "cpu-smoke", overrides=suite.parse_overrides(items), progress=False)
    assert list(tmp_path.iterdir()) == []  # no run folder was made


def test_environment_diff_names_the_override(tmp_path):
    env = {"gpus": ["NVIDIA H200"], "packages": {}, "tuning_variables": {}}
    for name, overrides in (("base", {}), ("run", {"enforce_eager": True})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "suite.json").write_text(json.dumps({"hardware_key": "h200", "environment": env,
                                                                "overrides": overrides}))
    diff = baseline.environment_diff(tmp_path / "run", tmp_path / "base")
    assert diff.to_dict("records") == [{"what": "launch override enforce_eager", "baseline": None, "run": True}]


def test_resume_runs_only_the_notebooks_of_the_interrupted_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "suite.json").write_text(json.dumps({"profile": "cpu-smoke", "hardware_key": "cpu-x",
                                                "notebooks": ["00_quickstart.ipynb"], "overrides": {"max_num_seqs": 4}}))
    (run / "00_quickstart.status.json").write_text(json.dumps({"status": "ok"}))
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))  # restored after the test
    executed = []
    monkeypatch.setattr("papermill.execute_notebook", lambda nb, *a, **k: executed.append(nb))
    # every notebook of this run is done: nothing executes (the other notebooks are not this run's)
    assert suite.run_suite(run_dir=run, progress=False) == run
    assert executed == []


def test_each_notebook_runs_with_the_overrides_that_reach_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, "")  # restored after the test
    seen = {}
    monkeypatch.setattr("papermill.execute_notebook",
                        lambda nb, *a, **k: seen.update({Path(nb).stem: json.loads(os.environ[LAUNCH_OVERRIDES_VARIABLE])}))
    run = suite.run_suite(["00_quickstart", "L3_kernel/profile_hotspots"], "cpu-smoke", progress=False,
                          overrides={"L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8})
    assert seen == {"00_quickstart": {"max_num_seqs": 8}, "profile_hotspots": {"enforce_eager": True, "max_num_seqs": 8}}
    assert os.environ[LAUNCH_OVERRIDES_VARIABLE] == "" and "LABKIT_RESULTS_DIR" not in os.environ  # restored
    assert json.loads((run / "suite.json").read_text())["overrides"] == {
        "L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8}


def test_max_model_len_beyond_the_shape_fails_before_any_engine(tmp_path):
    exp = Experiment("too-long", arms={"long": {"max_model_len": 8208}}, workload=LOAD, model="llama3-8b",
                     results_dir=tmp_path, platform=H200)
    with pytest.raises(BadParameter, match="exceeds the llama3-8b shape's 8192 positions"):
        exp.run(progress=False)
    assert not (tmp_path / "too-long" / "arms").exists()


def test_a_resumed_run_keeps_its_overrides(tmp_path):
    (tmp_path / "suite.json").write_text(json.dumps({"profile": "cpu-smoke", "notebooks": ["00_quickstart.ipynb"],
                                                     "overrides": {}}))
    with pytest.raises(BadParameter, match="a resumed run keeps"):
        suite.run_suite(run_dir=tmp_path, progress=False, overrides={"enforce_eager": True})
