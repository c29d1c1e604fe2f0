"""How every arm of a comparison is measured: warm-up, trials, the profiler window and the sampling.

One protocol per comparison, so both sides of every verdict were measured alike."""
from __future__ import annotations

from dataclasses import dataclass

from labkit.spec.numbers import COUNT, COUNT_OR_ZERO, NON_NEGATIVE, POSITIVE, check_numbers
from labkit.spec.limits import MAX_REQUESTS_PER_TRIAL, check_at_most

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class Protocol:
    """One fixed protocol per comparison: warm-up requests (never timed) and measured trials."""

    trials: int = 3
    warmup_requests: int = 8
    kv_sample_interval_s: float = 0.25
    profile_requests: int = 0  # > 0: after the trials, a torch-profiler window over this many requests
    # None: what vLLM's server gives a request that names no temperature, as `vllm bench serve` sends them
    # (the model's generation config, else 1.0); 0.0: greedy
    temperature: float | None = None

    def __post_init__(self):
        check_numbers("Protocol", {"trials": (self.trials, COUNT),
                                   "warmup_requests": (self.warmup_requests, COUNT_OR_ZERO),
                                   "kv_sample_interval_s": (self.kv_sample_interval_s, POSITIVE),
                                   "profile_requests": (self.profile_requests, COUNT_OR_ZERO),
                                   "temperature": (self.temperature, dict(NON_NEGATIVE, allow_none=True))})
        check_at_most("warmup_requests", self.warmup_requests, MAX_REQUESTS_PER_TRIAL)
        check_at_most("profile_requests", self.profile_requests, MAX_REQUESTS_PER_TRIAL)


def choose_sampling(model_defaults: dict, neutral: dict, temperature: float | None) -> dict:
    """The sampling keys from the model's defaults, else vLLM's neutral values; the protocol's temperature wins."""
    chosen = {key: model_defaults.get(key, neutral[key]) for key in SAMPLING_KEYS}
    if temperature is not None:
        chosen["temperature"] = float(temperature)
    return chosen
