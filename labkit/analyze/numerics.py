"""How far one launch's greedy answers agree with a reference launch's on the same prompts: the numerics of fp8
weights or an fp8 KV cache against bf16 on real weights (pure: answers in, a table out).

An answer is {"ids": [the greedy token ids], "logprobs": [the chosen token's log-probability at each step] or
None}. Greedy answers part for good at the first differing token (each later token is conditioned on a
different text), so the leading agreement is the measure; the log-probabilities are compared only over that
common prefix, where both launches chose the same token after the same text.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from labkit.errors import BadParameter

COLUMNS = ["launch", "prompts", "tokens", "mean_leading_agreement", "identical_share", "position_agreement",
           "mean_abs_dlogprob", "compared_logprobs", "word", "cause"]


def leading(first: list[int], second: list[int]) -> int:
    """How many leading tokens two answers share."""
    same = 0
    for x, y in zip(first, second):
        if x != y:
            break
        same += 1
    return same


def compare(reference: list[dict], other: list[dict]) -> dict:
    """One launch's answers against the reference's, prompt by prompt (the same prompts, in the same order):
    prompts; tokens (N, the longest reference answer); mean leading agreement (tokens until the first differing
    token); the share of prompts whose answers are identical over all their tokens; the share of compared
    positions that agree (a position one answer has and the other lacks counts as differing); the mean
    |delta log-probability| of the chosen tokens over the common prefix (NaN where no log-probabilities or no
    common token) and how many positions it is over."""
    if len(reference) != len(other):
        raise BadParameter(f"the answers are to different prompt sets: {len(reference)} reference answers, "
                           f"{len(other)} to compare")
    leads, identical, agree, compared, deltas = [], 0, 0, 0, []
    for ref, got in zip(reference, other):
        a, b = list(ref.get("ids") or []), list(got.get("ids") or [])
        lead = leading(a, b)
        leads.append(lead)
        identical += a == b
        agree += sum(x == y for x, y in zip(a, b))
        compared += max(len(a), len(b))
        ref_lp, got_lp = ref.get("logprobs"), got.get("logprobs")
        if ref_lp is not None and got_lp is not None:
            deltas += [abs(x - y) for x, y in zip(ref_lp[:lead], got_lp[:lead])]
    n = len(reference)
    return {"prompts": n, "tokens": max((len(r.get("ids") or []) for r in reference), default=0),
            "mean_leading_agreement": sum(leads) / n if n else math.nan,
            "identical_share": identical / n if n else math.nan,
            "position_agreement": agree / compared if compared else math.nan,
            "mean_abs_dlogprob": sum(deltas) / len(deltas) if deltas else math.nan,
            "compared_logprobs": len(deltas)}


def agreement_word(row: dict) -> str:
    """The comparison in words: identical, where it parts, or why there is nothing to compare."""
    if not row["prompts"]:
        return "no prompts to compare"
    if row["tokens"] == 0:
        return "no tokens to compare (empty answers)"
    if row["identical_share"] == 1:
        return "identical"
    if row["mean_leading_agreement"] == 0:
        return "differs from the first token"
    identical = round(row["identical_share"] * row["prompts"])
    return (f"agrees for {row['mean_leading_agreement']:.1f} of {row['tokens']} tokens on average "
            f"({identical} of {row['prompts']} prompts identical)")


def numerics_table(runs: dict[str, dict], reference: str) -> pd.DataFrame:
    """One row per launch other than `reference`: its answers compared with the reference's (compare's
    columns), a plain word, and the cause where a launch (or the reference) did not run. `runs` maps a launch
    name to {"answers": [answer per prompt]} or {"cause": why it did not run}."""
    if reference not in runs:
        raise BadParameter(f"the reference launch {reference!r} is not among the launches {sorted(runs)}")
    ref = runs[reference]
    rows = []
    for name, run in runs.items():
        if name == reference:
            continue
        row = {"launch": name, "prompts": 0, "tokens": 0, "mean_leading_agreement": math.nan,
               "identical_share": math.nan, "position_agreement": math.nan, "mean_abs_dlogprob": math.nan,
               "compared_logprobs": 0, "cause": ""}
        if ref.get("cause") is not None or ref.get("answers") is None:
            row["cause"] = f"the reference {reference!r} did not run: {ref.get('cause') or 'no answers'}"
            row["word"] = "not compared"
        elif run.get("cause") is not None or run.get("answers") is None:
            row["cause"] = run.get("cause") or "no answers"
            row["word"] = "did not run"
        else:
            row.update(compare(ref["answers"], run["answers"]))
            row["word"] = agreement_word(row)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def agreement_phrase(entry: dict, launch: str) -> str | None:
    """A stored measurement's agreement for one launch, as a diagnosis cites it: 'greedy tokens agreed for 31.5
    of 32 on average on smollm2-135m (7 prompts; measured on h100-80gb-hbm3, 2026-11-20)', or None where the
    entry holds no compared row for that launch. `entry` is one model's record of a numerics file: {"model",
    "hardware", "measured_utc", "rows": [numerics_table rows]}."""
    row = next((r for r in entry.get("rows", []) if r.get("launch") == launch), None)
    if not row or not row.get("prompts") or row.get("cause") or row.get("tokens") in (None, 0):
        return None
    lead = row.get("mean_leading_agreement")
    if lead is None or (isinstance(lead, float) and math.isnan(lead)):
        return None
    dlp = row.get("mean_abs_dlogprob")
    logprob = (f", mean |delta logprob| {dlp:.3f}" if isinstance(dlp, (int, float)) and not math.isnan(dlp) else "")
    when = str(entry.get("measured_utc", ""))[:10]
    return (f"greedy tokens agreed for {lead:.1f} of {row['tokens']} on average on {entry.get('model', '?')} "
            f"({row['prompts']} prompts{logprob}; measured on {entry.get('hardware', '?')}"
            + (f", {when}" if when else "") + ")")


def read_numerics_file(path: Path) -> dict:
    """A hardware's stored numerics (model -> entry), {} where there is none or it cannot be read."""
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return kept if isinstance(kept, dict) else {}


def pick_entry(kept: dict, model: str | None = None) -> dict | None:
    """The entry measured on `model`, else the newest one (it names its own model), else None."""
    entries = [e for e in kept.values() if isinstance(e, dict) and e.get("rows")]
    if not entries:
        return None
    same = [e for e in entries if model is not None and e.get("model") == model]
    return max(same or entries, key=lambda e: str(e.get("measured_utc", "")))
