"""Experiment planning without an engine: launch overrides (one deliberate change forced onto every arm) and
the length checks that run before any engine starts."""

import pytest

from labkit.errors import BadParameter
from labkit import settings
import labkit as lk
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


def test_the_variables_of_base_arm_and_overrides_add_up(tmp_path):
    exp = Experiment("vars", arms={"p2p_off": {"environment": {"NCCL_P2P_DISABLE": "1", "VLLM_LOGGING_LEVEL": "INFO"}},
                                   "plain": {}},
                     workload=LOAD, model="llama3-8b", results_dir=tmp_path, platform=H200,
                     base={"environment": {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CACHE_ROOT": "/cache"}},
                     overrides={"environment": {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    plans = exp.plans()
    assert plans["p2p_off"].variables == {"VLLM_CACHE_ROOT": "/cache", "NCCL_P2P_DISABLE": "1",
                                          "VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert plans["plain"].variables == {"VLLM_CACHE_ROOT": "/cache", "VLLM_LOGGING_LEVEL": "DEBUG",
                                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


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
                                         ('{"max_num_seqs": 0}', "whole number >= 1")])
def test_bad_environment_override_is_a_clear_error(monkeypatch, text, words):
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, text)
    with pytest.raises(BadParameter, match=words):
        launch_overrides()


def test_max_model_len_beyond_the_shape_fails_before_any_engine(tmp_path):
    exp = Experiment("too-long", arms={"long": {"max_model_len": 8208}}, workload=LOAD, model="llama3-8b",
                     results_dir=tmp_path, platform=H200)
    with pytest.raises(BadParameter, match="exceeds the llama3-8b shape's 8192 positions"):
        exp.run(progress=False)
    assert not (tmp_path / "too-long" / "arms").exists()


class _Worker:
    """A stand-in for an ArmWorker: alive until discarded (no process: this is the hand-over logic only)."""

    def __init__(self):
        self.discarded = False
        self.proc = self

    def is_alive(self):
        return not self.discarded

    def discard(self):
        self.discarded = True


def test_the_plans_early_worker_is_taken_over_only_for_the_arm_it_was_started_for(tmp_path):
    from labkit.experiment import _discard_unused

    exp = lk.Experiment("early", {"a": {}, "b": {"max_num_seqs": 4}}, lk.Workload(4, lk.Fixed(16), lk.Fixed(8),
                        lk.Burst()), model="tiny-llama", results_dir=tmp_path)
    planned = ("a", {"model": "m"}, {"knobs": {}})
    worker = _Worker()
    exp._early = taken = {"planned": planned, "worker": worker}
    assert exp._take_early([planned, ("b", {}, {})]) is worker and exp._early is None
    _discard_unused(taken)  # the experiment collected after run() took it over: its worker is run()'s now
    assert not worker.discarded
    other = _Worker()
    exp._early = {"planned": planned, "worker": other}
    assert exp._take_early([("b", {}, {})]) is None and other.discarded  # the first arm to run is another one
    unused = {"planned": planned, "worker": _Worker()}
    kept = unused["worker"]
    _discard_unused(unused)
    assert kept.discarded and unused["worker"] is None
