"""Time to a verdict: how long the lab makes its user wait, and where the time goes.

    python benchmarks/time_to_verdict.py arms [--arms 2] [--compile] [--trials N|auto] [--model tiny-llama]
                                              [--out result.json]
    python benchmarks/time_to_verdict.py notebook NOTEBOOK [--profile cpu-smoke] [-p NAME VALUE] [--limit S]
                                                  [--workdir DIR] [--out result.json]
    python benchmarks/time_to_verdict.py saved RESULTS_DIR [--fixed 3] [--out result.json]

`arms` runs a small experiment of a synthetic model (tiny-llama unless --model; eager unless --compile) in a fresh results folder
and reports the wall time, each arm's lifecycle (worker imports, engine start, measuring, ending once the
results were stored: `lifecycle_s` in the arm's facts), the trials it ran and the host load beside it.
`notebook` runs one notebook through `labkit run` with a suite profile (papermill, a fresh kernel) and
reports its wall time. `saved` reads the arms stored under a results folder and counts, per experiment, the
trials the adaptive protocol ran against what a fixed protocol of `--fixed` trials per load would have run
(arms measured with a fixed protocol count as they ran). All print one JSON object (and write it with --out); figures quoted in the README
come from these commands. Run them on an idle machine: the host load is reported so a busy one is visible.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def host_load() -> float:
    return round(os.getloadavg()[0], 2)


def arms(args) -> dict:
    import labkit as lk

    names = {f"max_num_seqs={n}": {"max_num_seqs": n} for n in (4, 8, 16, 32)[: args.arms]}
    base = {} if args.compile else {"enforce_eager": True}
    trials = args.trials if args.trials == "auto" else int(args.trials)
    results_dir = Path(args.workdir or tempfile.mkdtemp(prefix="ttv-"))
    load_before = host_load()
    started = time.monotonic()
    exp = lk.Experiment("time-to-verdict", names, lk.Workload(16, lk.Fixed(32), lk.Fixed(16), lk.Burst()),
                        model=args.model, base=base, protocol=lk.Protocol(trials=trials, warmup_requests=2),
                        results_dir=results_dir)
    results = exp.run(progress=False)
    wall = time.monotonic() - started
    per_arm = []
    for row in results.arms.itertuples():
        facts = row._asdict()
        lifecycle = facts.get("lifecycle_s")
        per_arm.append({"arm": row.arm, "status": row.status, "seconds": facts.get("seconds"),
                        "lifecycle_s": json.loads(lifecycle) if isinstance(lifecycle, str) else lifecycle,
                        "trials": int(results.trials[results.trials.arm == row.arm].trial.nunique())
                        if not results.trials.empty else 0})
    return {"what": "arms", "model": args.model, "arms": len(names), "compile": args.compile, "trials": args.trials,
            "wall_s": round(wall, 1), "per_arm": per_arm, "load_1min_before": load_before,
            "load_1min_after": host_load(), "cpu_count": os.cpu_count(), "results_dir": str(results_dir)}


def notebook(args) -> dict:
    out = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ttv-nb-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LABKIT_RESULTS_DIR": str(out / "results")}
    command = [sys.executable, "-m", "labkit.cli", "run", args.notebook, "--profile", args.profile, "-o", str(out)]
    for name, value in args.parameter or []:
        command += ["-p", name, value]
    load_before = host_load()
    started = time.monotonic()
    # its own session: at the limit the whole tree goes (papermill, the kernel, the arm's worker and engine)
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.limit)
        ended = "finished"
    except subprocess.TimeoutExpired:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
            child.kill()
        output, _ = proc.communicate()
        ended = f"cut at its limit of {args.limit} s"
    wall = time.monotonic() - started
    return {"what": "notebook", "notebook": args.notebook, "profile": args.profile,
            "parameters": dict(args.parameter or []), "exit": proc.returncode, "ended": ended,
            "wall_s": round(wall, 1), "per_arm": stored_arms(out / "results"), "load_1min_before": load_before,
            "load_1min_after": host_load(), "cpu_count": os.cpu_count(), "output": str(out),
            "tail": output[-1200:]}


def stored_arms(results: Path) -> list[dict]:
    """Each stored arm's seconds, lifecycle, trials and why it stopped (read from its record, no pandas)."""
    arms = []
    for record in sorted(results.glob("*/arms/*/arm.json")):
        meta = json.loads(record.read_text())
        facts = meta.get("facts", {})
        arms.append({"experiment": record.parents[2].name, "arm": record.parent.name,
                     "seconds": round(meta.get("seconds", 0.0), 1), "lifecycle_s": facts.get("lifecycle_s"),
                     "trials_run": facts.get("trials_run"), "stopped": facts.get("stopped_by_load") or facts.get("stopped"),
                     "compile_cache": facts.get("compile_cache"), "engine_init_s": facts.get("engine_init_s"),
                     "compile_s": facts.get("compile_s"), "graph_capture_s": facts.get("graph_capture_s")})
    for record in sorted(results.glob("*/failures/*/failure.json")):
        meta = json.loads(record.read_text())
        arms.append({"experiment": record.parents[2].name, "arm": meta.get("arm"), "failed": meta.get("cause"),
                     "seconds": round(meta.get("seconds") or 0.0, 1)})
    return arms


def saved(args) -> dict:
    """Per experiment: trials run, against `fixed` trials on each load of each stored arm."""
    experiments: dict[str, dict] = {}
    for record in sorted(Path(args.results).glob("*/arms/*/arm.json")):
        meta = json.loads(record.read_text())
        loads = len(meta.get("spec", {}).get("workloads") or {"default": None})
        protocol = meta.get("spec", {}).get("protocol", {})
        ran = meta.get("facts", {}).get("trials_run")
        ran = ran if ran is not None else protocol.get("trials", 0) * loads
        found = experiments.setdefault(record.parents[2].name, {"arms": 0, "trials_run": 0, "trials_fixed": 0})
        found["arms"] += 1
        found["trials_run"] += ran
        found["trials_fixed"] += (args.fixed * loads if protocol.get("trials") == "auto" else ran)
    for found in experiments.values():
        found["trials_saved"] = found["trials_fixed"] - found["trials_run"]
    return {"what": "saved", "results": args.results, "fixed": args.fixed, "experiments": experiments}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("arms")
    a.add_argument("--arms", type=int, default=2, choices=range(1, 5))
    a.add_argument("--compile", action="store_true", help="keep torch.compile on (the default engine)")
    a.add_argument("--trials", default="2", help="a number, or auto")
    a.add_argument("--model", default="tiny-llama", help="a lab model name (llama3-8b: the GPU's default shape)")
    a.add_argument("--workdir", help="results folder (default: a new temporary one)")
    n = sub.add_parser("notebook")
    n.add_argument("notebook")
    n.add_argument("--profile", default="cpu-smoke")
    n.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a notebook parameter, as labkit run -p takes it")
    n.add_argument("--limit", type=float, help="end the run after this many seconds and report what it stored")
    n.add_argument("--workdir", help="the run's folder: executed notebook and results (default: a new temporary one)")
    v = sub.add_parser("saved")
    v.add_argument("results", help="a results folder (experiments under it)")
    v.add_argument("--fixed", type=int, default=3, help="trials per load of the fixed protocol compared with")
    for p in (a, n, v):
        p.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    result = {"arms": arms, "notebook": notebook, "saved": saved}[args.what](args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
