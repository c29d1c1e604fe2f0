"""How much a long prefill stalls the streams that share its steps.

In a Mix of steady streams and long prompts injected at known times, every gap between two stream tokens
is placed on the trial's clock. A gap that ends while a long request is in prefill (from its submission to
its first token) is "inside"; the rest are "outside". The interference is TBT P99 inside against outside.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.errors import BadParameter


def prefill_windows(results, arm: str, injected: str = "long") -> pd.DataFrame:
    """One row per injected request of the arm: its trial and its prefill window on the trial's clock, from
    submission (start_s) to first token (end_s, NaN when none came)."""
    req = results.requests
    long = req[(req.arm == arm) & (req.get("part") == injected)]
    if long.empty:
        raise BadParameter(f"arm {arm!r} has no requests of part {injected!r}: measure a Mix with that part")
    return pd.DataFrame({"trial": long.trial, "start_s": long.submitted_s,
                         "end_s": [t[0] if len(t) else np.nan for t in long.token_s]}).reset_index(drop=True)


def stream_gaps(results, arm: str, streams: str = "streams", injected: str = "long") -> pd.DataFrame:
    """Every stream gap with the time it ended and whether a long prefill was running then."""
    req = results.requests
    windows = prefill_windows(results, arm, injected)
    rows = []
    for r in req[(req.arm == arm) & (req.get("part") == streams)].itertuples():
        ends = np.asarray(r.token_s[1:], float)
        gaps = np.asarray(r.itl_ms, float)
        win = windows[windows.trial == r.trial]
        inside = np.zeros(len(ends), dtype=bool)
        for w in win.itertuples():
            inside |= (ends >= w.start_s) & (ends <= w.end_s)
        rows.append(pd.DataFrame({"trial": r.trial, "end_s": ends, "gap_ms": gaps, "inside": inside}))
    if not rows:
        raise BadParameter(f"arm {arm!r} has no requests of part {streams!r}")
    return pd.concat(rows, ignore_index=True)


def interference(results, arm: str, streams: str = "streams", injected: str = "long") -> dict:
    """One arm's stream TBT P99 inside and outside long prefills, their ratio, the number of gaps in each, and
    the injected requests' median TTFT."""
    gaps = stream_gaps(results, arm, streams, injected)
    inside, outside = gaps[gaps.inside].gap_ms, gaps[~gaps.inside].gap_ms
    p99_in = float(np.percentile(inside, 99)) if len(inside) else float("nan")
    p99_out = float(np.percentile(outside, 99)) if len(outside) else float("nan")
    windows = prefill_windows(results, arm, injected)
    return {"arm": arm, "tbt_p99_inside_ms": p99_in, "tbt_p99_outside_ms": p99_out,
            "inside_over_outside": p99_in / p99_out if p99_out else float("nan"),
            "gaps_inside": int(len(inside)), "gaps_outside": int(len(outside)),
            "long_ttft_p50_ms": float(np.nanmedian((windows.end_s - windows.start_s) * 1e3))}


def interference_table(results, streams: str = "streams", injected: str = "long") -> pd.DataFrame:
    """`interference` for every complete arm, one row each."""
    return pd.DataFrame([interference(results, arm, streams, injected) for arm in results.complete_arms])


def recommend(table: pd.DataFrame) -> dict:
    """Streaming-first: the arm that keeps stream tails lowest; batch-first: the one that finishes long
    prompts' prefill fastest."""
    stream = table.sort_values("tbt_p99_inside_ms").iloc[0]
    batch = table.sort_values("long_ttft_p50_ms").iloc[0]
    return {"streaming_first": f"{stream.arm} (stream TBT P99 during long prefills {stream.tbt_p99_inside_ms:.1f} ms)",
            "batch_first": f"{batch.arm} (long-prompt TTFT P50 {batch.long_ttft_p50_ms:.0f} ms)"}
