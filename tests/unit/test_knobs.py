"""Knob values, contradictions and their translation to engine arguments (no engine, no torch)."""
import pytest

from labkit.errors import BadParameter
from labkit.spec.knobs import KNOBS, check_knobs, plan_arm, pool_arms
from labkit.measure.platform import Platform

CPU = Platform(kind="cpu", vllm_version=(0, 32, 0))
H200 = Platform("cuda", (0, 26, 0), ("NVIDIA H200",))

# knob -> (a value it accepts, a value it rejects)
GOOD_AND_BAD = {
    "cuda_graphs": (False, "yes"),
    "cudagraph_capture_sizes": ([1, 2, 4], [0, 2]),
    "enforce_eager": (True, 1),
    "api_server": (True, "yes"),
    "api_server_count": (2, 0),
    "attention_backend": ("FLASH_ATTN", "FLASH_ATTENTION_9000"),
    "max_num_seqs": (32, 0),
    "max_num_batched_tokens": (2048, -5),
    "enable_chunked_prefill": (True, "off"),
    "enable_prefix_caching": (False, None),
    "gpu_memory_utilization": (0.9, 1.5),
    "kv_cache_memory_bytes": (1 << 30, 0),
    "max_model_len": (4096, True),
    "kv_cache_dtype": ("fp8", "int4"),
    "quantization": ("fp8", "awq"),
    "tensor_parallel_size": (1, 1.5),
    "data_parallel_size": (2, 0),
    "dtype": ("bfloat16", "int8"),
    "custom_all_reduce": (True, "off"),
    "environment": ({"NCCL_P2P_DISABLE": "1"}, {"CUDA_VISIBLE_DEVICES": "0"}),
    "speculative": ({"method": "ngram", "num_speculative_tokens": 3}, {"method": "ngram", "num_speculative_tokens": 0}),
    "dummy_weights": (True, "yes"),
}

NEEDS = {"custom_all_reduce": {"tensor_parallel_size": 2}}  # a knob that only means something beside another


def test_table_covers_every_knob():
    assert set(GOOD_AND_BAD) == set(KNOBS)


@pytest.mark.parametrize("name", sorted(GOOD_AND_BAD))
def test_knob_accepts_good_value(name):
    good, _ = GOOD_AND_BAD[name]
    assert KNOBS[name].check(good) is None
    check_knobs({name: good, **NEEDS.get(name, {})})  # does not raise


@pytest.mark.parametrize("name", sorted(GOOD_AND_BAD))
def test_knob_rejects_bad_value_naming_the_knob(name):
    _, bad = GOOD_AND_BAD[name]
    assert KNOBS[name].check(bad) is not None
    with pytest.raises(BadParameter, match=name):
        check_knobs({name: bad}, where="arm 'x'")


@pytest.mark.parametrize("value", [0, 1.0001, -0.1, True, "0.5"])
def test_fraction_bounds(value):
    with pytest.raises(BadParameter, match="gpu_memory_utilization"):
        check_knobs({"gpu_memory_utilization": value})


def test_fraction_upper_bound_inclusive():
    check_knobs({"gpu_memory_utilization": 1})
    check_knobs({"gpu_memory_utilization": 1.0})


@pytest.mark.parametrize("value", [True, False, 2.0, "8"])
def test_positive_int_rejects_bools_floats_and_text(value):
    with pytest.raises(BadParameter, match="max_num_seqs"):
        check_knobs({"max_num_seqs": value})


def test_unknown_knob_rejected_listing_known_ones():
    with pytest.raises(BadParameter) as info:
        check_knobs({"max_num_seqs": 8, "max_batch": 4})
    message = str(info.value)
    assert "max_batch" in message
    for known in KNOBS:
        assert known in message


def test_knobs_must_be_a_dict():
    with pytest.raises(BadParameter, match="dict"):
        check_knobs([("max_num_seqs", 8)])


def test_enforce_eager_with_cuda_graphs_is_a_contradiction():
    with pytest.raises(BadParameter, match="enforce_eager"):
        check_knobs({"enforce_eager": True, "cuda_graphs": True})
    check_knobs({"enforce_eager": True, "cuda_graphs": False})
    check_knobs({"enforce_eager": False, "cuda_graphs": True})


def test_kv_cache_bytes_with_memory_utilization_is_a_contradiction():
    with pytest.raises(BadParameter, match="kv_cache_memory_bytes"):
        check_knobs({"kv_cache_memory_bytes": 1 << 30, "gpu_memory_utilization": 0.5})


def test_no_chunked_prefill_needs_budget_at_least_max_model_len():
    with pytest.raises(BadParameter, match="max_num_batched_tokens"):
        check_knobs({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048, "max_model_len": 4096})
    check_knobs({"enable_chunked_prefill": False, "max_num_batched_tokens": 4096, "max_model_len": 4096})
    check_knobs({"enable_chunked_prefill": True, "max_num_batched_tokens": 2048, "max_model_len": 4096})


def test_bad_value_raises_before_platform_translation():
    with pytest.raises(BadParameter):
        plan_arm({"max_num_seqs": -1}, CPU)


# ---- plan_arm on a CPU platform -----------------------------------------------------------------------
@pytest.mark.parametrize("knobs, words", [
    ({"cuda_graphs": True}, "NVIDIA GPU"),
    ({"cuda_graphs": False}, "NVIDIA GPU"),
    ({"quantization": "fp8"}, "NVIDIA GPU"),
    ({"attention_backend": "FLASH_ATTN"}, "CPU_ATTN"),
    ({"data_parallel_size": 2}, "one GPU each"),
])
def test_cpu_marks_gpu_knobs_not_applicable(knobs, words):
    plan = plan_arm(knobs, CPU)
    assert plan.not_applicable, f"{knobs} should not apply on CPU"
    name = next(iter(knobs))
    assert plan.not_applicable.startswith(f"{name}=")
    assert words in plan.not_applicable
    assert plan.engine_args == {}
    assert plan.knobs == knobs


def test_cpu_plan_for_portable_knobs():
    knobs = {"max_num_seqs": 16, "enforce_eager": True, "attention_backend": "CPU_ATTN", "quantization": None,
             "tensor_parallel_size": 1, "kv_cache_memory_bytes": 1 << 30}
    plan = plan_arm(knobs, CPU)
    assert plan.not_applicable is None
    assert plan.engine_args == {"max_num_seqs": 16, "enforce_eager": True, "attention_backend": "CPU_ATTN",
                                "quantization": None, "tensor_parallel_size": 1, "kv_cache_memory_bytes": 1 << 30}


def test_plan_copies_the_knobs():
    knobs = {"max_num_seqs": 4}
    plan = plan_arm(knobs, CPU)
    knobs["max_num_seqs"] = 99
    assert plan.knobs == {"max_num_seqs": 4}


# ---- plan_arm on one H200 -------------------------------------------------------------------------------
def test_cuda_graphs_off_sets_cudagraph_mode_none():
    plan = plan_arm({"cuda_graphs": False}, H200)
    assert plan.not_applicable is None
    assert plan.engine_args == {"compilation_config": {"cudagraph_mode": "NONE"}}


def test_cuda_graphs_on_adds_nothing():
    plan = plan_arm({"cuda_graphs": True}, H200)
    assert plan.not_applicable is None
    assert plan.engine_args == {}


def test_enforce_eager_passes_through():
    assert plan_arm({"enforce_eager": True}, H200).engine_args == {"enforce_eager": True}


def test_tensor_parallel_needs_enough_gpus():
    plan = plan_arm({"tensor_parallel_size": 2}, H200)
    assert plan.not_applicable and "2 GPUs" in plan.not_applicable and "1" in plan.not_applicable
    two = Platform("cuda", (0, 26, 0), ("NVIDIA H200", "NVIDIA H200"))
    assert plan_arm({"tensor_parallel_size": 2}, two).engine_args == {"tensor_parallel_size": 2}


def test_data_parallel_needs_a_gpu_per_replica():
    plan = plan_arm({"data_parallel_size": 2}, H200)
    assert plan.not_applicable == "data_parallel_size=2: data_parallel_size=2 needs 2 GPUs; this machine has 1"
    two = Platform("cuda", (0, 26, 0), ("NVIDIA H200", "NVIDIA H200"))
    assert plan_arm({"data_parallel_size": 2}, two).engine_args == {"data_parallel_size": 2}
    assert plan_arm({"data_parallel_size": 1}, CPU).engine_args == {"data_parallel_size": 1}


def test_tensor_times_data_parallel_gpus_are_counted_together(monkeypatch):
    two = Platform("cuda", (0, 26, 0), ("NVIDIA H200",) * 2)
    plan = plan_arm({"tensor_parallel_size": 2, "data_parallel_size": 2}, two)
    assert plan.not_applicable == ("tensor_parallel_size=2 x data_parallel_size=2 needs 4 GPUs; "
                                   "this machine has 2")
    assert plan.engine_args == {}
    four = Platform("cuda", (0, 26, 0), ("NVIDIA H200",) * 4)
    assert plan_arm({"tensor_parallel_size": 2, "data_parallel_size": 2}, four).engine_args == {
        "tensor_parallel_size": 2, "data_parallel_size": 2}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    on_cpu = plan_arm({"tensor_parallel_size": 2, "data_parallel_size": 2}, CPU)
    assert on_cpu.not_applicable.startswith("tensor_parallel_size=2: VLLM_CPU_OMP_THREADS_BIND='0-3' lists 1")


def test_tensor_parallel_on_cpu_needs_a_numa_node_or_a_core_group_per_rank(monkeypatch):
    from labkit.spec.platform import cpu_ranks_problem
    assert cpu_ranks_problem(2, bind="auto", nodes=2) is None
    assert "'0|1'" in cpu_ranks_problem(2, bind="auto", nodes=1)
    assert cpu_ranks_problem(2, bind="0|1") is None and cpu_ranks_problem(2, bind="nobind") is None
    assert "lists 3 core group(s); 2 ranks need 2" in cpu_ranks_problem(2, bind="0|1|2")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    assert plan_arm({"tensor_parallel_size": 2}, CPU).engine_args == {"tensor_parallel_size": 2}
    assert plan_arm({"data_parallel_size": 2}, CPU).not_applicable  # replicas stay a GPU matter


def test_cuda_attention_backend():
    plan = plan_arm({"attention_backend": "TRITON_ATTN"}, H200)
    assert plan.not_applicable is None
    assert plan.engine_args == {"attention_backend": "TRITON_ATTN"}
    assert plan_arm({"attention_backend": "CPU_ATTN"}, H200).not_applicable


def test_cuda_fp8_quantization_applies():
    assert plan_arm({"quantization": "fp8"}, H200).engine_args == {"quantization": "fp8"}


def test_fp8_needs_fp8_tensor_cores_and_an_unknown_capability_lets_vllm_decide():
    a100 = Platform("cuda", (0, 26, 0), ("NVIDIA A100-SXM4-80GB",), "8.0")
    for knobs in ({"quantization": "fp8"}, {"kv_cache_dtype": "fp8_e4m3"}):
        assert "compute capability 8.9 or newer); this GPU has 8.0" in plan_arm(knobs, a100).not_applicable
        assert plan_arm(knobs, Platform("cuda", (0, 26, 0), ("NVIDIA H200",), "9.0")).not_applicable is None
        assert plan_arm(knobs, H200).not_applicable is None  # capability not known
    assert plan_arm({"kv_cache_dtype": "fp8"}, CPU).engine_args["kv_cache_dtype"] == "fp8"  # vLLM's CPU backend


def test_an_fp8_kv_cache_on_a_cpu_needs_avx512_or_amx():
    """vLLM's CPU attention raises at the engine's start without them: the plan says so before any engine."""
    plain = Platform("cpu", (0, 32, 0), cpu_features=())
    why = plan_arm({"kv_cache_dtype": "fp8"}, plain).not_applicable
    assert "needs a CPU with AVX-512 or AMX" in why and "this CPU has neither" in why
    for features in (("avx512f",), ("amx_tile",)):
        found = Platform("cpu", (0, 32, 0), cpu_features=features)
        assert plan_arm({"kv_cache_dtype": "fp8"}, found).engine_args == {"kv_cache_dtype": "fp8"}
    assert plan_arm({"kv_cache_dtype": "auto"}, plain).not_applicable is None


def test_cpu_features_are_read_from_the_flags_line():
    from labkit.measure.platform import cpu_features

    assert cpu_features("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw amx_tile\n") == ("avx512f",
                                                                                               "amx_tile")
    assert cpu_features("processor\t: 0\nflags\t\t: fpu sse avx2\n") == ()
    assert cpu_features("processor\t: 0\n") is None  # no flags line: unknown, vLLM decides


def test_engine_args_combine_across_knobs():
    plan = plan_arm({"cuda_graphs": False, "max_num_seqs": 64, "enable_prefix_caching": False}, H200)
    assert plan.engine_args == {"compilation_config": {"cudagraph_mode": "NONE"}, "max_num_seqs": 64,
                                "enable_prefix_caching": False}


def test_capture_sizes_knob_maps_to_compilation_config_and_merges():
    from labkit.spec.knobs import plan_arm
    from labkit.measure.platform import Platform
    gpu = Platform("cuda", (0, 26, 0), ("NVIDIA H200",))
    plan = plan_arm({"cudagraph_capture_sizes": [8, 1, 4, 2]}, gpu)
    assert plan.engine_args == {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8]}}
    assert plan_arm({"cudagraph_capture_sizes": [1]}, Platform("cpu", (0, 32, 0))).not_applicable
    with pytest.raises(BadParameter, match="no effect"):
        plan_arm({"cudagraph_capture_sizes": [1], "enforce_eager": True}, gpu)
    with pytest.raises(BadParameter, match="positive batch sizes"):
        plan_arm({"cudagraph_capture_sizes": [0]}, gpu)


def test_pool_arms_per_platform():
    cpu, h200 = Platform("cpu", (0, 32, 0)), Platform("cuda", (0, 26, 0), ("NVIDIA H200",))
    arms, largest = pool_arms(cpu, 768, [0.5, 0.9], [256, 64])
    assert largest == "kv=256MiB"
    assert arms == {"kv=256MiB": {"kv_cache_memory_bytes": 256 << 20}, "kv=64MiB": {"kv_cache_memory_bytes": 64 << 20},
                    "fitted_max_model_len": {"kv_cache_memory_bytes": 256 << 20, "max_model_len": 768}}
    arms, largest = pool_arms(h200, 768, [0.5, 0.9], [256])
    assert largest == "util=0.9"
    assert arms["fp8_kv_cache"] == {"gpu_memory_utilization": 0.9, "max_model_len": 768, "kv_cache_dtype": "fp8"}
    assert arms["fp8_weights"] == {"gpu_memory_utilization": 0.9, "max_model_len": 768, "quantization": "fp8"}
    assert set(arms) == {"util=0.5", "util=0.9", "fitted_max_model_len", "fp8_kv_cache", "fp8_weights"}


def test_the_environment_knob_takes_nccl_and_vllm_variables_as_text_and_never_multicast():
    assert "must be a non-empty dict" in KNOBS["environment"].check({})
    assert "not a value" in KNOBS["environment"].check({"NCCL_P2P_DISABLE": True})
    with pytest.raises(BadParameter, match="NVLink multicast"):
        check_knobs({"environment": {"NCCL_NVLS_ENABLE": "1"}})
    check_knobs({"environment": {"NCCL_NVLS_ENABLE": "0"}})  # keeping it off is allowed


def test_environment_variables_go_to_the_worker_not_to_the_engine_arguments():
    two = Platform("cuda", (0, 26, 0), ("NVIDIA H200",) * 2)
    plan = plan_arm({"tensor_parallel_size": 2, "environment": {"NCCL_P2P_DISABLE": "1"}}, two)
    assert plan.not_applicable is None and plan.engine_args == {"tensor_parallel_size": 2}
    assert plan.variables == {"NCCL_P2P_DISABLE": "1"}
    on_cpu = plan_arm({"environment": {"NCCL_P2P_DISABLE": "1"}}, CPU)
    assert "NCCL_P2P_DISABLE change NCCL, which vLLM on cpu does not use" in on_cpu.not_applicable
    assert plan_arm({"environment": {"VLLM_LOGGING_LEVEL": "INFO"}}, CPU).variables == {"VLLM_LOGGING_LEVEL": "INFO"}


def test_custom_all_reduce_off_is_vllms_flag_and_needs_a_tensor_parallel_group():
    two = Platform("cuda", (0, 26, 0), ("NVIDIA H200",) * 2)
    plan = plan_arm({"tensor_parallel_size": 2, "custom_all_reduce": False}, two)
    assert plan.engine_args == {"tensor_parallel_size": 2, "disable_custom_all_reduce": True}
    with pytest.raises(BadParameter, match="only matters in a tensor-parallel group"):
        check_knobs({"custom_all_reduce": False})


@pytest.mark.parametrize("name", ["", "A B", "1X", "A=B", 7, None, ("NCCL_X",), "NCCL_A B", "VLLM_X=1", "NCCL_\n",
                                  "VLLM_\x00", "NCCL_\u00c9", "nccl_debug"])
def test_an_environment_knob_name_that_is_no_variable_name_is_refused(name):
    with pytest.raises(BadParameter, match="not a NCCL_\\*/VLLM_\\* variable name"):
        check_knobs({"environment": {name: "1"}})


@pytest.mark.parametrize("value", [None, ["1"], True, float("nan"), float("inf"), "a\x00b", {"x": 1}])
def test_an_environment_knob_value_must_be_text_or_a_finite_number(value):
    with pytest.raises(BadParameter, match="is not a value"):
        check_knobs({"environment": {"NCCL_DEBUG": value}})


def test_every_bad_environment_variable_is_named_at_once():
    problem = KNOBS["environment"].check({"A B": "1", "VLLM_OK": None, "1X": "2"})
    assert all(part in problem for part in ("'A B'", "'VLLM_OK'", "'1X'"))


def test_a_number_value_reaches_the_worker_and_the_launch_as_text():
    from labkit.spec.knobs import serve_args
    knobs = {"environment": {"VLLM_X": 1, "VLLM_Y": 2.5}}
    assert plan_arm(knobs, CPU).variables == {"VLLM_X": "1", "VLLM_Y": "2.5"}
    assert serve_args(knobs)[1] == {"VLLM_X": "1", "VLLM_Y": "2.5"}


def test_speculative_decoding_is_vllms_speculative_config_on_every_platform():
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    for platform in (CPU, H200):
        assert plan_arm({"speculative": ngram}, platform).engine_args == {"speculative_config": ngram}
    from labkit.spec.knobs import serve_args
    assert serve_args({"speculative": ngram})[0] == {"speculative_config": ngram}  # --speculative-config '{...}'


def test_every_problem_of_a_speculative_config_is_named_at_once():
    problem = KNOBS["speculative"].check({"method": "eagel", "num_speculative_tokns": 3, "prompt_lookup_min": 0,
                                          "prompt_lookup_max": 2.5})
    for words in ("'num_speculative_tokns' is not a field of it (did you mean num_speculative_tokens?)",
                  "method must be one of ['ngram']", "num_speculative_tokens (k, the tokens drafted a step) is missing",
                  "prompt_lookup_min must be a whole number >= 1, got 0",
                  "prompt_lookup_max must be a whole number >= 1, got 2.5"):
        assert words in problem, problem
    assert "n-gram window is empty" in KNOBS["speculative"].check(
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3})
    assert "must be a dict such as" in KNOBS["speculative"].check(3)
    with pytest.raises(BadParameter, match="num_speculative_tokens must be a whole number >= 1, got -1"):
        check_knobs({"speculative": {"method": "ngram", "num_speculative_tokens": -1}})


def test_dummy_weights_load_the_same_model_with_random_weights_on_every_platform():
    for platform in (CPU, H200):
        assert plan_arm({"dummy_weights": True}, platform).engine_args == {"load_format": "dummy"}
        assert plan_arm({"dummy_weights": False}, platform).engine_args == {}  # the model's own weights
    with pytest.raises(BadParameter, match="dummy_weights must be True or False"):
        check_knobs({"dummy_weights": "yes"})
