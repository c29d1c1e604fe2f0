"""What a GPU's compute capability unlocks in vLLM: the hardware's rules for what a launch may ask (the knobs
check fp8 against them) and a table a notebook can show (pure: no driver asked here)."""
from __future__ import annotations

import re

import pandas as pd

FP8_MIN = (8, 9)  # Ada and Hopper: fp8 tensor cores

# feature -> (lowest compute capability, highest or None, what it means for a launch). vLLM picks most of
# them itself when the hardware allows; the lab's knobs name the ones a launch chooses.
FEATURES = {
    "bf16 weights and activations": ((8, 0), None, "dtype=bfloat16 (vLLM's default for bf16 checkpoints)"),
    "FlashAttention 2": ((8, 0), None, "attention_backend=FLASH_ATTN on Ampere and Ada"),
    "FlashAttention 3": ((9, 0), (9, 0), "FLASH_ATTN uses FA3 on Hopper: faster prefill and fp8 attention"),
    "FlashInfer": ((8, 0), None, "attention_backend=FLASHINFER"),
    "fp8 weights (W8A8)": (FP8_MIN, None, "quantization=fp8: half the weight bytes, fp8 tensor cores"),
    "fp8 KV cache": (FP8_MIN, None, "kv_cache_dtype=fp8: twice the KV tokens in the same pool"),
    "4-bit AWQ/GPTQ (Marlin kernels)": ((8, 0), None, "quantized checkpoints; weights a quarter of bf16"),
    "fp4 (NVFP4)": ((10, 0), None, "Blackwell only"),
    "CUDA graphs": ((0, 0), None, "every CUDA GPU: vLLM captures decode batches by default"),
}


def capability_tuple(compute_capability: str | None) -> tuple[int, int] | None:
    found = re.findall(r"\d+", compute_capability or "")
    return (int(found[0]), int(found[1])) if len(found) >= 2 else None


def has_fp8_tensor_cores(hardware) -> bool:
    """Whether a platform or hardware profile (its `kind` and `compute_capability`) is a GPU with fp8 tensor cores."""
    return hardware.kind == "cuda" and (capability_tuple(hardware.compute_capability) or (0, 0)) >= FP8_MIN


def unlocks(compute_capability: str | None) -> pd.DataFrame:
    """One row per feature: the compute capability it needs, whether this device has it, and what it means.
    Without a compute capability (a CPU) none is available."""
    here = capability_tuple(compute_capability)
    rows = []
    for feature, (low, high, meaning) in FEATURES.items():
        needs = "any" if low == (0, 0) else f"{low[0]}.{low[1]}" + (" only" if high == low else "")
        ok = here is not None and here >= low and (high is None or here[0] <= high[0])
        rows.append({"feature": feature, "needs": needs, "available": ok, "meaning": meaning})
    return pd.DataFrame(rows)
