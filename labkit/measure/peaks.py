"""This machine's peaks for the roofline. `measure_device_peaks` measures them with torch (a device-to-device
copy for memory bandwidth, dense bf16 and, from compute capability 8.9, fp8 GEMMs for the FLOP rate) and
`record_peaks` keeps them per device, so every later roofline of that hardware uses them; `detect_peaks`
answers with the recorded ones, else a GPU's datasheet figures, else a quick NumPy measurement of the CPU
(a large array copy and one thread's fp32 matmul times the cores): honest, but below what vLLM's own kernels
can reach."""
from __future__ import annotations

import datetime
import functools
import os
import subprocess
import sys
import time

import numpy as np

from labkit import settings
from labkit.spec.capabilities import FP8_MIN, capability_tuple
from labkit.analyze.roofline import Peaks, gpu_peaks, measured_peaks
from labkit.files import write_json_atomic
from labkit.measure.environment import cpu_model, hardware_key
from labkit.measure.platform import current_platform
from labkit.spec.numbers import COUNT, COUNT_OR_ZERO, POSITIVE, check_numbers


# One thread's fp32 GEMM rate, timed in a process of its own so that its BLAS runs one thread (the variables are
# read when the library loads, and this process's copy is loaded already)
_ONE_THREAD_GEMM = """
import time
import numpy as np
a = np.ones(({n}, {n}), np.float32)
a @ a
best = float("inf")
for _ in range({repeats}):
    t = time.perf_counter()
    a @ a
    best = min(best, time.perf_counter() - t)
print(2 * {n} ** 3 / best / 1e12)
"""
_ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@functools.lru_cache(maxsize=1)
def measure_cpu_peaks(size_mib: int = 256, repeats: int = 3) -> Peaks:
    """Best-of-N array copy (read + write bytes) and fp32 matmul on this CPU. The FLOP rate is one thread's
    times the cores this process may use: a threaded matmul slows down by whatever else keeps any core busy
    (0.036-0.127 TFLOP/s on this 2-core machine as other work came and went), and a peak measured low puts the
    floors it gives above what the engine does; one thread finds a free core wherever one is (0.10-0.12 TFLOP/s
    a thread, with and without a busy loop beside it)."""
    check_numbers("measure_cpu_peaks", {"size_mib": (size_mib, COUNT), "repeats": (repeats, COUNT)})
    src = np.ones(size_mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    bw = 2 * src.nbytes / best / 1e9
    one_thread = subprocess.run([sys.executable, "-c", _ONE_THREAD_GEMM.format(n=1024, repeats=max(repeats, 5))],
                                env={**os.environ, **_ONE_THREAD}, capture_output=True, text=True, timeout=120,
                                check=True)
    tflops = float(one_thread.stdout) * len(os.sched_getaffinity(0))
    return Peaks(cpu_model(), round(bw, 1), round(tflops, 3), "measured with NumPy")


def detect_peaks(mem_bw_gbs: float | None = None, tflops: float | None = None) -> Peaks:
    """Peaks of the first GPU (or the CPU): recorded measurements first, then the datasheet, then a quick
    NumPy measurement of the CPU; pass both numbers to override."""
    check_numbers("detect_peaks", {"mem_bw_gbs": (mem_bw_gbs, dict(POSITIVE, allow_none=True)),
                                   "tflops": (tflops, dict(POSITIVE, allow_none=True))})
    if mem_bw_gbs and tflops:
        return Peaks("given", mem_bw_gbs, tflops, "given")
    platform = current_platform()
    device = platform.gpu_names[0] if platform.gpu_names else cpu_model()
    found = measured_peaks(device) or (gpu_peaks(device) if platform.gpu_names else None)
    found = found or measure_cpu_peaks()
    return Peaks(found.device, mem_bw_gbs or found.mem_bw_gbs, tflops or found.tflops,
                 found.source if not (mem_bw_gbs or tflops) else found.source + " (partly given)")


def _best_seconds(run, sync, repeats: int, inner: int) -> float:
    """The fastest of `repeats` timings of `inner` back-to-back calls, per call (after one warm-up call)."""
    run()
    sync()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        best = min(best, (time.perf_counter() - started) / inner)
    return best


def measure_device_peaks(copy_mib: int | None = None, gemm_n: int | None = None, repeats: int = 5) -> dict:
    """This machine's first GPU (or its CPU) measured with torch: memory bandwidth from a device-to-device copy
    (bytes read + written), dense GEMM rates in bf16 and, where the GPU has fp8 tensor cores, fp8 (e4m3 inputs,
    bf16 output, torch._scaled_mm). On a CPU also fp32, the rate torch reaches with all its threads. Sizes
    default to what saturates each: 2 GiB and n=8192 on a GPU, 256 MiB and n=1024 on a CPU (None or 0)."""
    check_numbers("measure_device_peaks", {"copy_mib": (copy_mib, dict(COUNT_OR_ZERO, allow_none=True)),
                                           "gemm_n": (gemm_n, dict(COUNT_OR_ZERO, allow_none=True)),
                                           "repeats": (repeats, COUNT)})
    import torch

    platform = current_platform()
    on_gpu = platform.kind == "cuda" and torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    copy_mib = copy_mib or (2048 if on_gpu else 256)
    n = gemm_n or (8192 if on_gpu else 1024)
    inner = 10 if on_gpu else 1
    record = {"device": torch.cuda.get_device_name(0) if on_gpu else cpu_model(), "kind": "cuda" if on_gpu else "cpu",
              "hardware_key": hardware_key(), "torch": torch.__version__,
              "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if on_gpu:
        major, minor = torch.cuda.get_device_capability(0)
        record["compute_capability"] = f"{major}.{minor}"

    src = torch.empty(copy_mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), sync, repeats, inner)
    record["mem_bw_gbs"] = round(2 * src.numel() / seconds / 1e9, 1)

    def gemm_rate(dtype) -> float:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        return round(2 * n**3 / _best_seconds(lambda: a @ b, sync, repeats, inner) / 1e12, 3)

    record["tflops_bf16"] = gemm_rate(torch.bfloat16)
    if not on_gpu:
        record["tflops_fp32"] = gemm_rate(torch.float32)
    record["tflops_fp8"], record["fp8_why_not"] = None, fp8_problem(record.get("compute_capability"))
    if record["fp8_why_not"] is None:
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device=device)
        seconds = _best_seconds(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                sync, repeats, inner)
        record["tflops_fp8"] = round(2 * n**3 / seconds / 1e12, 3)
    datasheet = gpu_peaks(record["device"]) if on_gpu else None
    record["datasheet"] = {"mem_bw_gbs": datasheet.mem_bw_gbs, "tflops_bf16": datasheet.tflops} if datasheet else None
    record["method"] = (f"torch {device.type} copy of {copy_mib} MiB and {n}x{n} GEMMs, best of {repeats}"
                        + (f" x {inner}" if inner > 1 else ""))
    return record


def fp8_problem(compute_capability: str | None) -> str | None:
    """Why this device cannot run fp8 GEMMs, or None when it can (compute capability 8.9 or newer)."""
    if compute_capability is None:
        return "a CPU: vLLM's fp8 paths need an NVIDIA GPU of compute capability 8.9 or newer"
    if capability_tuple(compute_capability) < FP8_MIN:
        return f"compute capability {compute_capability}: fp8 tensor cores start at 8.9 (Ada, Hopper)"
    return None


def record_peaks(record: dict) -> str:
    """Keep a measurement as this hardware's peaks (data/peaks/<hardware key>.json, replaced atomically):
    later rooflines of results from this device use it. Returns the file's path."""
    path = settings.current().peaks_dir / f"{record['hardware_key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return str(path)
