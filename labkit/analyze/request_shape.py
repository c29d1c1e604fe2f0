"""The business side's own levers, measured: what a shorter prompt or a tighter output cap buys on this
hardware. Prefill is compute-bound, so TTFT grows with the prompt at a cost per token that the hardware's
FLOP/s bounds from below; every output token costs about one TPOT, so E2E grows with max_tokens.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analyze.roofline import Peaks, prefill_floor_s
from labkit.errors import BadParameter
from labkit.spec.models import ModelShape
from labkit.spec.numbers import COUNT, check_number, raise_problems


def per_token_cost(table: pd.DataFrame, x: str, y: str) -> tuple[float, float]:
    """The least-squares line through the measured points of `y` against `x` (from `stats.by_load`):
    (cost per unit of x, fixed part)."""
    if len(table) < 2 or table[x].nunique() < 2:
        raise BadParameter(f"a cost per token needs {y} at two or more values of {x}, got {len(table)}")
    slope, intercept = np.polyfit(table[x].to_numpy(float), table[y].to_numpy(float), 1)
    return float(slope), float(intercept)


def prefill_floors_ms(shape: ModelShape, peaks: Peaks, prompt_tokens) -> pd.Series:
    """The TTFT floor of each prompt length: its prefill at peak FLOP/s (or its weight read, if longer)."""
    return pd.Series([1e3 * prefill_floor_s(shape, peaks, n) for n in prompt_tokens], dtype=float)


def fastest_ms(results, arm: str, column: str) -> pd.Series:
    """Each load's fastest request of one arm, by a per-request time (`ttft_ms`, `e2e_ms`): the request outside load
    on a busy machine delayed least, so the order of two loads' fastest holds where a disturbed trial turns their
    medians over."""
    requests = results.requests
    return requests[requests.arm == arm].groupby("load")[column].min()


def cut_table(table: pd.DataFrame, current_prompt: int, cuts: list[int]) -> pd.DataFrame:
    """"Cut the prompt by N tokens" in milliseconds and requests per second, read off the measured prompt
    sweep (TTFT P50 and request/s against prompt_tokens, interpolated between measured lengths): one row
    per cut, from `current_prompt` tokens."""
    raise_problems("cut_table", [check_number("current_prompt", current_prompt, **COUNT)]
                   + [check_number(f"cut {cut!r}", cut, **COUNT) for cut in cuts])
    lengths = table.prompt_tokens.to_numpy(float)
    if not (lengths.min() <= current_prompt - max(cuts) and current_prompt <= lengths.max()):
        raise BadParameter(f"the sweep measured prompts of {lengths.min():.0f}..{lengths.max():.0f} tokens; cutting "
                           f"{max(cuts)} from {current_prompt} needs both ends inside it")
    order = np.argsort(lengths)

    def at(column: str, n: float) -> float:
        return float(np.interp(n, lengths[order], table[column].to_numpy(float)[order]))

    rows = []
    for cut in cuts:
        shorter = current_prompt - cut
        rows.append({"cut_tokens": cut, "prompt_tokens": shorter,
                     "ttft_p50_ms": at("ttft_p50_ms", shorter),
                     "ttft_saved_ms": at("ttft_p50_ms", current_prompt) - at("ttft_p50_ms", shorter),
                     "request_s": at("request_s", shorter),
                     "request_s_gain_pct": 100 * (at("request_s", shorter) / at("request_s", current_prompt) - 1)})
    return pd.DataFrame(rows)
