"""The two-level bootstrap of a percentile of many values, drawing only the values near the percentile.

A replicate of P99 TBT over tens of thousands of token gaps used to draw, gather and partition every value:
about a millisecond each, so thousands of replicates per comparison made an H200 notebook's record take 17 s
and the explorer's tables wait as long. Only the values near the percentile can decide it. So each trial's
values are split by two thresholds `a <= b` around the pooled percentile into below / inside / above. For
each trial a replicate draws, the counts falling in the three parts come from one multinomial draw (that is
exactly how many of its resampled values would fall there), and only the values inside are drawn one by
one. When the percentile's order statistics of the replicate lie inside (nearly always: the window is wide
against the percentile's sampling spread and the trials' differences), they are read from those draws.
Otherwise the replicate's below and above values are drawn too and its percentile computed in full. Every
replicate has the distribution of the plain two-level draw; none is approximated.
"""
from __future__ import annotations

import numpy as np

# margin of the window, in standard deviations of the percentile's position in the smallest trial
MARGIN_SD = 8.0
# a window holding more than this share of the values would save little over drawing them all
MAX_INSIDE_SHARE = 0.25
BLOCK_DRAWS = 2_000_000  # inside values drawn per block of replicates


def windowed_replicates(data: list[np.ndarray], percentile: float, n_boot: int, rng) -> np.ndarray | None:
    """`n_boot` replicates of the `percentile` (0-100, numpy's linear method) of the pooled two-level resample
    of `data` (trials drawn with replacement, then each drawn trial's values); None when the window would hold
    too much of the values to save time (the caller draws every value instead)."""
    p = percentile / 100.0
    lengths = np.array([len(g) for g in data])
    pooled = np.sort(np.concatenate(data))
    n = len(pooled)
    # the trials' own percentiles, as positions in the pooled distribution: a replicate that draws one trial
    # several times moves its percentile towards that trial's
    own = np.array([np.searchsorted(pooled, np.percentile(g, percentile)) / n for g in data])
    sd = np.sqrt(max(p * (1 - p), 1.0 / lengths.min()) / lengths.min())
    low_q = max(0.0, min(own.min(), p) - MARGIN_SD * sd)
    high_q = min(1.0, max(own.max(), p) + MARGIN_SD * sd)
    if high_q - low_q > MAX_INSIDE_SHARE:
        return None
    a, b = pooled[int(low_q * (n - 1))], pooled[int(np.ceil(high_q * (n - 1)))]
    parts = [(np.sort(g[g < a]), np.sort(g[(g >= a) & (g <= b)]), np.sort(g[g > b])) for g in data]
    shares = np.array([[len(x) for x in trial] for trial in parts], float) / lengths[:, None]
    inside = [trial[1] for trial in parts]
    inside_len = np.array([len(x) for x in inside])
    inside_start = np.concatenate([[0], np.cumsum(inside_len)[:-1]])
    inside_flat = np.concatenate(inside)
    # each inside value's rank among all of them: a replicate's order statistics are found by sorting ranks
    window = np.sort(inside_flat)
    inside_rank = np.searchsorted(window, inside_flat)  # ties share the lowest rank: the value is the same
    width = len(window)

    out = np.empty(n_boot)
    per_replicate = max(1, int(inside_len.mean() * len(data)))
    block = max(1, BLOCK_DRAWS // per_replicate)
    for start in range(0, n_boot, block):
        count = min(block, n_boot - start)
        chosen = (rng.integers(0, len(data), size=(count, len(data))) if len(data) > 1
                  else np.zeros((count, 1), dtype=int))
        counts = rng.multinomial(lengths[chosen], shares[chosen])  # (count, trials, below/inside/above)
        below = counts[..., 0].sum(axis=1)
        drawn_inside = counts[..., 1]
        size = lengths[chosen].sum(axis=1)
        position = (size - 1) * p
        k_low = np.floor(position).astype(np.int64)
        k_high = np.minimum(k_low + 1, size - 1)
        # the inside draws of every replicate of the block, as ranks, sorted within each replicate
        trial_of = np.repeat(chosen.ravel(), drawn_inside.ravel())
        picked = inside_start[trial_of] + (rng.random(len(trial_of)) * inside_len[trial_of]).astype(np.int64)
        per_row = drawn_inside.sum(axis=1)
        row = np.repeat(np.arange(count), per_row)
        keys = np.sort(row * width + inside_rank[picked])
        row_start = np.concatenate([[0], np.cumsum(per_row)[:-1]])
        fits = (below <= k_low) & (k_high < below + per_row)
        r = np.flatnonzero(fits)
        v_low = window[keys[row_start[r] + k_low[r] - below[r]] - r * width]
        v_high = window[keys[row_start[r] + k_high[r] - below[r]] - r * width]
        out[start + r] = v_low + (position[r] - k_low[r]) * (v_high - v_low)
        for r in np.flatnonzero(~fits):  # rare: the percentile fell outside the window; draw the rest too
            sample = [window[keys[row_start[r]:row_start[r] + per_row[r]] - r * width]]
            for t, (below_t, _, above_t) in zip(chosen[r], counts[r]):
                under, _, over = parts[t]
                sample.append(under[(rng.random(below_t) * len(under)).astype(np.int64)])
                sample.append(over[(rng.random(above_t) * len(over)).astype(np.int64)])
            out[start + r] = np.percentile(np.concatenate(sample), percentile)
    return out
