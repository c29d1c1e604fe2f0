"""Where an arm runs when several run at once on one host: the GPUs it is given (tp x pp x dp of them, each GPU
one arm's at a time) or, on a CPU, the cores its engine is bound to (each arm a contiguous share of them).

A place becomes variables of the arm's worker only (CUDA_VISIBLE_DEVICES, or vLLM's own
VLLM_CPU_OMP_THREADS_BIND), set before vLLM is imported; the GPU-memory checks of the supervisor look at the
place's GPUs alone, so an arm beside another is neither refused nor kept waiting for that one's memory.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from labkit.errors import BadParameter

BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM's own: the cores a CPU engine's threads run on


@dataclass(frozen=True)
class Place:
    """The GPUs (driver indices, as this process sees them) or the cores one arm has; empty: the whole machine."""

    gpus: tuple[str, ...] = ()
    uuids: tuple[str, ...] = ()  # the same GPUs by UUID: CUDA may number them otherwise than the driver does
    cores: str | None = None  # a VLLM_CPU_OMP_THREADS_BIND value ("0,1")

    def variables(self) -> dict[str, str]:
        if self.gpus:
            return {"CUDA_VISIBLE_DEVICES": ",".join(self.uuids or self.gpus)}
        return {BIND: self.cores} if self.cores else {}

    def label(self) -> str:
        if self.gpus:
            return f"GPU {','.join(self.gpus)}" + (f" (cores {self.cores})" if self.cores else "")
        return f"cores {self.cores}" if self.cores else "the whole machine"


def split_cores(usable: list[int], groups: int) -> list[str]:
    """`usable` cores split into `groups` contiguous shares, as VLLM_CPU_OMP_THREADS_BIND values."""
    size, extra = divmod(len(usable), groups)
    shares, start = [], 0
    for group in range(groups):
        end = start + size + (group < extra)
        shares.append(",".join(str(core) for core in usable[start:end]))
        start = end
    return shares


def count_problems(parallel) -> list[str]:
    """What is wrong with `parallel` as a number of arms at once (empty: nothing)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        return [f"parallel is how many arms run at once, a whole number from 1; got {parallel!r}"]
    return []


def parallel_problems(parallel, platform_kind: str, gpus: list[str], needs: dict[str, int],
                      usable_cores: list[int] | None = None, bind: str | None = None) -> list[str]:
    """Everything that keeps `parallel` arms from running at once here, at once: `gpus` are the visible GPUs'
    indices, `needs` each arm's GPU count (tp x pp x dp)."""
    wrong = count_problems(parallel)
    if wrong or parallel == 1:
        return wrong
    problems = []
    if platform_kind == "cuda":
        too_big = {arm: n for arm, n in needs.items() if n > len(gpus)}
        if too_big:
            problems.append(f"arm(s) {too_big} need more GPUs than the {len(gpus)} this process may use "
                            f"({', '.join(gpus) or 'none'})")
        if parallel > len(gpus):
            problems.append(f"{parallel} arms at once need at least {parallel} GPUs and this process may use "
                            f"{len(gpus)}: use parallel={max(1, len(gpus))} or fewer")
    else:
        usable = sorted(os.sched_getaffinity(0)) if usable_cores is None else usable_cores
        bind = os.environ.get(BIND) if bind is None else bind
        if parallel > len(usable):
            problems.append(f"{parallel} arms at once need {parallel} cores and this process may use "
                            f"{len(usable)}: use parallel={len(usable)} or fewer")
        if bind not in (None, "", "auto"):
            problems.append(f"{BIND}={bind!r} is set: parallel arms bind each engine to cores of its own through "
                            "it, so unset it or leave parallel at 1")
    return problems


class Placer:
    """Hands out places to arms as they start and takes them back as they end (threads of one driver): on a
    GPU host any free GPUs an arm needs, at most `parallel` arms at once; on a CPU one of `parallel` core shares.
    A GPU arm also gets one of the host's `parallel` core shares: its host side (the scheduler, the client loop,
    an eager arm's kernel launches) then never waits for another arm's."""

    def __init__(self, parallel: int, platform_kind: str, gpus: list[tuple[str, str]],
                 usable_cores: list[int] | None = None):
        """`gpus`: (driver index, UUID) of each GPU this process may use."""
        self.parallel, self.kind = parallel, platform_kind
        self._free_gpus = list(gpus)
        usable = sorted(os.sched_getaffinity(0)) if usable_cores is None else usable_cores
        self._free_cores = split_cores(usable, min(parallel, len(usable)))
        self._running = 0
        self._lock = threading.Lock()

    def take(self, gpus_needed: int) -> Place | None:
        """A place for an arm needing `gpus_needed` GPUs, or None while none is free."""
        with self._lock:
            if self._running >= self.parallel:
                return None
            if self.kind == "cuda":
                if len(self._free_gpus) < gpus_needed:
                    return None
                taken = self._free_gpus[:gpus_needed]
                place = Place(gpus=tuple(i for i, _ in taken), uuids=tuple(u for _, u in taken),
                              cores=self._free_cores.pop(0) if self._free_cores else None)
                del self._free_gpus[:gpus_needed]
            else:
                place = Place(cores=self._free_cores.pop(0))
            self._running += 1
            return place

    def give_back(self, place: Place) -> None:
        with self._lock:
            self._running -= 1
            if place.gpus:
                self._free_gpus = sorted(self._free_gpus + list(zip(place.gpus, place.uuids)), key=lambda g: int(g[0]))
            if place.cores:
                self._free_cores.append(place.cores)


def placement_record(place: Place | None, at_once: int, node: str = "local") -> dict:
    """What an arm's job carries of where it runs: its worker's variables, and what the arm records of it
    (placement_facts). `node` names the machine without its host name (stored results name no host): "local",
    or the Ray node's id."""
    place = place or Place()
    return {"variables": place.variables(), "placed_on": place.label(), "gpus": list(place.gpus),
            # a GPU arm's cores bound by affinity (a CPU engine's by vLLM's own variable)
            "affinity": place.cores if place.gpus else None, "arms_at_once": at_once, "node": node}


def placement_facts(record: dict | None, gpu_uuids: list[str]) -> dict:
    """The facts an arm records of where it ran: the node, its GPUs by UUID (those its worker could see) or its
    cores, and how many arms ran at once."""
    record = record or placement_record(None, 1)
    facts = {"node": record["node"], "placed_on": record["placed_on"], "arms_at_once": record["arms_at_once"]}
    if "niceness" in record:  # a Ray task that could not run its worker at the driver's niceness
        facts["niceness"] = record["niceness"]
    if gpu_uuids:
        facts["gpu_uuids"] = list(gpu_uuids)
    return facts
