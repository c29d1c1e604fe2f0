"""What vLLM really chose for an arm: read from the live engine config and from the engine's own log.

Many tuning surprises are silent fallbacks (another attention backend, graphs not captured, a smaller
KV cache than expected), so the lab records the effective configuration, not only what was asked.
"""
from __future__ import annotations

import re

_LOG_FACTS = {
    "attention_backend": r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) (?:attention )?backend",
    "attention_candidates": r"potential backends: \[([^\]]*)\]",
    "kv_cache_tokens_logged": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "graph_capture_gib": r"Graph capturing finished in [\d.]+ secs, took ([-\d.]+) GiB",
    "compile_s": r"torch\.compile (?:took|takes) ([\d.]+) s in total",
    "model_load_gib": r"Model loading took ([\d.]+) GiB",
    "model_load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
    "kv_cache_available_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)",
}


def facts_from_log(text: str) -> dict:
    """Facts the engine printed while starting; the first occurrence of each wins."""
    facts: dict = {}
    for key, pattern in _LOG_FACTS.items():
        match = re.search(pattern, text)
        if not match:
            continue
        raw = match.group(1)
        if key == "attention_candidates":
            facts[key] = [name.strip(" '\"") for name in raw.split(",") if name.strip()]
        elif key == "attention_backend":
            facts[key] = raw
        else:
            facts[key] = float(raw.replace(",", ""))
    if "kv_cache_tokens_logged" in facts:
        facts["kv_cache_tokens_logged"] = int(facts["kv_cache_tokens_logged"])
    return facts


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return getattr(value, "name", None) or str(value)


def facts_from_config(vllm_config) -> dict:
    """The effective settings after vLLM resolved its defaults (the frontend's VllmConfig)."""
    model, cache = vllm_config.model_config, vllm_config.cache_config
    sched, par, comp = vllm_config.scheduler_config, vllm_config.parallel_config, vllm_config.compilation_config
    blocks = cache.num_gpu_blocks
    facts = {
        "dtype": str(model.dtype).replace("torch.", ""),
        "max_model_len": model.max_model_len,
        "enforce_eager": bool(model.enforce_eager),
        "quantization": model.quantization,
        "kv_cache_dtype": cache.cache_dtype,
        "block_size": cache.block_size,
        "kv_cache_blocks": blocks,
        "kv_cache_tokens": blocks * cache.block_size if blocks else None,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "kv_cache_memory_bytes": getattr(cache, "kv_cache_memory_bytes", None),
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "enable_chunked_prefill": bool(getattr(sched, "enable_chunked_prefill", True)),
        "tensor_parallel_size": par.tensor_parallel_size,
        "data_parallel_size": par.data_parallel_size,  # the frontend's; each engine core resets its own to 1
        "compile_mode": _plain(getattr(comp, "mode", None)),
        "cudagraph_mode": _plain(getattr(comp, "cudagraph_mode", None)),
        "cudagraph_capture_sizes": _plain(list(getattr(comp, "cudagraph_capture_sizes", None) or [])),
        "requested_attention_backend": _plain(getattr(getattr(vllm_config, "attention_config", None),
                                                      "backend", None)),
        "speculative_config": _speculative(getattr(vllm_config, "speculative_config", None)),
    }
    return facts


def _speculative(config) -> dict | None:
    """The speculative decoding vLLM set up (None: none): method and draft length, the n-gram window."""
    if config is None:
        return None
    fields = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
    return {name: _plain(getattr(config, name, None)) for name in fields if getattr(config, name, None) is not None}


def resolve(vllm_config, log_text: str, platform_kind: str) -> dict:
    """An arm's effective settings: the config's facts, then the log's, with the attention backend's source and
    whether the engine was compiled and captured CUDA graphs."""
    facts = facts_from_config(vllm_config)
    facts.update(facts_from_log(log_text))
    if "attention_backend" in facts:
        facts["attention_backend_source"] = "engine log"
    elif platform_kind == "cpu":
        # vLLM's CPU platform picks CPU_ATTN for dense models without logging it.
        facts["attention_backend"] = "CPU_ATTN"
        facts["attention_backend_source"] = "CPU platform rule (not logged by vLLM)"
    facts["compiled"] = facts.get("compile_mode") not in (None, "NONE", 0) and not facts["enforce_eager"]
    facts["cuda_graphs"] = (platform_kind == "cuda" and not facts["enforce_eager"]
                            and facts.get("cudagraph_mode") not in (None, "NONE"))
    return facts
