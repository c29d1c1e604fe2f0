"""What a machine runs vLLM on, as plain data (found by labkit.measure.platform), and what follows from it
for a launch without asking the machine again."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    """What this machine runs vLLM on: the kind (cuda or cpu), the installed vLLM version and the GPUs' names."""

    kind: str  # "cuda" or "cpu"
    vllm_version: tuple[int, ...] | None
    gpu_names: tuple[str, ...] = ()
    compute_capability: str | None = None  # the first GPU's, such as "9.0"; None on a CPU or where unknown
    # the CPU's instruction sets vLLM's CPU backend chooses kernels by (of CPU_FEATURES); None where unread
    cpu_features: tuple[str, ...] | None = None
    numa_nodes: int = 1  # vLLM's CPU backend places one tensor-parallel rank on each by default

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


# vLLM's CPU attention picks its kernels by these (vllm/v1/attention/backends/cpu_attn.py): an fp8 KV cache
# needs AVX-512 or AMX there, and the engine fails at its start without them
CPU_FEATURES = ("avx512f", "amx_tile")


def cpu_ranks_problem(ranks: int, bind: str = "auto", nodes: int = 1) -> str | None:
    """Why `ranks` CPU workers (tensor parallelism on CPU) cannot be placed on `nodes` NUMA nodes, or None. vLLM's
    CPU backend binds each rank to a NUMA node of its own (VLLM_CPU_OMP_THREADS_BIND=auto, `bind`), to the core
    groups the variable lists, one per rank ('0-3|4-7'), or to nothing ('nobind')."""
    if bind == "nobind":
        return None
    if bind != "auto":
        groups = len(bind.split("|"))
        return None if groups == ranks else (
            f"VLLM_CPU_OMP_THREADS_BIND={bind!r} lists {groups} core group(s); {ranks} ranks need {ranks}, "
            "separated by '|'")
    if nodes >= ranks:
        return None
    return (f"vLLM on CPU binds each of the {ranks} ranks to a NUMA node of its own and this machine has {nodes}; "
            f"to split one node's cores, set VLLM_CPU_OMP_THREADS_BIND to {ranks} core groups (e.g. "
            f"{'|'.join(str(i) for i in range(ranks))!r}) before the lab starts")
