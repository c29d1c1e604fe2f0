"""The estimate of an experiment's time from earlier arms' records on this machine (stored records, no engine)."""
import json

import pandas as pd

from labkit.analyze import eta
from labkit.experiment import _time_left
from labkit.spec.protocol import Protocol

LOAD = {"num_requests": 8, "prompt": 32}
OTHER_LOAD = {"num_requests": 64, "prompt": 512}


def _arm(root, experiment, arm, hardware="cpu-x", eager=True, start=(0.5, 30.0, 1.5), durations=(2.0, 4.0),
         workloads=None):
    folder = root / experiment / "arms" / arm
    folder.mkdir(parents=True)
    waiting, engine, ending = start
    workloads = workloads or {"default": LOAD}
    (folder / "arm.json").write_text(json.dumps({
        "spec": {"engine_args": {"enforce_eager": eager}, "workloads": workloads},
        "facts": {"lifecycle_s": {"worker_imports": 12.0, "waiting_for_imports": waiting, "engine_start": engine,
                                  "measuring": 9.0, "ending": ending}},
        "environment": {"hardware_key": hardware}}))
    rows = [{"load": load, "duration_s": d} for load in workloads for d in durations]
    pd.DataFrame(rows).to_parquet(folder / "trials.parquet")


def test_an_arm_is_estimated_from_earlier_arms_of_this_machine_and_compile_mode(tmp_path):
    _arm(tmp_path, "a", "x", start=(0.5, 30.0, 1.5))
    _arm(tmp_path, "a", "y", start=(0.5, 40.0, 1.5))
    _arm(tmp_path, "b", "z", start=(0.5, 90.0, 1.5), eager=False)  # compiled: another start time
    _arm(tmp_path, "c", "w", start=(0.5, 500.0, 1.5), hardware="h200")  # another machine
    records = eta.read_records([tmp_path])
    found = eta.estimate(records, "cpu-x", True, {"default": LOAD})
    assert found.start_s == 37.0 and found.start_basis == 2  # the median of 32 and 42
    assert found.trial_s == {"default": 3.0}
    assert found.arm_seconds(2) == 37.0 + 2 * 3.0
    assert eta.estimate(records, "cpu-x", False, {"default": LOAD}).start_s == 92.0


def test_a_load_never_measured_here_is_unknown_and_the_total_says_so(tmp_path):
    _arm(tmp_path, "a", "x")
    records = eta.read_records([tmp_path])
    found = eta.estimate(records, "cpu-x", True, {"big": OTHER_LOAD})
    assert found.trial_s == {"big": None} and found.arm_seconds(3) is None
    text = eta.expected_total([found, found], 2, 6)
    assert text.startswith("expected at least 1 min 04 s for 2 arms") and "known once the first arm" in text


def test_the_total_spans_the_adaptive_protocols_fewest_and_most_trials(tmp_path):
    _arm(tmp_path, "a", "x")
    found = eta.estimate(eta.read_records([tmp_path]), "cpu-x", True, {"default": LOAD})
    assert eta.expected_total([found], 2, 6) == "expected 38 s to 50 s for 1 arm (engine start ~32 s from 1 earlier arm here)"
    assert eta.expected_total([found], 3, 3).startswith("expected 41 s for 1 arm")


def test_no_record_here_means_no_guess(tmp_path):
    _arm(tmp_path, "a", "x", hardware="h200")
    found = eta.estimate(eta.read_records([tmp_path, tmp_path / "missing"]), "cpu-x", True, {"default": LOAD})
    assert found.start_s is None
    assert eta.expected_total([found], 2, 6).startswith("expected time unknown for 1 arm")


def test_a_damaged_record_is_passed_over(tmp_path):
    _arm(tmp_path, "a", "x")
    broken = tmp_path / "a" / "arms" / "broken"
    broken.mkdir(parents=True)
    (broken / "arm.json").write_text("{not json")
    assert len(eta.read_records([tmp_path])) == 1


def test_the_time_left_counts_the_start_until_the_engine_has_started(tmp_path):
    estimate = eta.Estimate(start_s=30.0, start_basis=4, trial_s={"default": 2.0})
    fixed = Protocol(trials=3)
    assert _time_left(estimate, fixed, {"default": 0}, started=False) == "~36 s left"
    assert _time_left(estimate, fixed, {"default": 1}, started=True) == "~4 s left"
    assert _time_left(estimate, Protocol(trials="auto"), {"default": 2}, started=True) == "at most ~8 s left"
    unknown = eta.Estimate(start_s=None, start_basis=0, trial_s={"default": None})
    assert _time_left(unknown, fixed, {"default": 0}, started=False) == ""


def test_durations_read_as_minutes_and_seconds():
    assert eta.duration_text(40.4) == "40 s" and eta.duration_text(72) == "1 min 12 s"
