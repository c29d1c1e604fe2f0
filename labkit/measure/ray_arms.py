"""Arms as Ray tasks: the engine for experiments spread over more than one host (the `labkit[ray]` extra).

The lab schedules nothing itself here. Each arm is one Ray task asking for the GPUs it needs (tp x pp x dp, and
where asked a GPU model, so an H200 experiment never lands on an H100) or, on CPU nodes, a share of a node's
cores. The task runs the same supervisor and worker as a local arm (labkit.measure.supervisor.run_arm) in a
folder of the node's own, and sends the arm's files back; the driver alone commits them to the experiment's
store (append-only, each arm whole or not at all, the store's lock held by the driver). A task whose node or
worker is lost is recorded as the arm's failure with its cause (Ray does not retry it: a retry would measure on
another machine without saying so), and the next run resumes.

Where an arm ran is recorded with it: the node's Ray id (never its host name), its GPUs' UUIDs, its cores.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter

RAY_CAUSE = "ray_lost"  # the arm's task ended without an outcome: its worker or node was lost (cause's detail says)
CORE_LOCKS = Path(tempfile.gettempdir()) / "labkit-cores"  # a node's claimed cores, one lock file per core


def ray_module():
    try:
        import ray
    except ImportError:
        raise BadParameter("arms on a Ray cluster need Ray: pip install 'labkit[ray]' (or pip install ray)") from None
    return ray


def _answers(address: str, timeout_s: float = 3.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


_joined = None  # the address this process joined


def connect(address: str) -> list[dict]:
    """Join the Ray cluster at `address` ("HOST:PORT", or "auto" for the one this machine belongs to) as a
    driver, once per process; returns its live nodes. A cluster that does not answer is refused at once, naming
    the address, before anything starts."""
    global _joined
    ray = ray_module()
    if ray.is_initialized() and address != _joined:
        ray.shutdown()  # joined to another cluster earlier in this process
    if not ray.is_initialized():
        if address != "auto" and not _answers(address):
            raise BadParameter(f"no Ray cluster answers at {address!r} ({settings.VARIABLES['ray_address']}): start one with "
                               "`ray start --head`, or give the address its head printed")
        ray.init(address=address, log_to_driver=False, logging_level="ERROR", configure_logging=False)
        _joined = address
    return [node for node in ray.nodes() if node.get("Alive")]


@contextlib.contextmanager
def local_cluster(cpus: int, gpus: int = 0):
    """A Ray head on 127.0.0.1 of this machine with `cpus` CPUs (and `gpus` GPUs), in a session folder of its own:
    its address ("127.0.0.1:PORT") inside the block; afterwards this process leaves it and it is stopped. (`ray
    stop` ends every Ray process this user runs on the machine: for trying the Ray path here, not beside a
    cluster of one's own.)"""
    global _joined
    from labkit.measure.served import free_port

    # Ray's command line through this interpreter: a Ray installed with `pip --target` (the GPU machine's bundle)
    # has no `ray` script beside the interpreter
    ray_cli = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]
    port, session = free_port(), Path(tempfile.mkdtemp(prefix="ray-lk-", dir="/tmp"))  # Ray's socket paths stay short
    started = subprocess.run([*ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                              f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--include-dashboard=false",
                              "--disable-usage-stats", f"--temp-dir={session}"], capture_output=True, text=True,
                             timeout=120)
    if started.returncode:
        shutil.rmtree(session, ignore_errors=True)
        raise RuntimeError(f"ray start failed ({started.returncode}): {(started.stdout + started.stderr)[-2000:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
            _joined = None
        subprocess.run([*ray_cli, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(session, ignore_errors=True)


@dataclass(frozen=True)
class Request:
    """What one arm's task asks Ray for."""

    gpus: int = 0
    cpus: int = 1
    accelerator_type: str | None = None

    def options(self) -> dict:
        options = {"num_cpus": self.cpus, "num_gpus": self.gpus, "max_retries": 0}
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        return options


def node_summary(nodes: list[dict]) -> str:
    return "; ".join(f"node {n['NodeID'][:12]}: {int(n['Resources'].get('CPU', 0))} CPUs, "
                     f"{int(n['Resources'].get('GPU', 0))} GPUs"
                     + "".join(f", {key.split(':', 1)[1]}" for key in n["Resources"] if key.startswith("accelerator_type:"))
                     for n in nodes) or "no live node"


def cluster_problems(nodes: list[dict], requests: dict[str, Request]) -> list[str]:
    """Every arm the cluster cannot place (more GPUs or cores than any node has, a GPU model no node offers),
    named with what the nodes have."""
    problems = []
    for arm, request in requests.items():
        fits = [n for n in nodes if n["Resources"].get("GPU", 0) >= request.gpus
                and n["Resources"].get("CPU", 0) >= request.cpus
                and (not request.accelerator_type
                     or f"accelerator_type:{request.accelerator_type}" in n["Resources"])]
        if not fits:
            wanted = (f"{request.gpus} GPU(s)" if request.gpus else f"{request.cpus} CPU(s)") + (
                f" of type {request.accelerator_type}" if request.accelerator_type else "")
            problems.append(f"arm {arm!r} needs {wanted} on one node")
    if problems:
        problems.append(f"the cluster has: {node_summary(nodes)}")
    return problems


def claim_cores(count: int, usable: list[int] | None = None):
    """`count` of this node's cores for one CPU arm, claimed through lock files that the kernel releases when
    the claiming process ends (however it ends): the first aligned group no other arm holds. Returns (the
    cores as a VLLM_CPU_OMP_THREADS_BIND value, the open lock files to keep), or (None, []) when none is free."""
    usable = sorted(os.sched_getaffinity(0)) if usable is None else usable
    CORE_LOCKS.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(usable) - count + 1, count):
        group, held = usable[start:start + count], []
        for core in group:
            handle = open(CORE_LOCKS / f"{core}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                break
            held.append(handle)
        if len(held) == count:
            return ",".join(str(core) for core in group), held
        for handle in held:
            handle.close()
    return None, []


def pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def unpack(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def driver_process() -> dict:
    """What of this (the driver's) process an arm's worker would inherit, were the arm started here."""
    return {"omp_threads": os.environ.get("OMP_NUM_THREADS"), "niceness": os.getpriority(os.PRIO_PROCESS, 0)}


def as_the_driver_runs(driver: dict) -> dict:
    """In a Ray task's process, undo what Ray changed of it before an arm's worker inherits it, so that the arm
    measures as one the driver starts would: Ray runs task workers at niceness 15 and sets OMP_NUM_THREADS to
    the task's CPUs (1 for a GPU arm) where it was unset. Seen on one H100 (vLLM 0.26, the 8B shape eager,
    16 clients): through Ray as it was, TPOT P50 28-31 ms against 18.5-19 ms for the same launch started by the
    driver. Returns what still differs (an unprivileged process may not lower its niceness): the arm records it."""
    if driver["omp_threads"] is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = driver["omp_threads"]
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, driver["niceness"])
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    return {} if niceness == driver["niceness"] else {"niceness": niceness}


def run_arm_on_node(job: dict, timeout_s: float, cores_per_arm: int, arms_at_once: int, driver: dict) -> dict:
    """The task's body, on the node: the arm measured by the lab's own supervisor in a folder of the node's, its
    worker started as the driver would start it (`driver`: driver_process()), its outcome and files returned
    (the folder is removed: the driver's store keeps them)."""
    import ray

    from labkit.measure.placement import Place, placement_record
    from labkit.measure.supervisor import ArmJob, run_arm

    context = ray.get_runtime_context()
    node = context.get_node_id()[:12]
    held = []
    if job["platform_kind"] == "cuda":  # Ray gave this task its GPUs (CUDA_VISIBLE_DEVICES is set for it)
        place = Place(gpus=tuple(str(g) for g in ray.get_gpu_ids()))
    else:
        cores, held = claim_cores(cores_per_arm)
        place = Place(cores=cores)
    differs = as_the_driver_runs(driver)
    job = {**job, "placement": {**placement_record(place, arms_at_once, node=node), **differs}}
    with tempfile.TemporaryDirectory(prefix="labkit-arm-") as work:
        workdir = Path(work) / "arm"
        outcome = run_arm(ArmJob(**job), workdir, timeout_s)
        for handle in held:
            handle.close()
        return {"status": outcome.status, "cause": outcome.cause, "log_tail": outcome.log_tail,
                "seconds": outcome.seconds, "facts": outcome.facts, "node": node, "files": pack(workdir)}


_remote = None


def remote_arm():
    """The Ray remote function of run_arm_on_node (made once, when Ray is there)."""
    global _remote
    if _remote is None:
        _remote = ray_module().remote(run_arm_on_node)
    return _remote


def lost_cause(exc: BaseException, running: str = "arm") -> str:
    """In words, why a task ended without an outcome (its worker process or node lost, or cancelled); `running`
    is what the task ran (an arm, a notebook)."""
    name = type(exc).__name__
    what = {"WorkerCrashedError": f"the Ray worker running the {running} died (killed, or out of memory)",
            "NodeDiedError": f"the node running the {running} left the cluster",
            "TaskCancelledError": f"the {running}'s task was cancelled",
            "ObjectLostError": f"the {running}'s results were lost with their node"}.get(name, f"Ray: {name}")
    return f"{what}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else name}"
