"""Memory arithmetic against a known shape."""
import pandas as pd
import pytest

from dataclasses import asdict

from labkit import memory
from labkit.models import SHAPES
from labkit.store import Results

LLAMA = SHAPES["llama3-8b"]


def test_kv_bytes_per_token_follows_the_kv_dtype():
    assert memory.kv_bytes_per_token(LLAMA, "auto", "bfloat16") == 131072  # 2 * 32 layers * 8 heads * 128 * 2 B
    assert memory.kv_bytes_per_token(LLAMA, "fp8", "bfloat16") == 65536


def test_breakdown_matches_what_an_h200_logged():
    # facts as the H200 run of the quickstart recorded them (vLLM 0.26, Llama-3-8B shape, bf16)
    facts = {"arm": "a", "status": "complete", "dtype": "bfloat16", "kv_cache_dtype": "auto",
             "quantization": None, "model_load_gib": 14.96, "kv_cache_available_gib": 112.42,
             "graph_capture_gib": 0.41, "kv_cache_tokens": 920960, "max_model_len": 8192, "max_concurrency": 112.42,
             "kv_cache_memory_bytes": None}
    results = Results("m", None, {"shape": asdict(LLAMA)}, pd.DataFrame([facts]), pd.DataFrame(), pd.DataFrame(), {})
    row = memory.breakdown(results).iloc[0]
    assert row.weights_gib_computed == pytest.approx(row.weights_gib_measured, rel=0.01)
    assert row.kv_tokens_computed == pytest.approx(row.kv_tokens_measured, rel=0.01)
    assert row.max_concurrency_computed == pytest.approx(row.max_concurrency_measured, rel=0.01)


def test_fitted_max_model_len_covers_the_quantile():
    prompts, outputs = [100] * 99 + [5000], [100] * 100
    assert memory.fitted_max_model_len(prompts, outputs, quantile=0.95) == 256
    assert memory.fitted_max_model_len(prompts, outputs, quantile=1.0) == 5120
