"""The largest batch your SLO allows, found with as few engine starts as an ordered search allows.

Latency grows with the batch (more sequences share each step), so on an ordered grid of max_num_seqs the
values that meet an SLO form a prefix. A binary search finds its end in about log2(grid) engine starts;
each start is expensive, so every measurement is kept and reused. A point meets the SLOs only when the
upper end of each metric's confidence interval is within its limit (noise counts against the setting),
and the answer backs off one notch from the largest meeting value, for headroom.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from labkit.errors import BadParameter
from labkit.spec.numbers import COUNT, POSITIVE, check_number, raise_problems
from labkit.analyze.stats import METRICS, metric, request_gaps
from labkit.shown import Facts, shows_whole, whole

Measurement = dict[str, tuple[float, float, float]]  # metric -> (value, ci_low, ci_high)


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
    """Reject an empty set of SLOs, a metric that is not a latency, or a limit that is not positive."""
    if not slos:
        raise BadParameter("give at least one SLO, e.g. {'tbt_p99_ms': 50}")
    for name in slos:
        if not metric(name).lower_is_better:
            raise BadParameter(f"{name} is not a latency (higher is better); SLOs are upper limits on latencies, "
                               f"e.g. {[m for m in METRICS if m.endswith('_ms')][:4]}")
    check_slo_limits(slos)


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


def goodput(requests, slos: dict[str, float], duration_s: float) -> float:
    """Requests per second that met every per-request SLO (TTFT, TPOT, E2E, and TBT as the request's own
    P99 gap): throughput that users experienced as good."""
    ok = np.ones(len(requests), dtype=bool)
    for name, limit in slos.items():
        m = metric(name)
        if m.level == "token":
            per_request = pd.Series([np.percentile(gaps, m.percentile or 50) if len(gaps) else 0.0
                                     for gaps in (request_gaps(r, m) for _, r in requests.iterrows())],
                                    index=requests.index)
        else:
            per_request = requests[m.column]
        ok &= (per_request <= limit).to_numpy()
    return float(ok.sum() / duration_s) if duration_s > 0 else float("nan")


@shows_whole
def goodput_by_arm(results, slos: dict[str, float]) -> pd.DataFrame:
    """Per arm: mean request throughput and goodput (requests/s within every SLO) over the trials."""
    rows = []
    for arm in results.complete_arms:
        trials = results.trials[results.trials.arm == arm]
        req = results.requests[results.requests.arm == arm]
        good = [goodput(req[req.trial == t.trial], slos, t.duration_s) for t in trials.itertuples()]
        rows.append({"arm": arm, "request_s": trials.request_s.mean(), "goodput_request_s": float(np.mean(good))})
    return pd.DataFrame(rows)


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
