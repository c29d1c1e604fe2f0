"""Bytes per element, the one rule that the memory breakdown and the roofline share: weights by dtype and
quantization, the KV cache by kv_cache_dtype and dtype; and what a precision arm's memory bought (the KV
capacity table of L4_hardware/precision)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labkit.spec.models import ModelShape

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}


def dtype_bytes(dtype) -> float:
    """Bytes per element of a dtype name; 2 (bf16, vLLM's usual default) for one not in the table."""
    return DTYPE_BYTES.get(str(dtype), 2)  # an unrecorded dtype is vLLM's usual default, bf16


@dataclass(frozen=True)
class WeightBytes:
    """Bytes per weight parameter: of the decoder layers' projections, and of the rest (embeddings, LM
    head, norms), which weight quantization leaves alone."""

    projection: float = 2
    other: float = 2

    @classmethod
    def of(cls, value: "float | WeightBytes") -> "WeightBytes":
        """`value` itself when it is a WeightBytes, else one with `value` bytes for every weight."""
        return value if isinstance(value, WeightBytes) else cls(value, value)

    def loaded(self, shape: ModelShape) -> float:
        """Every weight, as it sits in device memory."""
        return shape.linear_params * self.projection + (shape.num_params - shape.linear_params) * self.other

    def read(self, shape: ModelShape, tokens: float) -> float:
        """What one forward pass over `tokens` tokens reads: every matrix once, but of an untied input
        embedding only its tokens' rows (a tied table is read in full anyway, as the LM head)."""
        if shape.tie_word_embeddings:
            return self.loaded(shape)
        unread_rows = max(shape.vocab_size - tokens, 0)
        return self.loaded(shape) - unread_rows * shape.hidden_size * self.other


def weight_bytes(dtype, quantization) -> WeightBytes:
    """Bytes per weight for a dtype and quantization: fp8 makes the projections 1 byte, the rest keeps the
    dtype's size."""
    model = dtype_bytes(dtype)
    # vLLM's fp8 converts only the linear layers: the H200 loaded 8.49 GiB of Llama-3-8B, not all-fp8's 7.48
    return WeightBytes(1 if quantization == "fp8" else model, model)


def kv_bytes(kv_cache_dtype, dtype) -> float:
    """Bytes per KV-cache element: kv_cache_dtype's, or the model dtype's when it is "auto" or unset."""
    # "auto" is the model's dtype, whatever the weights were quantized to
    unset = not isinstance(kv_cache_dtype, str) or kv_cache_dtype == "auto"  # None or a missing fact too
    return dtype_bytes(dtype if unset else kv_cache_dtype)


def capacity_table(results, reference: str) -> pd.DataFrame:
    """Per arm: what its precision costs in memory and buys in room: the weights as loaded, the KV tokens
    the pool holds and the requests of max_model_len that fit at once, each also as a multiple of the
    reference arm's (an fp8 KV cache should hold about twice the tokens in the same pool)."""
    facts = results.facts("cause", "dtype", "quantization", "kv_cache_dtype", "model_load_gib", "kv_cache_tokens",
                          "max_concurrency").set_index("arm")
    for column in ("kv_cache_tokens", "max_concurrency"):
        base = facts[column].get(reference)
        facts[f"{column}_x"] = (facts[column] / base).round(2) if base else float("nan")
    facts["kv_bytes_per_element"] = [kv_bytes(k, d) if status == "complete" else float("nan")
                                     for k, d, status in zip(facts.kv_cache_dtype, facts.dtype, facts.status)]
    return facts.reset_index()
