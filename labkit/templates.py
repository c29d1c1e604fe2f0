"""Hardware-aware starting launches: the per-GPU-class configurations practitioners start from, each setting
with its reason, chosen from the machine's hardware profile and the model's size, emitted as knobs and as a
`vllm serve` command line, and then measured against vLLM's defaults (notebooks/L4_hardware/templates.ipynb):
a template is a hypothesis until its A/B says otherwise.

A setting the lab cannot measure here says so instead of being dropped silently: 4-bit AWQ needs a quantized
checkpoint that synthetic (dummy) weights cannot stand in for; tensor parallelism needs the GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

from labkit.errors import BadParameter
from labkit.spec.capabilities import capability_tuple, has_fp8_tensor_cores
from labkit.spec.knobs import serve_args
from labkit.spec.launch import launch_command
from labkit.spec.numbers import COUNT_OR_ZERO, POSITIVE, check_numbers


@dataclass(frozen=True)
class Hardware:
    """What a template is chosen by: the device kind, the first GPU's name, compute capability and memory,
    and how many GPUs there are."""

    kind: str  # "cuda" or "cpu"
    name: str
    compute_capability: str | None = None
    memory_gib: float | None = None
    gpu_count: int = 0

    def __post_init__(self):
        check_numbers("Hardware", {"memory_gib": (self.memory_gib, dict(POSITIVE, allow_none=True)),
                                   "gpu_count": (self.gpu_count, COUNT_OR_ZERO)})

    @classmethod
    def from_environment(cls, env: dict) -> "Hardware":
        """From an environment fingerprint (labkit.measure.environment.fingerprint() or a stored result's)."""
        gpus = env.get("gpus") or []
        if not gpus:
            return cls("cpu", env.get("cpu_model") or "CPU")
        memory = env.get("gpu_memory_mib")
        return cls("cuda", gpus[0], env.get("compute_capability"), memory / 1024 if memory else None, len(gpus))

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"a CPU ({self.name})"
        memory = f", {self.memory_gib:.0f} GiB" if self.memory_gib else ""
        return f"{self.gpu_count} x {self.name} (compute capability {self.compute_capability or '?'}{memory})"


@dataclass(frozen=True)
class Setting:
    knob: str
    value: Any
    reason: str
    not_measured: str | None = None  # why the lab cannot measure this setting here (None: it is measured)


@dataclass(frozen=True)
class LaunchTemplate:
    """A starting launch for a class of hardware, each setting with its reason (a prompt's layout is
    labkit.Template, another thing)."""

    name: str
    fits: str  # the hardware class, in words
    settings: tuple[Setting, ...]

    def knobs(self) -> dict:
        """The settings the lab can measure here, as an arm's knobs."""
        return {s.knob: s.value for s in self.settings if s.not_measured is None}

    def table(self) -> pd.DataFrame:
        """One row per setting: knob, value, why, and whether it is measured here (or why not)."""
        return pd.DataFrame([{"knob": s.knob, "value": s.value, "reason": s.reason,
                              "measured here": "yes" if s.not_measured is None else f"no: {s.not_measured}"}
                             for s in self.settings], columns=["knob", "value", "reason", "measured here"])

    def serve_command(self, model: str) -> str:
        """The whole template, unmeasurable settings included, as the `vllm serve` line a team would deploy."""
        args, variables = serve_args({s.knob: s.value for s in self.settings})
        return launch_command("serve", model, args, variables)


def _hopper(hw: Hardware, weights_gib: float) -> tuple[Setting, ...]:
    return (Setting("quantization", "fp8", "fp8 tensor cores: half the bytes every decode step reads, and the "
                    "freed memory goes to the KV pool"),
            Setting("kv_cache_dtype", "fp8", "twice the KV tokens in the same pool: more requests at once, "
                    "fewer preemptions on long contexts"),
            Setting("max_num_batched_tokens", 32768, "large prefill chunks keep a Hopper's tensor cores busy; "
                    "costs decode smoothness under mixed load (L2_engine/chunked_prefill)"))


def _ampere(hw: Hardware, weights_gib: float) -> tuple[Setting, ...]:
    tp_note = None if hw.gpu_count >= 2 else f"needs 2 GPUs; this machine has {hw.gpu_count}"
    return (Setting("max_num_batched_tokens", 16384, "half the Hopper chunk: an A100's tensor cores saturate "
                    "earlier, and a smaller chunk stalls running decodes less"),
            Setting("tensor_parallel_size", 2, "two GPUs share the weights: more memory left for the KV pool "
                    f"(the bf16 weights are {weights_gib:.1f} GiB) and each step's GEMMs split in two", tp_note))


def _card_24gb(hw: Hardware, weights_gib: float) -> tuple[Setting, ...]:
    return (Setting("quantization", "awq", "4-bit weights: an 8B model's 15 GiB become about 5 GiB, leaving a 24 GB "
                    "card room for a KV pool", "AWQ needs a 4-bit quantized checkpoint; synthetic (dummy) weights "
                    "cannot stand in for one"),
            Setting("gpu_memory_utilization", 0.95, "a dedicated card: give vLLM nearly all of it"),
            Setting("max_model_len", 8192, "caps each request's KV reservation, so more requests fit"))


def _cpu(hw: Hardware, weights_gib: float) -> tuple[Setting, ...]:
    return (Setting("kv_cache_dtype", "fp8", "vLLM's CPU backend stores an fp8 KV cache: twice the tokens in the "
                    "same memory, at a conversion cost this A/B weighs"),)


# name -> (the class in words, does this hardware fit, settings)
TEMPLATES: dict[str, tuple[str, Callable[[Hardware], bool], Callable[[Hardware, float], tuple[Setting, ...]]]] = {
    "hopper": ("an NVIDIA GPU with fp8 tensor cores and 70 GiB or more (H100, H200, GH200)",
               lambda hw: has_fp8_tensor_cores(hw) and (hw.memory_gib or 0) >= 70, _hopper),
    "ampere": ("an NVIDIA GPU of compute capability 8.0 or newer with 40 GiB or more (A100)",
               lambda hw: hw.kind == "cuda" and (capability_tuple(hw.compute_capability) or (0, 0)) >= (8, 0)
               and (hw.memory_gib or 0) >= 40, _ampere),
    "24gb": ("an NVIDIA GPU of 24 GiB or less (RTX 4090, A10, L4)",
             lambda hw: hw.kind == "cuda" and 0 < (hw.memory_gib or 0) <= 24.5, _card_24gb),
    "cpu": ("a CPU (vLLM's CPU backend)", lambda hw: hw.kind == "cpu", _cpu),
}


def named(name: str, hw: Hardware, weights_gib: float) -> LaunchTemplate:
    """The template `name` for this hardware; a template the hardware does not fit is a clear error."""
    if name not in TEMPLATES:
        raise BadParameter(f"unknown template {name!r}; templates are {sorted(TEMPLATES)} (or 'auto')")
    fits, check, build = TEMPLATES[name]
    if not check(hw):
        raise BadParameter(f"template {name!r} is for {fits}; this machine is {hw.describe()}: use template='auto' "
                           f"or one of {[n for n, (_, ok, _) in TEMPLATES.items() if ok(hw)] or 'none'}")
    return LaunchTemplate(name, fits, build(hw, weights_gib))


def choose(hw: Hardware, weights_gib: float) -> LaunchTemplate:
    """The first template this hardware fits (most specific first); none fits -> a clear error."""
    for name, (_, check, _) in TEMPLATES.items():
        if check(hw):
            return named(name, hw, weights_gib)
    raise BadParameter(f"no template fits {hw.describe()}: start from vLLM's defaults "
                       f"(templates cover {', '.join(f for f, _, _ in TEMPLATES.values())})")


def for_this_machine(template: str = "auto", model: str = "auto"):
    """This machine's hardware profile, `model` resolved (its ModelRef: `.model` is what `vllm serve` is given)
    and the template `template` for it here ("auto": the first the hardware fits), sized by the model's bf16
    weights (0 for a model whose shape is unknown)."""
    from labkit.analyze import precision
    from labkit.experiment import default_model
    from labkit.measure import environment
    from labkit.spec.models import resolve_model

    hardware = Hardware.from_environment(environment.fingerprint())
    ref = resolve_model(default_model() if model == "auto" else model)
    weights_gib = precision.weight_bytes("bfloat16", None).loaded(ref.shape) / 2**30 if ref.shape else 0.0
    return hardware, ref, (choose(hardware, weights_gib) if template == "auto"
                           else named(template, hardware, weights_gib))
