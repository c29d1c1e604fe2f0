"""What vLLM chose, read from its log (no engine)."""

import pytest

from labkit.measure.resolved import facts_from_log

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
