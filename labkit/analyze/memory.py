"""Device memory = weights + KV-cache pool + activations/graphs: computed from the model's shape, set
against what the engine measured and logged for each arm."""
from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.errors import BadParameter
from labkit.spec.numbers import COUNT, FRACTION, check_numbers
from labkit.spec.models import ModelShape
from labkit.analyze.precision import kv_bytes, weight_bytes

GIB = 2**30


def kv_bytes_per_token(shape: ModelShape, kv_cache_dtype: str, dtype: str) -> float:
    """KV-cache bytes of one token of this shape at the arm's kv_cache_dtype ("auto": the model's dtype)."""
    return shape.kv_bytes_per_token(kv_bytes(kv_cache_dtype, dtype))


def breakdown(results) -> pd.DataFrame:
    """Per arm: weights, KV pool and graphs in GiB (computed and measured), KV capacity in tokens and
    maximum concurrency at max_model_len (measured and computed from the pool's size)."""
    shape = ModelShape(**results.spec["shape"])
    rows = []
    for arm in results.complete_arms:
        f = results.arms.set_index("arm").loc[arm]
        dtype = f.get("dtype")
        weights = weight_bytes(dtype, f.get("quantization")).loaded(shape)
        per_token = kv_bytes_per_token(shape, f.get("kv_cache_dtype"), dtype)
        # the pool's size: logged on GPUs; on a CPU it is the kv_cache_memory_bytes the arm asked for
        pool_gib = f.get("kv_cache_available_gib")
        if pool_gib is None or pd.isna(pool_gib):
            pool_gib = (f.get("kv_cache_memory_bytes") or np.nan) / GIB
        tokens = f.get("kv_cache_tokens")
        rows.append({
            "arm": arm,
            "weights_gib_computed": weights / GIB,
            "weights_gib_measured": f.get("model_load_gib"),
            "kv_pool_gib": pool_gib,
            "graphs_gib": f.get("graph_capture_gib"),
            "kv_bytes_per_token": per_token,
            "kv_tokens_measured": tokens,
            "kv_tokens_computed": pool_gib * GIB / per_token,
            "max_model_len": f.get("max_model_len"),
            "max_concurrency_measured": f.get("max_concurrency"),
            "max_concurrency_computed": tokens / f.get("max_model_len") if tokens else np.nan,
        })
    return pd.DataFrame(rows)


def fitted_max_model_len(prompt_lengths, output_lengths, quantile: float = 0.99, multiple: int = 256) -> int:
    """A max_model_len that covers the real length distribution (its quantile), rounded up, instead of
    the model's maximum: every request slot then reserves what requests really use."""
    check_numbers("a fitted max_model_len", {"quantile": (quantile, FRACTION), "multiple": (multiple, COUNT)})
    total = np.asarray(prompt_lengths) + np.asarray(output_lengths)
    if total.size == 0:
        raise BadParameter("a fitted max_model_len needs request lengths, got none")
    need = np.quantile(total, quantile)
    return int(np.ceil(need / multiple) * multiple)
