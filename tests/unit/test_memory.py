"""Memory arithmetic against a known shape."""
import pandas as pd
import pytest

from dataclasses import asdict

from labkit.analyze import memory
from labkit.spec.models import SHAPES
from labkit.store import Results

LLAMA = SHAPES["llama3-8b"]


def test_kv_bytes_per_token_follows_the_kv_dtype():
    assert memory.kv_bytes_per_token(LLAMA, "auto", "bfloat16") == 131072  # 2 * 32 layers * 8 heads * 128 * 2 B
    assert memory.kv_bytes_per_token(LLAMA, "fp8", "bfloat16") == 65536
    assert memory.kv_bytes_per_token(LLAMA, "fp8_e5m2", "bfloat16") == 65536
    # unset (None, or missing in a facts table) is "auto": the model's dtype
    assert memory.kv_bytes_per_token(LLAMA, None, "float32") == memory.kv_bytes_per_token(LLAMA, float("nan"), "float32") == 262144


def test_breakdown_matches_what_an_h200_logged():
    # facts as the H200 run of the quickstart recorded them (vLLM 0.26, Llama-3-8B shape, bf16)
    facts = {"arm": "a", "status": "complete", "dtype": "bfloat16", "kv_cache_dtype": "auto",
             "quantization": None, "model_load_gib": 14.96, "kv_cache_available_gib": 112.42,
             "graph_capture_gib": 0.41, "kv_cache_tokens": 920960, "max_model_len": 8192, "max_concurrency": 112.42,
             "kv_cache_memory_bytes": None}
    results = Results("m", None, {"shape": asdict(LLAMA)}, pd.DataFrame([facts]), pd.DataFrame(), pd.DataFrame(), {})
    row = memory.breakdown(results).iloc[0]
    assert row.weights_gib_computed == pytest.approx(14.96, abs=0.005)
    assert row.weights_gib_computed == pytest.approx(row.weights_gib_measured, rel=0.01)
    assert row.kv_tokens_computed == pytest.approx(row.kv_tokens_measured, rel=0.01)
    assert row.max_concurrency_computed == pytest.approx(row.max_concurrency_measured, rel=0.01)


def test_fp8_weights_shrink_only_the_decoder_projections():
    # the H200's fp8_weights arm (vLLM 0.26) loaded 8.49 GiB: the layers' projections in fp8, while the
    # embeddings and LM head (2 x 128256 x 4096) stay bf16; all-fp8 would be 7.48 GiB
    facts = {"arm": "fp8", "status": "complete", "dtype": "bfloat16", "kv_cache_dtype": "auto",
             "quantization": "fp8", "model_load_gib": 8.49, "kv_cache_available_gib": 116.09,
             "graph_capture_gib": 0.32, "kv_cache_tokens": 950976, "max_model_len": 2304, "max_concurrency": 412.75,
             "kv_cache_memory_bytes": None}
    results = Results("m", None, {"shape": asdict(LLAMA)}, pd.DataFrame([facts]), pd.DataFrame(), pd.DataFrame(), {})
    row = memory.breakdown(results).iloc[0]
    assert row.weights_gib_computed == pytest.approx(8.46, abs=0.005)
    assert abs(row.weights_gib_computed - row.weights_gib_measured) < 0.1
    assert LLAMA.num_params == 8_030_261_248  # Llama-3-8B's published parameter count
    # fp8 weights leave an "auto" KV cache in bf16: the H200 fit 950976 tokens in 116.09 GiB (2 bytes an element)
    assert row.kv_bytes_per_token == 131072
    assert row.kv_tokens_computed == pytest.approx(row.kv_tokens_measured, rel=0.01)


def test_fitted_max_model_len_covers_the_quantile():
    prompts, outputs = [100] * 99 + [5000], [100] * 100
    assert memory.fitted_max_model_len(prompts, outputs, quantile=0.95) == 256
    assert memory.fitted_max_model_len(prompts, outputs, quantile=1.0) == 5120
