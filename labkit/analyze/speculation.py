"""Speculative decoding read from stored results: which k pays at which batch, and the k to run per batch range.

Prompt lookup drafts k tokens a step from the request's own n-grams and verifies them in one step of the
target model. Each step then does the work of up to k + 1 tokens: a gain while the step is launch- or
memory-bound (small batches), a loss once verification of drafts that are thrown away competes with other
requests for compute (large batches). The answer is per batch, which is why the lab tunes k together with it.
"""
from __future__ import annotations

import pandas as pd

from labkit.analyze.stats import BETTER, TOO_NOISY, summarize
from labkit.shown import cell, change as relative

KEEP_OFF = 0  # the recommendation where no k is better than none


def speculative_k(knobs: dict) -> int:
    """The k an arm's knobs draft per step (0 without speculation)."""
    return int((knobs.get("speculative") or {}).get("num_speculative_tokens", 0))


def load_shape(workload: dict) -> tuple[str, int | None]:
    """A stored load's task (its ChatText task, or "ids" for random token ids) and its clients (closed loop)."""
    prompt, arrival = workload.get("prompt_len", {}), workload.get("arrival", {})
    task = prompt.get("task", "ids") if prompt.get("kind") == "ChatText" else "ids"
    return task, (arrival.get("n") if arrival.get("kind") == "Concurrency" else None)


def recommend_k(record: pd.DataFrame, ks: dict[str, int], shapes: dict[str, tuple[str, int | None]],
                metric: str = "output_tok_s") -> pd.DataFrame:
    """Per load (its task and clients): the verdict of every k on `metric` against k = 0, and the k to run: the
    arm with the highest value among those better than k = 0, or 0 (keep speculation off) where none is, with
    its change [95 % interval]. A task's rows, read by clients, show the batch where each k stops paying."""
    rows = []
    compared = record[(record.metric == metric) & record.verdict.notna()] if "verdict" in record else record.iloc[0:0]
    for load, part in compared.groupby("load", sort=False):
        task, clients = shapes.get(load, ("ids", None))
        row = {"load": load, "task": task, "clients": clients}
        row.update({f"k={ks.get(r.arm, '?')}": r.verdict for r in part.itertuples()})
        winners = part[part.verdict == BETTER].sort_values("value", ascending=False)
        best = winners.iloc[0] if len(winners) else None
        noisy = best is None and (part.verdict == TOO_NOISY).any()  # a k the host's load hides may have paid
        row["recommended k"] = pd.NA if noisy else KEEP_OFF if best is None else ks.get(best.arm)
        row[f"{metric} change [95 % interval]"] = (
            f"{TOO_NOISY}: rerun on a quiet machine" if noisy else "keep speculation off" if best is None else
            relative(best.change, best.change_ci_low, best.change_ci_high))
        rows.append(row)
    return pd.DataFrame(rows)


def stops_paying(recommended: pd.DataFrame) -> pd.DataFrame:
    """Per task and k, from `recommend_k`'s table: the most clients at which that k was better than k = 0, and
    the fewest at which it was not (empty where it paid at every batch measured, or at none)."""
    rows = []
    for task, part in recommended.dropna(subset=["clients"]).sort_values("clients").groupby("task", sort=False):
        for column in (c for c in part.columns if c.startswith("k=")):
            paying = part[column] == BETTER
            rows.append({"task": task, "k": int(column[2:]),
                         "pays up to (clients)": part.clients[paying].max() if paying.any() else None,
                         "stops paying at (clients)": part.clients[~paying].min() if (~paying).any() else None})
    return pd.DataFrame(rows).astype({"pays up to (clients)": "Int64", "stops paying at (clients)": "Int64"},
                                     errors="ignore")


def k_schedule(recommended: pd.DataFrame, task: str, largest_batch: int) -> list[tuple[int, int, int]]:
    """The recommended k per batch range for one task, as vLLM's `num_speculative_tokens_per_batch_size` writes
    it ((first batch, last batch, k), inclusive; vllm 0.32 has the field): each measured clients count's k holds
    up to the next count measured, the last up to `largest_batch`."""
    # the loads with a recommendation (one too noisy to judge leaves its batches to its neighbours' ranges)
    part = recommended[(recommended.task == task)].dropna(subset=["clients", "recommended k"]).sort_values("clients")
    sizes, ks = part.clients.astype(int).tolist(), part["recommended k"].astype(int).tolist()
    ranges = []
    for i, (size, k) in enumerate(zip(sizes, ks)):
        first = 1 if i == 0 else size
        last = sizes[i + 1] - 1 if i + 1 < len(sizes) else largest_batch
        if ranges and ranges[-1][2] == k:  # the same k as the range before: one range
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((first, last, k))
    return ranges


def arm_ks_and_load_shapes(results) -> tuple[dict[str, int], dict[str, tuple[str, int | None]]]:
    """Each complete arm's k (0 without speculation), and each load's task and clients."""
    ks = {arm: speculative_k(results.arm_spec(arm).get("knobs", {})) for arm in results.complete_arms}
    workloads = results.arm_spec(results.complete_arms[0]).get("workloads", {}) if results.complete_arms else {}
    return ks, {load: load_shape(w) for load, w in workloads.items()}


def k_plan(results, record: pd.DataFrame, metric: str = "output_tok_s") -> pd.DataFrame:
    """`recommend_k` on stored results: each arm's k from its knobs, each load's task and clients from its spec."""
    ks, shapes = arm_ks_and_load_shapes(results)
    return recommend_k(record, ks, shapes, metric)


def acceptance(results) -> pd.DataFrame:
    """Per load and speculating arm: the task, clients and k, the share of drafted tokens vLLM accepted and the
    mean tokens a step produced (1 + accepted per draft), each with its 95 % interval, from vLLM's counters."""
    ks, shapes = arm_ks_and_load_shapes(results)
    rows = []
    for load, part in results.per_load():
        table = summarize(part, ["spec_acceptance_pct", "spec_accepted_length"]).set_index(["arm", "metric"])
        task, clients = shapes.get(load, ("ids", None))
        for arm in (a for a in part.measured_arms if ks.get(a)):
            pct, length = table.loc[(arm, "spec_acceptance_pct")], table.loc[(arm, "spec_accepted_length")]
            rows.append({"load": load, "task": task, "clients": clients, "k": ks[arm],
                         "accepted % of drafted [95 %]": cell(pct.value, pct.ci_low, pct.ci_high),
                         "tokens per step [95 %]": cell(length.value, length.ci_low, length.ci_high)})
    return pd.DataFrame(rows)
