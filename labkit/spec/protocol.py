"""How every arm of a comparison is measured: warm-up, trials, the profiler window and the sampling.

One protocol per comparison, so both sides of every verdict were measured alike."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from labkit.errors import BadParameter

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


ADAPTIVE_FIELDS = ("min_trials", "max_trials", "precision", "budget_s", "decide_against", "decide_threshold")


def _is_number(value) -> bool:
    """A real, finite number (a bool is not one: True would pass for 1)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class Protocol:
    """One protocol per comparison: warm-up requests (never timed) and measured trials.

    `trials="auto"` (the default) runs each load of an arm `min_trials` times, then more until every headline
    metric's 95 % interval is within `precision` of its value, or `max_trials`, or the arm's `budget_s` of
    trial time is spent (labkit.analyze.stopping); with `decide_against` naming a reference arm measured
    earlier in the experiment, an arm also stops once its verdict against it is settled for every headline
    metric (`decide_threshold`: the smallest change that counts). A number runs exactly that many trials."""

    trials: int | str = "auto"
    warmup_requests: int = 8
    kv_sample_interval_s: float = 0.25
    profile_requests: int = 0  # > 0: after the trials, a torch-profiler window over this many requests
    # None: what vLLM's server gives a request that names no temperature, as `vllm bench serve` sends them
    # (the model's generation config, else 1.0); 0.0: greedy
    temperature: float | None = None
    min_trials: int = 2  # two values are the fewest that have a spread
    max_trials: int = 6
    precision: float = 0.02  # the 95 % interval's half-width, as a share of the value
    budget_s: float | None = 600.0  # trial time per arm (shared equally by its loads); None: no budget
    decide_against: str | None = None  # a reference arm: stop once the verdict against it is settled
    decide_threshold: float = 0.05

    def __post_init__(self):
        problems = []
        if self.trials != "auto" and (isinstance(self.trials, bool) or not isinstance(self.trials, int)
                                      or self.trials < 1):
            problems.append(f'trials must be "auto" (adaptive) or a positive integer, got {self.trials!r}')
        if not isinstance(self.warmup_requests, int) or isinstance(self.warmup_requests, bool) \
                or self.warmup_requests < 0:
            problems.append(f"warmup_requests must be >= 0, got {self.warmup_requests!r}")
        if not _is_number(self.kv_sample_interval_s) or self.kv_sample_interval_s <= 0:
            problems.append(f"kv_sample_interval_s must be a positive number of seconds, got "
                            f"{self.kv_sample_interval_s!r}")
        if not isinstance(self.profile_requests, int) or isinstance(self.profile_requests, bool) \
                or self.profile_requests < 0:
            problems.append(f"profile_requests must be >= 0, got {self.profile_requests!r}")
        if self.temperature is not None and (not _is_number(self.temperature) or self.temperature < 0):
            problems.append(f"temperature must be None (the server's default), 0.0 (greedy) or a positive "
                            f"number, got {self.temperature!r}")
        problems += self._adaptive_problems()
        if problems:
            raise BadParameter("Protocol: " + "; ".join(problems))

    def _adaptive_problems(self) -> list[str]:
        problems = []
        min_ok = isinstance(self.min_trials, int) and not isinstance(self.min_trials, bool) and self.min_trials >= 1
        max_ok = isinstance(self.max_trials, int) and not isinstance(self.max_trials, bool) and self.max_trials >= 1
        if not min_ok:
            problems.append(f"min_trials must be a positive integer (2 gives an interval), got {self.min_trials!r}")
        if not max_ok:
            problems.append(f"max_trials must be a positive integer, got {self.max_trials!r}")
        if min_ok and max_ok and self.max_trials < self.min_trials:
            problems.append(f"max_trials ({self.max_trials}) is below min_trials ({self.min_trials}): raise "
                            f"max_trials to at least {self.min_trials} or lower min_trials")
        if not _is_number(self.precision) or self.precision <= 0:
            problems.append(f"precision must be a positive share of the value (0.02 for +/-2 %), got "
                            f"{self.precision!r}")
        if self.budget_s is not None and (not _is_number(self.budget_s) or self.budget_s <= 0):
            problems.append(f"budget_s must be a positive number of seconds, or None for no budget, got "
                            f"{self.budget_s!r}")
        if self.decide_against is not None and (not isinstance(self.decide_against, str) or not self.decide_against):
            problems.append(f"decide_against must be the name of a reference arm, or None, got "
                            f"{self.decide_against!r}")
        if not _is_number(self.decide_threshold) or self.decide_threshold < 0:
            problems.append(f"decide_threshold must be a share >= 0 (0.05 for 5 %), got {self.decide_threshold!r}")
        return problems

    @property
    def adaptive(self) -> bool:
        """True when the number of trials is chosen as the trials come in (trials="auto")."""
        return self.trials == "auto"

    @property
    def most_trials(self) -> int:
        """The most trials a load can get: max_trials when adaptive, else the fixed number."""
        return self.max_trials if self.adaptive else self.trials

    def to_dict(self) -> dict:
        """The protocol as stored with every arm (and compared on resume). A fixed protocol leaves out the
        adaptive settings it does not use while they hold their defaults, so an arm stored before adaptive
        trials existed still resumes and still counts as launched alike; `Protocol(**to_dict())` is equal."""
        out = dict(self.__dict__)
        if not self.adaptive:
            for name in ADAPTIVE_FIELDS:
                if out[name] == _DEFAULTS[name]:
                    del out[name]
        return out


_DEFAULTS = {f.name: f.default for f in fields(Protocol)}


def choose_sampling(model_defaults: dict, neutral: dict, temperature: float | None) -> dict:
    """The sampling keys from the model's defaults, else vLLM's neutral values; the protocol's temperature wins."""
    chosen = {key: model_defaults.get(key, neutral[key]) for key in SAMPLING_KEYS}
    if temperature is not None:
        chosen["temperature"] = float(temperature)
    return chosen
