"""The Pareto front of an experiment's operating points: how fast each user is served against how much each
GPU produces.

Every (arm, load) measured is one point. x is output tokens per second per user: 1000 / the median TPOT
in ms, the rate at which one stream's tokens arrive once it is decoding (InferenceMAX's "interactivity",
tok/s/user). vLLM's `vllm bench sweep plot_pareto` divides output throughput by the number of concurrent
users instead, which also charges the wait for the first token and any queueing to the user; the TPOT form
is kept here because TTFT is its own SLO and a stream's speed should not move with the requests' length.
y is output tokens per second per GPU: the arm's output throughput over the GPUs one launch takes
(tensor x pipeline x data parallel sizes, labkit.analyze.parallel.gpus_per_arm).

Both are better higher. A point is dominated when another is at least as good on both and better on one:
nobody who wants either speed or throughput per GPU should pick it. The front is what is left.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analyze import stats
from labkit.analyze.parallel import gpus_per_arm
from labkit.shown import whole, with_detail

PER_USER = "tpot_p50_ms"  # the per-user speed is 1000 / this metric


def dominated(xs, ys) -> list[bool]:
    """For each point (both coordinates better higher): whether another point is at least as good on both and
    strictly better on one. Equal points do not dominate each other: both stay on the front."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    at_least = (x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])  # [i, j]: j at least as good as i
    better = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    return ((at_least & better).any(axis=1)).tolist()


def point_name(arm: str, load: str) -> str:
    """How a point is named in a table or on a plot: 'max_num_seqs=16 · c64'."""
    return f"{arm} · {load}"


def pareto_points(results, confidence: float = 0.95):
    """One row per load and complete arm that ran it: `gpus` (one launch's), `output_tok_s_per_user` (1000 / median TPOT,
    tokens/s one user's stream receives) and `output_tok_s_per_gpu` (output tokens/s over the GPUs), each
    with `_low` and `_high` from its 95 % bootstrap interval (the TPOT interval's ends, inverted; the
    throughput's over trials, divided by the GPUs); `dominated` (another point is at least as fast per user and
    gives at least as much per GPU, and more on one) judged on the values, and `dominated_by`, the point that
    gives the most per GPU among those dominating it. A point without a median TPOT (every output one token)
    cannot be placed: it is left out, and the table says so above it."""
    sizes = gpus_per_arm(results).set_index("arm").gpus
    rows = []
    for load, part in results.per_load():
        summary = stats.summarize(part, ["output_tok_s", PER_USER], confidence).set_index(["arm", "metric"])
        for arm in part.measured_arms:
            tok_s = summary.loc[(arm, "output_tok_s")]
            tpot = summary.loc[(arm, PER_USER)]
            gpus = int(sizes[arm])
            rows.append({"load": load, "arm": arm, "gpus": gpus,
                         "output_tok_s_per_user": 1000 / tpot.value, "output_tok_s_per_user_low": 1000 / tpot.ci_high,
                         "output_tok_s_per_user_high": 1000 / tpot.ci_low,
                         "output_tok_s_per_gpu": tok_s.value / gpus, "output_tok_s_per_gpu_low": tok_s.ci_low / gpus,
                         "output_tok_s_per_gpu_high": tok_s.ci_high / gpus})
    columns = ["load", "arm", "gpus", *[f"output_tok_s_per_{axis}{end}" for axis in ("user", "gpu")
                                        for end in ("", "_low", "_high")]]
    table = pd.DataFrame(rows, columns=columns)
    placed = np.isfinite(table.output_tok_s_per_user) & np.isfinite(table.output_tok_s_per_gpu)
    left_out = [point_name(a, lo) for a, lo in zip(table.arm[~placed], table.load[~placed])]
    table = table[placed].reset_index(drop=True)
    table["dominated"] = dominated(table.output_tok_s_per_user, table.output_tok_s_per_gpu)
    table["dominated_by"] = [_best_dominating(table, i) for i in range(len(table))]
    if left_out:
        return with_detail(table, None, "", f"left out, without a median TPOT to place them: {', '.join(left_out)}")
    return whole(table)


def _best_dominating(table: pd.DataFrame, i: int) -> str:
    """The point that dominates row i and gives the most per GPU ('' when none does)."""
    x, y = table.output_tok_s_per_user, table.output_tok_s_per_gpu
    over = table[(x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))]
    if over.empty:
        return ""
    best = over.output_tok_s_per_gpu.idxmax()
    return point_name(over.arm[best], over.load[best])
