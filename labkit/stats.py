"""Summaries with bootstrap confidence intervals, and A/B comparisons with a plain verdict.

Requests within a trial share that trial's conditions, so request- and token-level statistics use a
two-level (cluster) bootstrap: resample trials, then values within each chosen trial. With one trial
it falls back to resampling values. Trial-level metrics (throughput) resample trials.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .errors import BadParameter

N_BOOT = 1000


@dataclass(frozen=True)
class Metric:
    name: str
    level: str  # "trial", "request" or "token"
    column: str
    percentile: float | None  # None: the mean
    lower_is_better: bool
    meaning: str


def _metrics() -> dict[str, Metric]:
    out = {}
    for name, column, meaning in (("output_tok_s", "output_tok_s", "output tokens per second"),
                                  ("total_tok_s", "total_tok_s", "prompt + output tokens per second"),
                                  ("request_s", "request_s", "completed requests per second")):
        out[name] = Metric(name, "trial", column, None, False, meaning)
    out["preemptions"] = Metric("preemptions", "trial", "preemptions", None, True, "preemptions per trial")
    out["kv_usage_peak_pct"] = Metric("kv_usage_peak_pct", "trial", "kv_usage_peak_pct", None, True,
                                      "peak KV-cache usage, % of the pool")
    for prefix, level, column, meaning in (("ttft", "request", "ttft_ms", "time to first token"),
                                           ("tpot", "request", "tpot_ms", "time per output token after the first"),
                                           ("e2e", "request", "e2e_ms", "request latency, end to end"),
                                           ("tbt", "token", "itl_ms", "gap between consecutive tokens")):
        out[f"{prefix}_mean_ms"] = Metric(f"{prefix}_mean_ms", level, column, None, True, f"mean {meaning}")
        for q in (50, 90, 99):
            out[f"{prefix}_p{q}_ms"] = Metric(f"{prefix}_p{q}_ms", level, column, q, True, f"P{q} {meaning}")
    return out


METRICS = _metrics()


def metric(name: str) -> Metric:
    if name not in METRICS:
        raise BadParameter(f"unknown metric {name!r}; known: {sorted(METRICS)}")
    return METRICS[name]


def groups(results, arm: str, m: Metric) -> list[np.ndarray]:
    """The metric's raw values for one arm, one array per trial."""
    if len(getattr(results, "loads", [])) > 1:
        raise BadParameter(f"these results hold several loads {results.loads}: pick one with "
                           "results.select(load) so that like is compared with like")
    if m.level == "trial":
        frame = results.trials[results.trials.arm == arm]
        return [frame[m.column].to_numpy(float)] if len(frame) else []
    frame = results.requests[results.requests.arm == arm]
    out = []
    for _, trial in frame.groupby("trial"):
        values = (np.concatenate([np.asarray(v, float) for v in trial[m.column]]) if m.level == "token"
                  else trial[m.column].to_numpy(float))
        values = values[~np.isnan(values)]
        if len(values):
            out.append(values)
    return out


def _stat(values: np.ndarray, m: Metric) -> float:
    if not len(values):
        return float("nan")
    return float(np.mean(values) if m.percentile is None else np.percentile(values, m.percentile))


def replicates(data: list[np.ndarray], m: Metric, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates of the statistic (two-level for request/token metrics)."""
    rng = np.random.default_rng(seed)
    if not data:
        return np.full(n_boot, np.nan)
    if m.level == "trial":
        values = data[0]
        idx = rng.integers(0, len(values), size=(n_boot, len(values)))
        return values[idx].mean(axis=1)
    out = np.empty(n_boot)
    for b in range(n_boot):
        chosen = [data[i] for i in rng.integers(0, len(data), len(data))] if len(data) > 1 else data
        sample = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in chosen])
        out[b] = _stat(sample, m)
    return out


def point(data: list[np.ndarray], m: Metric) -> float:
    return _stat(np.concatenate(data), m) if data else float("nan")


def summarize(results, metrics: list[str] | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """One row per arm and metric: the value and its confidence interval."""
    names = metrics or ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tbt_p99_ms"]
    alpha = (1 - confidence) / 2
    rows = []
    for arm in results.complete_arms:
        for name in names:
            m = metric(name)
            data = groups(results, arm, m)
            reps = replicates(data, m)
            rows.append({"arm": arm, "metric": name, "value": point(data, m),
                         "ci_low": float(np.nanquantile(reps, alpha)), "ci_high": float(np.nanquantile(reps, 1 - alpha)),
                         "trials": len(data), "n": int(sum(len(g) for g in data))})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float
    candidate: float
    rel_change: float  # candidate / baseline - 1
    ci_low: float
    ci_high: float
    verdict: str  # "better", "worse" or "no detectable difference"

    def sentence(self) -> str:
        return (f"{self.metric}: {self.baseline:.4g} -> {self.candidate:.4g} ({self.rel_change:+.1%}, "
                f"95% CI {self.ci_low:+.1%} to {self.ci_high:+.1%}): {self.verdict}")


def compare_groups(base: list[np.ndarray], cand: list[np.ndarray], m: Metric, threshold: float = 0.0,
                   confidence: float = 0.95) -> Comparison:
    """Relative change of candidate vs baseline, its CI, and a verdict.

    A change counts only when the whole CI lies beyond `threshold` (a practical minimum, e.g. 0.05 for
    "more than 5 %"); otherwise the difference is not detectable at this noise.
    """
    a, b = point(base, m), point(cand, m)
    rel = replicates(cand, m, seed=2) / replicates(base, m, seed=1) - 1
    alpha = (1 - confidence) / 2
    low, high = float(np.nanquantile(rel, alpha)), float(np.nanquantile(rel, 1 - alpha))
    if low > threshold:
        direction = "higher"
    elif high < -threshold:
        direction = "lower"
    else:
        direction = None
    if direction is None:
        verdict = "no detectable difference"
    else:
        verdict = "worse" if (direction == "higher") == m.lower_is_better else "better"
    return Comparison(m.name, a, b, b / a - 1 if a else float("nan"), low, high, verdict)


def compare(results, baseline_arm: str, candidate_arm: str, metric_name: str, threshold: float = 0.0) -> Comparison:
    for arm in (baseline_arm, candidate_arm):
        if arm not in results.complete_arms:
            raise BadParameter(f"arm {arm!r} has no complete results; complete arms: {results.complete_arms}")
    m = metric(metric_name)
    return compare_groups(groups(results, baseline_arm, m), groups(results, candidate_arm, m), m, threshold)


def compare_arms(results, baseline_arm: str, metrics: list[str] | None = None, threshold: float = 0.0) -> pd.DataFrame:
    """Every other complete arm against the baseline arm, one row per arm and metric."""
    names = metrics or ["output_tok_s", "ttft_p99_ms", "tpot_p50_ms", "tbt_p99_ms"]
    rows = []
    for arm in results.complete_arms:
        if arm == baseline_arm:
            continue
        for name in names:
            c = compare(results, baseline_arm, arm, name, threshold)
            rows.append({"arm": arm, "vs": baseline_arm, **c.__dict__})
    return pd.DataFrame(rows)
