"""Inside an arm's worker process: start the engine with the deployment's usage context, record what vLLM
resolved, warm up, run the timed trials of every load (as many as the protocol's stopping rule asks), an optional profiler window, and write the results
into the arm's private folder. Errors are written down, never raised: the parent classifies them."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from labkit.files import write_json_atomic, write_table
from labkit.measure import rendezvous
from labkit.measure.engine_log import read_log
from labkit.measure.environment import cache_variables, tuning_variables
from labkit.redact import redacted_repr


@dataclass
class ArmJob:
    """Everything a worker needs, as plain data (it crosses a spawn boundary)."""

    arm: str
    engine_args: dict
    workloads: dict  # load name -> Workload.to_dict()
    protocol: dict
    vocab_size: int
    platform_kind: str
    context: str = "serve"  # the deployment's usage context (labkit.spec.launch.CONTEXTS)
    user_variables: dict = field(default_factory=dict)  # VLLM_*/NCCL_* as the user set them
    arm_variables: dict = field(default_factory=dict)  # the arm's `environment` knob: set in this worker only
    compile_cache: str | None = None  # VLLM_CACHE_ROOT for this machine and vLLM version, unless the user set one
    # the protocol's reference arm (decide_against) as measured earlier: load -> headline metric -> per-trial values
    reference: dict | None = None
    server_url: str | None = None  # a running server to measure as it is (nothing started or stopped)
    # where this arm runs beside others (labkit.measure.placement): its GPUs or cores, and how many arms at once
    placement: dict | None = None
    rpc_folder: str | None = None  # VLLM_RPC_BASE_PATH for this arm's sockets (labkit.measure.rendezvous)

    __repr__ = redacted_repr  # the real values cross to the worker; a repr (a traceback, a log) shows none


def worker_main(job: dict, workdir: str, parent_pid: int | None = None, release_within_s: float | None = None,
                plans=None) -> None:
    """The arm worker's entry point; never returns: measures the job into `workdir` with its output in
    engine.log, writes result.json (complete, or failed with the error) and exits the process. A worker not
    released within `release_within_s` (one started for a plan that was never run) exits unused. `plans`, a
    connection, brings a plan's arms to resolve while the worker waits (answered by a fork of it)."""
    os.setpgrp()  # the engine's own processes join this group, so a timeout can stop them all
    if parent_pid is not None:  # the engine's rendezvous files go with it (labkit.measure.rendezvous)
        _end_with_parent(parent_pid, lambda: rendezvous.remove(
            job.get("rpc_folder"), read_log(Path(workdir) / "engine.log")))
    # The arm's own variables go into this process only (the next arm's worker starts without them); then the
    # tuning variables in force, read before vLLM's import sets its own (the CPU platform sets several).
    own = dict(job.get("arm_variables") or {})
    before = dict(os.environ)
    placement = job.get("placement") or {}
    os.environ.update(placement.get("variables", {}))  # its GPUs or cores, before vLLM's import
    if placement.get("affinity"):  # a GPU arm beside others: its host side on cores of its own
        os.sched_setaffinity(0, [int(core) for core in placement["affinity"].split(",")])
    os.environ.update(own)
    job["user_variables"] = tuning_variables()
    if job.get("rpc_folder") and rendezvous.VARIABLE not in os.environ:  # the user's own choice stands
        rendezvous.make(job["rpc_folder"])
        os.environ[rendezvous.VARIABLE] = job["rpc_folder"]
    else:
        job["rpc_folder"] = None
    hide_ray(job["engine_args"])
    if job.get("compile_cache"):  # set after reading: the lab's, not the user's
        caches = cache_variables(job["compile_cache"])
        os.environ.update(caches)
        own.update(caches)
        if "VLLM_CACHE_ROOT" not in caches:  # the user's own cache: the lab neither keeps nor judges it
            job["compile_cache"] = None
    launched_with = {name: before.get(name) for name in own}  # the arm's variables as the plan knows them
    out = Path(workdir)
    log = open(out / "engine.log", "ab", buffering=0)
    os.dup2(log.fileno(), 1)  # vLLM's engine-core and worker children inherit these descriptors
    os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    try:
        began = time.perf_counter()
        _import_engine()
        _progress(out, stage=IMPORTED, seconds=round(time.perf_counter() - began, 2))
        handed_over = _wait_for_release(out, release_within_s, plans=plans, launched_with=launched_with)
        if handed_over is None:
            print(f"labkit: not released within {release_within_s:.0f} s; this worker exits unused", flush=True)
            rendezvous.remove(job.get("rpc_folder"), "")
            os._exit(0)
        job.update(handed_over)
        asyncio.run(_measure(ArmJob(**job), out))
    except BaseException as exc:  # recorded, never raised: the parent classifies it from the log
        traceback.print_exc()
        write_json_atomic(out / "result.json", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # engine teardown threads must not hold the process open after results are safe


# The worker's side of an early start (labkit.measure.supervisor.ArmWorker): it imports, says so, and waits for
# the parent's release; an arm whose successor is importing holds its measurement until that is done.
IMPORTED = "imported"
RELEASED = "released.json"
HOLD = "hold"
HOLD_LIMIT_S = 120.0  # a successor that cannot import in this time is not waited for any longer


def _import_engine() -> None:
    """What an arm's measurement needs imported (vLLM's engine above all: seconds of a core), done before the
    arm's turn. Importing touches no GPU memory."""
    import pandas  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    import labkit.measure.driver  # noqa: F401
    import labkit.measure.resolved  # noqa: F401


def _wait_for_release(out: Path, limit_s: float | None = None, poll_s: float = 0.05, plans=None,
                      launched_with: dict | None = None) -> dict | None:
    """Wait for the parent's go (it may come at once); returns what it handed over with it, or None when no go
    came within `limit_s`. Meanwhile a plan's arms sent over `plans` are resolved in a fork of this process."""
    released, began, forks = out / RELEASED, time.monotonic(), []
    try:
        while not released.exists():
            if limit_s is not None and time.monotonic() - began > limit_s:
                return None
            if plans is not None and plans.poll():
                forks.append(_resolve_in_a_fork(plans.recv(), plans, launched_with or {}))
            time.sleep(poll_s)
        return json.loads(released.read_text())
    finally:
        for pid in forks:  # a resolution still running when the arm's turn comes is not waited for
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _resolve_in_a_fork(asked: dict, plans, launched_with: dict) -> int:
    """vLLM's resolution of a plan's arms (labkit.measure.resolve.resolve_arms), sent back over `plans` by a fork
    of this worker: it has vLLM imported already, where a resolver of its own would import it again (seconds of
    a core, minutes on a busy machine). The fork ends with the answer, so nothing the configurations set stays in
    the worker; it sees the environment without this arm's own variables, as a separate resolver would, and its
    output (vLLM's config logs) goes to no arm's engine.log. Returns the fork's pid."""
    import warnings

    from labkit.measure.resolve import resolve_arms  # imported before the fork: the child takes no import lock

    with warnings.catch_warnings():  # Python 3.12's note on forking a threaded process would land in engine.log
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        for name, value in launched_with.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        plans.send(resolve_arms(asked["context"], asked["arms"]))
    finally:
        os._exit(0)


# vLLM imports Ray at import whenever it is installed (vllm.v1.engine.utils -> v1.executor.ray_utils): 1.2-2.2 s
# more for each import of vLLM here (3 runs each way), some minutes over the smoke suite, for engines that never use it
WITHOUT_RAY = Path(__file__).resolve().parent / "without_ray"


def hide_ray(engine_args: dict) -> bool:
    """Give this worker and every process it starts (vLLM's engine core and workers, `vllm serve`) a `ray` that
    cannot be imported, unless the arm asks vLLM for Ray as its executor: they start as on a machine without Ray.
    (A Ray task's own process keeps its Ray; the arm's worker is a fresh interpreter below it.) Returns whether
    Ray was hidden."""
    if engine_args.get("distributed_executor_backend") == "ray" or not WITHOUT_RAY.is_dir() or "ray" in sys.modules:
        return False
    sys.path.insert(0, str(WITHOUT_RAY))  # spawned children get this process's path
    os.environ["PYTHONPATH"] = without_ray_path(os.environ.get("PYTHONPATH"))
    return True


def without_ray_path(pythonpath: str | None) -> str:
    """A PYTHONPATH under which `import ray` fails (see hide_ray), for a fresh interpreter that runs vLLM."""
    return os.pathsep.join([str(WITHOUT_RAY), *filter(None, [pythonpath])])


def _wait_while_held(out: Path, limit_s: float = HOLD_LIMIT_S, poll_s: float = 0.1) -> float:
    """Seconds waited before measuring while the next arm's worker imports: its imports would take a core that
    a CPU engine's trials (and a GPU engine's host-side scheduling) count on."""
    began = time.perf_counter()
    while (out / HOLD).exists() and time.perf_counter() - began < limit_s:
        time.sleep(poll_s)
    return time.perf_counter() - began


def _end_with_parent(parent_pid: int, before_end) -> None:
    """When the process that started this worker dies (killed, or its notebook kernel restarted), end this
    worker's whole process group, engine included: nothing else would, and it would hold memory and cores
    (on a GPU, device memory) that the next run needs. `before_end()` runs first (the parent's own cleanup
    will not)."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        try:
            before_end()
        except Exception:  # noqa: BLE001 - logged; the group must end regardless
            traceback.print_exc()
            sys.stderr.flush()
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="labkit-parent-watch", daemon=True).start()


# On a CPU the engine's threads fill every core, so a trial during which other processes kept more than half of
# them busy measured the host rather than the launch; it is measured again after a short wait (with fresh
# content), a few times per arm at most so that a host busy for good costs seconds, not the run.
REMEASURE_SHARE = 0.5
REMEASURE_WAIT_S = 5.0
REMEASURE_MAX_PER_ARM = 2


def remeasure_above(platform_kind: str) -> float | None:
    """The outside load, in cores, past which a CPU trial is measured again (None: an engine that is not a
    CPU's): more than REMEASURE_SHARE of the cores this process may run on, once the cores it may not run on
    are full (work there does not take the engine's). A process bound to one of two cores (a test process of
    `make test`) re-measures past 1.5 busy cores. The suite binds its notebooks through vLLM's own
    VLLM_CPU_OMP_THREADS_BIND, not the affinity, and there the limit stays half the host: the sibling's other
    processes are not bound, and trials beside a sibling at 0.91-1.01 busy cores were seen to run slow (a
    12-request tiny-llama trial 3.7 s where the same shape took 0.2 s in another run), so the other core is
    not taken as full."""
    if platform_kind != "cpu":
        return None
    cores, own = os.cpu_count(), len(os.sched_getaffinity(0))
    return (cores - own) + REMEASURE_SHARE * own


async def _trial_with_retry(run_one, remeasured: list, load: str, trial: int, heavy_above: float | None,
                            wait_s: float = REMEASURE_WAIT_S, sleep=asyncio.sleep):
    """One trial, `await run_one(attempt)` -> (rows, summary); where `heavy_above` is given (a CPU engine,
    remeasure_above) and the outside load exceeded it, measured again after `wait_s` while the arm has
    re-measurements left (`remeasured` holds the arm's discarded attempts: load, trial, host_other_cores).
    Keeps the attempt under the least outside load; its summary says how many attempts it replaced."""
    attempts = [await run_one(0)]

    def heavy(summary) -> bool:
        cores = summary.get("host_other_cores")
        return heavy_above is not None and cores is not None and cores > heavy_above

    while heavy(attempts[-1][1]) and len(remeasured) + len(attempts) - 1 < REMEASURE_MAX_PER_ARM:
        await sleep(wait_s)
        attempts.append(await run_one(len(attempts)))
    kept = min(attempts, key=lambda a: a[1].get("host_other_cores") or 0.0)
    remeasured += [{"load": load, "trial": trial, "host_other_cores": a[1]["host_other_cores"]}
                   for a in attempts if a is not kept]
    return kept[0], {**kept[1], "remeasured": len(attempts) - 1}


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


PROBE_DEADLINE_FACTOR, PROBE_DEADLINE_GRACE_S = 2.0, 30.0  # a rate probe's trial ends by 2 x its schedule + 30 s


def _first_workload(spec: dict):
    """The Workload (or Mix) a load's spec describes; a load search's smallest probe."""
    from labkit.spec.load_search import LoadSearch
    from labkit.spec.workload import Workload

    if spec.get("kind") == "LoadSearch":
        search = LoadSearch.from_dict(spec)
        return search.probe(search.levels()[0])
    return Workload.from_dict(spec)


async def _drain(engine, limit_s: float = 60.0, poll_s: float = 0.1) -> None:
    """Wait until the engine holds no request (after a probe ended early its aborted requests leave), so the next
    probe starts on an idle engine; a served engine's own count is not read: a moment's pause instead."""
    processor = getattr(engine, "output_processor", None)
    began = time.perf_counter()
    if processor is None or not hasattr(processor, "get_num_unfinished_requests"):
        await asyncio.sleep(1.0)
        return
    while processor.get_num_unfinished_requests() and time.perf_counter() - began < limit_s:
        await asyncio.sleep(poll_s)


async def _search(engine, job: ArmJob, vocab, protocol, sampling: dict, name: str, spec: dict, index: int, out: Path,
                  gpu_state, rows: list, trials: list, remeasured: list) -> tuple[dict, str, int]:
    """A load search on this engine (labkit.spec.load_search): one warm-up at its smallest load, then probe after
    probe as labkit.analyze.load_search.next_probe chooses them, each measured with the protocol's trials (a rate
    probe watched for saturation and ended early when its queue keeps growing) and stored as a load of its own.
    Returns the search's result as plain data, the reason its probes stopped, and the trials they ran."""
    from labkit.analyze.load_search import Probe, conclude, measure, most_probes, next_probe, saturated
    from labkit.analyze.stopping import arm_reason, stop_reason, trial_values
    from labkit.measure.driver import Watch, run_trial, warm_up
    from labkit.spec.load_search import LoadSearch

    search = LoadSearch.from_dict(spec)
    levels, slos = search.levels(), search.slos
    share = len(job.workloads) * most_probes(levels)  # a probe's share of the arm's time budget
    _progress(out, stage=f"warm-up {name}")
    first = search.probe(levels[0])
    await warm_up(engine, first, vocab, min(protocol.warmup_requests, first.num_requests), sampling,
                  load_index=index)
    probes, reasons, ran = [], {}, 0
    while (rung := next_probe(levels, {p.index: not p.violations(slos) for p in probes})) is not None:
        level = levels[rung]
        workload, load = search.probe(level), LoadSearch.load_name(search.kind, level, name)
        probe_index = 1000 * (index + 1) + rung  # fresh token content per probe (labkit.measure.driver.content_seed)
        # a rate probe still running long after its schedule ended did not drain either, whatever the rule saw
        deadline = PROBE_DEADLINE_FACTOR * float(workload.lengths()[2].max()) + PROBE_DEADLINE_GRACE_S \
            if search.kind == "rate" else None
        _progress(out, stage=f"probe {load}")
        values, spent, trial, reason, measured = {}, 0.0, 0, None, []
        while reason is None:
            began = time.perf_counter()

            async def one(attempt, trial=trial):
                watch = Watch(lambda sent, done, now: saturated(sent, done, now) or now > deadline) \
                    if search.kind == "rate" else None
                return await run_trial(engine, workload, vocab, trial, protocol, sampling, probe_index,
                                       gpu_state, attempt=attempt, watch=watch)
            trial_rows, summary = await _trial_with_retry(one, remeasured, load, trial,
                                                          remeasure_above(job.platform_kind))
            spent += time.perf_counter() - began
            rows += [{**row, "load": load} for row in trial_rows]
            trials.append({**summary, "load": load, "search": name, "level": float(level)})
            _progress(out, stage="trial", trial=trial, load=name, probe=load)
            measured.append(trial_rows)
            trial += 1
            if summary.get("saturated"):  # no more trials at a rate the engine cannot keep up with
                reason = "saturated"
                await _drain(engine)
                break
            for metric_name, value in trial_values(summary, trial_rows).items():
                values.setdefault(metric_name, []).append(value)
            reason = stop_reason(values, protocol, None, spent, share)
        probes.append(Probe(rung, level, measure(measured, slos), reason == "saturated", trial,
                            sum(len(r) for r in measured), load))
        reasons[load], ran = reason, ran + trial
    result = conclude(search.kind, levels, probes, slos)
    _progress(out, stage=f"searched {name}: {result.sentence()}")
    kept = {load: reason for load, reason in reasons.items() if reason != "saturated"}
    return result.to_dict(), arm_reason(kept) if kept else "saturated", ran


async def _measure(job: ArmJob, out: Path) -> None:
    import pandas as pd
    from vllm.v1.engine.async_llm import AsyncLLM

    from labkit.measure.environment import fingerprint
    from labkit.measure.resolve import engine_launch
    from labkit.analyze.profiling import find_traces, summary as trace_summary
    from labkit.analyze.stopping import arm_reason, stop_reason, trial_values
    from labkit.measure.resolved import facts_from_log, resolve
    from labkit.measure.driver import profile_window, run_trial, sampling_for, warm_up
    from labkit.measure.gpu import gpu_identities
    from labkit.measure.gpu_state import GpuStateSampler
    from labkit.measure.placement import placement_facts
    from labkit.spec.protocol import Protocol
    from labkit.spec.texts import vocabulary
    from labkit.spec.workload import Workload
    from labkit.store import requests_to_store

    protocol = Protocol(**job.protocol)
    engine_args = dict(job.engine_args)
    if protocol.profile_requests:
        engine_args["profiler_config"] = _profiler_config(out / "profile")
    args, usage_context = engine_launch(engine_args, job.context)
    cache_was_warm = bool(job.compile_cache) and any(Path(job.compile_cache).glob("torch_compile_cache/*"))
    _progress(out, stage="starting engine")
    started = time.perf_counter()
    served = job.context == "served"
    if served:  # `vllm serve` for this arm, measured over HTTP (labkit.measure.served)
        from labkit.measure.served import ServedEngine

        engine = (await asyncio.to_thread(ServedEngine.attach, job.server_url) if job.server_url else
                  await asyncio.to_thread(ServedEngine.start, engine_args["model"], engine_args))
    else:
        engine = AsyncLLM.from_engine_args(args, usage_context=usage_context)
    init_s = time.perf_counter() - started
    try:
        sys.stdout.flush()
        log_text = read_log(out / "engine.log")
        if served:  # the server's configuration is read from its log; its sampling is its own default
            facts = {**facts_from_log(log_text), "served_url": engine.url, "served_model": engine.model,
                     **engine.described()}
            sampling = {} if protocol.temperature is None else {"temperature": protocol.temperature}
            engine.sampling = sampling
        else:
            facts = resolve(engine.vllm_config, log_text, job.platform_kind)
            sampling = sampling_for(engine.vllm_config.model_config, protocol.temperature)
        facts.update(init_s=init_s, context=job.context, usage_context=usage_context.name, sampling=sampling)
        facts.update(placement_facts(job.placement, [uuid for _, uuid in gpu_identities()]
                                     if job.platform_kind == "cuda" else []))
        if job.compile_cache:  # a rerun of a launch on this machine and version may reuse what was compiled
            facts["compile_cache"] = "warm" if cache_was_warm else "cold"  # warm: an earlier run compiled there
            if "Compiling model again due to a load failure" in read_log(out / "engine.log"):
                # seen on vllm-cpu 0.32: its own AOT artefact does not load; the recompile still reuses the
                # inductor cache beside it (10 s instead of 26 s for the tiny model here)
                facts["compile_cache"] = "warm, but vLLM could not load its compiled model and compiled again"
        gpu_state = GpuStateSampler()
        if job.platform_kind == "cuda":  # a GPU whose clocks were not watched says so; a CPU has none to watch
            facts["gpu_state"] = "sampled through NVML" if gpu_state.available else f"not sampled: {gpu_state.why_not}"
        facts["waited_for_next_worker_s"] = round(_wait_while_held(out), 1)
        vocab = vocabulary(job.vocab_size, engine_args["model"], job.workloads)
        rows, trials, stopped, ran, remeasured = [], [], {}, {}, []
        for index, (load, spec) in enumerate(job.workloads.items()):
            if spec.get("kind") == "LoadSearch":  # its loads are chosen as it goes, on this engine
                found, stopped[load], ran[load] = await _search(engine, job, vocab, protocol, sampling, load, spec, index,
                                                                out, gpu_state, rows, trials, remeasured)
                facts.setdefault("load_search", {})[load] = found
                continue
            workload = Workload.from_dict(spec)  # a Workload or a Mix
            _progress(out, stage=f"warm-up {load}")
            await warm_up(engine, workload, vocab, min(protocol.warmup_requests, workload.num_requests),
                          sampling, load_index=index)
            values, spent, trial, reason = {}, 0.0, 0, None
            while reason is None:  # a fixed protocol stops at its number, "auto" when the rule says so
                began = time.perf_counter()
                trial_rows, summary = await _trial_with_retry(
                    lambda attempt: run_trial(engine, workload, vocab, trial, protocol, sampling, index,
                                              gpu_state, attempt=attempt),
                    remeasured, load, trial, remeasure_above(job.platform_kind))
                spent += time.perf_counter() - began
                rows += [{**row, "load": load} for row in trial_rows]
                trials.append({**summary, "load": load})
                _progress(out, stage="trial", trial=trial, load=load)
                for name, value in trial_values(summary, trial_rows).items():
                    values.setdefault(name, []).append(value)
                trial += 1
                reason = stop_reason(values, protocol, (job.reference or {}).get(load), spent, len(job.workloads))
            stopped[load], ran[load] = reason, trial
        facts.update(stopped=arm_reason(stopped), trials_run=sum(ran.values()))
        if len(ran) > 1:  # each load stops on its own: say which stopped why
            facts.update(stopped_by_load=stopped, trials_by_load=ran)
        if job.platform_kind == "cpu":  # how often the host was too busy to keep a trial, and how busy
            facts.update(trials_remeasured=len({(r["load"], r["trial"]) for r in remeasured}), remeasured=remeasured,
                         remeasure_above_cores=remeasure_above(job.platform_kind))
        if protocol.profile_requests:
            _progress(out, stage="profiling")
            first = _first_workload(next(iter(job.workloads.values())))  # a Workload or a Mix
            facts["profile_window_s"] = await profile_window(engine, first, vocab, protocol.profile_requests,
                                                           sampling)
            traces = find_traces(out / "profile")
            facts["profile_trace"] = str(traces[0].relative_to(out)) if traces else None
            if traces:  # the bottleneck outlives a trace too large to keep; a trace it cannot read costs nothing else
                try:
                    facts["profile_summary"] = trace_summary(traces[0])
                except Exception as exc:  # noqa: BLE001
                    facts["profile_summary"] = {"not_analysed": f"{type(exc).__name__}: {exc}"}
        write_table(requests_to_store(pd.DataFrame(rows)), out / "requests.parquet")
        write_table(pd.DataFrame(trials), out / "trials.parquet")
        environment = fingerprint()
        environment["set_by_vllm"] = {k: v for k, v in environment["tuning_variables"].items()
                                      if k not in job.user_variables
                                      and not (k == "VLLM_CACHE_ROOT" and job.compile_cache)
                                      and not (k == rendezvous.VARIABLE and job.rpc_folder)}
        environment["tuning_variables"] = job.user_variables
        environment["arm_variables"] = sorted(job.arm_variables)  # which of them this arm's knob set
        write_json_atomic(out / "result.json", {"status": "complete", "facts": facts, "environment": environment})
    finally:
        try:
            if served:
                await engine.close()
            engine.shutdown()
        except Exception:  # results are already safe on disk; a noisy teardown changes nothing
            traceback.print_exc()
