"""The suite's regression demonstration on this machine, resumable across time-limited calls:

1. a suite run of the selection, pinned as the baseline for this hardware;
2. the same selection rerun with one deliberate change left in the launch configuration (--override);
3. `labkit compare` of the two, which writes the report (regressions flagged, the rest "no detectable change").

State lives in DIR (runs/, baselines/ and journal.jsonl under it); each call continues where the last one
stopped, and DIR/done is written when the report exists.
    python3 scripts/regression_demo.py DIR --override enforce_eager=true SELECTION...
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


def suite_runs(runs: Path) -> dict[bool, Path]:
    """The runs made so far, keyed by whether they carry the deliberate change."""
    found = {}
    for meta in sorted(runs.glob("*/suite.json")):
        found.setdefault(bool(json.loads(meta.read_text()).get("overrides")), meta.parent)
    return found


def finished(run: Path) -> bool:
    """Every notebook has a status (a failed one counts: its failure is the result)."""
    from labkit.suite import statuses

    return len(statuses(run)) == len(json.loads((run / "suite.json").read_text())["notebooks"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--override", action="append", required=True)
    parser.add_argument("--profile", default=None)
    parser.add_argument("selection", nargs="+")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    # all its state under DIR, the journal too: a demonstration adds nothing to this machine's own record
    os.environ.update(LABKIT_RUNS_DIR=str(root / "runs"), LABKIT_BASELINES_DIR=str(root / "baselines"),
                      LABKIT_JOURNAL=str(root / "journal.jsonl"))
    profile = ["--profile", args.profile] if args.profile else []
    for changed in (False, True):
        run = suite_runs(root / "runs").get(changed)
        extra = [a for o in args.override for a in ("--override", o)] if changed else []
        if run is None:
            labkit("suite", *args.selection, *profile, *extra)
            run = suite_runs(root / "runs")[changed]
        for _ in range(3):  # a resume that cannot finish (a crash outside any notebook) is not retried forever
            if finished(run):
                break
            labkit("suite", "--resume", str(run))
        if not changed and not (root / "baselines").exists():
            if labkit("baseline", str(run)) != 0:
                return 2
    labkit("compare", str(suite_runs(root / "runs")[True]))
    (root / "done").write_text("report written\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
