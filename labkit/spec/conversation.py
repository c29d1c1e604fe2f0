"""Multi-turn chat: each session sends `turns` requests in order, every one resending the whole history (the
shared system prompt, the earlier messages and the answers the engine really gave) plus a new message, as a
chat client does. Sessions run side by side, `concurrency` at a time; a session waits `think_time_s`
between an answer and its next message.

The history of turn t is what the prefix cache can serve on turn t + 1: the answers are fed back token for
token, so the cache sees exactly what a chat deployment sends it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from labkit.errors import BadParameter
from labkit.spec.limits import (MAX_REQUESTS_PER_TRIAL, MAX_TOKENS_PER_REQUEST, MAX_TOKENS_PER_TRIAL,
                                 check_at_most)
from labkit.spec.models import FIRST_TEXT_ID
from labkit.spec.numbers import COUNT, COUNT_OR_ZERO, NON_NEGATIVE, SEED, check_numbers
from labkit.spec.texts import Vocabulary, vocabulary_size
from labkit.spec.workload import Concurrency, Fixed, FromLog, LogNormal, Request, Uniform

LENGTHS = (Fixed, Uniform, LogNormal, FromLog)


@dataclass(frozen=True)
class Conversation:
    """`sessions` chats of `turns` turns: a `system` prompt shared by every session, a new message of
    `message` tokens and an answer of `output_len` tokens per turn."""

    sessions: int
    turns: int
    system: int
    message: Fixed | Uniform | LogNormal | FromLog
    output_len: Fixed | Uniform | LogNormal | FromLog
    concurrency: int = 1  # sessions in flight
    think_time_s: float = 0.0
    seed: int = 0

    def __post_init__(self):
        check_numbers("a Conversation", {"sessions": (self.sessions, COUNT), "turns": (self.turns, COUNT),
                                         "concurrency": (self.concurrency, COUNT),
                                         "system": (self.system, COUNT_OR_ZERO),
                                         "think_time_s": (self.think_time_s, NON_NEGATIVE), "seed": (self.seed, SEED)})
        for name in ("message", "output_len"):
            if not isinstance(getattr(self, name), LENGTHS):
                raise BadParameter(f"{name} must be a length distribution such as lk.Fixed(64), got "
                                   f"{getattr(self, name)!r}")
        # sizes the lab could not hold in memory (labkit.spec.limits), before drawing any of them
        check_at_most("the conversation's turns (sessions x turns)", self.num_requests, MAX_REQUESTS_PER_TRIAL,
                      "use fewer sessions or turns")
        check_at_most("system", self.system, MAX_TOKENS_PER_REQUEST)
        prompts = self.prompt_lengths()
        _, answers = self.turn_lengths()
        check_at_most("the last turn's request (the whole history, the message and the answer)",
                      int((prompts + answers).max()), MAX_TOKENS_PER_REQUEST, "use fewer turns or shorter messages")
        check_at_most("the trial's tokens (every turn resends its history)", int(prompts.sum() + answers.sum()),
                      MAX_TOKENS_PER_TRIAL, "use fewer sessions or turns, or shorter messages")

    @property
    def num_requests(self) -> int:
        """Every turn of every session."""
        return self.sessions * self.turns

    @property
    def arrival(self):
        """The arrival process a deployment check sees: sessions in flight, as a closed loop."""
        return Concurrency(self.concurrency)

    def turn_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Each session's message and answer lengths per turn (sessions x turns), from the seed."""
        rng = np.random.default_rng(self.seed)
        shape = (self.sessions, self.turns)
        messages = self.message.sample(rng, self.num_requests).reshape(shape)
        answers = self.output_len.sample(rng, self.num_requests).reshape(shape)
        return messages, answers

    def prompt_lengths(self) -> np.ndarray:
        """The prompt of every turn (sessions x turns): the system prompt, every earlier message and answer,
        and the new message."""
        messages, answers = self.turn_lengths()
        earlier = np.cumsum(messages + answers, axis=1) - (messages + answers)
        return self.system + earlier + messages

    def longest_request(self) -> int:
        """The last turn's prompt and answer: the most tokens one request needs."""
        _, answers = self.turn_lengths()
        return int((self.prompt_lengths() + answers).max())

    def contents(self, vocab: int | Vocabulary, content_seed: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The trial's token content: the shared system prompt and every session's messages (drawn fresh per
        trial), with the answer lengths."""
        vocab_size = vocabulary_size(vocab)
        messages, answers = self.turn_lengths()
        rng = np.random.default_rng([self.seed, content_seed])
        system = rng.integers(FIRST_TEXT_ID, vocab_size, size=self.system).tolist()
        texts = np.empty(messages.shape, dtype=object)
        for s in range(self.sessions):
            for t in range(self.turns):
                texts[s, t] = rng.integers(FIRST_TEXT_ID, vocab_size, size=int(messages[s, t])).tolist()
        return system, texts, answers

    def build(self, vocab_size: int, content_seed: int) -> list[Request]:
        """Every session's first turn (what warm-up and the profiler window send): the system prompt and the
        first message; later turns depend on the answers, so only the driver composes them."""
        system, texts, answers = self.contents(vocab_size, content_seed)
        return [Request(s, system + texts[s, 0], int(answers[s, 0]), None) for s in range(self.sessions)]

    def to_dict(self) -> dict:
        """The conversation as plain data (kind "Conversation"); `from_dict` reads it."""
        def describe(obj):
            return {"kind": type(obj).__name__, **asdict(obj)}
        data = asdict(self)
        data.update(kind="Conversation", message=describe(self.message), output_len=describe(self.output_len))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Conversation":
        """The Conversation a `to_dict` describes."""
        kinds = {c.__name__: c for c in LENGTHS}

        def make(d):
            d = dict(d)
            kind = kinds[d.pop("kind")]
            return kind(tuple(d["values"])) if kind is FromLog else kind(**d)
        fields = {k: v for k, v in data.items() if k != "kind"}
        fields.update(message=make(data["message"]), output_len=make(data["output_len"]))
        return cls(**fields)

