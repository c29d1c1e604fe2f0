"""GPU state during trials: NVML's answers turned into trial columns, and the cautions a verdict carries when
clocks differ or a trial throttled. NVML is a stand-in module here (no GPU on this machine)."""
import sys
import time
import types

import pandas as pd

from labkit.analyze import gpu_state as analysis
from labkit.analyze import stats
from labkit.measure import gpu, gpu_state


def fake_nvml(monkeypatch, clocks, reasons=0, fail_reads=False):
    """A stand-in for nvidia-ml-py whose SM clock walks through `clocks` (one value per read)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
    reads = iter(clocks)
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    nvml.nvmlDeviceGetUUID = lambda h: b"GPU-aaaa"

    def clock(handle, which):
        if fail_reads:
            raise RuntimeError("not supported")
        return next(reads, clocks[-1]) if which == nvml.NVML_CLOCK_SM else 3201

    nvml.nvmlDeviceGetClockInfo = clock
    nvml.nvmlDeviceGetTemperature = lambda h, kind: 61
    nvml.nvmlDeviceGetPowerUsage = lambda h: 450_000
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reasons
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu, "has_driver", lambda: True)


def columns_sample():
    return {"sm_mhz": 1980, "mem_mhz": 3201, "temp_c": 60, "power_w": 400.0, "reasons": 0}


def test_a_trial_gets_the_clocks_temperature_power_and_slowdowns_nvml_reported(monkeypatch):
    fake_nvml(monkeypatch, [1980, 1700, 1980], reasons=0x1 | 0x20)  # idle is normal, thermal is not
    sampler = gpu_state.GpuStateSampler(interval=0.01)
    assert sampler.available and not sampler.why_not
    sampler.start()
    time.sleep(0.1)
    columns = sampler.stop()
    assert columns["gpu_sm_clock_min_mhz"] == 1700 and 1700 < columns["gpu_sm_clock_mhz"] < 1980
    assert columns["gpu_mem_clock_mhz"] == 3201 and columns["gpu_temp_max_c"] == 61
    assert columns["gpu_power_mean_w"] == 450.0
    assert columns["gpu_slowdown"] == "software thermal slowdown"
    assert columns["gpu_slowdown_samples_pct"] == 100.0  # every sample held it
    samples = [{**columns_sample(), "reasons": r} for r in (0x4, 0, 0x1, 0)]
    assert gpu_state.summarize(samples)["gpu_slowdown_samples_pct"] == 25.0  # idle is no slowdown


def test_without_nvml_nothing_is_sampled_and_the_reason_is_kept(monkeypatch):
    monkeypatch.setattr(gpu, "has_driver", lambda: False)
    sampler = gpu_state.GpuStateSampler()
    assert not sampler.available and "no NVIDIA driver" in sampler.why_not
    assert sampler.start().stop() == {}


def test_a_driver_that_cannot_read_clocks_is_reported_not_raised(monkeypatch):
    fake_nvml(monkeypatch, [1980], fail_reads=True)
    sampler = gpu_state.GpuStateSampler()
    assert not sampler.available and "could not read the GPU state" in sampler.why_not
    assert sampler.start().stop() == {}


def trials(clocks_a, clocks_b, slowed_b=""):
    rows = [{"arm": "default", "load": "c8", "trial": i, "gpu_sm_clock_mhz": c, "gpu_sm_clock_min_mhz": c - 10,
             "gpu_mem_clock_mhz": 3201, "gpu_temp_max_c": 60, "gpu_power_mean_w": 400, "gpu_slowdown": "",
             "output_tok_s": 100 + i} for i, c in enumerate(clocks_a)]
    rows += [{"arm": "eager", "load": "c8", "trial": i, "gpu_sm_clock_mhz": c, "gpu_sm_clock_min_mhz": c - 10,
              "gpu_mem_clock_mhz": 3201, "gpu_temp_max_c": 83, "gpu_power_mean_w": 700,
              "gpu_slowdown": slowed_b if i == 0 else "", "output_tok_s": 80 + i} for i, c in enumerate(clocks_b)]
    return pd.DataFrame(rows)


def test_clocks_apart_or_a_slowed_trial_are_named_and_agreeing_clocks_are_not():
    assert analysis.caution(trials([1980, 1975], [1970, 1980]), "default", "eager") is None
    apart = analysis.caution(trials([1980, 1980], [1600, 1650]), "default", "eager")
    assert "1980 MHz (default) against 1625 MHz (eager)" in apart
    slowed = analysis.caution(trials([1980, 1980], [1980, 1980], "hardware thermal slowdown"), "default", "eager")
    assert slowed == "eager: 1 of 2 trials slowed by the driver (hardware thermal slowdown)"
    on_a_cpu = trials([1980], [1980]).filter(["arm", "load", "trial", "output_tok_s"])
    assert analysis.caution(on_a_cpu, "default", "eager") is None


def test_the_power_cap_alone_is_how_the_gpu_runs_under_load_and_shows_through_the_clock():
    capped = trials([1980, 1975], [1970, 1980], "software power cap")
    assert analysis.caution(capped, "default", "eager") is None
    assert analysis.run_summary(capped)["trials slowed by heat or hardware"] == 0
    both = analysis.caution(trials([1980, 1980], [1980, 1980], "software power cap, software thermal slowdown"),
                            "default", "eager")
    assert both == "eager: 1 of 2 trials slowed by the driver (software thermal slowdown)"
    clocked_down = analysis.caution(trials([1980, 1980], [1690, 1690], "software power cap"), "default", "eager")
    assert clocked_down == "SM clock 1980 MHz (default) against 1690 MHz (eager)"


def test_the_per_arm_table_counts_slowed_trials():
    class Results:
        pass
    r = Results()
    r.trials = trials([1980, 1960], [1600, 1700], "software power cap")
    table = analysis.state_by_arm(r).set_index("arm")
    assert table.loc["eager", "slowed_trials"] == 1 and table.loc["eager", "slowdowns"] == "software power cap"
    assert table.loc["default", "gpu_sm_clock_mhz"] == 1970 and table.loc["eager", "gpu_temp_max_c"] == 83
    r.trials = r.trials.assign(gpu_slowdown_samples_pct=[0, 0, 90, 10])  # recorded since 2026-12-02
    assert analysis.state_by_arm(r).set_index("arm").loc["eager", "slowdown_samples_pct"] == 50


def test_a_verdict_on_arms_at_different_clocks_carries_the_caution():
    record = pd.DataFrame([{"load": "c8", "arm": "eager", "metric": "output_tok_s", "verdict": "worse",
                            "caution": "SM clock 1980 MHz (default) against 1625 MHz (eager)"}])
    line = stats.conclusion(record, "default")
    assert line.startswith("eager is worse on output_tok_s") and "caution, the machine moved too: SM clock" in line
