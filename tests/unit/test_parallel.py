"""The 15 % rule, throughput per GPU, the communication share and the NCCL record, on constructed results."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.analyze import parallel, profiling
from labkit.store import Results

TRIALS, PER_TRIAL = 3, 40


def _arm(arm, gen, tpot=10.0, ttft=50.0, sigma=0.05, tok_s=(100.0, 101.0, 99.0)):
    requests = [{"arm": arm, "trial": t, "tpot_ms": tpot * gen.lognormal(0, sigma),
                 "ttft_ms": ttft * gen.lognormal(0, sigma)} for t in range(TRIALS) for _ in range(PER_TRIAL)]
    trials = [{"arm": arm, "trial": t, "output_tok_s": v} for t, v in enumerate(tok_s)]
    return requests, trials


def make(arms: dict, skipped: dict | None = None, facts: dict | None = None, environment: dict | None = None):
    """arms: name -> (requests, trials) of complete arms; skipped: name -> reason (not applicable)."""
    requests = [r for rows, _ in arms.values() for r in rows]
    trials = [t for _, rows in arms.values() for t in rows]
    table = [{"arm": a, "status": "complete", "cause": None, **(facts or {}).get(a, {})} for a in arms]
    table += [{"arm": a, "status": "not applicable", "cause": why, **(facts or {}).get(a, {})}
              for a, why in (skipped or {}).items()]
    return Results("fake", Path("/nonexistent"), {}, pd.DataFrame(table), pd.DataFrame(requests),
                   pd.DataFrame(trials), environment or {})


@pytest.fixture
def gen():
    return np.random.default_rng(7)


# ---- the 15 % rule -------------------------------------------------------------------------------------
def test_clearly_worse_fires_the_rule(gen):
    r = make({"tp1": _arm("tp1", gen), "tp2": _arm("tp2", gen, tpot=14.0)})
    v = parallel.tp_rule(r)
    assert v.status == parallel.FIRES
    assert "tpot_p50_ms" in v.advice and "replicas" in v.advice
    table = v.table().set_index("metric")
    assert table.loc["tpot_p50_ms", "beyond_rule"] and not table.loc["ttft_p50_ms", "beyond_rule"]
    assert table.loc["tpot_p50_ms", "ci_low"] > 0.15


def test_worse_but_less_than_15_percent_passes(gen):
    r = make({"tp1": _arm("tp1", gen), "tp2": _arm("tp2", gen, tpot=10.5, ttft=52.0)})
    v = parallel.tp_rule(r)
    assert v.status == parallel.PASSES
    assert "faster" not in v.advice
    assert all(c.ci_high < 0.15 for c in v.comparisons)


def test_noise_straddling_the_threshold_is_called_noise(gen):
    r = make({"tp1": _arm("tp1", gen, sigma=0.6), "tp2": _arm("tp2", gen, tpot=11.5, sigma=0.6)})
    v = parallel.tp_rule(r)
    assert v.status == parallel.UNDECIDED, v.sentence()
    c = v.table().set_index("metric").loc["tpot_p50_ms"]
    assert c.ci_low < 0.15 < c.ci_high
    assert "more trials" in v.advice


def test_better_with_tp2_passes_and_says_faster(gen):
    r = make({"tp1": _arm("tp1", gen), "tp2": _arm("tp2", gen, tpot=6.0, ttft=30.0)})
    v = parallel.tp_rule(r)
    assert v.status == parallel.PASSES
    assert "faster on tpot_p50_ms, ttft_p50_ms" in v.advice
    assert {c.verdict for c in v.comparisons} == {"better"}


def test_tp2_not_applicable_is_not_measurable_with_the_reason(gen):
    why = ("tensor_parallel_size=2: vLLM on CPU binds each of the 2 ranks to a NUMA node of its own and this "
           "machine has 1")
    r = make({"tp1": _arm("tp1", gen)}, skipped={"tp2": why})
    v = parallel.tp_rule(r)
    assert v.status == parallel.NOT_MEASURABLE and why in v.advice
    assert v.comparisons == () and v.table().empty
    assert v.sentence().startswith("TP=2 vs TP=1, single request: not measurable here")


def test_tp2_absent_is_not_measurable(gen):
    v = parallel.tp_rule(make({"tp1": _arm("tp1", gen)}))
    assert v.status == parallel.NOT_MEASURABLE and "'tp2' is not measured" in v.advice


# ---- throughput per GPU ---------------------------------------------------------------------------------
def _three_arms(gen, dp_tok_s=(180.0, 182.0, 178.0)):
    return make({"tp1": _arm("tp1", gen, tok_s=(100.0, 102.0, 98.0)),
                 "tp2": _arm("tp2", gen, tok_s=(150.0, 151.0, 149.0)),
                 "dp2": _arm("dp2", gen, tok_s=dp_tok_s)},
                facts={"tp1": {"tensor_parallel_size": 1, "data_parallel_size": 1},
                       "tp2": {"tensor_parallel_size": 2, "data_parallel_size": 1},
                       "dp2": {"knob.data_parallel_size": 2}})  # an older arm: only the knob recorded


def test_per_gpu_throughput_divides_by_tp_times_dp(gen):
    table = parallel.throughput_per_gpu(_three_arms(gen)).set_index("arm")
    assert table.gpus.to_dict() == {"tp1": 1, "tp2": 2, "dp2": 2}
    assert table.loc["tp1", "output_tok_s_per_gpu"] == pytest.approx(100.0)
    assert table.loc["tp2", "output_tok_s_per_gpu"] == pytest.approx(75.0)
    assert table.loc["dp2", "output_tok_s_per_gpu"] == pytest.approx(90.0)
    low, high = table.loc["tp2", ["per_gpu_ci_low", "per_gpu_ci_high"]]
    assert 74.5 <= low <= 75.0 <= high <= 75.5


def test_replicas_against_the_split_per_gpu(gen):
    results = _three_arms(gen)
    c = parallel.compare_per_gpu(results, "tp2", "dp2")
    assert c.metric == "output_tok_s_per_gpu" and c.verdict == "better"
    assert c.rel_change == pytest.approx(90 / 75 - 1)
    assert parallel.replicas_or_split(results).startswith("replicas (dp2) give more output per GPU")
    even = _three_arms(np.random.default_rng(1), dp_tok_s=(150.0, 151.0, 149.0))
    assert parallel.replicas_or_split(even).startswith("no detectable difference per GPU")
    # against one GPU, the same per-GPU throughput from twice the GPUs is no gain
    c1 = parallel.compare_per_gpu(results, "tp1", "tp2")
    assert c1.rel_change == pytest.approx(75 / 100 - 1) and c1.verdict == "worse"


def test_per_gpu_on_one_gpu_lists_what_did_not_run(gen):
    why = "data_parallel_size=2: data-parallel replicas need one GPU each; this machine runs vLLM on cpu"
    results = make({"tp1": _arm("tp1", gen)}, skipped={"tp2": "tp reason", "dp2": why},
                   facts={"dp2": {"knob.data_parallel_size": 2}, "tp2": {"knob.tensor_parallel_size": 2}})
    table = parallel.throughput_per_gpu(results).set_index("arm")
    assert table.loc["dp2", "why_not"] == why and np.isnan(table.loc["dp2", "output_tok_s_per_gpu"])
    assert table.gpus.to_dict() == {"tp1": 1, "tp2": 2, "dp2": 2}
    assert parallel.compare_per_gpu(results, "tp2", "dp2") is None
    assert parallel.replicas_or_split(results) == f"not measurable here: 'tp2' is not applicable (tp reason); " \
                                                  f"'dp2' is not applicable ({why})"


def test_scope_note_says_why_not_here():
    plan = pd.DataFrame([{"arm": "tp1", "runs_here": True, "why_not": None},
                         {"arm": "tp2", "runs_here": False, "why_not": "needs 2 GPUs"}])
    note = parallel.scope_note(plan)
    assert note.startswith("runs here: tp1.") and "tp2: needs 2 GPUs" in note and "Two GPUs" in note and "15 % rule" in note
    assert parallel.scope_note(plan.assign(runs_here=True)).startswith("every arm runs here")
    replicas_only = pd.DataFrame([{"arm": "tp1", "runs_here": True, "why_not": None},
                                  {"arm": "tp2", "runs_here": True, "why_not": None},
                                  {"arm": "dp2", "runs_here": False, "why_not": "one GPU each"}])
    note = parallel.scope_note(replicas_only)
    assert "15 % rule" not in note and "replicas against the split model" in note
    assert "communication settings" not in note  # the experiment has no communication arms
    with_settings = pd.concat([replicas_only, pd.DataFrame([{"arm": "tp2_p2p_off", "runs_here": False,
                                                             "why_not": "NCCL_P2P_DISABLE change NCCL"}])])
    assert "the communication settings (NCCL's P2P path" in parallel.scope_note(with_settings)


# ---- communication and NCCL ------------------------------------------------------------------------------
def test_communication_share_from_a_trace_analysis():
    events = pd.DataFrame({"name": ["sm90_xmma_gemm", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm90_xmma_gemm"],
                           "cat": ["kernel"] * 3, "ts_us": [0.0, 60.0, 100.0], "dur_us": [60.0, 30.0, 10.0],
                           "pid": ["0"] * 3, "tid": ["7"] * 3})
    shares = profiling.time_shares(events)
    analysis = {"source": "gpu kernels", "window_ms": 0.11, "shares": shares, "bottleneck": profiling.bottleneck(shares)}
    row = parallel.communication_share({"tp2": analysis}).iloc[0]
    assert row.communication_pct_of_busy == pytest.approx(30.0)
    assert row.communication_pct_of_window == pytest.approx(100 * 30 / 110)
    assert row.bottleneck.startswith("communication-bound")
    cpu = {**analysis, "shares": shares[shares.category != "communication"]}
    assert parallel.communication_share({"tp1": cpu}).iloc[0].communication_pct_of_busy == 0.0


def test_communication_variables_show_who_set_them(gen):
    env = {"tp1": {"tuning_variables": {"NCCL_NVLS_ENABLE": "0", "VLLM_LOGGING_LEVEL": "INFO"},
                   "set_by_vllm": {"NCCL_CUMEM_ENABLE": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}}
    table = parallel.communication_variables(make({"tp1": _arm("tp1", gen)}, environment=env))
    assert table.to_dict("records") == [
        {"arm": "tp1", "variable": "NCCL_NVLS_ENABLE", "value": "0", "set_by": "user or the lab, before vLLM"},
        {"arm": "tp1", "variable": "NCCL_CUMEM_ENABLE", "value": "0", "set_by": "vLLM"}]


def test_an_arms_own_nccl_variable_is_named_as_its_knob(gen):
    env = {"tp2_p2p_off": {"tuning_variables": {"NCCL_P2P_DISABLE": "1"}, "arm_variables": ["NCCL_P2P_DISABLE"]}}
    table = parallel.communication_variables(make({"tp2_p2p_off": _arm("tp2_p2p_off", gen)}, environment=env))
    assert table.set_by.tolist() == ["this arm's environment knob"]


# ---- the communication settings of the split arm ----------------------------------------------------------
def test_communication_arms_are_the_split_arm_with_one_setting_changed():
    arms = parallel.communication_arms()
    assert arms["tp2_p2p_off"] == {"tensor_parallel_size": 2, "environment": {"NCCL_P2P_DISABLE": "1"}}
    assert arms["tp2_custom_all_reduce_off"] == {"tensor_parallel_size": 2, "custom_all_reduce": False}


def test_communication_settings_give_a_verdict_on_tpot_or_say_what_did_not_run(gen):
    r = make({"tp2": _arm("tp2", gen), "tp2_p2p_off": _arm("tp2_p2p_off", gen, tpot=13.0)},
             skipped={"tp2_custom_all_reduce_off": "custom_all_reduce=False: vLLM's custom all-reduce needs an "
                                                   "NVIDIA GPU"})
    table = parallel.communication_settings(r).set_index("arm")
    assert table.loc["tp2_p2p_off", "verdict"] == "worse"  # TPOT up 30 %: lower is better
    assert table.loc["tp2_p2p_off", "why"].startswith("tpot_p50_ms: ")
    off = table.loc["tp2_custom_all_reduce_off"]
    assert off.verdict == parallel.NOT_MEASURABLE and "needs an NVIDIA GPU" in off.why
    no_split = parallel.communication_settings(make({"tp2_p2p_off": _arm("tp2_p2p_off", gen)})).set_index("arm")
    assert no_split.loc["tp2_p2p_off", "why"] == "arm 'tp2' is not measured"


def test_gpus_per_arm_count_every_replicas_tensor_times_pipeline_group(gen):
    results = make({"tp1": _arm("tp1", gen)}, skipped={"tp2pp2": "r", "dp2pp2": "r"},
                   facts={"tp1": {"tensor_parallel_size": 1, "data_parallel_size": 1},
                          "tp2pp2": {"knob.tensor_parallel_size": 2, "knob.pipeline_parallel_size": 2},
                          "dp2pp2": {"data_parallel_size": 2, "knob.pipeline_parallel_size": 2}})
    sizes = parallel.gpus_per_arm(results).set_index("arm")
    assert sizes.gpus.to_dict() == {"tp1": 1, "tp2pp2": 4, "dp2pp2": 4}
    assert sizes.loc["dp2pp2", ["tp", "pp", "dp"]].tolist() == [1, 2, 2]
