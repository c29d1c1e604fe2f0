"""Arms at once: the wall time of one experiment run one arm at a time, with `parallel` arms at once on this
host, and through a Ray cluster started here (127.0.0.1) — and, on paper, what a host of more GPUs would take.

    python benchmarks/parallel_arms.py [--arms 4] [--parallel N] [--no-ray] [--model M] [--out result.json]
    python benchmarks/parallel_arms.py paper RESULTS_DIR EXPERIMENT [--gpus 8] [--out result.json]

The first form runs the tiny synthetic model (eager, a smoke run's launch) with `--arms` arms of different
max_num_seqs, the same workload and a fixed protocol, three times in fresh results folders: sequential,
`parallel=N` (default: this process's cores), and on a Ray head started for the run with as many CPUs. It
reports each run's wall time, each arm's seconds and place, and the host load. On a CPU the arms at once share
one machine's cores and memory bandwidth: every arm measures slower there, which the per-arm seconds show.
On a GPU machine (`--model llama3-8b`, say) the arms share nothing but the host: `parallel` defaults to its GPUs
(on one GPU the at-once run is the sequential one and is left out), the Ray head gets every GPU, and the
workload is one a GPU measures (32 requests of 256 tokens in, 64 out, 16 clients; batches from 8): each arm's
output tok/s, sequential against through Ray on the same GPU, says what the Ray path costs a measurement.
`paper` reads a stored experiment (one arm at a time, e.g. committed GPU evidence) and reports the sum of its
arms' seconds against the makespan of the same arms on `--gpus` GPUs of one host (labkit.analyze.placement.makespan:
each arm on the first GPU to come free, as Experiment.run(parallel=) places them) — an estimate that assumes
the arms keep their one-at-a-time durations, which a shared host does not promise.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def run_once(exp_args: dict, results_dir: Path, **run_args) -> dict:
    import labkit as lk

    began = time.perf_counter()
    results = lk.Experiment(results_dir=results_dir, **exp_args).run(progress=False, **run_args)
    wall = time.perf_counter() - began
    facts = results.facts("seconds", "init_s", "placed_on", "arms_at_once")
    rates = results.trials.groupby("arm").output_tok_s.mean().round(1)  # each arm's mean over its trials
    facts["output_tok_s"] = facts.arm.map(rates)
    return {"wall_s": round(wall, 1), "complete": results.complete_arms,
            "arms": facts[["arm", "status", "seconds", "init_s", "placed_on", "output_tok_s"]].round(1)
            .to_dict("records"),
            "load_avg_after": round(os.getloadavg()[0], 2)}


def measured(a) -> dict:
    import labkit as lk
    from labkit.measure.platform import current_platform
    from labkit.suite.parameters import SMOKE_OVERRIDES

    cores, gpus = len(os.sched_getaffinity(0)), current_platform().gpu_count
    parallel = a.parallel or gpus or cores
    # a GPU's eager 8B-shaped engine takes ~25 ms a step: batches of 8 and up keep each trial to seconds
    workload = (lk.Workload(32, lk.Fixed(256), lk.Fixed(64), lk.Concurrency(16)) if gpus
                else lk.Workload(16, lk.Fixed(32), lk.Fixed(16), lk.Concurrency(4)))
    batches = (8, 16, 32, 64) if gpus else (2, 4, 8, 16, 32, 64)
    exp_args = {"name": "parallel-arms", "model": a.model, "base": SMOKE_OVERRIDES,
                "arms": {f"max_num_seqs={n}": {"max_num_seqs": n} for n in batches[: a.arms]},
                "workload": workload, "protocol": lk.Protocol(trials=2, warmup_requests=2)}
    report = {"model": a.model, "cores": cores, "gpus": gpus, "parallel": parallel, "arms": a.arms,
              "load_avg_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = a.keep or tmp  # --keep: the three runs' stores stay there (evidence), else they go with the run
        report["sequential"] = run_once(exp_args, Path(tmp) / "sequential")
        save(report, a.out)  # each run as it ends: a run cut off by a time limit keeps the ones before it
        if parallel > 1:
            report["at_once"] = run_once(exp_args, Path(tmp) / "at-once", parallel=parallel)
            save(report, a.out)
        if not a.no_ray:
            report["ray"] = on_ray(exp_args, Path(tmp), parallel, cores, gpus)
    return report


def save(report: dict, out: str | None) -> None:
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


def on_ray(exp_args: dict, tmp: Path, parallel: int, cores: int, gpus: int) -> dict:
    from labkit.measure.ray_arms import local_cluster

    began = time.perf_counter()
    with local_cluster(cpus=cores, gpus=gpus) as address:
        started = time.perf_counter() - began
        found = run_once(exp_args, tmp / "ray", parallel=parallel, cluster=address)
    return {**found, "cluster_start_s": round(started, 1)}


def paper(a) -> dict:
    from labkit.analyze.placement import makespan
    from labkit.store import load

    results = load(a.experiment, a.results_dir)
    complete = results.arms[results.arms.status == "complete"]
    seconds = [float(s) for s in complete.seconds]
    return {"experiment": a.experiment, "arms": complete.arm.tolist(), "arm_seconds": [round(s, 1) for s in seconds],
            "sequential_s": round(sum(seconds), 1), "gpus": a.gpus,
            "at_once_s": round(makespan(seconds, a.gpus), 1),
            "assumes": "each arm keeps its one-at-a-time duration; engine starts and compile caches are per GPU"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what")
    paper_args = sub.add_parser("paper")
    paper_args.add_argument("results_dir")
    paper_args.add_argument("experiment")
    paper_args.add_argument("--gpus", type=int, default=8)
    paper_args.add_argument("--out")
    parser.add_argument("--arms", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=0, help="arms at once (default: this process's cores)")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--model", default="tiny-llama", help="a lab model (llama3-8b on a GPU machine)")
    parser.add_argument("--keep", help="a folder to keep the runs' stores in (sequential/, at-once/, ray/)")
    parser.add_argument("--out")
    a = parser.parse_args()
    report = paper(a) if a.what == "paper" else measured(a)
    print(json.dumps(report, indent=1))
    save(report, a.out)


if __name__ == "__main__":
    main()
