"""Tensor parallelism through the lab's own path (knob, worker, resolved facts, per-rank traces, the 15 % rule)
on the real vLLM CPU engine: two ranks on one core each, bound by VLLM_CPU_OMP_THREADS_BIND."""
import json
import os

import pytest

import labkit as lk
from labkit.analyze import parallel, profiling

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))  # a test process bound to a share of the cores widens it
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        os.sched_setaffinity(0, own)
        pytest.skip("two CPU ranks need two cores")
    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    # the arm workers inherit it: each rank on a core of its own, of those this process may use
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}|{cores[1]}"
    try:
        exp = lk.Experiment(
            "tp", {"tp1": {"tensor_parallel_size": 1}, "tp2": {"tensor_parallel_size": 2}},
            {"single": lk.Workload.closed_loop(3, 32, 16, clients=1)}, model="tiny-llama",
            base={"enforce_eager": True},  # the ranks and their all-reduce, without two compile waits
            protocol=lk.Protocol(trials=2, warmup_requests=2, profile_requests=2),
            results_dir=tmp_path_factory.mktemp("results"))
        return exp.run(progress=False)
    finally:
        os.sched_setaffinity(0, own)
        if saved is None:
            del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved


def test_both_arms_run_with_the_parallel_size_vllm_resolved(tp_results):
    assert tp_results.complete_arms == ["tp1", "tp2"], tp_results.facts("cause")
    assert tp_results.facts("tensor_parallel_size").set_index("arm").tensor_parallel_size.to_dict() == {
        "tp1": 1, "tp2": 2}


def test_the_split_arm_keeps_rank_zeros_trace_and_shows_its_all_reduce(tp_results):
    assert profiling.arm_trace(tp_results, "tp2").name.startswith("rank0.")
    share = parallel.communication_share(profiling.profile_arms(tp_results)).set_index("arm")
    assert share.loc["tp1", "communication_pct_of_busy"] == 0
    assert share.loc["tp2", "communication_pct_of_busy"] > 0
    # the worker recorded what the trace says, for a store that cannot keep the trace
    recorded = json.loads(tp_results.facts("profile_summary").set_index("arm").profile_summary["tp2"])
    assert recorded["bottleneck"] == profiling.analyse(profiling.arm_trace(tp_results, "tp2"))["bottleneck"][0]
    assert recorded["shares_pct"].get("communication", 0) > 0


def test_the_15_percent_rule_is_measured(tp_results):
    verdict = parallel.tp_rule(tp_results.select("single"))
    assert verdict.status != parallel.NOT_MEASURABLE and len(verdict.comparisons) == 2
