"""Arms at once: an experiment's arms on places of their own on this host, or as tasks of a Ray cluster, and the
GPU-to-GPU control (Experiment.run's `parallel`, `control`, `cluster`). The experiment's own checks, worker and
store are used as they are; what is here is where each arm runs and in what order the places are handed out.
"""
from __future__ import annotations

from labkit import settings
from labkit.errors import BadParameter
from labkit.measure.gpu import gpu_identities
from labkit.measure.placement import Placer, count_problems, parallel_problems, placement_record
from labkit.spec.knobs import ArmPlan, gpus_needed
from labkit.spec.models import ModelRef
from labkit.spec.numbers import raise_problems


def control_reference(exp) -> str:
    """The arm whose launch a control repeats: the protocol's reference, else the first arm."""
    return exp.protocol.decide_against or next(iter(exp.arms))


def control_problems(exp, parallel: int, plans: dict[str, ArmPlan]) -> list[str]:
    """Why a GPU-to-GPU control cannot be measured with this run (every reason at once)."""
    problems = []
    if exp.platform.kind != "cuda":
        problems.append(f"a control measures the spread between GPUs; this machine is a {exp.platform.kind.upper()}")
    if parallel == 1:
        problems.append("a control runs beside its reference on another GPU: give parallel=2 or more")
    reference = control_reference(exp)
    if reference not in plans or plans[reference].not_applicable:
        problems.append(f"the reference arm {reference!r} is not among the arms to run here")
    return problems


def placer_for(exp, parallel: int, plans: dict[str, ArmPlan], ref: ModelRef) -> Placer | None:
    """Where arms run at once (None: one at a time, on the whole machine); BadParameter names every reason
    they cannot."""
    if parallel == 1:
        return None
    gpus = gpu_identities() if exp.platform.kind == "cuda" else []
    needs = {arm: gpus_needed(exp._engine_args(plan, ref)) for arm, plan in plans.items()
             if not plan.not_applicable}
    raise_problems(f"parallel={parallel!r}", parallel_problems(parallel, exp.platform.kind,
                                                              [index for index, _ in gpus], needs))
    return Placer(parallel, exp.platform.kind, gpus)


def run_at_once(exp, todo: list, vocab: int, placer: Placer, bar, estimates: dict) -> None:
    """Run the arms on places of their own, as many at once as the placer allows, in the experiment's order
    (an arm waits for a place rather than being passed by a later one). Each arm's worker is started with its
    place; the store takes each result as it comes (one writer: this process). Interrupted, every running
    arm's engine is ended, and what each had logged is kept for the next run."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    pending, running = list(todo), {}
    with ThreadPoolExecutor(placer.parallel, thread_name_prefix="labkit-arm") as pool:
        try:
            while pending or running:
                while pending:
                    arm, launch, spec = pending[0]
                    place = placer.take(gpus_needed(launch))
                    if place is None:
                        break
                    pending.pop(0)
                    worker = exp._worker((arm, launch, spec), vocab,
                                          placement=placement_record(place, placer.parallel))
                    bar.write(f"arm {arm!r}: started on {place.label()}")
                    future = pool.submit(exp._run_one, arm, spec, worker, None, False, bar, estimates[arm])
                    running[future] = (place, worker)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    place, _worker = running.pop(future)
                    placer.give_back(place)
                    bar.update(1)
                    future.result()
        except BaseException:
            for _place, worker in running.values():  # their threads then record them as interrupted
                worker.discard_engine()
            raise


def ray_plan(exp, cluster: str, parallel: int, plans: dict[str, ArmPlan], ref: ModelRef,
             accelerator_type: str | None) -> dict:
    """Join the cluster and check that a node can take every arm (BadParameter names each one that cannot,
    and what the nodes have), before anything starts: what each arm's task asks for."""
    from labkit.measure import ray_arms

    raise_problems(f"parallel={parallel!r}", count_problems(parallel))
    if exp.server_url is not None:
        raise BadParameter("a running server is measured from this machine: leave cluster (and "
                           f"{settings.VARIABLES['ray_address']}) unset for server_url")
    nodes = ray_arms.connect(cluster)
    cuda = exp.platform.kind == "cuda"
    # a CPU arm takes an equal share of the smallest node's cores, `parallel` of them filling it
    cores = max(1, min((int(n["Resources"].get("CPU", 1)) for n in nodes), default=1) // parallel)
    requests = {arm: ray_arms.Request(gpus=gpus_needed(exp._engine_args(plan, ref)) if cuda else 0,
                                      cpus=1 if cuda else cores, accelerator_type=accelerator_type if cuda else None)
                for arm, plan in plans.items() if not plan.not_applicable}
    raise_problems(f"the Ray cluster at {cluster}", ray_arms.cluster_problems(nodes, requests))
    return {"requests": requests, "parallel": parallel, "cores": cores}


def run_on_ray(exp, todo: list, vocab: int, on_ray: dict, bar) -> None:
    """Each arm a Ray task, up to `parallel` at once in the experiment's order; each outcome committed here
    as it comes (an arm whose task was lost is recorded as failed, with why). Interrupted, the running tasks
    are cancelled, which ends their engines."""
    from labkit.measure import ray_arms
    from labkit.measure.supervisor import ArmOutcome

    ray = ray_arms.ray_module()
    remote, pending, running = ray_arms.remote_arm(), list(todo), {}
    try:
        while pending or running:
            while pending and len(running) < on_ray["parallel"]:
                arm, launch, spec = pending.pop(0)
                task = remote.options(**on_ray["requests"][arm].options()).remote(
                    exp._job((arm, launch, spec), vocab).__dict__, exp.arm_timeout_s, on_ray["cores"],
                    on_ray["parallel"], ray_arms.driver_process())
                running[task] = (arm, spec)
                bar.write(f"arm {arm!r}: sent to the Ray cluster")
            ready, _ = ray.wait(list(running), num_returns=1)
            for task in ready:
                arm, spec = running.pop(task)
                workdir = exp.store.new_workdir(arm)
                try:
                    answer = ray.get(task)
                except ray.exceptions.RayError as exc:
                    outcome = ArmOutcome("failed", workdir, cause=ray_arms.RAY_CAUSE,
                                         log_tail=ray_arms.lost_cause(exc))
                else:
                    ray_arms.unpack(answer.pop("files"), workdir)
                    outcome = ArmOutcome(answer["status"], workdir, cause=answer["cause"],
                                         log_tail=answer["log_tail"], seconds=answer["seconds"],
                                         facts=answer["facts"])
                exp._store_outcome(arm, spec, outcome, workdir, bar)
                bar.update(1)
    except BaseException:
        for task in running:
            ray.cancel(task, force=True)
        raise
