"""The largest batch your SLO allows, found with as few engine starts as an ordered search allows.

Latency grows with the batch (more sequences share each step), so on an ordered grid of max_num_seqs the
values that meet an SLO form a prefix. A binary search finds its end in about log2(grid) engine starts;
each start is expensive, so every measurement is kept and reused. A point meets the SLOs only when the
upper end of each metric's confidence interval is within its limit (noise counts against the setting),
and the answer backs off one notch from the largest meeting value, for headroom.

Goodput is the throughput of the requests that met every SLO, each request held to its own values
(`meets_slos`): per load and arm with intervals over trials (`goodput_by_load`), reported beside throughput.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from labkit.errors import BadParameter
from labkit.spec.numbers import COUNT, POSITIVE, PROBABILITY, check_number, check_numbers, raise_problems
from labkit.analyze import stats
from labkit.analyze.stats import METRICS, metric, request_gaps
from labkit.shown import Facts, shows_whole, whole

Measurement = dict[str, tuple[float, float, float]]  # metric -> (value, ci_low, ci_high)
EXAMPLE_SLOS = {"ttft_p99_ms": 500, "tpot_p50_ms": 50}


@dataclass
class SloResult:
    """The outcome of an SLO search: the recommended and the largest meeting setting, the constraint that binds
    above it, every measurement taken and what the search cost."""

    answer: int | None  # the recommended setting (None: nothing meets the SLOs)
    largest_meeting: int | None
    engine_starts: int
    binding_constraint: str | None  # the metric that fails first above the largest meeting value
    measured: dict[int, Measurement] = field(default_factory=dict)
    note: str = ""
    from_store: int = 0  # settings the search read from results already stored: no engine started for them

    def table(self, knob: str = "max_num_seqs"):
        """Every measured setting: each metric's value with its interval's upper end (what the SLO is held
        to), and whether it met them, in the grid's order."""
        rows = [{knob: value, **{f"{name} (upper end)": round(m[2], 3) for name, m in measured.items()},
                 "meets": "yes" if value <= (self.largest_meeting or 0) and self.largest_meeting is not None else "no",
                 "recommended": "yes" if value == self.answer else ""}
                for value, measured in sorted(self.measured.items())]
        return whole(pd.DataFrame(rows))

    def sentence(self, knob: str = "max_num_seqs") -> str:
        """One line: the recommended setting (or that none meets the SLOs), the binding constraint and the starts."""
        starts = f"{self.engine_starts} engine starts" + (
            f" and {self.from_store} settings read from the store" if self.from_store else "")
        if self.answer is None:
            return f"no {knob} on the grid meets the SLOs ({self.note}); {starts}"
        return (f"{knob}={self.answer} (largest meeting: {self.largest_meeting}, backed off one notch); "
                f"binding constraint: {self.binding_constraint or 'none within the grid'}; "
                f"{starts}" + (f"; {self.note}" if self.note else ""))


def check_slos(slos: dict[str, float]) -> None:
    """Reject an empty set of SLOs, a name that is no metric or no latency, and a limit that is not a positive,
    finite number: one BadParameter naming every problem, so one correction fixes them all."""
    if not slos or not isinstance(slos, dict):
        raise BadParameter(f"give at least one SLO as a dict of metric -> limit, e.g. {EXAMPLE_SLOS}; got {slos!r}")
    latencies = [m for m in METRICS if m.endswith("_ms")]
    problems = []
    for name, limit in slos.items():
        if name not in METRICS:
            problems.append(f"{name!r} is no metric; SLOs limit latencies: {latencies}")
        elif not METRICS[name].lower_is_better or not name.endswith("_ms"):
            problems.append(f"{name!r} is not a latency; SLOs are upper limits on latencies, e.g. {latencies[:4]}")
        problems.append(check_number(f"SLO {name}", limit, **POSITIVE))
    raise_problems("SLOs", problems)


def check_slo_limits(slos: dict[str, float]) -> None:
    """Reject an SLO limit that is not a positive, finite number, naming every one."""
    raise_problems("SLO limits", [check_number(f"SLO {name}", limit, **POSITIVE) for name, limit in slos.items()])


def violations(measurement: Measurement, slos: dict[str, float]) -> list[str]:
    """The SLOs this measurement does not clearly meet (its CI's upper end is over the limit)."""
    return [name for name, limit in slos.items() if not measurement[name][2] <= limit]


def backed_off(grid: list, last_meeting: int):
    """The recommended setting: one notch below the largest meeting one on the ordered grid, for headroom (the
    smallest setting stays itself: there is no notch below it)."""
    return grid[max(0, last_meeting - 1)]


def search(evaluate: Callable[[int], Measurement], grid: list[int], slos: dict[str, float]) -> SloResult:
    """The largest grid value that meets every SLO, found by binary search and backed off one notch, as an
    SloResult that keeps every measurement taken."""
    check_slos(slos)
    if not grid:
        raise BadParameter(f"the grid must hold positive integers, got {grid!r}")
    raise_problems("the grid must hold positive integers",
                   [check_number(f"grid value {v!r}", v, **COUNT) for v in grid])
    grid = sorted(set(grid))
    measured: dict[int, Measurement] = {}

    def fails(index: int) -> list[str]:
        value = grid[index]
        if value not in measured:
            measured[value] = evaluate(value)
        return violations(measured[value], slos)

    lo, hi = 0, len(grid) - 1  # invariant: every index < lo meets, every index > hi fails
    while lo <= hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid - 1
        else:
            lo = mid + 1
    last_meeting = hi  # -1 when even the smallest setting fails
    starts = len(measured)
    if last_meeting < 0:
        return SloResult(None, None, starts, ", ".join(fails(0)), measured,
                         f"{grid[0]} already violates {', '.join(fails(0))}")
    binding = ", ".join(fails(last_meeting + 1)) if last_meeting + 1 < len(grid) else None
    note = "" if binding else "even the largest grid value meets the SLOs: extend the grid"
    return SloResult(backed_off(grid, last_meeting), grid[last_meeting], starts, binding, measured, note)


def from_points(measured: dict[int, Measurement], slos: dict[str, float]) -> SloResult:
    """The rule of `search` applied to settings already measured (a stored batch triangle, the explorer's slider):
    the largest setting that meets every SLO with every smaller one, backed off one notch, and the constraint
    that fails at the next setting. Nothing is measured; every point counts as read from the store."""
    check_slos(slos)
    grid = sorted(measured)
    meeting = -1
    while meeting + 1 < len(grid) and not violations(measured[grid[meeting + 1]], slos):
        meeting += 1
    if meeting < 0:
        first = ", ".join(violations(measured[grid[0]], slos)) if grid else None
        return SloResult(None, None, 0, first, dict(measured),
                         f"{grid[0]} already violates {first}" if grid else "no measured setting", from_store=len(grid))
    binding = ", ".join(violations(measured[grid[meeting + 1]], slos)) if meeting + 1 < len(grid) else None
    note = "" if binding else "even the largest measured setting meets the SLOs: extend the grid"
    return SloResult(backed_off(grid, meeting), grid[meeting], 0, binding, dict(measured), note, from_store=len(grid))


def meets_slos(requests: pd.DataFrame, slos: dict[str, float]) -> np.ndarray:
    """Per request, whether it met every SLO: the one definition of a good request. A request-level limit
    (TTFT, TPOT, E2E) holds the request's own value, whatever percentile the name says (`ttft_p99_ms: 200`:
    this request's TTFT within 200 ms); a token-level one (TBT, ITL) holds the request's own percentile of its
    gaps (`tbt_p99_ms: 50`: the P99 of this request's token gaps within 50 ms; ITL its streamed-chunk gaps). A
    request without gaps (one token) meets a gap limit; one without a value (NaN) meets no limit on it."""
    check_slos(slos)
    ok = np.ones(len(requests), dtype=bool)
    for name, limit in slos.items():
        m = metric(name)
        if m.level == "token":
            stat = (lambda g: float(np.mean(g))) if m.percentile is None else (lambda g: float(np.percentile(g, m.percentile)))
            per_request = np.array([stat(gaps) if len(gaps) else 0.0
                                    for gaps in (request_gaps(r, m) for r in requests.to_dict("records"))])
        else:
            per_request = requests[m.column].to_numpy(float)
        ok &= per_request <= limit
    return ok


def trial_goodput(requests: pd.DataFrame, slos: dict[str, float], duration_s: float) -> dict[str, float]:
    """One trial's goodput from its requests and its measured duration: requests/s and output tokens/s of the
    requests that met every SLO (`meets_slos`), and their share of the trial's requests in %."""
    good = meets_slos(requests, slos)
    if not duration_s > 0 or not len(requests):
        return {name: float("nan") for name in GOODPUT_METRICS}
    return {"goodput_request_s": float(good.sum() / duration_s),
            "goodput_output_tok_s": float(requests.output_tokens.to_numpy(float)[good].sum() / duration_s),
            "good_pct": float(100 * good.mean())}


def goodput(requests: pd.DataFrame, slos: dict[str, float], duration_s: float) -> float:
    """Requests per second that met every per-request SLO (`meets_slos`): throughput users experienced as good."""
    return float(meets_slos(requests, slos).sum() / duration_s) if duration_s > 0 else float("nan")


# Goodput beside the throughput it is part of: each a mean over trials, like stats' trial-level metrics.
GOODPUT_METRICS = {
    "goodput_request_s": "requests per second that met every SLO",
    "goodput_output_tok_s": "output tokens per second of the requests that met every SLO",
    "good_pct": "share of the requests that met every SLO, %",
}
THROUGHPUT_METRICS = ("request_s", "output_tok_s")


@shows_whole
def goodput_by_load(results, slos: dict[str, float], confidence: float = 0.95) -> pd.DataFrame:
    """Per load and the complete arms that ran it, throughput beside goodput, each the mean over trials with its bootstrap
    interval over trials (stats.replicates of a trial-level metric; NaN bounds with fewer than two trials):
    `request_s` and `output_tok_s` (all requests), `goodput_request_s` and `goodput_output_tok_s` (only the
    requests that met every SLO, per request as `meets_slos` says) and `good_pct` (their share of requests,
    %). Each metric comes with `_low` and `_high` columns; `trials` counts the trials behind the row."""
    check_slos(slos)
    check_numbers("goodput_by_load", {"confidence": (confidence, PROBABILITY)})
    alpha = (1 - confidence) / 2
    names = [*THROUGHPUT_METRICS, *GOODPUT_METRICS]
    rows = []
    for load, part in results.per_load():
        for arm in part.measured_arms:
            trials = part.trials[part.trials.arm == arm]
            requests = part.requests[part.requests.arm == arm]
            per_trial = pd.DataFrame([{**{n: getattr(t, n) for n in THROUGHPUT_METRICS},
                                       **trial_goodput(requests[requests.trial == t.trial], slos, t.duration_s)}
                                      for t in trials.itertuples()], columns=names)
            row = {"load": load, "arm": arm, "trials": len(per_trial)}
            for name in names:
                values = per_trial[name].dropna().to_numpy(float)
                reps = stats.replicates([values], stats.Metric(name, "trial", name, None, False, name))
                enough = len(values) >= 2  # one trial has no spread: its "interval" would have zero width
                row.update({name: float(values.mean()) if len(values) else float("nan"),
                            f"{name}_low": float(np.nanquantile(reps, alpha)) if enough else float("nan"),
                            f"{name}_high": float(np.nanquantile(reps, 1 - alpha)) if enough else float("nan")})
            rows.append(row)
    columns = ["load", "arm", "trials", *[f"{n}{s}" for n in names for s in ("", "_low", "_high")]]
    return pd.DataFrame(rows, columns=columns)


# The name the batch-triangle notebooks call it by: the same table (one row per arm where there is one load).
goodput_by_arm = goodput_by_load


def preemption_onset(results, arms: dict[str, int], footprint_tokens: int) -> dict:
    """Predicted vs observed: the smallest batch whose full-length requests (prompt + output) need more
    KV blocks than the pool holds, against the smallest measured batch that really preempted."""
    facts = results.arms.set_index("arm")
    done = [a for a in arms if a in results.complete_arms]
    if not done:
        return Facts(predicted_onset=None, observed_onset=None)
    blocks, block_size = facts.loc[done[0], "kv_cache_blocks"], facts.loc[done[0], "block_size"]
    per_request = int(np.ceil(footprint_tokens / block_size))
    fits = int(blocks // per_request)
    preempted = results.trials.groupby("arm").preemptions.sum()
    observed = min((arms[a] for a in done if preempted.get(a, 0) > 0), default=None)
    return Facts(kv_cache_blocks=int(blocks), block_size=int(block_size), blocks_per_request=per_request,
                 requests_that_fit=fits, predicted_onset=fits + 1, observed_onset=observed)
