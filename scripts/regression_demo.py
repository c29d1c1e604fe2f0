"""The suite's regression demonstration on this machine, resumable across time-limited calls:

1. a suite run of the selection, pinned as the baseline for this hardware, and with --replicates N, N more
   unchanged runs added to it as replicates (so verdicts weigh the noise between runs);
2. the same selection rerun with one deliberate change left in the launch configuration (--override);
3. `labkit compare` of the rerun with the baseline, which writes the report (regressions flagged, the rest
   "no detectable change").

State lives in DIR (runs/, baselines/ and journal.jsonl under it); each call continues where the last one
stopped, and DIR/done is written when the report exists.
    python3 scripts/regression_demo.py DIR --override enforce_eager=true [--replicates 1] SELECTION...
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def labkit(*args: str) -> int:
    print("$ labkit " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "labkit.cli", *args])


def suite_runs(runs: Path, changed: bool) -> list[Path]:
    """The runs made so far that carry the deliberate change, or those that do not, oldest first."""
    return [meta.parent for meta in sorted(runs.glob("*/suite.json"))
            if bool(json.loads(meta.read_text()).get("overrides")) == changed]


def completed(runs: Path, changed: bool, index: int, start: list[str]) -> Path:
    """The index-th run of its kind: started with `start` when it does not exist yet, resumed when unfinished."""
    if len(suite_runs(runs, changed)) <= index:
        labkit(*start)
    run = suite_runs(runs, changed)[index]
    for _ in range(3):  # a resume that cannot finish (a crash outside any notebook) is not retried forever
        if finished(run):
            break
        labkit("suite", "--resume", str(run))
    return run


def finished(run: Path) -> bool:
    """Every notebook has a status (a failed one counts: its failure is the result)."""
    from labkit.suite.notebooks import statuses

    return len(statuses(run)) == len(json.loads((run / "suite.json").read_text())["notebooks"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--override", action="append", required=True)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--replicates", type=int, default=0, help="unchanged runs added to the baseline beyond the first")
    parser.add_argument("selection", nargs="+")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    # all its state under DIR, the journal too: a demonstration adds nothing to this machine's own record
    os.environ.update(LABKIT_RUNS_DIR=str(root / "runs"), LABKIT_BASELINES_DIR=str(root / "baselines"),
                      LABKIT_JOURNAL=str(root / "journal.jsonl"))
    start = ["suite", *args.selection, *(["--profile", args.profile] if args.profile else [])]
    for index in range(1 + args.replicates):
        run = completed(root / "runs", False, index, start)
        if not list((root / "baselines").glob(f"*/{run.name}")):
            if labkit("baseline", str(run), *(["--replicate"] if index else [])) != 0:
                return 2
    changed = completed(root / "runs", True, 0, start + [a for o in args.override for a in ("--override", o)])
    labkit("compare", str(changed))
    (root / "done").write_text("report written\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
