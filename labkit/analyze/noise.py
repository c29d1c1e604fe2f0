"""Host load during two arms' trials, and what it means for a verdict between them.

Each trial records the cores other processes kept busy while it ran (`host_other_cores`, labkit.measure.hostload).
Two arms measured under different outside load differ by the machine as well as by the configuration, so:

- a verdict carries a *caution* when the arms' mean outside load differs by LOAD_GAP_CORES or more, or either
  arm's exceeds LOAD_SHARE of the cores the engine may use (the host was busy: even equal loads disturb);
- it is *too noisy to judge here* when the load explains the change: the cores free to the engine differ between
  the arms' trials by at least as much as the metric moved, in the direction the load would move it.

Cores free to the engine: of the cores it needs, those other processes left it, min(needed, cpu_count - other).
On a CPU the engine's threads fill every core, so it needs them all and a throughput scales at most linearly
with them (Amdahl: no better); that linear shift is the largest the load can explain, so a change smaller than
it cannot be told from the load. On a GPU the engine keeps only a few cores busy (the client loop, the engine
core's scheduler, one worker per GPU when split): outside load costs it nothing until the free cores fall below
that, which is what the min() says (on the H200 the committed trials' outside load stayed under 0.6 of 16 cores).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.analyze.arm_facts import arm_fact

LOAD_GAP_CORES = 0.25  # the arms' mean outside loads further apart than this are named; below, the measure's own jitter
# A host kept a quarter busy by others disturbs the engine even when both arms saw it (memory bandwidth, caches,
# the scheduler's time slices): named, though it cannot tell the arms apart by itself.
LOAD_SHARE = 0.25
ADVICE = "rerun on a quiet machine"


@dataclass(frozen=True)
class ArmLoad:
    """One arm's trials: the mean cores other processes kept busy, the host's cores and those the engine needs."""

    arm: str
    other_cores: float
    cpu_count: int | None
    engine_cores: float | None

    @property
    def free(self) -> float | None:
        """Cores free to the engine: of those it needs, what the other processes left (None: cores unknown)."""
        if self.cpu_count is None or self.engine_cores is None:
            return None
        return max(0.0, min(self.engine_cores, self.cpu_count - self.other_cores))


def engine_cores(results, arm: str, cpu_count: int) -> float:
    """The cores the arm's engine keeps busy: all of them on a CPU; on a GPU one for the client loop and, per
    data-parallel engine, one for its scheduler and one per tensor-parallel worker when there are several."""
    platform = (results.environment.get(arm) or {}).get("platform")
    if platform == "cpu":
        return float(cpu_count)
    tp, dp = (int(arm_fact(results, arm, name) or 1) for name in ("tensor_parallel_size", "data_parallel_size"))
    return float(min(cpu_count, 1 + dp * (1 + (tp if tp > 1 else 0))))


def arm_load(results, arm: str) -> ArmLoad | None:
    """The arm's outside load over its trials in `results` (one load); None where no trial recorded it."""
    trials = results.trials
    if "host_other_cores" not in trials:
        return None
    values = trials.loc[trials.arm == arm, "host_other_cores"].dropna()
    if values.empty:
        return None
    count = (results.environment.get(arm) or {}).get("cpu_count")
    count = int(count) if count else None
    return ArmLoad(arm, float(values.mean()), count, engine_cores(results, arm, count) if count else None)


def caution(results, baseline_arm: str, arm: str) -> str | None:
    """Why the two arms' trials ran under different outside load, or on a busy host; None when they did not
    (or it was not recorded)."""
    loads = arm_load(results, baseline_arm), arm_load(results, arm)
    if None in loads:
        return None
    base, cand = loads
    busy = [x for x in loads if x.cpu_count and x.other_cores > LOAD_SHARE * x.cpu_count]
    if abs(cand.other_cores - base.other_cores) < LOAD_GAP_CORES and not busy:
        return None
    of = f" of {base.cpu_count}" if base.cpu_count else ""
    note = (f"host load: other processes kept {base.other_cores:.2f} cores{of} busy during {baseline_arm}'s trials "
            f"against {cand.other_cores:.2f} during {arm}'s")
    shift = free_shift(base, cand)
    if shift is not None and abs(shift) >= 0.005:
        note += f" ({abs(shift):.0%} {'fewer' if shift < 0 else 'more'} cores free to the engine)"
    return note


def free_shift(base: ArmLoad, cand: ArmLoad) -> float | None:
    """The candidate's free cores relative to the baseline's, minus one (-0.38: 38 % fewer); None when unknown."""
    if base.free is None or cand.free is None or not base.free:
        return None
    return cand.free / base.free - 1


def _load_effect(shift: float, level: str, column: str) -> float | None:
    """The largest relative change the free cores' shift explains in a metric: a rate (tokens or requests per
    second) scales with the cores, a time inversely; None for the counts and shares the cores do not drive
    (preemptions, prefix-cache hits, KV usage)."""
    if level == "trial":
        return shift if column.endswith("_s") else None  # output_tok_s, total_tok_s, request_s
    return 1 / (1 + shift) - 1 if shift > -1 else math.inf  # request and token times


def explains(results, baseline_arm: str, arm: str, m, rel_change: float) -> str | None:
    """Why the load explains the change (the reason, in words), or None when it does not: the arms ran under
    different outside load (the caution's gap) and the free cores moved the metric at least as far, and the
    same way, as it moved."""
    base, cand = arm_load(results, baseline_arm), arm_load(results, arm)
    if base is None or cand is None or abs(cand.other_cores - base.other_cores) < LOAD_GAP_CORES:
        return None
    shift = free_shift(base, cand)
    if shift is None or not math.isfinite(rel_change):
        return None
    effect = _load_effect(shift, m.level, m.column)
    if effect is None or effect * rel_change <= 0 or abs(effect) < abs(rel_change):
        return None
    return (f"the cores free to the engine alone can move {m.name} by {effect:+.1%} between these arms' trials, "
            f"as far as its {rel_change:+.1%}: {ADVICE}")
