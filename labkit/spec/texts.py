"""Requests written in words, for a model whose output content matters (real weights): each request is one user
message, rendered through the model's own chat template and tokenized in the arm's worker.

Random token ids are enough where only shapes count. Speculative decoding by prompt lookup is not such a case:
its drafts are n-grams of the request's own prompt, so what it saves depends on how much of the answer repeats
the prompt. The tasks span that range: `copy` (repeat a passage), `edit` (return a passage with its misspellings
fixed: mostly a copy), `quote` (answer with sentences of a document) and `open` (write something new).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from labkit.errors import BadParameter, close_match

# Written for the lab (no third party's text). About 100 words each: a copy fits a few hundred output tokens.
PASSAGES = (
    "The harbour wakes before the town does. At five the first boats slide out past the breakwater, their "
    "engines low, their lights still on. Gulls follow them as far as the buoy and then turn back, because the "
    "real feast comes later, when the catch is sorted on the quay. By seven the cafe on the corner has its "
    "shutters up and its chairs out, and the men who mend nets sit with their coffee and argue about the "
    "weather. Nobody agrees, and nobody needs to: the sea will decide, as it always has.",
    "A good recipe for bread needs only four things: flour, water, salt and time. Mix the flour and water and "
    "leave them for half an hour, so the flour can drink. Add the salt and the yeast, then fold the dough every "
    "thirty minutes for two hours. Shape it gently, keeping the air inside, and let it rise again in a cool "
    "place overnight. In the morning, bake it in a very hot oven with a lid for the first twenty minutes. The "
    "crust will crackle as it cools, which is the sound of a loaf done well.",
    "The library kept its oldest maps in a room without windows. Each map lay flat in a wide drawer, under a "
    "sheet of paper that was changed every spring. Visitors had to wear cotton gloves and speak quietly, not "
    "because the maps could hear but because the keeper could. She had worked there for thirty years and knew "
    "every coastline by heart, including the ones that were wrong. Her favourite showed an island that never "
    "existed, drawn with great care, with rivers, towns and a lighthouse on its northern cape.",
    "To replace a bicycle chain, first shift to the smallest gears so the chain is slack. Find the quick link, "
    "squeeze it with pliers and pull the chain off the bike. Count the links of the old chain, because the new "
    "one must be the same length; cut it with a chain tool if it is longer. Thread the new chain through the "
    "rear derailleur and around both gears, join the ends with a new quick link and pull the pedals hard to "
    "seat it. Finally, shift through every gear and listen for noise before your first ride.",
    "Every autumn the village held a market for apples. Farmers came from the valleys with carts full of fruit "
    "whose names sounded like people: Annie, Pearmain, Russet, Bramley. Children were allowed to taste one "
    "slice of each, and many of them took the job very seriously, with notebooks and a scoring system. The "
    "winner was announced at noon from the steps of the town hall. The prize was a small silver spoon and the "
    "right to choose the apple for next year's pie, which was baked in a single enormous dish.",
    "The night train left the capital at ten and reached the mountains by dawn. Its cabins were narrow, with "
    "two beds that folded against the wall, a small sink and a window that did not open. A steward came by "
    "at eleven with tea and a list of the stations, written by hand. Most passengers slept through the long "
    "climb, but a few stayed in the corridor to watch the lights of the valley towns fall away below them. "
    "At six the steward knocked again, this time with bread, butter and the news that it had snowed.",
    "Our team ships a new release every second Tuesday. On the Friday before, we freeze the main branch and "
    "run the full test suite on every supported machine. Any failure blocks the release until someone owns "
    "it, writes down the cause and either fixes it or reverts the change that caused it. On Monday we write "
    "the release notes in plain words: what changed, what might break and what users should do. On Tuesday "
    "morning one person tags the release, and everyone else watches the dashboards for an hour.",
    "The old lighthouse keeper kept a log of every ship that passed. He wrote the time, the direction, the "
    "weather and, when he could read it, the ship's name. Some nights there were none; on others there were "
    "dozens, and he filled three pages by candlelight. After he retired, the logs were found in a trunk in the "
    "cellar, forty years of them, tied with string. Historians used them to learn how trade along the coast "
    "rose and fell, and one of them wrote a whole book about a single winter of storms.",
)
TOPICS = ("a robot that learns to paint", "a city where it never stops raining", "the last day of summer camp",
          "a cat that runs a small hotel", "two rivals stuck in a lift", "a message found in a bottle",
          "a gardener who grows impossible flowers", "a chess game that lasts a hundred years")

TASKS = {
    "copy": "Repeat the following text exactly as it is written, with no comment before or after it.\n\n{passage}",
    "edit": "Fix the spelling mistakes in the following text and return the whole corrected text, with no "
            "comment.\n\n{passage}",
    "quote": "Here is a document.\n\n{passage}\n\nQuote, word for word, the two sentences of the document that best "
             "show what it is about.",
    "open": "Write a short original story about {topic}.",
}
COPYING_TASKS = ("copy", "edit", "quote")  # answers that repeat the prompt: where prompt lookup can draft
# Tokens a chat template may add around a message (system prompt, role markers): an allowance for the length bound.
TEMPLATE_TOKENS = 128


@dataclass(frozen=True)
class Vocabulary:
    """What a trial's prompts are drawn from: the token ids below `size`, and, for requests written in words,
    `chat`, which turns a user message into the prompt's token ids with the model's chat template."""

    size: int
    chat: Callable[[str], list[int]] | None = None


def vocabulary_size(vocab: int | Vocabulary) -> int:
    """The number of token ids, from a Vocabulary or a plain count."""
    return vocab.size if isinstance(vocab, Vocabulary) else int(vocab)


def written_in_words(spec) -> bool:
    """Whether a load's plain-data form (a Workload, a Mix, a load search) has a ChatText anywhere in it."""
    if isinstance(spec, dict):
        return spec.get("kind") == "ChatText" or any(written_in_words(v) for v in spec.values())
    return isinstance(spec, list) and any(written_in_words(v) for v in spec)


def vocabulary(size: int, model: str, workloads: dict) -> Vocabulary:
    """An arm's Vocabulary: the model's chat tokenizer is loaded only where a load is written in words."""
    return Vocabulary(size, chat_tokenizer(model) if any(map(written_in_words, workloads.values())) else None)


def chat_tokenizer(model: str) -> Callable[[str], list[int]]:
    """A user message -> the token ids a chat client sends for it: the model's chat template with the assistant's
    turn opened. Raises BadParameter when the model's tokenizer has no chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if not getattr(tokenizer, "chat_template", None):
        raise BadParameter(f"the tokenizer of {model} has no chat template: requests written in words (ChatText) "
                           "need a model with one, such as smollm2-135m")

    def chat(message: str) -> list[int]:
        # rendered as text, then tokenized without adding special tokens again: the same on transformers 4 and 5
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return chat


def _misspelled(passage: str, rng: np.random.Generator, share: float = 0.08) -> str:
    """The passage with letters swapped inside about `share` of its longer words: what the `edit` task fixes."""
    words = passage.split(" ")
    for i in np.flatnonzero(rng.random(len(words)) < share):
        word = words[i]
        if len(word) >= 5 and word.isalpha():
            j = int(rng.integers(1, len(word) - 2))
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2:]
    return " ".join(words)


@dataclass(frozen=True)
class ChatText:
    """Requests written in words, as a workload's `prompt_len`: each request one user message of the `task`
    (copy, edit, quote or open), on a passage (or, for `open`, a topic) drawn per trial. Each message opens
    with its own request number, so no request is served from another's prefix cache beyond the template's
    shared start. Prompt lengths are the model tokenizer's; the workload's length checks use a bound."""

    task: str = "copy"

    def __post_init__(self):
        if self.task not in TASKS:
            raise BadParameter(f"ChatText task {self.task!r} is not one of {', '.join(TASKS)}"
                               f"{close_match(self.task, TASKS)}")

    @property
    def copying(self) -> bool:
        """Whether the answer repeats the prompt (where prompt lookup can draft)."""
        return self.task in COPYING_TASKS

    def messages(self, count: int, rng: np.random.Generator) -> list[str]:
        """The user messages of `count` requests, drawn from `rng`."""
        out = []
        for i in range(count):
            number = f"Request {int(rng.integers(10_000, 100_000))}-{i}.\n"
            if self.task == "open":
                out.append(number + TASKS["open"].format(topic=TOPICS[int(rng.integers(len(TOPICS)))]))
                continue
            passage = PASSAGES[int(rng.integers(len(PASSAGES)))]
            if self.task == "edit":
                passage = _misspelled(passage, rng)
            out.append(number + TASKS[self.task].format(passage=passage))
        return out

    def bound(self) -> int:
        """At most this many prompt tokens: every token of a byte-level tokenizer covers at least one byte."""
        longest = max(len(text.encode()) for text in (*PASSAGES, *TOPICS))
        return longest + max(len(t.encode()) for t in TASKS.values()) + 32 + TEMPLATE_TOKENS

    def sample(self, rng, count: int) -> np.ndarray:
        """`count` prompt lengths, each the bound (the real ones are known once the worker tokenizes)."""
        return np.full(count, self.bound(), dtype=np.int64)

    def compose(self, count: int, rng: np.random.Generator, vocab: Vocabulary) -> list[list[int]]:
        """The prompts' token ids, tokenized with the model's chat template."""
        if not isinstance(vocab, Vocabulary) or vocab.chat is None:
            raise BadParameter("requests written in words (ChatText) need the model's tokenizer: run them in an "
                               "arm's worker, which loads it")
        return [vocab.chat(message) for message in self.messages(count, rng)]

    def to_dict(self) -> dict:
        """The prompt kind as plain data; `from_dict` reads it."""
        return {"kind": "ChatText", "task": self.task}

    @classmethod
    def from_dict(cls, data: dict) -> "ChatText":
        """The ChatText a `to_dict` describes."""
        return cls(data["task"])
