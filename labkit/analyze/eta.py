"""How long an experiment will take here, from the lab's own records of earlier arms on this machine: each
arm's start (waiting for its worker, the engine's start, ending it: `lifecycle_s`) and its trials' durations.

An engine's start depends on the machine, the vLLM version and whether torch.compile runs, little on the knobs,
so it is read from every earlier arm of this hardware with the same compile mode. A trial's duration depends on
the workload, so it is read from earlier arms that measured the same load (this experiment's own first arms,
or another experiment's with the same workload). Where nothing matches, the estimate says it does not know
rather than guessing.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from labkit.store import spec_hash

START_PHASES = ("waiting_for_imports", "engine_start", "ending")
MOST_RECORDS = 400  # the newest arm records read: enough for a median, few enough to read in a moment


@dataclass
class Record:
    """One earlier arm: its hardware, compile mode, start seconds and trial seconds by load (spec hash)."""

    hardware: str
    eager: bool
    start_s: float | None
    trial_s: dict[str, float] = field(default_factory=dict)


def _eager(engine_args: dict) -> bool:
    return bool(engine_args.get("enforce_eager"))


def workload_key(workload: dict) -> str:
    return spec_hash(workload)


def read_records(roots: list[Path], limit: int = MOST_RECORDS) -> list[Record]:
    """The arm records under results folders (`<experiment>/arms/<arm>/arm.json`), newest first."""
    files = sorted({p for root in roots if Path(root).is_dir() for p in Path(root).glob("*/arms/*/arm.json")},
                   key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
    records = []
    for path in files:
        try:
            meta = json.loads(path.read_text())
            lifecycle = meta["facts"].get("lifecycle_s") or {}
            spec = meta["spec"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged or older record tells nothing about time
        start = sum(lifecycle.get(k, 0.0) for k in START_PHASES) if "engine_start" in lifecycle else None
        records.append(Record(meta.get("environment", {}).get("hardware_key", "?"), _eager(spec.get("engine_args", {})),
                              start, _trial_seconds(path.parent, spec.get("workloads", {}))))
    return records


def _trial_seconds(arm_dir: Path, workloads: dict) -> dict[str, float]:
    """Median trial duration per load (keyed by the load's workload), from the arm's trials table."""
    try:
        import pandas as pd

        trials = pd.read_parquet(arm_dir / "trials.parquet", columns=["load", "duration_s"])
    except Exception:  # noqa: BLE001 - no table (an arm of an older lab) or unreadable: no trial times
        return {}
    return {workload_key(workloads[load]): float(group.duration_s.median())
            for load, group in trials.groupby("load") if load in workloads}


@dataclass
class Estimate:
    """Seconds an arm's start and each of its loads' trials take here, and how many records say so."""

    start_s: float | None
    start_basis: int
    trial_s: dict[str, float | None]  # load name -> seconds per trial (None: no earlier arm measured it)

    def arm_seconds(self, trials: int) -> float | None:
        """One arm's seconds with `trials` trials of every load, or None where a part is unknown."""
        if self.start_s is None or any(v is None for v in self.trial_s.values()):
            return None
        return self.start_s + trials * sum(self.trial_s.values())


def estimate(records: list[Record], hardware: str, eager: bool, loads: dict[str, dict]) -> Estimate:
    """The estimate for an arm of this compile mode measuring these loads (name -> workload dict) here."""
    here = [r for r in records if r.hardware == hardware]
    starts = [r.start_s for r in here if r.eager == eager and r.start_s is not None]
    trial_s = {}
    for name, workload in loads.items():
        key = workload_key(workload)
        seen = [r.trial_s[key] for r in here if key in r.trial_s]
        trial_s[name] = statistics.median(seen) if seen else None
    return Estimate(statistics.median(starts) if starts else None, len(starts), trial_s)


def duration_text(seconds: float) -> str:
    """72 -> '1 min 12 s', 40 -> '40 s'."""
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def expected_total(estimates: list[Estimate], fewest: int, most: int) -> str:
    """A sentence for the expected total of these arms with `fewest`..`most` trials per load."""
    if not estimates:
        return "nothing to run"
    arms = f"{len(estimates)} arm{'s' if len(estimates) != 1 else ''}"
    starts = [e.start_s for e in estimates]
    if any(s is None for s in starts):
        return f"expected time unknown for {arms}: no earlier arm of this compile mode on this machine to go by"
    low, high = (sum(e.arm_seconds(n) or 0.0 for e in estimates) for n in (fewest, most))
    known = all(e.arm_seconds(fewest) is not None for e in estimates)
    count = estimates[0].start_basis
    basis = (f"engine start ~{duration_text(statistics.median(starts))} from {count} earlier "
             f"arm{'s' * (count != 1)} here")
    if not known:
        return (f"expected at least {duration_text(sum(starts))} for {arms} ({basis}; the trials' time is known "
                "once the first arm has measured them)")
    span = duration_text(low) if round(low) == round(high) else f"{duration_text(low)} to {duration_text(high)}"
    return f"expected {span} for {arms} ({basis})"
