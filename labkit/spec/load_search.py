"""A load search: the largest closed-loop concurrency, or the largest Poisson rate, that meets a set of SLOs on
one engine, found by growing the load until an SLO breaks and bisecting between the last load that met them and
the first that did not (labkit.analyze.load_search holds the search itself, pure; the arm's worker runs it
between trials on the engine it already has, so no load level costs an engine start).

The loads tried lie on a ladder from the range's low end to its high end, `steps_per_doubling` notches per
doubling (4: each notch about 19 % above the one before; clients are whole, so the low rungs are 1, 2, 3, ...).
The answer backs off one notch from the largest load that met every SLO, as the max_num_seqs search does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.errors import BadParameter
from labkit.spec.limits import MAX_REQUESTS_PER_TRIAL
from labkit.spec.numbers import COUNT, POSITIVE, SEED, check_number, raise_problems
from labkit.spec.prompts import Template
from labkit.spec.workload import Concurrency, Fixed, FromLog, LogNormal, Poisson, Uniform, Workload

_LENGTHS = (Fixed, Uniform, LogNormal, FromLog)


def slo_problems(slos) -> list[str]:
    """Every problem of a load search's SLOs: none given, a metric the lab does not know, one that is no latency of
    requests or tokens (a limit on throughput or on a trial counter is no SLO), a limit that is not a positive
    number."""
    from labkit.analyze.stats import METRICS  # the metric names, defined once with the analysis

    if not isinstance(slos, dict) or not slos:
        return [f"slos must be a non-empty dict of latency limits in ms, e.g. {{'tbt_p99_ms': 50}}; got {slos!r}"]
    latencies = [name for name, m in METRICS.items() if m.level != "trial" and m.lower_is_better]
    problems = []
    for name, limit in slos.items():
        if name not in METRICS:
            problems.append(f"unknown SLO metric {name!r}; an SLO limits one of {latencies}")
        elif name not in latencies:
            problems.append(f"{name} is no latency of requests or tokens; an SLO limits one of {latencies}")
        problems.append(check_number(f"the limit of SLO {name}", limit, **POSITIVE))
    return problems


def _range_problems(name: str, bounds, rules: dict) -> list[str]:
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        return [f"{name} must be a (low, high) pair, e.g. {name}=(1, 64); got {bounds!r}"]
    low, high = bounds
    problems = [check_number(f"{name}'s low end", low, **rules), check_number(f"{name}'s high end", high, **rules)]
    if not any(problems) and not low < high:
        problems.append(f"{name}'s low end must be below its high end to leave a range to search, got {bounds!r}")
    return problems


def ladder(low: float, high: float, whole: bool, steps_per_doubling: int) -> list:
    """The loads a search may try, ascending: low, then `steps_per_doubling` geometric notches per doubling up to
    high, which is always the last rung. Whole loads (clients) are rounded and kept once each; rates keep three
    significant digits."""
    rungs, k = [], 0
    while True:
        value = low * 2 ** (k / steps_per_doubling)
        if value >= high * (1 - 1e-9):
            break
        rungs.append(int(round(value)) if whole else float(f"{value:.3g}"))
        k += 1
    rungs.append(int(high) if whole else float(high))
    return sorted(set(rungs))


@dataclass(frozen=True)
class LoadSearch:
    """The largest load that meets every SLO on one engine: `clients=(low, high)` searches closed-loop
    concurrency, `rate=(low, high)` a Poisson rate in requests/s (give one of them). `slos` limits latencies in
    ms (`{"tbt_p99_ms": 50, "ttft_p99_ms": 2000}`); a load meets them when each one's 95 % interval lies within
    its limit. Each probe's trial sends `requests` requests at least; a closed-loop probe `per_client` per client,
    a rate probe as many as `seconds` of its schedule hold. Given as an Experiment's workload (or one of its named
    loads), each arm searches on its own engine; every probe is stored as a load of its own (`c8`, `rate=4`)."""

    slos: dict[str, float]
    clients: tuple[int, int] | None = None
    rate: tuple[float, float] | None = None
    prompt_len: object = 128  # a length (Fixed, Uniform, LogNormal, FromLog), a Template, or a number of tokens
    output_len: object = 128  # a length, or a number of tokens
    requests: int = 32
    per_client: int = 4
    seconds: float = 10.0
    steps_per_doubling: int = 4
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.clients, list):
            object.__setattr__(self, "clients", tuple(self.clients))
        if isinstance(self.rate, list):
            object.__setattr__(self, "rate", tuple(self.rate))
        if isinstance(self.slos, dict):
            object.__setattr__(self, "slos", dict(self.slos))
        problems = slo_problems(self.slos)
        if (self.clients is None) == (self.rate is None):
            problems.append("give one range to search: clients=(low, high) for closed-loop concurrency, or "
                            "rate=(low, high) for a Poisson rate in requests/s"
                            + (f"; got clients={self.clients!r} and rate={self.rate!r}" if self.clients else ""))
        elif self.clients is not None:
            problems += _range_problems("clients", self.clients, COUNT)
        else:
            problems += _range_problems("rate", self.rate, POSITIVE)
        problems += [check_number(name, value, **rules) for name, value, rules in (
            ("requests", self.requests, COUNT), ("per_client", self.per_client, COUNT),
            ("seconds", self.seconds, POSITIVE), ("steps_per_doubling", self.steps_per_doubling, COUNT),
            ("seed", self.seed, SEED))]
        for name, value, kinds in (("prompt_len", self.prompt_len, _LENGTHS + (Template,)),
                                   ("output_len", self.output_len, _LENGTHS)):
            if isinstance(value, kinds):
                continue
            if (found := check_number(name, value, **COUNT)) is None:
                object.__setattr__(self, name, Fixed(value))  # a number of tokens is that Fixed length
            else:
                problems.append(f"{found} (or a length such as lk.Fixed(128))")
        raise_problems("LoadSearch", problems)
        largest = self.probe_requests(self.levels()[-1])
        if largest > MAX_REQUESTS_PER_TRIAL:
            raise BadParameter(f"LoadSearch: the top of the range needs {largest} requests per probe trial, more than "
                               f"the lab holds ({MAX_REQUESTS_PER_TRIAL}); lower the high end or `seconds`")
        self.probe(self.levels()[-1])  # the Workload's own checks of size and lengths, before any engine

    @property
    def kind(self) -> str:
        """"clients" (closed loop) or "rate" (Poisson arrivals)."""
        return "clients" if self.clients is not None else "rate"

    @property
    def bounds(self) -> tuple:
        """The searched range, (low, high)."""
        return self.clients if self.clients is not None else self.rate

    def levels(self) -> list:
        """Every load the search may try, ascending (labkit.spec.load_search.ladder)."""
        low, high = self.bounds
        return ladder(low, high, self.kind == "clients", self.steps_per_doubling)

    def probe_requests(self, level) -> int:
        """Requests of one trial at this load: `requests` at least; per client, or as `seconds` of the rate hold."""
        extra = self.per_client * level if self.kind == "clients" else math.ceil(level * self.seconds)
        return int(max(self.requests, extra))

    def probe(self, level) -> Workload:
        """The Workload of one probe at this load."""
        arrival = Concurrency(int(level)) if self.kind == "clients" else Poisson(float(level))
        prompt, output = self.prompt_len, self.output_len
        return Workload(self.probe_requests(level), prompt, output, arrival, seed=self.seed)

    @staticmethod
    def load_name(kind: str, level, search: str = "default") -> str:
        """The stored load of one probe: `c8` or `rate=4`, after the search's own name when it has one."""
        own = f"c{int(level)}" if kind == "clients" else f"rate={float(level):g}"
        return own if search == "default" else f"{search}.{own}"

    @property
    def num_requests(self) -> int:
        """Requests of one trial of the heaviest probe."""
        return self.probe_requests(self.levels()[-1])

    def longest_request(self) -> int:
        """The most tokens (prompt + output) one request needs."""
        return max(self.probe(level).longest_request() for level in self.levels())

    def to_dict(self) -> dict:
        """The search as plain data (kind "LoadSearch"); `from_dict` reads it."""
        prompt, output = self.prompt_len, self.output_len
        return {"kind": "LoadSearch", "slos": dict(self.slos),
                self.kind: list(self.bounds),
                "prompt_len": prompt.to_dict() if isinstance(prompt, Template) else
                Workload(1, prompt, output).to_dict()["prompt_len"],
                "output_len": Workload(1, Fixed(1), output).to_dict()["output_len"],
                "requests": self.requests, "per_client": self.per_client, "seconds": self.seconds,
                "steps_per_doubling": self.steps_per_doubling, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict) -> "LoadSearch":
        """The LoadSearch a `to_dict` describes."""
        data = {k: v for k, v in data.items() if k != "kind"}
        lengths = Workload.from_dict({"num_requests": 1, "prompt_len": data.pop("prompt_len"),
                                      "output_len": data.pop("output_len"), "arrival": {"kind": "Burst"},
                                      "shared_prefix_len": 0, "num_prefixes": 1, "seed": 0})
        return cls(prompt_len=lengths.prompt_len, output_len=lengths.output_len, **data)
