"""The suite judged across one change on this machine, resumable across time-limited calls:

1. a suite run of the selection, pinned as the baseline for this hardware, and with --replicates N, N more
   unchanged runs added to it as replicates (so verdicts weigh the noise between runs);
2. the same selection rerun with the change: a deliberate one left in the launch configuration (--override),
   or another environment (--after PYTHON: the interpreter of a second vLLM version, for an upgrade; the
   runs before use --before PYTHON, default this interpreter);
3. `labkit compare` of the rerun with the baseline, which writes the report (regressions flagged, the rest
   "no detectable change"); its exit status is this script's (0 clean, 1 a regression, 2 unusable data,
   3 a notebook failed).

State lives in DIR (runs/ before the change, runs-changed/ after it, baselines/ and journal.jsonl); each call
continues where the last one stopped, and DIR/done is written when the report exists.
    python3 scripts/regression_demo.py DIR --override enforce_eager=true [--replicates 1] SELECTION...
    .venv-vllm031/bin/python scripts/regression_demo.py DIR --after .venv/bin/python --replicates 1 [SELECTION...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def labkit(python: str, runs: Path, *args: str) -> int:
    print(f"$ {python} -m labkit.cli " + " ".join(args), flush=True)
    return subprocess.call([python, "-m", "labkit.cli", *args], env={**os.environ, "LABKIT_RUNS_DIR": str(runs)})


def suite_runs(runs: Path) -> list[Path]:
    """The suite runs made so far in one folder, oldest first."""
    return [meta.parent for meta in sorted(runs.glob("*/suite.json"))]


def completed(python: str, runs: Path, index: int, start: list[str]) -> Path:
    """The index-th run in `runs`: started with `start` when it does not exist yet, resumed when unfinished."""
    if len(suite_runs(runs)) <= index:
        labkit(python, runs, *start)
    run = suite_runs(runs)[index]
    for _ in range(3):  # a resume that cannot finish (a crash outside any notebook) is not retried forever
        if finished(run):
            break
        labkit(python, runs, "suite", "--resume", str(run))
    return run


def finished(run: Path) -> bool:
    """Every notebook has a status (a failed one counts: its failure is the result)."""
    from labkit.suite.notebooks import statuses

    return len(statuses(run)) == len(json.loads((run / "suite.json").read_text())["notebooks"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--override", action="append", default=[], help="KNOB=VALUE forced onto the rerun's arms")
    parser.add_argument("--before", default=sys.executable, help="the interpreter of the environment before the change")
    parser.add_argument("--after", default=None, help="the interpreter of the environment after the change")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--replicates", type=int, default=0, help="unchanged runs added to the baseline beyond the first")
    parser.add_argument("selection", nargs="*")
    args = parser.parse_args()
    if not args.override and not args.after:
        parser.error("name the change: --override KNOB=VALUE, or --after PYTHON (another environment)")
    root = Path(args.dir).resolve()
    # all its state under DIR, the journal too: a demonstration adds nothing to this machine's own record
    os.environ.update(LABKIT_BASELINES_DIR=str(root / "baselines"), LABKIT_JOURNAL=str(root / "journal.jsonl"))
    start = ["suite", *args.selection, *(["--profile", args.profile] if args.profile else [])]
    for index in range(1 + args.replicates):
        run = completed(args.before, root / "runs", index, start)
        if not list((root / "baselines").glob(f"*/{run.name}")):
            if labkit(args.before, root / "runs", "baseline", str(run), *(["--replicate"] if index else [])) != 0:
                return 2
    after = args.after or args.before
    changed = completed(after, root / "runs-changed", 0, start + [a for o in args.override for a in ("--override", o)])
    verdict = labkit(after, root / "runs-changed", "compare", str(changed))
    (root / "done").write_text(f"report written; compare exited {verdict}\n")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
