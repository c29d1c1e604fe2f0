"""One arm, one fresh worker process: engine start, resolved config, warm-up, trials, results on disk.

vLLM does not reliably free device memory when an engine is deleted, so each arm's engine lives and
dies in its own spawned process; the notebook kernel never holds an engine. The worker writes its
results into a private folder and the parent reads them back; if the worker dies, its log tells why.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .environment import tuning_variables
from .platform import gpu_memory_in_use
from .store import write_json_atomic

LOG_TAIL_LINES = 40
OCCUPIED_GIB = 1.0  # more than a CUDA context's worth in use before an engine starts: another process holds it

_FAILURE_CAUSES = [  # (cause, pattern in the log), most specific first
    ("kv_cache_too_small", r"larger than the (?:maximum number of tokens that can be stored|available KV cache)"
                           r"|No available memory for the cache blocks|KV cache (?:is )?(?:too small|insufficient)"
                           r"|max_model_len .* KV cache|To serve at least one request"),
    ("out_of_memory", r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|Cannot allocate memory"),
    ("backend_unavailable", r"Selected backend .* is not valid|No valid attention backend"),
    ("unsupported_configuration", r"Unsupported .* configuration|NotImplementedError|is not supported"),
    ("graph_capture_failed", r"(?:CUDA graph|cudagraph).*(?:fail|error)"),
    ("bad_engine_argument", r"TypeError: .*unexpected keyword|pydantic.*ValidationError|ValidationError"),
]


def classify_failure(log_text: str, exitcode: int | None, timed_out: bool) -> str:
    """A short cause a user can act on, from the worker's exit and its log."""
    if timed_out:
        return "timeout"
    # Only error lines count: warnings such as "X is not supported, falling back" are not causes.
    errors = "\n".join(line for line in log_text.splitlines()
                       if "ERROR" in line or re.search(r"(?:Error|Exception)\b", line))
    for cause, pattern in _FAILURE_CAUSES:
        if re.search(pattern, errors, re.IGNORECASE):
            return cause
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"killed_by_signal_{name}" + (
            " (often the host's out-of-memory killer)" if exitcode == -signal.SIGKILL else "")
    return "engine_error"


@dataclass
class ArmJob:
    """Everything a worker needs, as plain data (it crosses a spawn boundary)."""

    arm: str
    engine_args: dict
    workloads: dict  # load name -> Workload.to_dict()
    protocol: dict
    vocab_size: int
    platform_kind: str
    context: str = "serve"  # the deployment's usage context (labkit.launch.CONTEXTS)
    user_variables: dict = field(default_factory=dict)  # VLLM_*/NCCL_* as the user set them


@dataclass
class ArmOutcome:
    status: str  # "complete" or "failed"
    workdir: Path
    cause: str | None = None
    log_tail: str = ""
    seconds: float = 0.0
    facts: dict = field(default_factory=dict)


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def failure_summary(log_text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The first root-cause error line (vLLM prints it well above the end of its log), then the tail."""
    root = re.search(r"^.*\b(?:[A-Z]\w*Error|Exception|OutOfMemoryError): .+$", log_text, re.MULTILINE)
    tail = "\n".join(log_text.splitlines()[-lines:])
    return (f"root cause: {root.group(0).strip()}\n...\n" if root else "") + tail


def run_arm(job: ArmJob, workdir: Path, timeout_s: float, on_progress=None) -> ArmOutcome:
    """Run one arm in a fresh spawned process and wait for it; never raises for an engine failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=worker_main, args=(job.__dict__, str(workdir)), name=f"labkit-arm-{job.arm}")
    in_use = gpu_memory_in_use() if job.platform_kind == "cuda" else {}
    start = time.monotonic()
    proc.start()
    progress_file, seen, timed_out = workdir / "progress.jsonl", 0, False
    try:
        while proc.is_alive():
            proc.join(0.5)
            if on_progress and progress_file.exists():
                events = progress_file.read_text().splitlines()
                for line in events[seen:]:
                    on_progress(json.loads(line))
                seen = len(events)
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
    finally:
        if proc.is_alive():  # timeout or the user interrupted: take the engine's processes down too
            _kill_group(proc.pid)
            proc.join(10)
        # A worker killed from outside (the out-of-memory killer) leaves its engine's processes in its group,
        # holding memory and cores the next arm needs; after a clean exit the group is empty and this returns.
        _kill_group(proc.pid)
    seconds = time.monotonic() - start
    result_file = workdir / "result.json"
    log_text = read_log(workdir / "engine.log")
    if result_file.exists() and not timed_out:
        result = json.loads(result_file.read_text())
        if result["status"] == "complete":
            facts = result["facts"]
            if in_use:
                facts["gpu_gib_in_use_at_start"] = max(in_use.values())
            return ArmOutcome("complete", workdir, seconds=seconds, facts=facts)
    cause = classify_failure(log_text, proc.exitcode, timed_out)
    return ArmOutcome("failed", workdir, cause=cause, log_tail=occupied_note(in_use) + failure_summary(log_text),
                      seconds=seconds)


def occupied_note(in_use: dict[str, float], limit_gib: float = OCCUPIED_GIB) -> str:
    """For a failed start: which GPUs another process already held memory on, and what to do."""
    held = {gpu: gib for gpu, gib in in_use.items() if gib > limit_gib}
    if not held:
        return ""
    listed = ", ".join(f"GPU {gpu}: {gib:.1f} GiB" for gpu, gib in held.items())
    return (f"before this engine started, memory was already in use ({listed}): another process, often an "
            "engine left behind by an interrupted run, holds it. Stop it (nvidia-smi lists it) and rerun the arm.\n")


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


# ---- inside the worker process ---------------------------------------------------------------------
def worker_main(job: dict, workdir: str) -> None:
    os.setpgrp()  # the engine's own processes join this group, so a timeout can stop them all
    # The user's tuning variables, read before vLLM's import sets its own (the CPU platform sets several).
    job["user_variables"] = tuning_variables()
    out = Path(workdir)
    log = open(out / "engine.log", "ab", buffering=0)
    os.dup2(log.fileno(), 1)  # vLLM's engine-core and worker children inherit these descriptors
    os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    try:
        asyncio.run(_measure(ArmJob(**job), out))
    except BaseException as exc:  # recorded, never raised: the parent classifies it from the log
        traceback.print_exc()
        write_json_atomic(out / "result.json", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # engine teardown threads must not hold the process open after results are safe


def _progress(out: Path, **event) -> None:
    with open(out / "progress.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def _profiler_config(directory: Path):
    """vLLM's own torch-profiler hook (engine argument `profiler_config`, in 0.26 and 0.32); Python stacks
    and the frontend trace are left out: they multiply the trace size and the stop time."""
    from vllm.config import ProfilerConfig

    wanted = {"profiler": "torch", "torch_profiler_dir": str(directory.resolve()),
              "torch_profiler_with_stack": False, "ignore_frontend": True}
    fields = set(getattr(ProfilerConfig, "__dataclass_fields__", {})) or set(wanted)
    return ProfilerConfig(**{k: v for k, v in wanted.items() if k in fields})


async def _measure(job: ArmJob, out: Path) -> None:
    import pandas as pd
    from vllm.v1.engine.async_llm import AsyncLLM

    from .environment import fingerprint
    from .launch import engine_launch
    from .profiling import find_traces
    from .resolved import resolve
    from .runner import Protocol, profile_window, run_trial, sampling_for, warm_up
    from .workload import Workload

    protocol = Protocol(**job.protocol)
    engine_args = dict(job.engine_args)
    if protocol.profile_requests:
        engine_args["profiler_config"] = _profiler_config(out / "profile")
    args, usage_context = engine_launch(engine_args, job.context)
    _progress(out, stage="starting engine")
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(args, usage_context=usage_context)
    init_s = time.perf_counter() - started
    try:
        sys.stdout.flush()
        facts = resolve(engine.vllm_config, (out / "engine.log").read_text(errors="replace"), job.platform_kind)
        sampling = sampling_for(engine.vllm_config.model_config, protocol.temperature)
        facts.update(init_s=init_s, context=job.context, usage_context=usage_context.name, sampling=sampling)
        rows, trials = [], []
        for index, (load, spec) in enumerate(job.workloads.items()):
            workload = Workload.from_dict(spec)  # a Workload or a Mix
            _progress(out, stage=f"warm-up {load}")
            await warm_up(engine, workload, job.vocab_size, min(protocol.warmup_requests, workload.num_requests),
                          sampling, load_index=index)
            for trial in range(protocol.trials):
                trial_rows, summary = await run_trial(engine, workload, job.vocab_size, trial, protocol, sampling, index)
                rows += [{**row, "load": load} for row in trial_rows]
                trials.append({**summary, "load": load})
                _progress(out, stage="trial", trial=trial, load=load)
        if protocol.profile_requests:
            _progress(out, stage="profiling")
            first = Workload.from_dict(next(iter(job.workloads.values())))  # a Workload or a Mix
            facts["profile_window_s"] = await profile_window(engine, first, job.vocab_size, protocol.profile_requests,
                                                           sampling)
            traces = find_traces(out / "profile")
            facts["profile_trace"] = str(traces[0].relative_to(out)) if traces else None
        pd.DataFrame(rows).to_parquet(out / "requests.parquet")
        pd.DataFrame(trials).to_parquet(out / "trials.parquet")
        environment = fingerprint()
        environment["set_by_vllm"] = {k: v for k, v in environment["tuning_variables"].items()
                                      if k not in job.user_variables}
        environment["tuning_variables"] = job.user_variables
        write_json_atomic(out / "result.json", {"status": "complete", "facts": facts, "environment": environment})
    finally:
        try:
            engine.shutdown()
        except Exception:  # results are already safe on disk; a noisy teardown changes nothing
            traceback.print_exc()
