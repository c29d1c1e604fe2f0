"""The diagnosis path's logic: which one-change arms a launch gets and why, how helpful changes combine, what
the lab reproduces of a launch, SLO texts, and the ranked table and waterfall read from stored results."""
import dataclasses

import numpy as np
import pytest

import labkit as lk
from labkit.analyze import diagnosis
from labkit.diagnose import candidate_changes, combine, parse_slo
from labkit.errors import BadParameter
from labkit.measure.platform import Platform
from labkit.spec.serve_command import to_knobs
from test_stats import _requests, _trials, make_results

H200 = Platform("cuda", (0, 26, 0), ("NVIDIA H200",), "9.0")
CPU = Platform("cpu", (0, 32, 0))
LOAD = lk.Workload.closed_loop(64, 500, 800, 16)


def test_the_audit_findings_become_one_change_arms():
    launch = {"enforce_eager": True, "attention_backend": "TRITON_ATTN", "max_num_seqs": 4,
              "enable_prefix_caching": False}
    found = candidate_changes(launch, H200, LOAD)
    assert set(found) == {"no_enforce_eager", "default_attention_backend", "default_max_num_seqs",
                          "prefix_caching_on", "fp8_kv_cache"}
    assert found["no_enforce_eager"][0] == {k: v for k, v in launch.items() if k != "enforce_eager"}
    assert "below the load's 16 requests in flight" in found["default_max_num_seqs"][1]
    assert "fp8_kv_cache" not in candidate_changes(launch, CPU, LOAD)  # no fp8 tensor cores to use
    assert candidate_changes({"max_num_seqs": 64}, CPU, LOAD) == {}  # nothing to try: keep what you have


def test_helpful_changes_combine_into_one_launch():
    launch = {"enforce_eager": True, "max_num_seqs": 4, "attention_backend": "TRITON_ATTN"}
    merged = combine(launch, [{"max_num_seqs": 4, "attention_backend": "TRITON_ATTN"},
                              {"enforce_eager": True, "attention_backend": "TRITON_ATTN", "max_num_seqs": 4,
                               "kv_cache_dtype": "fp8"}])
    assert merged == {"max_num_seqs": 4, "attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8"}


def test_each_variable_the_command_sets_is_an_arm_without_it_and_they_combine_one_by_one():
    launch = {"max_num_seqs": 64, "environment": {"NCCL_P2P_DISABLE": "1", "VLLM_USE_TRITON_AWQ": "1"}}
    found = candidate_changes(launch, H200, LOAD)
    assert found["without_NCCL_P2P_DISABLE"][0] == {"max_num_seqs": 64, "environment": {"VLLM_USE_TRITON_AWQ": "1"}}
    assert found["without_VLLM_USE_TRITON_AWQ"][0] == {"max_num_seqs": 64, "environment": {"NCCL_P2P_DISABLE": "1"}}
    assert "NCCL_P2P_DISABLE=1 is set on the command line" in found["without_NCCL_P2P_DISABLE"][1]
    both = combine(launch, [found["without_NCCL_P2P_DISABLE"][0], found["without_VLLM_USE_TRITON_AWQ"][0]])
    assert both == {"max_num_seqs": 64}  # both dropped, not one put back by the other
    one = combine(launch, [found["without_NCCL_P2P_DISABLE"][0], found["fp8_kv_cache"][0]])
    assert one == {"max_num_seqs": 64, "environment": {"VLLM_USE_TRITON_AWQ": "1"}, "kv_cache_dtype": "fp8"}


def test_what_a_launch_sets_becomes_knobs_and_the_rest_is_named():
    knobs, rest = to_knobs({"enforce_eager": True, "max_num_seqs": 16, "seed": 1, "swap_space": 8,
                            "compilation_config": {"cudagraph_mode": "CUDAGraphMode.NONE", "level": 3}})
    assert knobs == {"enforce_eager": True, "max_num_seqs": 16, "cuda_graphs": False}
    assert rest == {"swap_space": 8, "compilation_config": {"level": 3}}  # the seed changes nothing measured
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert to_knobs({"speculative_config": ngram}) == ({"speculative": ngram}, {})  # --speculative-config
    eagle = {"method": "eagle", "model": "some/drafter", "num_speculative_tokens": 3}
    assert to_knobs({"speculative_config": eagle}) == ({}, {"speculative_config": eagle})  # a draft model: not ours
    # random weights change decode speed (measured): kept as a knob; where real weights come from changes nothing
    assert to_knobs({"load_format": "dummy", "seed": 1}) == ({"dummy_weights": True}, {})
    assert to_knobs({"load_format": "safetensors"}) == ({}, {})


def test_slo_texts():
    assert parse_slo(["tpot_p50_ms=40", "ttft_p99_ms = 500"]) == {"tpot_p50_ms": 40.0, "ttft_p99_ms": 500.0}
    with pytest.raises(BadParameter, match="METRIC=LIMIT"):
        parse_slo(["tpot_p50_ms<40"])
    with pytest.raises(BadParameter, match="unknown metric 'tpot'"):
        parse_slo(["tpot=40"])


@pytest.fixture(scope="module")
def measured():
    gen = np.random.default_rng(3)
    return make_results({
        "current": (_requests("current", gen), _trials("current", [1000, 1010, 990])),
        "no_enforce_eager": (_requests("no_enforce_eager", gen, tpot_scale=0.5), _trials("no_enforce_eager", [1900, 1910, 1890])),
        "fp8_kv_cache": (_requests("fp8_kv_cache", gen, tpot_scale=0.9), _trials("fp8_kv_cache", [1100, 1105, 1095])),
        "worse": (_requests("worse", gen, tpot_scale=1.4), _trials("worse", [800, 810, 790])),
        "combined": (_requests("combined", gen, tpot_scale=0.42), _trials("combined", [2100, 2110, 2090])),
    })


def test_changes_are_ranked_best_first_with_their_verdicts(measured):
    about = {arm: {"why": arm} for arm in ("worse", "fp8_kv_cache", "no_enforce_eager", "never_ran")}
    table = diagnosis.ranked_changes(measured, "current", "tpot_p50_ms", about)
    assert list(table.arm) == ["no_enforce_eager", "fp8_kv_cache", "worse", "never_ran"]
    assert list(table.verdict) == ["better", "better", "worse", "not measured"]
    assert table.change[0] == pytest.approx(-0.5, abs=0.06) and table.ci_low[0] < table.change[0] < table.ci_high[0]


def test_the_waterfall_ends_at_the_measured_combination_not_the_sum(measured):
    path = diagnosis.waterfall(measured, "current", ["no_enforce_eager", "fp8_kv_cache"], "combined", "tpot_p50_ms")
    assert list(path.kind) == ["total", "change", "change", "change", "total"]
    start, end = path.value.iloc[0], path.value.iloc[-1]
    assert start + path.value.iloc[1:4].sum() == pytest.approx(end)  # the interaction closes the gap
    assert path.value.iloc[3] > 0  # combined gains less than the two alone would add up to
    single = diagnosis.waterfall(measured, "current", ["no_enforce_eager", "fp8_kv_cache"], None, "tpot_p50_ms")
    assert list(single.step)[-1] == "recommended (no_enforce_eager)"  # the best change alone
    beaten = diagnosis.waterfall(measured, "current", ["no_enforce_eager"], "combined", "tpot_p50_ms", "no_enforce_eager")
    assert list(beaten.kind) == ["total", "change", "change", "total", "total"]


def test_the_recommended_command_drops_what_the_winning_change_dropped():
    from labkit.diagnose import Diagnosis
    from labkit.spec.serve_command import Launch
    launch = Launch("vllm serve m --max-num-seqs 1 --block-size 32", "m", {"max_num_seqs": 1}, {"block_size": 32}, {})
    found = Diagnosis(launch, "ttft_p99_ms", None, [], {}, None, None, {}, 2, "recommended: default_max_num_seqs")
    assert found.recommended_command() == "vllm serve m --block-size 32"
    assert found.cost() == "recommended: default_max_num_seqs (2 engine start(s) this run; read back from the store: none)"
    assert dataclasses.replace(found, resumed=["current"]).cost().endswith("read back from the store: current)")
    # knobs in vLLM's own flags, not the lab's names
    graphs_off = dataclasses.replace(found, recommended={"cuda_graphs": False, "max_num_seqs": 8})
    with_variable = dataclasses.replace(found, recommended={"environment": {"NCCL_P2P_DISABLE": "1"}})
    assert with_variable.recommended_command() == "NCCL_P2P_DISABLE=1 vllm serve m --block-size 32"
    assert graphs_off.recommended_command() == ("vllm serve m --compilation-config '{\"cudagraph_mode\": \"NONE\"}' "
                                                "--max-num-seqs 8 --block-size 32")


@pytest.fixture(scope="module")
def trade_offs():
    """A batch limit's fix (same TPOT, far lower TTFT, more throughput), a change that wins TPOT by losing
    throughput, and a combination."""
    gen = np.random.default_rng(5)
    return make_results({
        "current": (_requests("current", gen), _trials("current", [1000, 1010, 990])),
        "queue_fix": (_requests("queue_fix", gen, ttft_scale=0.05), _trials("queue_fix", [3000, 3010, 2990])),
        "queue_worse": (_requests("queue_worse", gen, ttft_scale=3), _trials("queue_worse", [2000, 2010, 1990])),
        "tpot_only": (_requests("tpot_only", gen, tpot_scale=0.5), _trials("tpot_only", [500, 505, 495])),
        "both": (_requests("both", gen, ttft_scale=0.05, tpot_scale=0.8), _trials("both", [3500, 3510, 3490])),
    })


def test_a_change_the_target_cannot_see_counts_when_it_wins_elsewhere_and_loses_nowhere(trade_offs):
    assert diagnosis.side_effects(trade_offs, "current", "queue_fix", "tpot_p50_ms") == (["output_tok_s", "ttft_p99_ms"], [])
    assert diagnosis.helps(trade_offs, "current", "queue_fix", "tpot_p50_ms")
    assert not diagnosis.helps(trade_offs, "current", "queue_worse", "tpot_p50_ms")  # wins throughput, loses TTFT
    assert diagnosis.helps(trade_offs, "current", "tpot_only", "tpot_p50_ms")  # the target decides first
    table = diagnosis.ranked_changes(trade_offs, "current", "tpot_p50_ms", {"queue_fix": {"why": ""}})
    assert table.loc[0, "verdict"] == "no detectable difference"
    assert table.loc[0, "also better on"] == "output_tok_s, ttft_p99_ms" and table.loc[0, "also worse on"] == ""


def test_a_launch_that_wins_the_target_by_losing_elsewhere_is_named_not_chosen(trade_offs):
    chosen, trades = diagnosis.choose(trade_offs, ["queue_fix", "tpot_only"], "both", "tpot_p50_ms")
    assert chosen == "both"
    assert trades == ["tpot_only alone has the better tpot_p50_ms and is worse on output_tok_s, ttft_p99_ms: "
                      "choose it by your SLO"]
    # without the combination: neither single beats the other everywhere, so the target decides
    assert diagnosis.choose(trade_offs, ["queue_fix", "tpot_only"], None, "tpot_p50_ms")[0] == "tpot_only"
    # a single change better on the target and worse on nothing beats the combination
    assert diagnosis.choose(trade_offs, ["both"], "queue_fix", "tpot_p50_ms") == ("both", [])
    assert diagnosis.choose(trade_offs, [], None, "tpot_p50_ms") == (None, [])


def test_the_profile_adds_the_changes_it_points_to():
    from labkit.diagnose import profile_changes
    attention = "attention-bound: long contexts (attention backend, KV dtype)"
    found = profile_changes({"max_num_seqs": 64}, H200, attention, "FLASH_ATTN")
    assert set(found) == {"attention_FLASHINFER", "attention_TRITON_ATTN"}  # not the backend in use
    assert found["attention_FLASHINFER"][0] == {"max_num_seqs": 64, "attention_backend": "FLASHINFER"}
    assert "in place of FLASH_ATTN" in found["attention_FLASHINFER"][1]
    compute = "compute-bound: at the GEMM limit (quantize, or a bigger GPU)"
    assert set(profile_changes({}, H200, compute, "FLASH_ATTN")) == {"fp8_weights"}
    assert profile_changes({"quantization": "fp8"}, H200, compute, "FLASH_ATTN") == {}
    a100 = Platform("cuda", (0, 26, 0), ("NVIDIA A100",), "8.0")
    assert profile_changes({}, a100, compute, "FLASH_ATTN") == {}  # no fp8 tensor cores
    launch_bound = "launch/scheduling-bound: many gaps between kernels (CUDA graphs, larger batches)"
    assert profile_changes({}, H200, launch_bound, "FLASH_ATTN") == {}  # the audit's changes cover it
    assert profile_changes({}, CPU, attention, "CPU_ATTN") == {}


def test_a_users_load_from_length_logs_and_an_arrival_rate(tmp_path):
    from labkit.diagnose import user_workload
    (tmp_path / "prompts.txt").write_text("120\n480\n2000\n")
    load = user_workload(16, 500, 800, 8, prompt_log=str(tmp_path / "prompts.txt"), rate=4.0)
    assert load.prompt_len == lk.FromLog((120, 480, 2000)) and load.output_len == lk.Fixed(800)
    assert load.arrival == lk.Poisson(4.0)
    assert set(load.lengths()[0]) <= {120, 480, 2000}
    assert user_workload(16, 500, 800, 8) == lk.Workload.closed_loop(16, 500, 800, 8)
    # an open loop has no fixed concurrency to hold max_num_seqs against
    assert "default_max_num_seqs" not in candidate_changes({"max_num_seqs": 4}, H200, load)


def test_a_speculating_launch_is_tried_without_speculation_and_with_k_a_notch_down_and_up():
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    found = candidate_changes({"speculative": ngram}, CPU, LOAD)
    assert found["no_speculation"][0] == {}
    assert found["speculative_k2"][0] == {"speculative": {**ngram, "num_speculative_tokens": 2}}
    assert found["speculative_k5"][0] == {"speculative": {**ngram, "num_speculative_tokens": 5}}
    assert set(found) == {"no_speculation", "speculative_k2", "speculative_k5"}
    lowest = candidate_changes({"speculative": {**ngram, "num_speculative_tokens": 1}}, CPU, LOAD)
    assert set(lowest) == {"no_speculation", "speculative_k2"}  # nothing below one token
    assert not any(name.startswith(("no_spec", "speculative_")) for name in candidate_changes({}, CPU, LOAD))
