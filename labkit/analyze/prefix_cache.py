"""The prefix cache, read from stored results: how many prompt tokens it served, what was left to prefill,
and what that did to TTFT, per load and arm; where a working set of shared prefixes outgrows the KV pool;
the conclusion in one sentence with its interval.

Hit rates come from vLLM's own counters (prompt tokens queried and hit), summed over each trial.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from labkit.analyze import stats
from labkit.analyze.roofline import Peaks, prefill_floor_s
from labkit.errors import BadParameter
from labkit.spec.models import ModelShape
from labkit.shown import cell, shows_whole

CACHE_METRICS = ["prefix_hit_pct", "prefill_tokens_computed", "ttft_p50_ms", "ttft_p99_ms", "output_tok_s"]


def cache_table(results, metrics: list[str] | None = None) -> pd.DataFrame:
    """Per load and arm: each metric's value and 95 % interval ("value [low, high]" in `shown`), and the
    prompt tokens sent per trial, to set against those prefilled."""
    if "prefix_hit_pct" not in results.trials:
        raise BadParameter("these results hold no prefix-cache counters (measured before the lab recorded them)")
    rows = []
    for load, part in results.per_load():
        summary = stats.summarize(part, stats.metric_names(metrics, CACHE_METRICS))
        sent = part.requests.groupby(["arm", "trial"]).prompt_tokens.sum().groupby("arm").mean()
        for row in summary.itertuples():
            rows.append({"load": load, "arm": row.arm, "metric": row.metric, "value": row.value,
                         "ci_low": row.ci_low, "ci_high": row.ci_high,
                         "shown": cell(row.value, row.ci_low, row.ci_high),
                         "prompt_tokens_sent": float(sent.get(row.arm, np.nan))})
    return pd.DataFrame(rows)


def working_set_knee(pool_tokens: float, prefix_tokens: int) -> float:
    """How many distinct shared prefixes the KV pool holds at once (pool tokens / prefix tokens): requests
    cycling through more than that evict each prefix before it is asked for again."""
    if prefix_tokens <= 0 or not pool_tokens or pool_tokens <= 0:
        raise BadParameter(f"the knee needs a positive pool and prefix length, got {pool_tokens} and {prefix_tokens}")
    return float(pool_tokens) / prefix_tokens


def compare_loads(results, arm: str, baseline_load: str, candidate_load: str,
                  metric_name: str = "ttft_p50_ms") -> stats.Comparison:
    """One arm's metric under the candidate load against the baseline load (two layouts of the same tokens,
    measured on the same engine), with the interval of the relative change."""
    m = stats.metric(metric_name)
    base, cand = (stats.groups(results.select(load), arm, m) for load in (baseline_load, candidate_load))
    if not base or not cand:
        raise BadParameter(f"arm {arm!r} has no {metric_name} under {baseline_load!r} and {candidate_load!r}")
    return stats.compare_groups(base, cand, m)


def hit_rate(results, load: str, arm: str) -> float:
    """The % of one arm's prompt tokens the prefix cache served under one load, over its trials."""
    m = stats.metric("prefix_hit_pct")
    return stats.point(stats.groups(results.select(load), arm, m), m)


def layout_conclusion(results, arm: str, shared_first: str, unique_first: str) -> str:
    """"hit rate X % -> TTFT -Y % (CI)": what putting the shared segments first bought, on one arm."""
    hit = {load: hit_rate(results, load, arm) for load in (shared_first, unique_first)}
    parts = [f"{arm}: shared segments first, the cache served {hit[shared_first]:.0f} % of prompt tokens "
             f"(against {hit[unique_first]:.0f} % with them last)"]
    for name in ("ttft_p50_ms", "ttft_p99_ms"):
        c = compare_loads(results, arm, unique_first, shared_first, name)
        parts.append(f"{name} {c.rel_change:+.0%} (95 % CI {c.ci_low:+.0%} to {c.ci_high:+.0%}, {c.verdict})")
    return "; ".join(parts)


def uncached_ttft_floor_ms(shape: ModelShape, peaks: Peaks, uncached_tokens: float) -> float:
    """The TTFT floor of the prompt tokens the cache does not serve: their prefill at peak FLOP/s."""
    return 1e3 * prefill_floor_s(shape, peaks, uncached_tokens)


@shows_whole
def working_set_table(results, arm: str, prefixes_by_load: dict[str, int]) -> pd.DataFrame:
    """One row per working-set load of one arm: the number of distinct shared prefixes, the hit rate and
    TTFT P50 with their intervals."""
    return stats.by_load(results, arm, prefixes_by_load, ["prefix_hit_pct", "ttft_p50_ms"], x="prefixes")


@shows_whole
def by_turn(results, load: str, metrics: list[str] | None = None) -> pd.DataFrame:
    """A conversation load's request-level metrics per arm and turn, with 95 % intervals: what a growing,
    resent history costs each turn, with the cache and without."""
    part = results.select(load)
    if "turn" not in part.requests:
        raise BadParameter(f"load {load!r} is not a Conversation: its requests have no turn")
    names = stats.metric_names(metrics, ["ttft_p50_ms", "ttft_p99_ms"])
    if any(stats.metric(name).level == "trial" for name in names):
        raise BadParameter("per turn only request-level metrics exist (the engine's counters cover whole trials)")
    rows = []
    for turn, requests in part.requests.groupby("turn"):
        summary = stats.summarize(replace(part, requests=requests), names)
        prompt = requests.groupby("arm").prompt_tokens.mean()
        rows += [{"turn": int(turn), "arm": r.arm, "metric": r.metric, "value": r.value, "ci_low": r.ci_low,
                  "ci_high": r.ci_high, "prompt_tokens": float(prompt[r.arm])} for r in summary.itertuples()]
    return pd.DataFrame(rows)
