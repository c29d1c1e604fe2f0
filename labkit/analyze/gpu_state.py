"""The GPUs' clocks, temperature, power and slowdowns during the trials (labkit.measure.gpu_state), per arm,
and the cautions a verdict carries when two arms did not run at the same clocks or a trial was slowed by heat or
the hardware: such a difference measures the machine as well as the configuration."""
from __future__ import annotations

import pandas as pd

COLUMNS = ["gpu_sm_clock_mhz", "gpu_sm_clock_min_mhz", "gpu_mem_clock_mhz", "gpu_temp_max_c", "gpu_power_mean_w"]
CLOCK_TOLERANCE = 0.05  # mean SM clocks further apart than this are named; boost clocks wander by a few %
# The power cap is how the GPU runs under load, not a fault of the machine: on the H200 every trial of every
# arm met it (prefill-heavy loads for 92-98 % of their samples, at SM clocks 13-20 % below decode's), so
# naming it made a caution of every verdict. Its effect is the lower clock, which the clock rule names when
# two arms differ. Heat and the hardware's own slowdowns are the machine moving: named whenever they occur.
UNDER_LOAD = {"software power cap"}


def _names(slowdown) -> set[str]:
    """The slowdowns one trial recorded (a comma-separated text, or nothing)."""
    return {n for n in slowdown.split(", ") if n} if isinstance(slowdown, str) else set()


def _drift(slowdown) -> set[str]:
    """The slowdowns among one trial's recorded ones that say the machine moved (not the power cap)."""
    return _names(slowdown) - UNDER_LOAD


def sampled(trials: pd.DataFrame) -> bool:
    return "gpu_sm_clock_mhz" in trials and trials.gpu_sm_clock_mhz.notna().any()


def state_by_arm(results) -> pd.DataFrame:
    """Per arm and load: the mean of each trial's GPU figures, the lowest SM clock seen, the hottest moment and
    how many trials the driver slowed (and why). Empty where no GPU state was sampled (a CPU, no NVML)."""
    t = results.trials
    if not sampled(t):
        return pd.DataFrame(columns=["arm", "load", *COLUMNS, "slowed_trials", "slowdowns"])
    slowed = t.gpu_slowdown.fillna("").astype(bool)
    table = t.assign(slowed=slowed).groupby(["arm", "load"], sort=False).agg(
        gpu_sm_clock_mhz=("gpu_sm_clock_mhz", "mean"), gpu_sm_clock_min_mhz=("gpu_sm_clock_min_mhz", "min"),
        gpu_mem_clock_mhz=("gpu_mem_clock_mhz", "mean"), gpu_temp_max_c=("gpu_temp_max_c", "max"),
        gpu_power_mean_w=("gpu_power_mean_w", "mean"), slowed_trials=("slowed", "sum"),
        slowdowns=("gpu_slowdown", lambda s: ", ".join(sorted(set().union(*s.map(_names))))))
    if "gpu_slowdown_samples_pct" in t:  # recorded since 2026-12-02: how much of the trials the slowdowns held
        table["slowdown_samples_pct"] = t.groupby(["arm", "load"], sort=False).gpu_slowdown_samples_pct.mean()
    return table.reset_index()


def caution(trials: pd.DataFrame, baseline_arm: str, arm: str) -> str | None:
    """Why a comparison of `arm` with `baseline_arm` (trials of one load) may hold the machine's drift: trials
    slowed by heat or the hardware, or mean SM clocks more than 5 % apart (the power cap shows there). None when
    the clocks agree or were not sampled."""
    if not sampled(trials):
        return None
    notes = []
    for name in (baseline_arm, arm):
        mine = trials[trials.arm == name]
        drift = mine.gpu_slowdown.map(_drift)
        slowed = drift.astype(bool)
        if slowed.any():
            why = ", ".join(sorted(set().union(*drift)))
            notes.append(f"{name}: {int(slowed.sum())} of {len(mine)} trials slowed by the driver ({why})")
    clocks = [trials.loc[trials.arm == name, "gpu_sm_clock_mhz"].mean() for name in (baseline_arm, arm)]
    if all(pd.notna(clocks)) and abs(clocks[1] - clocks[0]) > CLOCK_TOLERANCE * clocks[0]:
        notes.append(f"SM clock {clocks[0]:.0f} MHz ({baseline_arm}) against {clocks[1]:.0f} MHz ({arm})")
    return "; ".join(notes) or None


def run_summary(trials: pd.DataFrame) -> dict:
    """A whole run's GPU figures, for comparing two runs: mean SM clock and the number of trials slowed by heat
    or the hardware (the power cap is left to the clock)."""
    if not sampled(trials):
        return {}
    return {"mean SM clock (MHz)": round(float(trials.gpu_sm_clock_mhz.mean())),
            "trials slowed by heat or hardware": int(trials.gpu_slowdown.map(_drift).astype(bool).sum())}
