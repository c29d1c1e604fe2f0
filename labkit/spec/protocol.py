"""How every arm of a comparison is measured: warm-up, trials, the profiler window and the sampling.

One protocol per comparison, so both sides of every verdict were measured alike."""
from __future__ import annotations

from dataclasses import dataclass, fields

from labkit.spec.numbers import COUNT, COUNT_OR_ZERO, NON_NEGATIVE, POSITIVE, check_number, raise_problems
from labkit.spec.limits import MAX_REQUESTS_PER_TRIAL, check_at_most

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


FIXES = {  # what a refused value should be, said with the refusal
    "trials": '"auto" for adaptive trials, or a whole number for exactly that many',
    "min_trials": "2 is the fewest that give an interval", "max_trials": "at least min_trials",
    "precision": "a share of the value: 0.02 for +/-2 %", "budget_s": "seconds of trial time per arm, or None",
    "decide_threshold": "a share: 0.05 for 5 %"}
ADAPTIVE_FIELDS = ("min_trials", "max_trials", "precision", "budget_s", "decide_against", "decide_threshold",
                   "precise_on")
# The headline metrics of every verdict (labkit.analyze.stats.VERDICT_METRICS names the same four), and those the
# stopping rule holds to its precision and its decision by default: throughput and the median token time. A tail
# latency of a few dozen requests moves by 5-25 % from trial to trial (seen on an H200 after six trials of the
# cuda_graphs loads: TTFT P99 +/-4-24 %, TBT P99 +/-4-13 %, output tok/s and TPOT P50 +/-0.1-1.8 %): held to
# +/-2 %, every arm would run to its maximum. Their intervals are still reported, and judged by the verdicts.
HEADLINE_METRICS = ("output_tok_s", "ttft_p99_ms", "tpot_p50_ms", "tbt_p99_ms")
PRECISE_ON = ("output_tok_s", "tpot_p50_ms")


@dataclass(frozen=True)
class Protocol:
    """One protocol per comparison: warm-up requests (never timed) and measured trials.

    `trials="auto"` (the default) runs each load of an arm `min_trials` times, then more until the 95 % interval
    of each metric in `precise_on` is within `precision` of its value, or `max_trials`, or the arm's `budget_s` of
    trial time is spent (labkit.analyze.stopping); with `decide_against` naming a reference arm measured
    earlier in the experiment, an arm also stops once its verdict against it is settled for every
    metric of `precise_on` (`decide_threshold`: the smallest change that counts). A number runs exactly that
    many trials."""

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
    precise_on: tuple[str, ...] = PRECISE_ON  # the headline metrics that must be precise (or decided) to stop

    def __post_init__(self):
        numeric = {"warmup_requests": (self.warmup_requests, COUNT_OR_ZERO),
                   "kv_sample_interval_s": (self.kv_sample_interval_s, POSITIVE),
                   "profile_requests": (self.profile_requests, COUNT_OR_ZERO),
                   "temperature": (self.temperature, dict(NON_NEGATIVE, allow_none=True)),
                   "min_trials": (self.min_trials, COUNT), "max_trials": (self.max_trials, COUNT),
                   "precision": (self.precision, POSITIVE), "budget_s": (self.budget_s, dict(POSITIVE, allow_none=True)),
                   "decide_threshold": (self.decide_threshold, NON_NEGATIVE)}
        if self.trials != "auto":
            numeric["trials"] = (self.trials, COUNT)
        problems = [(found + f" ({FIXES[name]})" if found and name in FIXES else found)
                    for name, (value, rules) in numeric.items() if (found := check_number(name, value, **rules))]
        problems += self._adaptive_problems()
        raise_problems("Protocol", problems)
        check_at_most("warmup_requests", self.warmup_requests, MAX_REQUESTS_PER_TRIAL)
        check_at_most("profile_requests", self.profile_requests, MAX_REQUESTS_PER_TRIAL)

    def _adaptive_problems(self) -> list[str]:
        """What the numbers cannot say alone: a maximum below the minimum, a reference arm that is no name."""
        problems = []
        if not check_number("min_trials", self.min_trials, **COUNT) and not check_number(
                "max_trials", self.max_trials, **COUNT) and self.max_trials < self.min_trials:
            problems.append(f"max_trials ({self.max_trials}) is below min_trials ({self.min_trials}): raise "
                            f"max_trials to at least {self.min_trials} or lower min_trials")
        if isinstance(self.precise_on, (list, tuple)):  # stored as a JSON list, compared as the tuple it was
            object.__setattr__(self, "precise_on", tuple(self.precise_on))
        if not isinstance(self.precise_on, tuple) or not self.precise_on \
                or not set(self.precise_on) <= set(HEADLINE_METRICS):
            problems.append(f"precise_on must name one or more of the headline metrics {list(HEADLINE_METRICS)}, "
                            f"got {self.precise_on!r}")
        if self.decide_against is not None and (not isinstance(self.decide_against, str) or not self.decide_against):
            problems.append(f"decide_against must be the name of a reference arm, or None, got "
                            f"{self.decide_against!r}")
        return problems

    @property
    def adaptive(self) -> bool:
        """True when the number of trials is chosen as the trials come in (trials="auto")."""
        return self.trials == "auto"

    @property
    def fewest_trials(self) -> int:
        """The fewest trials a load can get: min_trials when adaptive, else the fixed number."""
        return self.min_trials if self.adaptive else self.trials

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
        if "precise_on" in out:
            out["precise_on"] = list(out["precise_on"])  # as JSON stores it, so a stored spec compares equal
        return out


_DEFAULTS = {f.name: f.default for f in fields(Protocol)}


def choose_sampling(model_defaults: dict, neutral: dict, temperature: float | None) -> dict:
    """The sampling keys from the model's defaults, else vLLM's neutral values; the protocol's temperature wins."""
    chosen = {key: model_defaults.get(key, neutral[key]) for key in SAMPLING_KEYS}
    if temperature is not None:
        chosen["temperature"] = float(temperature)
    return chosen
