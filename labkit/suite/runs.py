"""A suite run's folder, read: its suite.json, the experiments it stored, the host load during its trials,
and what changed around the engine against another run."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from labkit.analyze import gpu_state
from labkit.errors import BadParameter, DamagedStore
from labkit.store import Results, load, read_record


def suite_meta(run: str | Path) -> dict:
    """The run's suite.json: profile, hardware key, notebooks, overrides and environment."""
    path = Path(run) / "suite.json"
    if not path.exists():
        raise BadParameter(f"{run} is not a suite run (no suite.json): make one with `labkit suite`")
    return read_record(path, "hardware_key", "environment")


def experiments(run: str | Path) -> list[str]:
    """The names of the experiments the run stored."""
    return experiments_under(Path(run) / "results")


def experiments_under(results: str | Path) -> list[str]:
    """The names of the experiments stored in a results folder: its folders with an experiment record or
    arms (arms without a record are a damaged experiment, which `readable` names, not a missing one)."""
    root = Path(results)
    return sorted(p.name for p in root.iterdir()
                  if (p / "experiment.json").exists() or (p / "arms").is_dir()) if root.is_dir() else []


def readable(run: str | Path) -> tuple[dict[str, Results], dict[str, str]]:
    """The run's experiments that can be read, by name, and for each one that cannot, what is wrong with it:
    one damaged experiment leaves the others readable."""
    found, damaged = {}, {}
    for name in experiments(run):
        try:
            found[name] = load(name, Path(run) / "results")
        except DamagedStore as exc:
            damaged[name] = str(exc)
    return found, damaged


HOST_LOAD = "host: other processes' busy cores during trials"


def other_cores(run: str | Path) -> float | None:
    """The mean over the run's trials of the cores kept busy by processes outside the engine (None when no
    trial recorded it: runs made before it was measured)."""
    values = pd.concat([results.trials.get("host_other_cores", pd.Series(dtype=float))
                        for results in readable(run)[0].values()] or [pd.Series(dtype=float)]).dropna()
    return round(float(values.mean()), 1) if len(values) else None


def gpu_figures(run: str | Path) -> dict:
    """The run's GPU clocks and slowed trials over all its experiments (empty where none were sampled)."""
    trials = [results.trials for results in readable(run)[0].values()]
    return gpu_state.run_summary(pd.concat(trials)) if trials else {}


NOTEBOOKS_AT_ONCE = "notebooks at once (--jobs)"


def environment_diff(run: str | Path, baseline: str | Path) -> pd.DataFrame:
    """What changed around the engine: versions, GPU, driver, VLLM_*/NCCL_* variables, launch overrides,
    how many notebooks ran at once, other work on the host when it differs by half a core or more, and the
    GPUs' mean SM clock during the trials when it differs by more than 5 % or either run had trials slowed by heat or the hardware."""
    def flat(meta: dict) -> dict:
        env = meta["environment"]
        out = {k: env.get(k) for k in ("gpus", "driver", "cuda_driver_api", "cpu_model", "cpu_signature", "cpu_count",
                                       "python", "os")}
        out.update({f"package {k}": v for k, v in env.get("packages", {}).items()})
        out.update({f"variable {k}": v for k, v in env.get("tuning_variables", {}).items()})
        out.update({f"launch override {k}": v for k, v in meta.get("overrides", {}).items()})
        out[NOTEBOOKS_AT_ONCE] = meta.get("jobs", 1)  # jobs > 1: arms of two notebooks contended for the host
        return {k: json.dumps(v) if isinstance(v, list) else v for k, v in out.items()}
    a, b = flat(suite_meta(baseline)), flat(suite_meta(run))
    loads = other_cores(baseline), other_cores(run)
    if None not in loads and abs(loads[0] - loads[1]) >= 0.5:
        a[HOST_LOAD], b[HOST_LOAD] = loads
    clocks = gpu_figures(baseline), gpu_figures(run)
    if clocks[0] and clocks[1]:
        key = "mean SM clock (MHz)"
        if abs(clocks[1][key] - clocks[0][key]) > gpu_state.CLOCK_TOLERANCE * clocks[0][key] or \
                clocks[0]["trials slowed by heat or hardware"] or clocks[1]["trials slowed by heat or hardware"]:
            for what in clocks[0]:
                a[f"GPU: {what}"], b[f"GPU: {what}"] = clocks[0][what], clocks[1][what]
    return pd.DataFrame([{"what": k, "baseline": a.get(k), "run": b.get(k)}
                         for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)], columns=["what", "baseline", "run"])
