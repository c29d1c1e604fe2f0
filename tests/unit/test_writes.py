"""The lab writes only where it should: a baseline lands under the baselines folder whatever a run's own files
say, two suites started in the same second get two runs, and what an interrupted arm's engine logged survives
the next run's clean-up as a failure record."""
import json
import subprocess
import sys

import pytest

from labkit.errors import DamagedStore
from labkit.files import new_folder
from labkit.store import INTERRUPTED, ExperimentStore, load
from labkit.suite import baseline
from labkit.suite import notebooks as suite

from test_baseline import make_run


@pytest.mark.parametrize("hardware", ["../../escaped", "/tmp/elsewhere", "..", ".hidden", "a/b"])
def test_a_baseline_is_pinned_only_under_the_baselines_folder(tmp_path, hardware):
    run = make_run(tmp_path / "runs" / "r1", {"e": {"a": (10.0, 1000.0, 1)}})
    meta = json.loads((run / "suite.json").read_text())
    (run / "suite.json").write_text(json.dumps({**meta, "hardware_key": hardware}))
    root = tmp_path / "area" / "baselines"
    root.mkdir(parents=True)
    with pytest.raises(DamagedStore, match="pinned only under"):
        baseline.pin(run, root=root)
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "runs" not in p.parts)
    assert made == ["area", "area/baselines"]  # nothing written anywhere


def test_a_good_baseline_still_pins(tmp_path):
    run = make_run(tmp_path / "r1", {"e": {"a": (10.0, 1000.0, 1)}})
    target = baseline.pin(run, root=tmp_path / "baselines")
    assert target == tmp_path / "baselines" / "h200" / "r1" and baseline.pinned("h200", tmp_path / "baselines") == target


def test_two_suites_started_in_the_same_second_both_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(suite, "utc_stamp", lambda: "20261203T000000Z")
    monkeypatch.setattr("papermill.execute_notebook", lambda *a, **k: None)
    first = suite.run_suite(["00_quickstart"], "cpu-smoke", progress=False)
    second = suite.run_suite(["00_quickstart"], "cpu-smoke", progress=False)
    assert first != second and first.name.startswith("20261203T000000Z") and second.name == first.name + "-2"
    assert (first / "suite.json").exists() and (second / "suite.json").exists()


def test_new_folder_never_hands_one_folder_to_two_callers(tmp_path):
    made = {new_folder(tmp_path, "x") for _ in range(5)}
    assert len(made) == 5 and all(p.is_dir() for p in made)


def test_two_failures_of_an_arm_in_one_second_are_both_kept(tmp_path, monkeypatch):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({"arms": {"a": {}}})
    monkeypatch.setattr("labkit.store._utc_stamp", lambda: "20261203T000000Z")
    for n in range(2):
        work = store.new_workdir("a")
        (work / "engine.log").write_text(f"attempt {n}\n")
        store.record_failure("a", work, {"arm": "a", "cause": "engine_error"})
    assert len(list((tmp_path / "exp" / "failures").iterdir())) == 2


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_interrupted_arms_engine_log_survives_the_next_clean_up(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({"arms": {"a": {}, "b": {}}})
    interrupted = tmp_path / "exp" / ".work" / f"a-{_dead_pid()}-0123abcd"
    interrupted.mkdir(parents=True)
    (interrupted / "engine.log").write_text("INFO loading\nRuntimeError: engine core died mid-trial\nINFO end\n")
    (interrupted / "progress.jsonl").write_text('{"stage": "imported"}\n{"stage": "starting engine"}\n')
    empty = tmp_path / "exp" / ".work" / f"b-{_dead_pid()}-4567abcd"
    empty.mkdir()
    # the next arm's worker, started ahead of its turn, had imported and was waiting: it measured nothing
    early = tmp_path / "exp" / ".work" / f"b-{_dead_pid()}-89abcdef"
    early.mkdir()
    (early / "engine.log").write_text("INFO importing\n")
    (early / "progress.jsonl").write_text('{"stage": "imported"}\n')
    assert sorted(store.clean_work()) == sorted([interrupted, empty, early])
    assert not (tmp_path / "exp" / ".work").exists() or not any((tmp_path / "exp" / ".work").iterdir())
    arms = load("exp", tmp_path).arms.set_index("arm")
    assert arms.loc["a", "status"] == "failed" and arms.loc["a", "cause"] == INTERRUPTED
    assert "engine core died mid-trial" in arms.loc["a", "log_tail"]
    (kept,) = (tmp_path / "exp" / "failures").iterdir()
    assert (kept / "engine.log").read_text().startswith("INFO loading")
