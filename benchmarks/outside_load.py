"""What outside load does to a CPU engine bound to one core, and what the lab's two load measures see of it.

    python benchmarks/outside_load.py [--trials 3] [--out result.json]

One arm of the tiny synthetic model (eager, in-process, a smoke run's launch), its engine bound to core 0 as
`labkit suite --jobs 2` binds a notebook's (VLLM_CPU_OMP_THREADS_BIND), measured three times in fresh results
folders: on an otherwise idle machine, beside a busy loop pinned to core 0 (the engine's core), and beside one
pinned to core 1. Each trial reports its output tok/s, the cores the rest of the host kept busy
(`host_other_cores`, which the re-measure rule and the noise-aware verdicts read) and the mean number of the lab's
threads that were ready to run but waited for a CPU (`threads_waiting_for_cpu`). Needs two cores or more.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COLUMNS = ["output_tok_s", "host_other_cores", "threads_waiting_for_cpu", "remeasured"]


def measure(where: str, trials: int) -> list[dict]:
    import labkit as lk
    from labkit.suite.parameters import SMOKE_OVERRIDES

    busy = None if where == "idle" else subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{where}}})\nwhile True: pass"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exp = lk.Experiment(name="outside-load", model="tiny-llama", base=SMOKE_OVERRIDES, arms={"bound": {}},
                                workload=lk.Workload(12, lk.Fixed(64), lk.Fixed(16), lk.Concurrency(4)),
                                protocol=lk.Protocol(trials=trials, warmup_requests=2), results_dir=tmp)
            trials_table = exp.run(progress=False).trials
            return trials_table[[c for c in COLUMNS if c in trials_table]].round(3).to_dict("records")
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out")
    a = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("outside_load needs two cores or more: core 0 for the engine, core 1 for the other busy loop")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"  # the engine's threads on core 0, as the suite binds them
    report = {"load_avg_before": round(os.getloadavg()[0], 2),
              "conditions": {name: measure(where, a.trials)
                             for name, where in (("idle", "idle"), ("busy loop on the engine's core", "0"),
                                                 ("busy loop on the other core", "1"))}}
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
