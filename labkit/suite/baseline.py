"""Baselines per hardware and regression verdicts: did anything change by more than the threshold?

A change counts only when its whole 95 % interval lies beyond the threshold (default 5 %): a regression
or an improvement; anything else is "no detectable change" at this noise.

One run's trials hold only the noise within one engine. Between engine starts and between machines of
the same kind an arm can move much more (on the H200, an eager engine's throughput differed 2.2x
between two runs of the same launch), so a baseline can hold replicates: further runs of the same
configuration. With two or more, an arm's interval also holds the 95 % prediction interval of a new run
from the replicates' spread, and only a change beyond what the baseline itself varied by counts.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from labkit import settings
from labkit.errors import BadParameter, DamagedStore, StoreConflict
from labkit.analyze import stats
from labkit.analyze.stats import VERDICT_METRICS, compare_groups, groups, metric, point, t_quantile
from labkit.analyze.stats import verdict as stats_verdict
from labkit.store import ExperimentStore, check_name, read_record, spec_hash
from labkit.files import write_json_atomic
from labkit.spec.numbers import NON_NEGATIVE, check_numbers
from labkit.suite.runs import readable, suite_meta

_VERDICT = {stats.WORSE: "regression", stats.BETTER: "improvement", stats.NO_DIFFERENCE: "no detectable change",
            stats.TOO_FEW: "too few trials to judge", stats.TOO_NOISY: stats.TOO_NOISY}
DAMAGED = "damaged: not judged"  # a stored file that cannot be read: named in the row's note


def pin(run: str | Path, root: Path | None = None, replicate: bool = False) -> Path:
    """Copy a suite run into data/baselines/<hardware>/ and make it the pinned baseline there, or with
    `replicate` add it to the pinned baseline as one more run of the same configuration."""
    run = Path(run)
    meta = suite_meta(run)
    hardware = meta["hardware_key"]
    try:  # read from the run's own files: it must not lead the copy out of the baselines folder
        check_name(hardware, "hardware")
        check_name(run.resolve().name, "run")
    except BadParameter as exc:
        raise DamagedStore(f"{run / 'suite.json'}: {exc}; a baseline is pinned only under "
                           f"{root or settings.current().baselines_dir}/<hardware>/<run>") from None
    root = Path(root or settings.current().baselines_dir)
    target = root / hardware / run.resolve().name
    if target.exists():
        raise StoreConflict(f"{target} exists already; baselines are never overwritten")
    if replicate:
        if pinned(hardware, root) is None:
            raise BadParameter(f"no baseline is pinned for {hardware}: pin one first with `labkit baseline RUN`")
        if meta.get("overrides"):
            raise BadParameter(f"{run} ran with launch overrides {meta['overrides']}: a replicate measures how much "
                               "the baseline's own configuration varies, so run it without --override")
    shutil.copytree(run, target, ignore=shutil.ignore_patterns(".work", ".lock", "*.tmp"))
    runs = ([path.name for path in baseline_runs(hardware, root)] if replicate else []) + [run.name]
    write_json_atomic(root / hardware / "pinned.json", {"run": runs[0], "replicates": runs[1:]})
    return target


def baseline_runs(hardware: str, root: Path | None = None) -> list[Path]:
    """The pinned baseline run of this hardware, then its replicates (empty when none is pinned)."""
    root = Path(root or settings.current().baselines_dir)
    pointer = root / hardware / "pinned.json"
    if not pointer.exists():
        return []
    names = read_record(pointer, "run")
    runs = [names["run"], *names.get("replicates", [])]
    for name in runs:  # a name read from disk must not lead outside the hardware's folder
        try:
            check_name(name, "baseline run")
        except BadParameter:
            raise DamagedStore(f"{pointer} names {name!r}, which is not a run folder of {root / hardware}") from None
    return [root / hardware / name for name in runs]


def pinned(hardware: str, root: Path | None = None) -> Path | None:
    """The pinned baseline run of this hardware, or None when none is pinned."""
    runs = baseline_runs(hardware, root)
    return runs[0] if runs else None


def compare_runs(run: str | Path, baseline: str | Path | list, threshold: float = 0.05,
                 metrics: list[str] | None = None) -> pd.DataFrame:
    """Per experiment, load, arm and metric: the relative change against the baseline and a verdict.
    `baseline` is one suite run, or a list: the pinned run, then its replicates."""
    check_numbers("compare_runs", {"threshold": (threshold, NON_NEGATIVE)})  # before any file is read
    references = [Path(b) for b in (baseline if isinstance(baseline, (list, tuple)) else [baseline])]
    here = suite_meta(run)
    for reference in references:
        if (hardware := suite_meta(reference)["hardware_key"]) != here["hardware_key"]:
            raise BadParameter(f"the baseline {reference} was measured on {hardware} and this run on "
                               f"{here['hardware_key']}: compare a run only with a baseline of the same hardware")
    baseline, replicas = references[0], references[1:]
    rows = []
    (now_all, now_damaged), (base_all, base_damaged) = readable(run), readable(baseline)
    replica_all = [(r, *readable(r)) for r in replicas]
    for name in sorted(set(now_all) | set(now_damaged) | set(base_all) | set(base_damaged)):
        # a file that cannot be read is named, never judged: it would read as a regression or as new
        unreadable = [(side, damaged[name]) for side, damaged in
                      [("this run", now_damaged), ("the baseline", base_damaged)]
                      + [(f"replicate {r.name}", damaged) for r, _, damaged in replica_all] if name in damaged]
        if unreadable:
            rows += [{"experiment": name, "verdict": DAMAGED, "note": f"{side}: {why}"} for side, why in unreadable]
            continue
        if name not in now_all or name not in base_all:
            rows.append({"experiment": name, "verdict": "missing in this run" if name not in now_all
                         else "new: no baseline"})
            continue
        now, base = now_all[name], base_all[name]
        damaged_arms = set()
        for side, results in (("this run", now), ("the baseline", base)):
            for arm in results.arms[results.arms.status == "damaged"].itertuples():
                damaged_arms.add(arm.arm)
                rows.append({"experiment": name, "arm": arm.arm, "verdict": DAMAGED, "note": f"{side}: {arm.cause}"})
        if not base.complete_arms and not damaged_arms:
            rows.append({"experiment": name, "verdict": "new: no baseline", "note": "no arm completed in the baseline"})
        for arm in base.complete_arms:
            if arm not in now.complete_arms and arm not in damaged_arms:
                rows.append({"experiment": name, "arm": arm, "verdict": "regression",
                             "note": "complete in the baseline, not in this run"})
        now_loads = dict(now.per_load())
        replica_loads = [(r, dict(found[name].per_load())) for r, found, _ in replica_all if name in found]
        for load_name, b in base.per_load():
            n = now_loads.get(load_name)
            if n is None:
                rows.append({"experiment": name, "load": load_name, "verdict": "missing in this run"})
                continue
            for arm in sorted(set(b.complete_arms) & set(n.complete_arms)):
                # a load search probes each arm at the levels its own answers lead to: an arm measured at a
                # load on one side only is named, not judged (a regression would be a search's choice)
                in_baseline, in_run = measured_at(b, arm), measured_at(n, arm)
                if in_baseline != in_run:
                    rows.append({"experiment": name, "load": load_name, "arm": arm,
                                 "verdict": "missing in this run" if in_baseline else "new: no baseline",
                                 "note": "measured at this load on one side only (an arm's own load search)"})
                if not (in_baseline and in_run):
                    continue
                launch = _launch(baseline, name, arm)
                configuration = "same" if _launch(run, name, arm) == launch else "changed"
                # a replicate counts for an arm only when it launched that arm exactly as the pinned run did
                peers = [b] + [loads[load_name] for r, loads in replica_loads if load_name in loads
                               and measured_at(loads[load_name], arm) and _launch(r, name, arm) == launch]
                trials = min(x.trials[x.trials.arm == arm].trial.nunique() for x in (b, n))
                note = (f"{trials} trial: the interval holds the noise within one engine, not between engine "
                        "starts" if trials < 2 and len(peers) < 2 else None)
                for name_m in metrics or VERDICT_METRICS:
                    m = metric(name_m)
                    row = _judge([groups(p, arm, m) for p in peers], groups(n, arm, m), m, threshold)
                    rows.append({"experiment": name, "load": load_name, "arm": arm, "configuration": configuration,
                                 "metric": name_m, **row, "baseline_runs": len(peers), "note": note})
    columns = ["experiment", "load", "arm", "configuration", "metric", "baseline", "run", "change", "ci_low", "ci_high",
               "verdict", "baseline_runs", "note"]
    table = pd.DataFrame(rows).reindex(columns=columns)
    table.attrs["baselines"] = [str(r) for r in references]
    return table


def measured_at(load_results, arm: str) -> bool:
    """Whether the arm has trials in one load's part of the results (complete arms need not: a load search
    measures each arm at its own levels)."""
    return bool((load_results.trials.arm == arm).any())


def _judge(runs: list[list[np.ndarray]], candidate: list[np.ndarray], m, threshold: float) -> dict:
    """The change of the candidate against the baseline runs' pooled values. Its interval is the bootstrap
    interval of the trials, widened, when there are replicates, to the 95 % prediction interval of one more
    run from the spread of the runs' own values: no narrower than the noise the baseline showed itself."""
    pooled = [np.concatenate([g for data in runs for g in data])] if m.level == "trial" else [g for data in runs for g in data]
    c = compare_groups(pooled, candidate, m, threshold)
    low, high, judged = c.ci_low, c.ci_high, _VERDICT[c.verdict]
    values = [point(data, m) for data in runs]
    if len(values) > 1 and c.baseline:
        half = t_quantile(len(values) - 1) * float(np.std(values, ddof=1)) * np.sqrt(1 + 1 / len(values)) / c.baseline
        # every metric is a positive quantity: no change is below -100 %, however wide the band
        low, high = max(-1.0, np.nanmin([low, c.rel_change - half])), np.nanmax([high, c.rel_change + half])
        judged = _VERDICT[stats_verdict(low, high, m, threshold)]
    return {"baseline": c.baseline, "run": c.candidate, "change": c.rel_change, "ci_low": low, "ci_high": high,
            "verdict": judged}


def _launch(run: str | Path, experiment: str, arm: str) -> str:
    """The hash of the spec an arm was launched with (knobs with overrides merged in, engine arguments,
    model, workloads, protocol): the rule the store resumes by, so "same" means what resuming means."""
    return spec_hash(ExperimentStore(experiment, Path(run) / "results").completed_spec(arm))


def caution(comparison: pd.DataFrame) -> str | None:
    """Control arms that moved. When a run changed some arms' launch configuration (an --override, a new
    default), an arm launched exactly as in the baseline should not move; if it did, the machine moved
    between the runs too (another job on the host, clocks, a driver), and the changed arms' verdicts hold
    that drift as well as the change."""
    if "configuration" not in comparison or not (comparison.configuration == "changed").any():
        return None
    moved = comparison[(comparison.configuration == "same") & comparison.verdict.isin(["regression", "improvement"])]
    if moved.empty:
        return None
    arms = ", ".join(sorted({f"{r.experiment}/{r.arm}" for r in moved.itertuples()}))
    return (f"{len(moved)} verdicts on arms launched exactly as in the baseline ({arms}): the machine moved "
            "between the runs as well as the configuration, so the changed arms' verdicts hold both; rerun "
            "both sides on a quiet machine before reading them as the change's effect")
