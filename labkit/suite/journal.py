"""The lab notebook of record: every experiment's change -> metric -> conclusion, with its evidence and
environment, appended to data/journal.jsonl (one JSON object per line, never rewritten)."""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import pandas as pd

from labkit import settings
from labkit.errors import DamagedStore
from labkit.suite.runs import readable
from labkit.redact import redact
from labkit.shown import number


def journal_path() -> Path:
    """The journal file of the current settings."""
    return settings.current().journal


def entries_for_run(run: str | Path, environment: dict) -> list[dict]:
    """A suite run's journal entries: per experiment and load, the arms' knobs and metric values, the
    conclusion against the first complete arm, the evidence folder and the environment."""
    from labkit.analyze import stats

    entries, now = [], _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for name, results in readable(run)[0].items():  # compare names the experiments that cannot be read
        if not results.complete_arms:
            continue
        base = results.reference_arm
        record = stats.ab_record(results, base, stats.VERDICT_METRICS)
        knobs = results.spec.get("arms", {})
        for load_name in record.load.unique():
            part = record[record.load == load_name]
            entries.append({
                "when_utc": now, "experiment": name, "load": load_name,
                "change": "; ".join(f"{arm}: {json.dumps(knobs.get(arm, {}))}" for arm in results.complete_arms),
                "metric": "; ".join(f"{r.arm} {r.metric}={number(float(r.value))}" for r in part.itertuples()),
                "conclusion": stats.conclusion(part, base),
                "evidence": str(Path(run) / "results" / name),
                "environment": {k: environment.get(k) for k in ("hardware_key", "gpus", "driver")}
                | {"packages": environment.get("packages", {})},
            })
    return entries


def append(entries: list[dict]) -> pd.DataFrame:
    """Append the entries to the journal, one JSON line each, secrets redacted; they come back as a table (as
    filed), so a notebook that files them also shows what it filed."""
    path = journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = redact(entries)
    with open(path, "a+b") as f:  # a line cut short (a full disk, a kill) must not swallow the next entry
        f.seek(0, 2)
        if f.tell() and (f.seek(-1, 2), f.read(1))[1] != b"\n":
            f.write(b"\n")
    with open(path, "a") as f:
        for entry in entries:
            f.write(json.dumps(entry, default=str) + "\n")
    return pd.DataFrame(entries)


def read() -> pd.DataFrame:
    """The journal as a DataFrame, one row per entry (empty, with its columns, when there is no journal yet).
    Lines that cannot be read are left out and named in the table's attrs["damaged"] ("line N: why")."""
    path = journal_path()
    columns = ["when_utc", "experiment", "load", "change", "metric", "conclusion", "evidence"]
    if not path.exists():
        return pd.DataFrame(columns=columns)
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise DamagedStore(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    entries, damaged = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            entry, why = None, f"not JSON ({exc.msg})"
        else:
            why = None if isinstance(entry, dict) else "not a journal entry"
        if why:
            damaged.append(f"{path} line {number}: {why}")
        else:
            entries.append(entry)
    table = pd.DataFrame(entries).reindex(columns=list(dict.fromkeys(columns + [k for e in entries for k in e])))
    table.attrs["damaged"] = damaged
    return table
