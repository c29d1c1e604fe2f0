"""What vLLM chose, read from its log; and the failure causes a user is told."""
import signal

import pytest

from labkit.engine import classify_failure
from labkit.launch import filter_engine_args
from labkit.resolved import facts_from_log

BACKEND_LINE = ("(EngineCore pid=1) INFO 11-29 [cuda.py:483] Using FLASH_ATTN attention backend out of "
                "potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")


def test_attention_backend_and_candidates():
    facts = facts_from_log(BACKEND_LINE)
    assert facts["attention_backend"] == "FLASH_ATTN"
    assert facts["attention_candidates"] == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]


def test_attention_backend_enum_form():
    facts = facts_from_log("(EngineCore pid=7) INFO [cuda.py:400] Using AttentionBackendEnum.TRITON_ATTN backend.")
    assert facts["attention_backend"] == "TRITON_ATTN"
    assert "attention_candidates" not in facts


def test_kv_cache_layout_is_not_a_backend():
    facts = facts_from_log("INFO [utils.py:12] Using LBHNC KV cache layout.")
    assert "attention_backend" not in facts


def test_first_backend_line_wins():
    text = "Using LBHNC KV cache layout.\n" + BACKEND_LINE + "\nUsing AttentionBackendEnum.TRITON_ATTN backend."
    assert facts_from_log(text)["attention_backend"] == "FLASH_ATTN"


def test_gpu_kv_cache_size():
    facts = facts_from_log("(EngineCore pid=1) INFO [kv_cache_utils.py:1] GPU KV cache size: 1,234,567 tokens")
    assert facts["kv_cache_tokens_logged"] == 1234567
    assert isinstance(facts["kv_cache_tokens_logged"], int)


def test_cpu_kv_cache_size_and_concurrency():
    facts = facts_from_log("INFO CPU KV cache size: 262,144 tokens, Maximum concurrency for 1,024 tokens "
                           "per request: 256.00x")
    assert facts["kv_cache_tokens_logged"] == 262144
    assert facts["max_concurrency"] == 256.0


def test_graph_capture():
    facts = facts_from_log("INFO [gpu_model_runner.py:1] Graph capturing finished in 7 secs, took 0.99 GiB")
    assert facts["graph_capture_s"] == 7.0
    assert facts["graph_capture_gib"] == 0.99


def test_compile_time():
    assert facts_from_log("INFO [monitor.py:1] torch.compile took 42.10 s in total")["compile_s"] == 42.10
    assert facts_from_log("torch.compile takes 3.5 s in total")["compile_s"] == 3.5


@pytest.mark.parametrize("line", ["Model loading took 14.96 GiB memory and 5.1 seconds",
                                  "Model loading took 14.96 GiB and 5.1 seconds"])
def test_model_loading(line):
    facts = facts_from_log(f"(EngineCore pid=1) INFO [gpu_model_runner.py:1] {line}")
    assert facts["model_load_gib"] == 14.96
    assert facts["model_load_s"] == 5.1


def test_engine_init():
    facts = facts_from_log("INFO [core.py:1] init engine (profile, create kv cache, warmup model) took 27.57 s")
    assert facts["engine_init_s"] == 27.57


def test_available_kv_memory():
    assert facts_from_log("Available KV cache memory: 120.5 GiB")["kv_cache_available_gib"] == 120.5


def test_whole_log_and_nothing():
    log = "\n".join([
        "INFO Model loading took 14.96 GiB memory and 5.1 seconds",
        BACKEND_LINE,
        "INFO torch.compile took 42.10 s in total",
        "INFO GPU KV cache size: 1,234,567 tokens",
        "INFO Graph capturing finished in 7 secs, took 0.99 GiB",
        "INFO init engine (profile, create kv cache, warmup model) took 27.57 seconds",
    ])
    facts = facts_from_log(log)
    assert facts == {"model_load_gib": 14.96, "model_load_s": 5.1, "attention_backend": "FLASH_ATTN",
                     "attention_candidates": ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"],
                     "compile_s": 42.10, "kv_cache_tokens_logged": 1234567, "graph_capture_s": 7.0,
                     "graph_capture_gib": 0.99, "engine_init_s": 27.57}
    assert facts_from_log("") == {}
    assert facts_from_log("INFO nothing interesting here\nWARNING still nothing") == {}


# ---- classify_failure --------------------------------------------------------------------------------
KV_TOO_SMALL = ("ValueError: To serve at least one request with the models's max seq len (8192), (1.00 GiB KV "
                "cache is needed, which is larger than the available KV cache memory (0.10 GiB)")


def test_timeout_wins():
    assert classify_failure("torch.OutOfMemoryError: CUDA out of memory", -9, timed_out=True) == "timeout"


def test_out_of_memory():
    tail = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert classify_failure(tail, 1, False) == "out_of_memory"


def test_kv_cache_too_small():
    assert classify_failure("INFO starting\n" + KV_TOO_SMALL, 1, False) == "kv_cache_too_small"


def test_killed_by_sigkill():
    cause = classify_failure("INFO warming up\nINFO still warming up", -signal.SIGKILL, False)
    assert cause.startswith("killed_by_signal_SIGKILL")
    assert "out-of-memory" in cause


def test_killed_by_other_signal():
    assert classify_failure("", -signal.SIGSEGV, False) == "killed_by_signal_SIGSEGV"


@pytest.mark.parametrize("tail, code", [("RuntimeError: something odd", 1), ("", None), ("", 0)])
def test_engine_error(tail, code):
    assert classify_failure(tail, code, False) == "engine_error"


@pytest.mark.parametrize("tail, cause", [
    ("ValueError: Selected backend FLASHINFER is not valid for this configuration", "backend_unavailable"),
    ("NotImplementedError: fp8 on this device", "unsupported_configuration"),
    ("TypeError: __init__() got an unexpected keyword argument 'foo'", "bad_engine_argument"),
])
def test_other_causes(tail, cause):
    assert classify_failure(tail, 1, False) == cause


def test_filter_engine_args():
    assert filter_engine_args({"max_num_seqs": 4}, {"max_num_seqs", "model"}) == {"max_num_seqs": 4}
    with pytest.raises(TypeError, match="attention_backend"):
        filter_engine_args({"max_num_seqs": 4, "attention_backend": "FLASH_ATTN"}, {"max_num_seqs"})


def test_unsupported_argument_is_classified_as_bad_argument():
    try:
        filter_engine_args({"bogus_arg": 1}, {"model"})
    except TypeError as exc:
        message = f"{type(exc).__name__}: {exc}"  # what the worker records in result.json
    assert "bogus_arg" in message
    assert classify_failure(message, 1, False) == "bad_engine_argument"


def test_root_cause_far_above_the_tail_is_found_and_quoted():
    from labkit.engine import classify_failure, failure_summary
    log = "\n".join(
        ["(EngineCore pid=1) INFO 11-29 [cpu.py:1] Warm-up op is not supported, falling back"]
        + ["(EngineCore pid=1) ERROR 11-29 [core.py:1510]   File \"x.py\", line 1"] * 5
        + ["(EngineCore pid=1) ERROR 11-29 [core.py:1510] ValueError: To serve at least one request with the "
           "model's max seq len (4096), (0.0 GiB KV cache is needed, which is larger than the available KV "
           "cache memory (0.0 GiB)."]
        + ["RuntimeError: Engine core initialization failed. See root cause above."]
        + ["(MainProcess) INFO shutdown line"] * 100)
    assert classify_failure(log, 1, False) == "kv_cache_too_small"
    summary = failure_summary(log)
    assert summary.startswith("root cause: ") and "larger than the available KV cache" in summary.splitlines()[0]


def test_a_warning_is_not_a_cause():
    from labkit.engine import classify_failure
    log = "(Worker) WARNING something is not supported, falling back\nRuntimeError: worker died"
    assert classify_failure(log, 1, False) == "engine_error"
