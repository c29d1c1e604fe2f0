"""When an arm has run enough trials (Protocol(trials="auto")): a pure rule, asked after every trial of a load.

Each trial gives one value per headline metric (stats.VERDICT_METRICS): a trial-level metric its own value
(output tok/s), a request- or token-level one its statistic over that trial's requests (the trial's P99
TTFT, its P50 TPOT, its P99 gap between tokens). The trials of one engine are independent repeats, so the
95 % interval of a metric is Student's t interval of those per-trial values: mean +/- t(n-1) * sd / sqrt(n).

After `min_trials`, a load stops
- "precise": the interval of every metric the protocol names in `precise_on` lies within +/- `precision` of
  its mean (from three trials on); by default throughput and TPOT P50, since a tail latency of a few dozen
  requests cannot reach +/-2 % (labkit.spec.protocol.PRECISE_ON says what was seen);
- "decided": against a reference arm's per-trial values, every such metric's relative difference has
  an interval wholly inside the +/- `decide_threshold` band or wholly beyond it (the verdict cannot change);
- "maximum": `max_trials` were run;
- "budget": one more trial, as long as the mean trial so far, would pass the load's share of `budget_s`.

Stopping when the interval looks narrow favours samples whose spread came out small, which would make
intervals cover less often than 95 %; tests/unit/test_stopping.py simulates the rule on synthetic noise and
holds its final intervals to >= 93 % coverage. No vLLM here: the worker asks it, a unit test checks it."""
from __future__ import annotations

import math

import numpy as np

from labkit.analyze import stats

HEADLINE = stats.VERDICT_METRICS
# Precision is judged from the third trial: two values' t factor (12.7) makes the check hinge on how close one
# lucky pair came out, and stopping on that pulled the simulated coverage to 90 %; from three it holds >= 93 %.
PRECISE_FROM = 3
REASONS = ("precise", "decided", "maximum", "budget")  # and "fixed": a protocol of trials=N ran its N


def trial_values(summary: dict, rows: list[dict], metrics: list[str] = HEADLINE) -> dict[str, float]:
    """One trial's value of each metric, formed as stats forms it: a trial-level metric from the trial's
    summary, a request-level one over its requests, a token-level one over all its requests' gaps."""
    out = {}
    for name in metrics:
        m = stats.metric(name)
        if m.level == "trial":
            value = summary.get(m.column)
            out[name] = float(value) if value is not None else float("nan")
            continue
        if m.level == "token":
            pooled = [v for row in rows for v in stats.request_gaps(row, m)]
        else:
            pooled = [row.get(m.column) for row in rows]
        values = np.asarray([float("nan") if v is None else v for v in pooled], float)
        out[name] = stats._stat(values[~np.isnan(values)], m)
    return out


def _finite(values) -> np.ndarray:
    array = np.asarray(values, float)
    return array if len(array) and np.isfinite(array).all() else np.empty(0)


def interval(values) -> tuple[float, float]:
    """(mean, half-width) of the 95 % t interval of per-trial values; the half-width is inf below two values."""
    array = np.asarray(values, float)
    if len(array) < 2:
        return (float(array.mean()) if len(array) else float("nan")), math.inf
    return float(array.mean()), stats.t_quantile(len(array) - 1) * float(array.std(ddof=1)) / math.sqrt(len(array))


def is_precise(values, precision: float) -> bool:
    """The interval's half-width is within `precision` of the mean's size."""
    mean, half = interval(values)
    return half <= precision * abs(mean)


def difference_interval(candidate, reference) -> tuple[float, float]:
    """95 % interval of candidate mean / reference mean - 1 from per-trial values: the ratio's standard error
    by the delta method, Welch's degrees of freedom (the arms' spreads may differ)."""
    c, r = np.asarray(candidate, float), np.asarray(reference, float)
    if len(c) < 2 or len(r) < 2 or c.mean() == 0 or r.mean() == 0:
        return -math.inf, math.inf
    ratio = c.mean() / r.mean()
    vc, vr = c.var(ddof=1) / len(c) / c.mean() ** 2, r.var(ddof=1) / len(r) / r.mean() ** 2  # relative variances
    if vc + vr == 0:
        return ratio - 1, ratio - 1
    df = (vc + vr) ** 2 / (vc ** 2 / (len(c) - 1) + vr ** 2 / (len(r) - 1))
    half = stats.t_quantile(max(1, int(df))) * abs(ratio) * math.sqrt(vc + vr)  # int(): the wider, safe side
    return ratio - half - 1, ratio + half - 1


def is_decided(candidate, reference, threshold: float) -> bool:
    """The difference's interval lies wholly inside the +/- threshold band or wholly beyond it."""
    low, high = difference_interval(candidate, reference)
    return low > threshold or high < -threshold or (low >= -threshold and high <= threshold)


def stop_reason(trial_values: dict[str, list[float]], protocol, reference: dict[str, list[float]] | None = None,
                elapsed_s: float = 0.0, loads: int = 1) -> str | None:
    """Why this load's trials may stop now ("precise", "decided", "maximum", "budget"), or None to run another.

    `trial_values`: each headline metric's per-trial values so far (a metric with a missing value, such as
    TPOT of one-token outputs, is left out of the judgement); `reference`: the reference arm's, for the same
    load; `elapsed_s`: the trial time this load has spent; `loads`: how many loads share the arm's budget.
    A fixed protocol (trials=N) stops at N, reason "fixed"."""
    n = max((len(v) for v in trial_values.values()), default=0)
    if not protocol.adaptive:
        return "fixed" if n >= protocol.trials else None
    if n < protocol.min_trials:
        return None
    judged = {name: _finite(values) for name, values in trial_values.items() if name in protocol.precise_on}
    judged = {name: values for name, values in judged.items() if len(values)}
    if n >= PRECISE_FROM and judged and all(is_precise(values, protocol.precision) for values in judged.values()):
        return "precise"
    if reference is not None and judged:
        paired = {name: _finite(reference.get(name, [])) for name in judged}
        if all(len(paired[name]) >= 2 and is_decided(values, paired[name], protocol.decide_threshold)
               for name, values in judged.items()):
            return "decided"
    if n >= protocol.max_trials:
        return "maximum"
    if protocol.budget_s is not None and elapsed_s * (n + 1) / n > protocol.budget_s / loads:
        return "budget"
    return None


def arm_reason(by_load: dict[str, str]) -> str:
    """The arm's one reason over its loads: the least settled one any load stopped for (a budget cut before a
    maximum, before a decided verdict, before precision), so that an arm reads "precise" only when all were."""
    order = {reason: rank for rank, reason in enumerate(("budget", "maximum", "decided", "precise", "fixed"))}
    return min(by_load.values(), key=lambda reason: order.get(reason, -1))


def reference_values(results, arm: str, metrics: list[str] = HEADLINE) -> dict[str, dict[str, list[float]]]:
    """A stored arm's per-trial headline values, per load: what a later arm's stopping rule compares against
    (formed from the stored trials and requests as `trial_values` forms them while measuring)."""
    out = {}
    for load, part in results.per_load():
        per_metric = {}
        for name in metrics:
            m = stats.metric(name)
            data = stats.groups(part, arm, m)
            per_metric[name] = ([float(v) for v in data[0]] if m.level == "trial" and data
                                else [stats._stat(g, m) for g in data])
        out[load] = per_metric
    return out
