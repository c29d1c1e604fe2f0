"""This machine's peaks for the roofline: a GPU's from the datasheet table, a CPU's measured here with NumPy
(a large array copy and an fp32 matmul): honest, but below what vLLM's own kernels can reach."""
from __future__ import annotations

import functools
import time

import numpy as np

from labkit.analyze.roofline import Peaks, gpu_peaks
from labkit.measure.environment import cpu_model
from labkit.measure.platform import current_platform


@functools.lru_cache(maxsize=1)
def measure_cpu_peaks(size_mib: int = 256, repeats: int = 3) -> Peaks:
    """Best-of-N array copy (read + write bytes) and fp32 matmul on this CPU."""
    src = np.ones(size_mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    bw = 2 * src.nbytes / best / 1e9
    n = 1024
    a = np.ones((n, n), np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return Peaks(cpu_model(), round(bw, 1), round(2 * n**3 / best / 1e12, 3), "measured with NumPy")


def detect_peaks(mem_bw_gbs: float | None = None, tflops: float | None = None) -> Peaks:
    """Peaks of the first GPU (or the CPU); pass both numbers to override."""
    if mem_bw_gbs and tflops:
        return Peaks("given", mem_bw_gbs, tflops, "given")
    platform = current_platform()
    found = gpu_peaks(platform.gpu_names[0]) if platform.gpu_names else None
    found = found or measure_cpu_peaks()
    return Peaks(found.device, mem_bw_gbs or found.mem_bw_gbs, tflops or found.tflops,
                 found.source if not (mem_bw_gbs or tflops) else found.source + " (partly given)")
