"""The GPUs' state while a trial runs: SM and memory clocks, temperature, power and the driver's reasons for
holding the clocks down, sampled through NVML in a background thread and summarised per trial.

Benchmark discipline asks for the same clocks on both sides of a comparison: a GPU that throttles for heat
or power in one arm's trials measures the cooling, not the configuration. Without NVML (no driver, no
nvidia-ml-py) nothing is sampled and the reason is kept, so the run goes on and says so.
"""
from __future__ import annotations

import os
import threading

from labkit.measure.gpu import nvml, visible_gpus

# NVML's clock-event (throttle) reasons that slow a measurement down. "GPU idle" and the application or
# display clock settings are the driver's normal states, not a slowdown the measurement suffered.
SLOWDOWNS = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
             0x40: "hardware thermal slowdown", 0x80: "hardware power brake", 0x10: "sync boost"}


SLOWDOWN_BITS = sum(SLOWDOWNS)


def _read(pynvml, handle) -> dict:
    reasons_of = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "reasons": int(reasons_of(handle))}


def summarize(samples: list[dict]) -> dict:
    """A trial's columns from its samples (all GPUs pooled: a tensor-parallel step waits for the slowest)."""
    if not samples:
        return {}
    sm = [s["sm_mhz"] for s in samples]
    reasons = 0
    for s in samples:
        reasons |= s["reasons"]
    return {"gpu_sm_clock_mhz": sum(sm) / len(sm), "gpu_sm_clock_min_mhz": min(sm),
            "gpu_mem_clock_mhz": sum(s["mem_mhz"] for s in samples) / len(samples),
            "gpu_temp_max_c": max(s["temp_c"] for s in samples),
            "gpu_power_mean_w": sum(s["power_w"] for s in samples) / len(samples),
            "gpu_slowdown": slowdown_names(reasons),
            # how much of the trial the slowdown held: one sample's power-cap bit and a trial spent under the
            # cap read alike in the bitmask (seen on the H200: every trial "power capped", one arm at a mean 1,978 MHz and 198 W)
            "gpu_slowdown_samples_pct": 100 * sum(bool(s["reasons"] & SLOWDOWN_BITS) for s in samples) / len(samples)}


def slowdown_names(reasons: int) -> str:
    """The slowdowns in an NVML reasons bitmask, comma-separated; "" when the clocks were free."""
    return ", ".join(name for bit, name in sorted(SLOWDOWNS.items()) if reasons & bit)


class GpuStateSampler:
    """Samples the GPUs this process may use every `interval` seconds between start() and stop().
    `available` is False (and `why_not` says why) where NVML cannot answer; stop() then returns {}."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml, self.why_not = nvml()
        self._handles = []
        if self._pynvml is not None:
            try:
                rows = [(str(i), self._uuid(i)) for i in range(self._pynvml.nvmlDeviceGetCount())]
                chosen = visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
                self._handles = [self._pynvml.nvmlDeviceGetHandleByIndex(int(i)) for i, _ in chosen]
                for handle in self._handles[:1]:  # one read now: a driver lacking a query fails here, not mid-trial
                    _read(self._pynvml, handle)
            except Exception as exc:  # an old driver without one of the queries: say so, sample nothing
                self._handles, self.why_not = [], f"NVML could not read the GPU state: {exc}"
            if not self._handles and not self.why_not:
                self.why_not = "NVML sees no GPU this process may use"

    def _uuid(self, index: int) -> str:
        uuid = self._pynvml.nvmlDeviceGetUUID(self._pynvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def start(self) -> "GpuStateSampler":
        if self.available:
            self.samples, self._stop = [], threading.Event()
            self._thread = threading.Thread(target=self._run, name="labkit-gpu-state", daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            for handle in self._handles:
                try:
                    self.samples.append(_read(self._pynvml, handle))
                except Exception:  # one failed read loses one sample, not the trial
                    pass
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        """The trial's summary columns (empty without NVML)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return summarize(self.samples)
