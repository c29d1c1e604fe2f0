"""The parent's side of an arm: start its worker process, follow its progress, end its process group, and
classify a failure from the worker's exit and log (labkit.measure.engine_log).

vLLM does not reliably free device memory when an engine is deleted, so each arm's engine lives and
dies in its own spawned process (labkit.measure.worker); the notebook kernel never holds an engine. The
worker writes its results into a private folder and the parent reads them back; if the worker dies, its
log tells why.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.files import write_json_atomic
from labkit.measure import rendezvous
from labkit.measure.engine_log import classify_failure, failure_summary, read_log
from labkit.measure.gpu import gpu_memory_in_use
from labkit.measure.worker import HOLD, HOLD_LIMIT_S, IMPORTED, RELEASED, ArmJob, worker_main
from labkit.spec.knobs import gpus_needed

OCCUPIED_GIB = 1.0  # more than a CUDA context's worth in use before an engine starts: another process holds it


@dataclass
class ArmOutcome:
    """How an arm's worker ended: its status and folder, a failure's cause and log tail, its duration and the
    facts it recorded."""

    status: str  # "complete" or "failed"
    workdir: Path
    cause: str | None = None
    log_tail: str = ""
    seconds: float = 0.0
    facts: dict = field(default_factory=dict)


class ArmWorker:
    """An arm's worker process, started ahead of its turn: it imports vLLM (seconds of a core), says so and waits
    for `release`, touching no GPU memory until then. Started while the previous arm's engine starts, it takes
    the imports out of the wait between arms; the previous arm holds its measurement until they are done. The
    first arm's is started by the plan (Experiment.plan_table), with a limit on its wait."""

    def __init__(self, job: ArmJob, workdir: Path, release_within_s: float | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.job, self.workdir = job, workdir
        self.rpc_folder = rendezvous.arm_folder()
        spawn = multiprocessing.get_context("spawn")
        self._plans, plans = spawn.Pipe()  # a plan's arms out, vLLM's resolution back (the engine args hold secrets:
        # they travel as the job does, never through a file)
        job_data = {**job.__dict__, "rpc_folder": self.rpc_folder}
        self.proc = spawn.Process(target=worker_main, args=(job_data, str(workdir), os.getpid(), release_within_s,
                                                            plans), name=f"labkit-arm-{job.arm}")
        self.proc.start()
        plans.close()

    def resolve(self, context: str, engine_args_by_arm: dict[str, dict], limit_s: float = 300.0) -> dict | None:
        """vLLM's resolution of a plan's arms in this context (labkit.measure.resolve.resolve_arms), answered by a
        fork of this worker once it has imported vLLM; None when the worker ended first or before it could be
        asked (a plan then resolves in a process of its own). Past `limit_s` each arm gets {"error": ...}."""
        try:
            self._plans.send({"context": context, "arms": engine_args_by_arm})
            began = time.monotonic()
            while time.monotonic() - began < limit_s:
                if self._plans.poll(0.2):
                    return self._plans.recv()
                if not self.proc.is_alive():
                    return None
        except (EOFError, OSError):
            return None
        return {arm: {"error": f"vLLM took over {limit_s:.0f} s to resolve the configuration"}
                for arm in engine_args_by_arm}

    def events(self) -> list[dict]:
        path = self.workdir / "progress.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def ready(self) -> bool:
        """Imported (or gone): nothing of it competes for a core any longer."""
        return not self.proc.is_alive() or any(e.get("stage") == IMPORTED for e in self.events())

    def release(self, **handed_over) -> None:
        write_json_atomic(self.workdir / RELEASED, handed_over)

    def discard_engine(self) -> None:
        """End the worker and its engine now (an interrupted run of arms at once); its folder stays, for the
        thread that waits on it to record what its engine had logged."""
        if self.proc.is_alive():
            _kill_group(self.proc.pid)

    def discard(self) -> None:
        """End a worker whose turn never came, and its folder: it measured nothing."""
        if self.proc.is_alive():
            _kill_group(self.proc.pid)
            self.proc.kill()  # one just spawned may not lead its own group yet
            self.proc.join(10)
        rendezvous.remove(self.rpc_folder, "")
        shutil.rmtree(self.workdir, ignore_errors=True)


def run_arm(job: ArmJob, workdir: Path, timeout_s: float, on_progress=None, worker: ArmWorker | None = None,
            start_next=None) -> ArmOutcome:
    """Run one arm in its spawned process (`worker`, started earlier, or a new one) and wait for it; never
    raises for an engine failure. `start_next()` starts the next arm's worker: called once this one has
    imported (two importing at once would slow this arm's start), and this arm measures only once the next
    has imported too."""
    in_use = gpu_memory_in_use() if job.platform_kind == "cuda" else {}
    placed = (job.placement or {}).get("gpus")
    if placed:  # an arm beside others sees, and waits for, its own GPUs only
        in_use = {gpu: gib for gpu, gib in in_use.items() if gpu in placed}
    occupied = occupied_for_multi_gpu(job.engine_args, in_use)
    if occupied:  # refused before vLLM starts: a multi-GPU start beside another process's memory fails obscurely
        if worker:
            worker.discard()
        workdir.mkdir(parents=True, exist_ok=True)
        return ArmOutcome("failed", workdir, cause="gpu_occupied", log_tail=occupied_note(occupied))
    worker = worker or ArmWorker(job, workdir)
    proc = worker.proc
    shared_before = _shared_segments()
    next_worker, holding = None, start_next is not None
    if holding:
        (workdir / HOLD).touch()
    start = time.monotonic()
    worker.release(reference=job.reference)
    progress_file, seen, timed_out = workdir / "progress.jsonl", 0, False
    engine_starting = stored = None  # when the worker began its engine; when its results were safe
    try:
        while proc.is_alive():
            proc.join(0.5)
            if holding and next_worker is None and worker.ready():
                next_worker = start_next()
            if holding and next_worker is not None and next_worker.ready() \
                    or holding and time.monotonic() - start > HOLD_LIMIT_S:
                (workdir / HOLD).unlink(missing_ok=True)
                holding = False
            if progress_file.exists():
                events = progress_file.read_text().splitlines()
                for line in events[seen:]:
                    event = json.loads(line)
                    if engine_starting is None and event.get("stage") == "starting engine":
                        engine_starting = time.monotonic()
                    if on_progress:
                        on_progress(event)
                seen = len(events)
            if _stored(workdir / "result.json"):
                stored = time.monotonic()
                break  # the results are safe on disk: vLLM's own teardown and its grace period are not waited out
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
    finally:
        if proc.is_alive() and stored:  # nothing left to save: no grace for vLLM's teardown
            _signal_group(proc.pid, signal.SIGKILL)
            proc.join(10)
            # the engine's message queues live in shared memory that its teardown would have unlinked: a kernel
            # running arm after arm must not collect them until it exits
            made = _shared_segments() - shared_before
            _unlink_segments(made - mapped_elsewhere(made, group=proc.pid))
        if proc.is_alive():  # timeout or the user interrupted: take the engine's processes down too
            _kill_group(proc.pid)
            proc.join(10)
        # A worker killed from outside (the out-of-memory killer) leaves its engine's processes in its group,
        # holding memory and cores the next arm needs; after a clean exit the group is empty and this returns.
        _kill_group(proc.pid)
        rendezvous.remove(worker.rpc_folder, read_log(workdir / "engine.log"))
        # The next arm must find the device as this one did: a GPU driver frees a killed process's memory
        # some time after it exits.
        freed_s, still_held = wait_for_gpu_memory(in_use, read=lambda: {
            gpu: gib for gpu, gib in gpu_memory_in_use().items() if gpu in in_use}) if in_use else (0.0, {})
    seconds = time.monotonic() - start
    result_file = workdir / "result.json"
    log_text = read_log(workdir / "engine.log")
    if result_file.exists() and not timed_out:
        result = json.loads(result_file.read_text())
        if result["status"] == "complete":
            facts = result["facts"]
            imports = next((e.get("seconds") for e in worker.events() if e.get("stage") == IMPORTED), None)
            facts["lifecycle_s"] = lifecycle(start, engine_starting, stored, time.monotonic(), facts.get("init_s"),
                                             imports)
            if in_use:
                facts.update(gpu_gib_in_use_at_start=max(in_use.values()), gpu_memory_freed_s=round(freed_s, 1))
            return ArmOutcome("complete", workdir, seconds=seconds, facts=facts)
    cause = classify_failure(log_text, proc.exitcode, timed_out)
    return ArmOutcome("failed", workdir, cause=cause, log_tail=occupied_note(in_use) + held_note(still_held)
                      + failure_summary(log_text), seconds=seconds)


def lifecycle(start: float, engine_starting: float | None, stored: float | None, ended: float,
              init_s: float | None, imports_s: float | None = None) -> dict:
    """Where an arm's wall time went, in seconds (to 0.5 s, the supervisor's polling step), counted from its
    release: waiting for its worker's imports (none when they were done while the previous arm ran; the
    imports themselves are `worker_imports`), the engine's start, warm-up and trials (measuring), and ending
    the processes once the results were stored. The lab's estimate of the time left reads these."""
    phases = {"worker_imports": imports_s, "waiting_for_imports": engine_starting and engine_starting - start,
              "engine_start": init_s,
              "measuring": stored and engine_starting and init_s is not None and stored - engine_starting - init_s,
              "ending": stored and ended - stored}
    return {k: round(v, 1) for k, v in phases.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def wait_for_gpu_memory(before: dict[str, float], timeout_s: float = 60.0, poll_s: float = 1.0,
                        margin_gib: float = 0.5, read=gpu_memory_in_use) -> tuple[float, dict[str, float]]:
    """Wait until every GPU holds no more than it did before the arm (plus a margin). Returns the seconds
    waited and the GPUs still above that after the timeout (empty when all were freed)."""
    start = time.monotonic()
    while True:
        now = read()
        held = {gpu: gib for gpu, gib in now.items() if gib > before.get(gpu, 0.0) + margin_gib}
        if not held or time.monotonic() - start >= timeout_s:
            return time.monotonic() - start, held
        time.sleep(poll_s)


def occupied_for_multi_gpu(engine_args: dict, in_use: dict[str, float], limit_gib: float = OCCUPIED_GIB) -> dict:
    """For an engine of several GPUs, those of the GPUs it will take (the first visible ones) on which another
    process already holds memory. Seen on two H200s: after a TP=2 start was cut off, the next TP=2 start
    failed with CUBLAS_STATUS_INTERNAL_ERROR on rank 1; such an arm is refused with the holder named instead.
    A one-GPU arm is left to start (a shared GPU only shrinks its KV cache, which its facts record)."""
    needed = gpus_needed(engine_args)
    if needed < 2:
        return {}
    return {gpu: gib for gpu, gib in list(in_use.items())[:needed] if gib > limit_gib}


def held_note(held: dict[str, float]) -> str:
    """For an arm whose GPU memory was not freed: which GPUs, and what the next arm will meet."""
    if not held:
        return ""
    listed = ", ".join(f"GPU {gpu}: {gib:.1f} GiB" for gpu, gib in held.items())
    return (f"after this arm ended, its GPU memory was still held ({listed}): a process of its engine may have "
            "escaped; the next arm may start short of memory. nvidia-smi lists the holder.\n")


def occupied_note(in_use: dict[str, float], limit_gib: float = OCCUPIED_GIB) -> str:
    """For a failed start: which GPUs another process already held memory on, and what to do."""
    held = {gpu: gib for gpu, gib in in_use.items() if gib > limit_gib}
    if not held:
        return ""
    listed = ", ".join(f"GPU {gpu}: {gib:.1f} GiB" for gpu, gib in held.items())
    return (f"before this engine started, memory was already in use ({listed}): another process, often an "
            "engine left behind by an interrupted run, holds it. Stop it (nvidia-smi lists it) and rerun the arm.\n")


def _stored(result_file: Path) -> bool:
    """The worker has stored a complete result (written atomically: once it exists, it is whole). A failed one
    is not ended early: the worker exits by itself, and its engine's last words must reach the log."""
    if not result_file.exists():
        return False
    try:
        return json.loads(result_file.read_text()).get("status") == "complete"
    except (OSError, ValueError):
        return False


SHARED_MEMORY = Path("/dev/shm")


def _shared_segments() -> set[str]:
    """This user's POSIX shared-memory segments of Python's naming (psm_*), as vLLM's message queues make them."""
    if not SHARED_MEMORY.is_dir():
        return set()
    uid = os.getuid()
    return {p.name for p in SHARED_MEMORY.glob("psm_*") if _owner(p) == uid}


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def mapped_elsewhere(names: set[str], group: int) -> set[str]:
    """Those of `names` that a live process outside the process group `group` (an arm's worker and engine)
    has mapped: another engine's message queues, made while this arm ran (a notebook running beside this
    one, a `vllm serve` of the user's), which are not the ended engine's to unlink."""
    held = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if os.getpgid(int(maps.parent.name)) == group:
                continue
            text = maps.read_text()
        except (OSError, ValueError):  # gone meanwhile, or another user's
            continue
        held |= {name for name in names if f"{SHARED_MEMORY}/{name}" in text}
    return held


def _unlink_segments(names: set[str]) -> None:
    """Unlink the segments an ended engine left and tell the resource tracker, which would otherwise warn
    of leaks when the kernel exits."""
    from multiprocessing import resource_tracker

    for name in names:
        try:
            (SHARED_MEMORY / name).unlink()
        except OSError:
            continue
        try:
            resource_tracker.unregister(f"/{name}", "shared_memory")
        except Exception:  # noqa: BLE001 - the tracker may not know it: nothing to tell
            pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _kill_group(pid: int, grace_s: float = 2.0) -> None:
    """End a worker's process group: SIGTERM, then SIGKILL for what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:  # a group that is gone needs no second signal, nor the wait
            time.sleep(0.1)
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
