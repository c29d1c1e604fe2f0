"""The largest loads the lab builds: every request's token ids are drawn and held in memory before a trial
starts, so a size past these would exhaust the host's memory (or take hours) before failing. Far above any
real deployment's request (vLLM's longest context windows are ~2^20 tokens) and any useful trial."""
from __future__ import annotations

from labkit.errors import BadParameter

MAX_TOKENS_PER_REQUEST = 2 ** 24  # one prompt plus its output
MAX_REQUESTS_PER_TRIAL = 2 ** 20  # requests (or conversation turns) of one trial, warm-up and profiler windows
MAX_TOKENS_PER_TRIAL = 2 ** 27  # prompt and output tokens of one trial together, shared variants included


def check_at_most(what: str, value: int, limit: int, fix: str = "") -> None:
    """BadParameter when `value` exceeds `limit`, naming both and the lab's reason."""
    if value > limit:
        raise BadParameter(f"{what} is {value:,}, above the lab's limit of {limit:,} (2^{limit.bit_length() - 1}): "
                           "the lab draws every token of a trial in memory first"
                           + (f"; {fix}" if fix else ""))
