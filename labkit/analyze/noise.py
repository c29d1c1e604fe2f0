"""Host load during two arms' trials, and what it means for a verdict between them.

Each trial records the cores other processes kept busy while it ran (`host_other_cores`, labkit.measure.hostload).
Two arms measured under different outside load differ by the machine as well as by the configuration, so:

- a verdict carries a *caution* when the arms' mean outside load differs by LOAD_GAP_CORES or more, or either
  arm's exceeds LOAD_SHARE of the cores the engine may use (the host was busy: even equal loads disturb);
- it is *too noisy to judge here* when the load explains the change: the cores free to the engine differ between
  the arms' trials by at least as much as the metric moved, in the direction the load would move it; or, on a
  CPU, the lab's threads also waited for a CPU more during the slower arm's trials (`threads_waiting_for_cpu`,
  WAIT_GAP_THREADS or more apart), whatever the size of the change.

Cores free to the engine: of the cores it needs, those other processes left it, min(needed, cpu_count - other).
On a CPU the engine's threads fill every core, so it needs them all and a throughput scales at most linearly
with them (Amdahl: no better); that linear shift is the largest the load can explain, so a change smaller than
it cannot be told from the load. On a GPU the engine keeps only a few cores busy (the client loop, the engine
core's scheduler, one worker per GPU when split): outside load costs it nothing until the free cores fall below
that, which is what the min() says (on the H200 the committed trials' outside load stayed under 0.6 of 16 cores).

The linear shift is a bound only for a load spread evenly over the trial and shared fairly. On a CPU neither
holds: a trial's mean hides bursts, and a descheduled engine thread holds its whole parallel step at the next
barrier. Seen on this lab's 2-core machines in suite runs, each notebook's engine bound to a core: a first token
6.9x later (TTFT P50 +585 %) beside 0.81 busy cores against 0.03 in the other arm's trial, where the linear bound
is +67 %; a 12-request trial 18x longer than the same shape's in another run beside 0.91-1.01; an 8-token load's
fastest request 884 ms against 100 ms for 64-token requests beside 0.99. Where it was recorded, the lab's threads
waited for a CPU far more in the slow trial (1.02 against 0.21 threads in the first; 0.99 against 0.35 in the
last). So where the loads differ and the waiting says the load reached the slower arm, no size of change can be
told from the load on a CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from labkit.analyze.arm_facts import arm_fact

LOAD_GAP_CORES = 0.25  # the arms' mean outside loads further apart than this are named; below, the measure's own jitter
# A host kept a quarter busy by others disturbs the engine even when both arms saw it (memory bandwidth, caches,
# the scheduler's time slices): named, though it cannot tell the arms apart by itself.
LOAD_SHARE = 0.25
# Threads waiting for a CPU, the arms' means further apart than this say the outside load reached one arm more:
# an idle 2-core run kept them within 0.18-0.27 over four trials, a busy loop beside the engine 0.31-0.53
# (data/baselines/cpu-amd-epyc/outside-load/). The lab's own threads crowding a core count too, and launches
# may crowd differently: so the waiting decides only between arms whose outside loads differ as well.
WAIT_GAP_THREADS = 0.25
ADVICE = "rerun on a quiet machine"


@dataclass(frozen=True)
class ArmLoad:
    """One arm's trials: the mean cores other processes kept busy, the host's cores and those the engine needs."""

    arm: str
    other_cores: float
    cpu_count: int | None
    engine_cores: float | None
    waiting: float | None = None  # mean threads of the lab's processes ready to run but waiting for a CPU
    platform: str | None = None

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
    environment = results.environment.get(arm) or {}
    count = int(environment["cpu_count"]) if environment.get("cpu_count") else None
    waits = trials.loc[trials.arm == arm, "threads_waiting_for_cpu"].dropna() \
        if "threads_waiting_for_cpu" in trials else pd.Series(dtype=float)
    return ArmLoad(arm, float(values.mean()), count, engine_cores(results, arm, count) if count else None,
                   float(waits.mean()) if not waits.empty else None, environment.get("platform"))


def waiting_gap(base: ArmLoad, cand: ArmLoad) -> float | None:
    """How many more threads waited for a CPU, on average, during the candidate's trials than the baseline's
    (negative: fewer); None where either was not recorded."""
    return None if base.waiting is None or cand.waiting is None else cand.waiting - base.waiting


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
    gap = waiting_gap(base, cand)
    if gap is not None and abs(gap) >= WAIT_GAP_THREADS:
        note += (f"; the lab's threads waited for a CPU {base.waiting:.2f} against {cand.waiting:.2f} threads on "
                 "average")
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
    if not math.isfinite(rel_change):
        return None
    gap = waiting_gap(base, cand)
    if "cpu" in (base.platform, cand.platform) and gap is not None and abs(gap) >= WAIT_GAP_THREADS:
        direction = _load_effect(-0.5 if gap > 0 else 0.5, m.level, m.column)  # the way the load would move m
        if direction is not None and direction * rel_change > 0:
            return (f"the lab's threads waited for a CPU {base.waiting:.2f} against {cand.waiting:.2f} threads on "
                    f"average, so the outside load reached {arm if gap > 0 else baseline_arm}'s trials more; on "
                    f"a CPU that can stall the engine's steps beyond the cores it took, so {m.name}'s "
                    f"{rel_change:+.1%} cannot be told from it: {ADVICE}")
    shift = free_shift(base, cand)
    if shift is None:
        return None
    effect = _load_effect(shift, m.level, m.column)
    if effect is None or effect * rel_change <= 0 or abs(effect) < abs(rel_change):
        return None
    return (f"the cores free to the engine alone can move {m.name} by {effect:+.1%} between these arms' trials, "
            f"as far as its {rel_change:+.1%}: {ADVICE}")
