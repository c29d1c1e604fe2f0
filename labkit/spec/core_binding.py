"""vLLM's own variable for where a CPU engine's threads run, and the cores a value of it names (read by the
measuring side, which places engines, and by the analysis, which counts the outside load on their cores)."""
from __future__ import annotations

BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM's own: the cores a CPU engine's threads run on


def bound_cores(bind: str | None) -> set[int] | None:
    """The cores a VLLM_CPU_OMP_THREADS_BIND value names ("0-3,5|6-7": every rank's), or None where it names
    none (unset, "auto", "nobind", "all")."""
    if not bind or not bind[0].isdigit():
        return None
    cores = set()
    for part in bind.replace("|", ",").split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores
