"""Prompts built from segments, in a chosen order: what a business can change about its requests without
touching the engine. A segment is shared by every request (a system prompt, a tool schema, a document:
one of `variants` versions, assigned round-robin) or unique to each request (the user's question).

vLLM's prefix cache reuses the KV blocks of a prompt's leading tokens only: the same segments cost a full
prefill when a unique one comes first, and almost none when every shared one comes before it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from labkit.errors import BadParameter
from labkit.spec.numbers import COUNT, check_numbers
from labkit.spec.lists import as_list

SCOPES = ("shared", "unique")


@dataclass(frozen=True)
class Segment:
    """One part of every prompt: `tokens` long, `shared` by every request (one of `variants` versions) or
    `unique` to each."""

    name: str
    tokens: int
    scope: str = "unique"
    variants: int = 1  # distinct versions of a shared segment (several documents): the cache's working set

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise BadParameter(f"a segment needs a name, got {self.name!r}")
        if self.scope not in SCOPES:
            raise BadParameter(f"segment {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")
        check_numbers(f"segment {self.name!r}", {"tokens": (self.tokens, COUNT), "variants": (self.variants, COUNT)})
        if self.scope == "unique" and self.variants != 1:
            raise BadParameter(f"segment {self.name!r}: variants apply to shared segments only")


@dataclass(frozen=True)
class Template:
    """A prompt's segments in order. As a workload's `prompt_len` it fixes every prompt's length and content:
    shared segments are drawn once per trial (fresh each trial, so no trial is served from another's cache)."""

    segments: tuple[Segment, ...]

    def __post_init__(self):
        segments = tuple(as_list("a Template's segments", self.segments,
                                 "[Segment('system', 1024, 'shared'), Segment('question', 64)]")) \
            if not isinstance(self.segments, Segment) else None
        if not segments or not all(isinstance(s, Segment) for s in segments):
            raise BadParameter("a Template needs a non-empty list of Segments, such as "
                               "[Segment('system', 1024, 'shared'), Segment('question', 64)]")
        names = [s.name for s in segments]
        if len(set(names)) != len(names):
            raise BadParameter(f"segment names must differ, got {names}")
        object.__setattr__(self, "segments", segments)

    @property
    def shared_tokens(self) -> int:
        """The tokens of every version of every shared segment: what a trial draws once and holds."""
        return sum(s.tokens * s.variants for s in self.segments if s.scope == "shared")

    @property
    def tokens(self) -> int:
        """Every prompt's length: the segments' tokens together."""
        return sum(s.tokens for s in self.segments)

    @property
    def shared_first_tokens(self) -> int:
        """The tokens before the first unique segment: what the prefix cache can serve from a second request on."""
        total = 0
        for segment in self.segments:
            if segment.scope == "unique":
                break
            total += segment.tokens
        return total

    def reordered(self, *names: str) -> "Template":
        """The same segments in the order named (every segment once)."""
        by_name = {s.name: s for s in self.segments}
        if sorted(names) != sorted(by_name):
            raise BadParameter(f"name every segment once to reorder, got {list(names)} for {list(by_name)}")
        return Template(tuple(by_name[n] for n in names))

    def sample(self, rng, count: int) -> np.ndarray:
        """`count` prompt lengths, all the template's (it draws nothing, so it fits the Lengths protocol)."""
        return np.full(count, self.tokens, dtype=np.int64)

    def compose(self, count: int, rng: np.random.Generator, low: int, high: int) -> list[list[int]]:
        """The prompts of `count` requests: each shared segment's version (request index modulo its variants)
        drawn once, each unique segment fresh per request, token ids in [low, high)."""
        versions = {s.name: rng.integers(low, high, size=(s.variants, s.tokens))
                    for s in self.segments if s.scope == "shared"}
        prompts = []
        for i in range(count):
            parts = [versions[s.name][i % s.variants] if s.scope == "shared" else rng.integers(low, high, size=s.tokens)
                     for s in self.segments]
            prompts.append(np.concatenate(parts).tolist())
        return prompts

    def to_dict(self) -> dict:
        """The template as plain data (kind "Template" and its segments); `from_dict` reads it."""
        return {"kind": "Template", "segments": [asdict(s) for s in self.segments]}

    @classmethod
    def from_dict(cls, data: dict) -> "Template":
        """The Template a `to_dict` describes."""
        return cls(tuple(Segment(**s) for s in data["segments"]))
