"""Seeded workloads: prompt/output length distributions, shared prefixes and arrival processes.

Lengths and arrival times come from the workload seed, so every arm and every trial sees the same
shape of load. Token content is drawn afresh per trial (and for warm-up), so no trial is served from
the prefix cache of an earlier one; shared prefixes are shared only within a trial, on purpose.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from labkit.errors import BadParameter
from labkit.spec.limits import (MAX_REQUESTS_PER_TRIAL, MAX_TOKENS_PER_REQUEST, MAX_TOKENS_PER_TRIAL,
                                 check_at_most)
from labkit.spec.lists import as_list
from labkit.spec.models import FIRST_TEXT_ID
from labkit.spec.numbers import (COUNT, COUNT_OR_ZERO, NON_NEGATIVE, POSITIVE, SEED, check_number, check_numbers,
                                 raise_problems)
from labkit.spec.prompts import Template
from labkit.spec.texts import ChatText, Vocabulary, vocabulary_size


# ---- length distributions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Fixed:
    """One length for every request: `n` tokens."""

    n: int

    def __post_init__(self):
        check_numbers("Fixed length", {"n": (self.n, COUNT)})
        check_at_most("a Fixed length", self.n, MAX_TOKENS_PER_REQUEST)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` lengths, all `n`."""
        return np.full(count, self.n, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Lengths drawn uniformly from `low` to `high`, both included."""

    low: int
    high: int  # inclusive

    def __post_init__(self):
        check_numbers("Uniform lengths need 1 <= low <= high", {"low": (self.low, COUNT), "high": (self.high, COUNT)})
        if self.low > self.high:
            raise BadParameter(f"Uniform lengths need 1 <= low <= high, got low={self.low}, high={self.high}")
        check_at_most("a Uniform length's high", self.high, MAX_TOKENS_PER_REQUEST)

    def sample(self, rng, count):
        """`count` lengths drawn uniformly from low to high inclusive."""
        return rng.integers(self.low, self.high + 1, size=count, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Long-tailed lengths, as real chat and RAG prompts are: median and sigma of the log."""

    median: float
    sigma: float
    low: int = 1
    high: int | None = None

    def __post_init__(self):
        check_numbers("LogNormal lengths need median >= 1, sigma >= 0 and 1 <= low <= high",
                      {"median": (self.median, dict(minimum=1)), "sigma": (self.sigma, NON_NEGATIVE),
                       "low": (self.low, COUNT), "high": (self.high, dict(COUNT, allow_none=True))})
        if self.high is not None and self.high < self.low:
            raise BadParameter("LogNormal lengths need median >= 1, sigma >= 0 and 1 <= low <= high, got "
                               f"median={self.median}, sigma={self.sigma}, low={self.low}, high={self.high}")

    def sample(self, rng, count):
        """`count` lengths drawn from the log-normal, rounded and clipped to low..high."""
        raw = np.rint(rng.lognormal(np.log(self.median), self.sigma, size=count)).astype(np.int64)
        return np.clip(raw, self.low, self.high if self.high is not None else None)


@dataclass(frozen=True)
class FromLog:
    """Lengths resampled from a log of real request lengths (a list, or a file with one number per line)."""

    values: tuple[int, ...]

    def __post_init__(self):
        if isinstance(self.values, (str, Path)):
            raise BadParameter(f"FromLog takes the lengths themselves; for a file of lengths use "
                               f"FromLog.read({str(self.values)!r})")
        object.__setattr__(self, "values", tuple(as_list("FromLog values", self.values, "[120, 512, 87]")))
        if not self.values:
            raise BadParameter("FromLog needs a non-empty list of positive whole lengths")
        raise_problems("FromLog needs positive whole lengths",
                       [check_number(f"values[{i}]", v, **COUNT) for i, v in enumerate(self.values)], most=5)

    @classmethod
    def read(cls, path: str | Path) -> "FromLog":
        """A FromLog of the lengths in a file, one number per line; a value that is not a number raises BadParameter."""
        try:
            text = Path(path).read_text().split()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadParameter(f"cannot read the length log {path}: {exc}") from None
        values = [_length_text(word) for word in text]
        raise_problems(f"{path}: expected one length per line",
                       [check_number(f"entry {i}", value, **COUNT) for i, value in enumerate(values, 1)], most=5)
        return cls(tuple(values))

    def sample(self, rng, count):
        """`count` lengths drawn from the logged values, with replacement."""
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=count, replace=True)


def _length_text(word: str):
    """A logged length as a number: 30.0 is the whole length 30 as exports write it; 2.5, nan and text stay as
    they are, for the number check to refuse."""
    try:
        value = float(word)
    except ValueError:
        return word
    return int(value) if value.is_integer() else value


Lengths = Fixed | Uniform | LogNormal | FromLog


# ---- arrival processes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Burst:
    """Offline: every request submitted at once (throughput-oriented batch jobs)."""

    def offsets(self, rng, count):
        """None: every request is sent at once, on no schedule."""
        return None


@dataclass(frozen=True)
class Concurrency:
    """Closed loop: `n` requests in flight, the next sent as one finishes (a fixed pool of clients)."""

    n: int

    def __post_init__(self):
        check_numbers("Concurrency needs a positive number of clients", {"n": (self.n, COUNT)})

    def offsets(self, rng, count):
        """None: each request is sent when a client is free, on no schedule."""
        return None


@dataclass(frozen=True)
class Poisson:
    """Open loop at `rate` requests/s; burstiness < 1 makes arrivals burstier (gamma intervals)."""

    rate: float
    burstiness: float = 1.0

    def __post_init__(self):
        check_numbers("Poisson arrivals need rate > 0 and burstiness > 0",
                      {"rate": (self.rate, POSITIVE), "burstiness": (self.burstiness, POSITIVE)})

    def offsets(self, rng, count):
        """`count` send times in seconds from the trial's start: 0, then gamma-distributed gaps of mean 1 / rate."""
        gaps = rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), size=count)
        gaps[0] = 0.0
        return np.cumsum(gaps)


@dataclass(frozen=True)
class Periodic:
    """Open loop at known times: the first request at `first_s`, then one every `interval_s` (injections)."""

    first_s: float
    interval_s: float

    def __post_init__(self):
        check_numbers("Periodic arrivals need first_s >= 0 and interval_s > 0",
                      {"first_s": (self.first_s, NON_NEGATIVE), "interval_s": (self.interval_s, POSITIVE)})

    def offsets(self, rng, count):
        """`count` send times in seconds from the trial's start: first_s, then one every interval_s."""
        return self.first_s + self.interval_s * np.arange(count, dtype=float)


Arrival = Burst | Concurrency | Poisson | Periodic


# ---- the workload ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One request of a trial: its index, prompt token ids, tokens to generate and send time."""

    index: int
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float | None  # offset from trial start; None for burst and closed-loop loads


@dataclass(frozen=True)
class Workload:
    """A seeded load: the number of requests, their prompt and output length distributions, the arrival
    process and the shared prefixes."""

    num_requests: int
    prompt_len: Lengths | Template | ChatText  # tokens after the shared prefix, a template of segments, or words
    output_len: Lengths  # generated tokens (exact: EOS is ignored)
    arrival: Arrival = field(default_factory=Burst)
    shared_prefix_len: int = 0
    num_prefixes: int = 1  # distinct shared prefixes, assigned round-robin
    seed: int = 0

    def __post_init__(self):
        check_numbers("Workload", {"num_requests": (self.num_requests, COUNT),
                                   "shared_prefix_len": (self.shared_prefix_len, COUNT_OR_ZERO),
                                   "num_prefixes": (self.num_prefixes, COUNT), "seed": (self.seed, SEED)})
        for name, kinds in (("prompt_len", (Fixed, Uniform, LogNormal, FromLog, Template, ChatText)),
                            ("output_len", (Fixed, Uniform, LogNormal, FromLog))):
            if not isinstance(getattr(self, name), kinds):
                raise BadParameter(f"{name} must be one of {[k.__name__ for k in kinds]}, such as lk.Fixed(128); "
                                   f"got {getattr(self, name)!r}")
        if not isinstance(self.arrival, (Burst, Concurrency, Poisson, Periodic)):
            raise BadParameter(f"arrival must be Burst(), Concurrency(n), Poisson(rate) or Periodic(first_s, "
                               f"interval_s); got {self.arrival!r}")
        if isinstance(self.prompt_len, Template) and (self.shared_prefix_len or self.num_prefixes != 1):
            raise BadParameter("a Template names its shared segments itself: leave shared_prefix_len and num_prefixes "
                               "out, and give the shared part as Segment(name, tokens, 'shared', variants=N)")
        if isinstance(self.prompt_len, ChatText) and (self.shared_prefix_len or self.num_prefixes != 1):
            raise BadParameter("requests written in words (ChatText) share only their chat template's start: leave "
                               "shared_prefix_len and num_prefixes out")
        self._check_size()

    def _check_size(self) -> None:
        """Refuse a load the lab could not hold in memory (labkit.spec.limits), before drawing any of it."""
        check_at_most("num_requests", self.num_requests, MAX_REQUESTS_PER_TRIAL, "measure fewer requests per trial")
        check_at_most("shared_prefix_len", self.shared_prefix_len, MAX_TOKENS_PER_REQUEST)
        check_at_most("the shared prefixes' tokens (num_prefixes x shared_prefix_len)",
                      self.num_prefixes * self.shared_prefix_len, MAX_TOKENS_PER_TRIAL, "use fewer or shorter prefixes")
        if isinstance(self.prompt_len, Template):
            check_at_most("the template's shared versions (tokens x variants)", self.prompt_len.shared_tokens,
                          MAX_TOKENS_PER_TRIAL, "use fewer or shorter variants")
        prompt, output, _ = self.lengths()
        longest = int((prompt + output).max())
        check_at_most("the longest request (prompt + output tokens)", longest, MAX_TOKENS_PER_REQUEST,
                      "bound the lengths (LogNormal's high)")
        check_at_most("the trial's tokens (every prompt and output)", int(prompt.sum() + output.sum()),
                      MAX_TOKENS_PER_TRIAL, "use fewer requests or shorter lengths")

    def lengths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Every request's prompt length (shared prefix included) and output length, and the send offsets (None
        when the arrival process has no schedule), all drawn from the workload's seed."""
        rng = np.random.default_rng(self.seed)
        prompt = self.prompt_len.sample(rng, self.num_requests) + self.shared_prefix_len
        output = self.output_len.sample(rng, self.num_requests)
        return prompt, output, self.arrival.offsets(rng, self.num_requests)

    @classmethod
    def closed_loop(cls, requests: int, prompt_len: int, output_len: int, clients: int) -> "Workload":
        """Fixed lengths, `clients` requests in flight: the lab's most common load."""
        return cls(requests, Fixed(prompt_len), Fixed(output_len), Concurrency(clients))

    def longest_request(self) -> int:
        """The most tokens (prompt + output) one request needs."""
        prompt, output, _ = self.lengths()
        return int((prompt + output).max())

    def build(self, vocab: int | Vocabulary, content_seed: int) -> list[Request]:
        """The requests of one trial; `content_seed` draws fresh content, lengths stay fixed (a ChatText's prompts
        are as long as the model's tokenizer makes them). `vocab`: a number of token ids, or a Vocabulary."""
        vocab_size = vocabulary_size(vocab)
        if vocab_size <= FIRST_TEXT_ID + 1:
            raise BadParameter(f"vocab_size {vocab_size} is too small to draw prompts from")
        prompt, output, arrivals = self.lengths()
        rng = np.random.default_rng([self.seed, content_seed])
        if isinstance(self.prompt_len, (Template, ChatText)):
            prompts = (self.prompt_len.compose(self.num_requests, rng, FIRST_TEXT_ID, vocab_size)
                       if isinstance(self.prompt_len, Template) else self.prompt_len.compose(self.num_requests, rng, vocab))
            return [Request(i, tokens, int(output[i]), None if arrivals is None else float(arrivals[i]))
                    for i, tokens in enumerate(prompts)]
        prefixes = rng.integers(FIRST_TEXT_ID, vocab_size, size=(self.num_prefixes, self.shared_prefix_len))
        requests = []
        for i in range(self.num_requests):
            suffix = rng.integers(FIRST_TEXT_ID, vocab_size, size=int(prompt[i]) - self.shared_prefix_len)
            tokens = np.concatenate([prefixes[i % self.num_prefixes], suffix]).tolist()
            requests.append(Request(i, tokens, int(output[i]),
                                    None if arrivals is None else float(arrivals[i])))
        return requests

    def to_dict(self) -> dict:
        """The workload as plain data, each distribution and arrival process with its kind; `from_dict` reads it."""
        def describe(obj):
            return obj.to_dict() if isinstance(obj, (Template, ChatText)) else {"kind": type(obj).__name__, **asdict(obj)}
        return {"num_requests": self.num_requests, "prompt_len": describe(self.prompt_len),
                "output_len": describe(self.output_len), "arrival": describe(self.arrival),
                "shared_prefix_len": self.shared_prefix_len, "num_prefixes": self.num_prefixes,
                "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict) -> "Workload":
        """The Workload, the Mix or the Conversation that a `to_dict` describes."""
        if data.get("kind") == "Conversation":
            from labkit.spec.conversation import Conversation  # it builds on this module
            return Conversation.from_dict(data)
        if data.get("kind") == "Mix":
            return Mix({name: cls.from_dict(part) for name, part in data["parts"].items()})
        kinds = {c.__name__: c for c in (Fixed, Uniform, LogNormal, FromLog, Burst, Concurrency, Poisson, Periodic)}

        def make(d):
            if d.get("kind") in ("Template", "ChatText"):
                return (Template if d["kind"] == "Template" else ChatText).from_dict(d)
            d = dict(d)
            kind = kinds[d.pop("kind")]
            if kind is FromLog:
                d["values"] = tuple(d["values"])
            return kind(**d)
        return cls(data["num_requests"], make(data["prompt_len"]), make(data["output_len"]),
                   make(data["arrival"]), data["shared_prefix_len"], data["num_prefixes"], data["seed"])


@dataclass(frozen=True)
class Mix:
    """Several workloads sent at once on one clock, e.g. steady streams plus long prompts injected at known
    times; each request row says which part it came from."""

    parts: dict[str, Workload]

    def __post_init__(self):
        if not self.parts or not all(isinstance(w, Workload) for w in self.parts.values()):
            raise BadParameter("Mix needs a non-empty dict of named Workloads")

    @property
    def num_requests(self) -> int:
        """The requests of every part together."""
        return sum(w.num_requests for w in self.parts.values())

    def longest_request(self) -> int:
        """The most tokens (prompt + output) one request of any part needs."""
        return max(w.longest_request() for w in self.parts.values())

    def to_dict(self) -> dict:
        """The mix as plain data: kind "Mix" and each part's `to_dict`."""
        return {"kind": "Mix", "parts": {name: w.to_dict() for name, w in self.parts.items()}}
