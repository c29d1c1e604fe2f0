"""Where two arms ran, and what it means for a verdict between them (arms measured at once: Experiment.run's
`parallel`).

- Two arms on different GPUs differ by the GPUs as well as by their launches: two cards of one model differ in
  clocks, memory and cooling (seen: two leases of one H100 model a quarter apart in decode speed). A *control*
  measures it: the reference arm's launch measured a second time on another GPU (arm `<reference>-control`).
  With one, a verdict between arms on different GPUs is *too noisy to judge here* when the GPU-to-GPU spread
  (the control's change, its interval's far end) reaches as far as the arms' change; without one, it carries a
  caution saying the spread is unknown.
- Arms at once on one CPU host run on cores of their own but share its memory bandwidth and caches: said.
"""
from __future__ import annotations

import json

from labkit.analyze.arm_facts import arm_fact

CONTROL_SUFFIX = "-control"


def control_arm(reference: str) -> str:
    return reference + CONTROL_SUFFIX


def gpus_of(results, arm: str) -> tuple[str, ...] | None:
    """The UUIDs of the GPUs the arm ran on, as it recorded them (None: not recorded, or a CPU)."""
    value = arm_fact(results, arm, "gpu_uuids")
    if value is None:
        return None
    return tuple(json.loads(value) if isinstance(value, str) else value)


def _short(uuids: tuple[str, ...]) -> str:
    return ",".join(u[:12] for u in uuids)


def different_gpus(results, baseline_arm: str, arm: str) -> tuple[tuple, tuple] | None:
    both = gpus_of(results, baseline_arm), gpus_of(results, arm)
    return both if None not in both and both[0] != both[1] else None


def spread(results, m, baseline_arm: str) -> tuple[float, float] | None:
    """The control's relative change against the reference arm on metric `m` as (change, far end of its 95 %
    interval in absolute value); None without a complete control on another GPU."""
    from labkit.analyze.stats import same_launch_move

    control = control_arm(baseline_arm)
    if control not in results.complete_arms or baseline_arm not in results.complete_arms \
            or not different_gpus(results, baseline_arm, control):
        return None
    return same_launch_move(results, baseline_arm, control, m)


def _reference_for(results, baseline_arm: str, arm: str) -> str:
    """The arm whose control measures the spread between these two: the baseline's own, else the experiment's
    reference arm's (the control is of one launch; the spread is the GPUs')."""
    if control_arm(baseline_arm) in results.complete_arms:
        return baseline_arm
    return results.reference_arm or baseline_arm


def caution(results, baseline_arm: str, arm: str, m=None) -> str | None:
    """Why where the two arms ran may have moved the verdict; None when they ran alike (or one at a time)."""
    notes = []
    nodes = arm_fact(results, baseline_arm, "node"), arm_fact(results, arm, "node")
    if None not in nodes and nodes[0] != nodes[1]:
        notes.append(f"measured on different machines ({nodes[0]} and {nodes[1]})")
    gpus = different_gpus(results, baseline_arm, arm)
    if gpus:
        note = f"measured on different GPUs ({_short(gpus[0])} and {_short(gpus[1])})"
        found = spread(results, m, _reference_for(results, baseline_arm, arm)) if m is not None else None
        notes.append(note + (f": the same launch moved {found[0]:+.1%} between two GPUs (control)" if found else
                             ": the GPU-to-GPU spread was not measured (run with control=True)"))
    at_once = [arm_fact(results, a, "arms_at_once") for a in (baseline_arm, arm)]
    platform = (results.environment.get(arm) or {}).get("platform")
    if platform == "cpu" and any(n and int(n) > 1 for n in at_once):
        places = [arm_fact(results, a, "placed_on") or "?" for a in (baseline_arm, arm)]
        notes.append(f"measured {max(int(n or 1) for n in at_once)} arms at once on this host ({places[0]}; "
                     f"{places[1]}): they shared its memory bandwidth and caches")
    return "; ".join(notes) or None


def explains(results, baseline_arm: str, arm: str, m, rel_change: float) -> str | None:
    """Why the GPU-to-GPU spread explains the change (in words), or None: the arms ran on different GPUs and the
    control's spread reaches as far as the change."""
    if not different_gpus(results, baseline_arm, arm) or rel_change != rel_change:
        return None
    found = spread(results, m, _reference_for(results, baseline_arm, arm))
    if found is None or abs(rel_change) > found[1]:
        return None
    return (f"the arms ran on different GPUs, and the same launch moved up to {found[1]:.1%} between two GPUs "
            f"(control), as far as the change ({rel_change:+.1%})")


def makespan(seconds: list[float], places: int) -> float:
    """How long arms of these durations take on `places` places at once, each started in order on the first
    place to come free (as Experiment.run's parallel arms are): the time the last one ends."""
    free = [0.0] * max(1, places)
    for duration in seconds:
        first = free.index(min(free))
        free[first] += duration
    return max(free)
