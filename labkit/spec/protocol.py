"""How every arm of a comparison is measured: warm-up, trials, the profiler window and the sampling.

One protocol per comparison, so both sides of every verdict were measured alike."""
from __future__ import annotations

from dataclasses import dataclass

from labkit.errors import BadParameter
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
        if not isinstance(self.trials, int) or self.trials < 1:
            raise BadParameter(f"trials must be a positive integer, got {self.trials!r}")
        if not isinstance(self.warmup_requests, int) or self.warmup_requests < 0:
            raise BadParameter(f"warmup_requests must be >= 0, got {self.warmup_requests!r}")
        if isinstance(self.kv_sample_interval_s, bool) or not isinstance(self.kv_sample_interval_s, (int, float)) \
                or self.kv_sample_interval_s <= 0:
            raise BadParameter(f"kv_sample_interval_s must be a positive number of seconds, got "
                               f"{self.kv_sample_interval_s!r}")
        if not isinstance(self.profile_requests, int) or self.profile_requests < 0:
            raise BadParameter(f"profile_requests must be >= 0, got {self.profile_requests!r}")
        check_at_most("warmup_requests", self.warmup_requests, MAX_REQUESTS_PER_TRIAL)
        check_at_most("profile_requests", self.profile_requests, MAX_REQUESTS_PER_TRIAL)
        if self.temperature is not None and (isinstance(self.temperature, bool) or
                                             not isinstance(self.temperature, (int, float)) or self.temperature < 0):
            raise BadParameter(f"temperature must be None (the server's default), 0.0 (greedy) or a positive "
                               f"number, got {self.temperature!r}")


def choose_sampling(model_defaults: dict, neutral: dict, temperature: float | None) -> dict:
    """The sampling keys from the model's defaults, else vLLM's neutral values; the protocol's temperature wins."""
    chosen = {key: model_defaults.get(key, neutral[key]) for key in SAMPLING_KEYS}
    if temperature is not None:
        chosen["temperature"] = float(temperature)
    return chosen
