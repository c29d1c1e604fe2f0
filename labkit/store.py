"""Append-only results on disk, loaded back as pandas DataFrames.

    data/results/<experiment>/
        experiment.json          the spec of the first run (never rewritten)
        arms/<arm>/              one complete arm: arm.json, requests.parquet, trials.parquet, engine.log
        failures/<arm>-<utc>/    every failed attempt: failure.json, engine.log
        skipped/<arm>.json       arms that cannot run on this platform, and why
        .work/                   workers write here; a folder moves into arms/ or failures/ in one rename

A complete arm is never overwritten: rerunning an experiment skips it (resume). An arm whose stored
spec differs from the one asked for is a conflict, reported before any engine starts.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from labkit import settings
from labkit.files import make_portable, new_folder, write_json_atomic
from labkit.errors import BadParameter, DamagedStore, StoreConflict, StoreUnwritable
from labkit.redact import redact, secret_values
from labkit.shown import shows_whole

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=+")


INTERRUPTED = ("interrupted: the run that measured this arm ended (a signal, a kill or a crash) before it could "
               "record the arm; the engine log up to then is kept here")


def check_name(name: str, what: str) -> str:
    """The name, when it is safe as a folder name; otherwise BadParameter says what a `what` name may hold."""
    if not isinstance(name, str) or not name or not set(name) <= _SAFE or name.startswith("."):
        raise BadParameter(f"{what} name {name!r} must be letters, digits and - _ . = + (used as a folder name)")
    return name


def spec_hash(spec: dict) -> str:
    """The first 16 hex digits of the SHA-256 of the spec as sorted JSON: equal for equal specs."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


class ExperimentStore:
    """The folder of one experiment."""

    def __init__(self, name: str, root: str | Path | None = None):
        self.name = check_name(name, "experiment")
        self.path = Path(root or settings.current().results_dir) / name

    def arm_dir(self, arm: str) -> Path:
        """The folder a complete arm is stored in."""
        return self.path / "arms" / arm

    def begin(self, spec: dict) -> None:
        """Create the experiment's folder and write the spec to experiment.json, unless one is there already."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / "experiment.json").exists():
            write_json_atomic(self.path / "experiment.json", spec)

    def completed_spec(self, arm: str) -> dict | None:
        """The spec a complete arm was measured with, or None when the arm is not stored; an arm folder whose
        record is damaged raises DamagedStore (it is never measured over)."""
        folder = self.arm_dir(arm)
        if not folder.is_dir() or not any(folder.iterdir()):
            return None
        try:
            return _complete_arm(folder)[0]["spec"]
        except DamagedStore as exc:
            raise DamagedStore(f"{exc}; move {folder} away to measure arm {arm!r} again") from None

    def check_resumable(self, arm: str, spec: dict) -> bool:
        """True when the arm is already complete with this spec; a different stored spec is a conflict. Specs
        are compared as stored, secrets redacted: a rerun with the same VLLM_API_KEY resumes."""
        stored = self.completed_spec(arm)
        if stored is None:
            return False
        stored, spec = redact(stored), redact(spec)
        if spec_hash(stored) != spec_hash(spec):
            changed = sorted(k for k in set(stored) | set(spec) if stored.get(k) != spec.get(k))
            raise StoreConflict(
                f"experiment {self.name!r} already holds arm {arm!r} measured with different {changed}. "
                f"Give the experiment a new name to compare both, or move {self.arm_dir(arm)} away to remeasure.")
        return True

    @contextlib.contextmanager
    def lock(self):
        """Hold the experiment for this process: one writer at a time. The lock is the kernel's (fcntl), so it
        goes with its process however that process ends; a lock file left by a dead run is simply taken. A
        second run is refused, naming the holder, before it touches anything."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = open(self.path / ".lock", "a+")
        except OSError as exc:
            raise StoreUnwritable(f"cannot write experiment {self.name!r} under {self.path.parent} "
                                  f"({exc.strerror or exc}); give results_dir (or "
                                  f"{settings.VARIABLES['results_dir']}) a folder this process can write") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise StoreConflict(f"experiment {self.name!r} is being measured by another run ({holder}); wait for it "
                                "to finish, or give this run another experiment name") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}, since {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}")
            handle.flush()
            yield self
        finally:
            handle.close()  # releases the lock

    def new_workdir(self, arm: str) -> Path:
        """A new, uniquely named folder under .work/ for one attempt at an arm, named with this process's id."""
        work = self.path / ".work" / f"{arm}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)
        return work

    def commit_arm(self, arm: str, workdir: Path, meta: dict) -> Path:
        """The arm's folder, once arm.json is written and the workdir renamed to it; an arm already stored
        there raises StoreConflict. A write that fails (a full disk) raises StoreUnwritable and leaves the
        measurement in its workdir, never a half-written arm."""
        secrets = secret_values(meta)  # the arm's own (its environment knob): its engine log may echo them
        with _writing(f"arm {arm!r}", workdir):
            write_json_atomic(workdir / "arm.json", meta)
            make_portable(workdir, secrets=secrets)  # stored results name no path of this machine, and no secret
            target = self.arm_dir(arm)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()  # an empty folder holds no measurement: nothing is lost by taking its place
            if target.exists():
                raise StoreConflict(f"{target} appeared while this arm ran; nothing was overwritten "
                                    f"(the new measurement stays in {workdir})")
            os.rename(workdir, target)
        return target

    def record_failure(self, arm: str, workdir: Path, meta: dict) -> Path:
        """The failure's folder under failures/, once failure.json is written and the workdir renamed to it."""
        with _writing(f"the failure of arm {arm!r}", workdir):
            write_json_atomic(workdir / "failure.json", meta)
            make_portable(workdir, secrets=secret_values(meta))
            # two failures of an arm in one second get two folders; a rename replaces only an empty folder
            target = new_folder(self.path / "failures", f"{arm}-{_utc_stamp()}")
            os.rename(workdir, target)
        return target

    def record_skip(self, arm: str, meta: dict) -> None:
        """Write why an arm cannot run here to skipped/<arm>.json, unless a record is there already."""
        target = self.path / "skipped" / f"{arm}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            write_json_atomic(target, meta)

    def clean_work(self, keep: Path | None = None) -> list[Path]:
        """Clear the work folders of runs that died (they hold no complete result and are never resumed from);
        a folder whose run is alive stays. One whose engine had started becomes a failure record of its arm
        (cause "interrupted"), so a run ended by a signal or a kill still shows what its engine said; a worker
        started ahead of its turn that never came measured nothing and leaves no record; `keep` is one about
        to be taken over (the plan's early worker). Returns the folders cleared."""
        cleared = []
        for work in sorted((self.path / ".work").glob("*")):
            if keep is not None and work == keep:
                continue
            match = re.search(r"^(.+)-(\d+)-[0-9a-f]{8}$", work.name)
            if match and _alive(int(match.group(2))) and int(match.group(2)) != os.getpid():
                continue
            if match and (work / "engine.log").is_file() and _engine_started(work):
                self.keep_interrupted(match.group(1), work)
            else:
                shutil.rmtree(work, ignore_errors=True)
            cleared.append(work)
        return cleared

    def keep_interrupted(self, arm: str, work: Path) -> None:
        """Record an attempt whose run ended before its outcome was known as a failure of cause "interrupted",
        with the engine log's root cause and tail."""
        from labkit.measure.engine_log import failure_summary, read_log

        try:
            self.record_failure(arm, work, {"arm": arm, "cause": INTERRUPTED, "log_tail": failure_summary(
                read_log(work / "engine.log")), "recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(
                timespec="seconds")})
        except StoreUnwritable:  # it stays in .work/ for a later run; the measurement was never complete
            pass


@contextlib.contextmanager
def _writing(what: str, workdir: Path):
    """Turn a failed write into StoreUnwritable naming what was being stored and where its files stay."""
    try:
        yield
    except OSError as exc:
        raise StoreUnwritable(f"could not store {what} ({exc.strerror or exc}); nothing was half-written, and its "
                              f"files stay in {workdir} until the next run: free space or fix the folder, then rerun") from None


def _engine_started(work: Path) -> bool:
    try:
        return '"starting engine"' in (work / "progress.jsonl").read_text()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@dataclass
class Results:
    """An experiment's stored results as DataFrames."""

    name: str
    path: Path
    spec: dict
    arms: pd.DataFrame  # one row per arm: status, cause, knobs and resolved facts
    requests: pd.DataFrame  # one row per measured request
    trials: pd.DataFrame  # one row per trial
    environment: dict  # arm -> fingerprint of the worker that measured it

    @property
    def complete_arms(self) -> list[str]:
        """The names of the complete arms, in the experiment's order."""
        return self.arms.loc[self.arms.status == "complete", "arm"].tolist()

    @property
    def measured_arms(self) -> list[str]:
        """The complete arms with trials in these results: within one load (`select`), those that ran it. A
        load search probes each arm at its own levels, so an arm can be complete without a given load."""
        ran = set(self.trials["arm"]) if "arm" in self.trials else set()
        return [arm for arm in self.complete_arms if arm in ran]

    @property
    def reference_arm(self) -> str | None:
        """The arm every other arm is compared with when nobody names one (report, journal): the first
        complete arm in the experiment's own order."""
        return self.complete_arms[0] if self.complete_arms else None

    def arm_file(self, arm: str, name: str) -> Path:
        """A file in one complete arm's stored folder (its trace, its arm.json). A name read from stored data
        that would lead out of that folder is refused: a damaged or hand-edited store cannot point elsewhere."""
        if arm not in self.complete_arms:
            raise BadParameter(f"no complete arm {arm!r} in {self.name}; complete arms: {self.complete_arms}")
        folder = (Path(self.path) / "arms" / arm).resolve()
        target = (folder / name).resolve()
        if not target.is_relative_to(folder):
            raise BadParameter(f"{self.name}/{arm}: the stored name {name!r} points outside the arm's folder")
        return target

    def arm_spec(self, arm: str) -> dict:
        """What the arm asked for (engine arguments, workloads, protocol), as stored with it."""
        return json.loads(self.arm_file(arm, "arm.json").read_text())["spec"]

    def part(self, name: str) -> "Results":
        """The requests of one part of a Mix load (trials stay whole: they cover every part)."""
        parts = set(self.requests.get("part", pd.Series(dtype=object)).dropna())
        if name not in parts:
            raise BadParameter(f"experiment {self.name!r} has no load part {name!r}; parts: {sorted(parts)}")
        return Results(self.name, self.path, self.spec, self.arms, self.requests[self.requests["part"] == name],
                       self.trials, self.environment)

    @shows_whole
    def facts(self, *columns: str) -> pd.DataFrame:
        """Arm, status and the named facts; a fact no arm recorded (e.g. graph capture on a CPU) shows as
        missing instead of failing."""
        return self.arms.reindex(columns=["arm", "status", *columns])

    def load_search(self, arm: str | None = None, search: str | None = None) -> pd.DataFrame:
        """The stored load searches as a table: per arm, search and probe the load, each SLO metric's value [95 %
        interval], whether it met them and whether it saturated (labkit.analyze.load_search.search_table)."""
        from labkit.analyze.load_search import search_table
        return search_table(self, arm, search)

    @property
    def loads(self) -> list[str]:
        """The load names of the trials, in first-seen order; empty when no load is named."""
        return list(dict.fromkeys(self.trials["load"])) if "load" in self.trials else []

    def per_load(self) -> list[tuple[str, "Results"]]:
        """(load name, its results) for each load; results of a single load (or none named) stay whole."""
        if len(self.loads) > 1:
            return [(name, self.select(name)) for name in self.loads]
        return [(self.loads[0] if self.loads else "default", self)]

    def select(self, load: str) -> "Results":
        """The same results restricted to one load (statistics compare like with like)."""
        if load not in self.loads:
            raise BadParameter(f"experiment {self.name!r} has no load {load!r}; its loads are {self.loads}")
        return Results(self.name, self.path, self.spec, self.arms, self.requests[self.requests["load"] == load],
                       self.trials[self.trials["load"] == load], self.environment)


def read_record(path: Path, *keys: str) -> dict:
    """The JSON object a store file holds, with `keys` present; a file that is cut short, edited or missing
    raises DamagedStore naming it."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedStore(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    missing = [key for key in keys if not isinstance(record, dict) or key not in record]
    if missing:
        raise DamagedStore(f"{path} lacks {missing}: it was not written by the lab, or was edited")
    return record


def _complete_arm(folder: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """A complete arm's record and tables; DamagedStore names the file that cannot be read."""
    meta = read_record(folder / "arm.json", "arm", "spec")
    if meta["arm"] != folder.name:
        raise DamagedStore(f"{folder / 'arm.json'} is arm {meta['arm']!r}'s record, in the folder of {folder.name!r}")
    tables = []
    for table in ("requests", "trials"):
        try:
            tables.append(pd.read_parquet(folder / f"{table}.parquet"))
        except Exception as exc:  # pyarrow raises several types for a missing or truncated file
            raise DamagedStore(f"{folder / (table + '.parquet')} cannot be read ({type(exc).__name__}: {exc})") from None
    return meta, with_token_gaps(tables[0]), tables[1]


# A request's tokens as stored: each token's stamp in s from the trial's start (`token_s`, the clock's own
# resolution). The gaps between consecutive tokens (`itl_ms`, what TBT reads) are the same information, so they
# are derived from the stamps (token_gaps) where a table is formed and loaded, and not stored; tables written
# before this hold both columns, and read as they were.
STAMPS, GAPS = "token_s", "itl_ms"


def token_gaps(token_s) -> np.ndarray:
    """A request's gaps between consecutive tokens, in ms, from its token stamps (s): tokens that arrived
    together share a stamp, so their gaps are exactly 0. The stamps are differences on one clock, so these are
    bit for bit the gaps taken between the clock's own readings."""
    stamps = np.asarray(token_s if token_s is not None else [], float)
    return np.diff(stamps) * 1e3 if len(stamps) > 1 else np.array([])


def requests_to_store(requests: pd.DataFrame) -> pd.DataFrame:
    """A requests table as it is written: without the gaps where the stamps they derive from are there."""
    return requests.drop(columns=GAPS) if STAMPS in requests and GAPS in requests else requests


def with_token_gaps(requests: pd.DataFrame) -> pd.DataFrame:
    """A stored requests table with its gaps column, derived from the stamps where it was not stored (placed
    before the stamps, where tables that hold both have it)."""
    if STAMPS not in requests or GAPS in requests:
        return requests
    out = requests.copy()
    out.insert(out.columns.get_loc(STAMPS), GAPS, [token_gaps(stamps) for stamps in out[STAMPS]])
    return out


def load(name: str, root: str | Path | None = None) -> Results:
    """An experiment's stored results: its complete arms with their requests and trials, the latest failure of
    each arm that never completed, the arms not applicable here, and any arm whose stored files are damaged
    (status "damaged", the file and what to do in `cause`): one damaged arm leaves the others readable."""
    store = ExperimentStore(name, root)
    if not (store.path / "experiment.json").exists():
        if (store.path / "arms").is_dir():
            raise DamagedStore(f"{store.path / 'experiment.json'} is missing beside the stored arms: the experiment "
                               f"cannot be read; move {store.path} away to measure it again")
        raise BadParameter(f"no stored experiment {name!r} under {store.path.parent}")
    spec = read_record(store.path / "experiment.json")
    rows, requests, trials, environment = [], [], [], {}
    for folder in sorted(p for p in (store.path / "arms").glob("*") if p.is_dir()):
        arm = folder.name
        try:
            meta, arm_requests, arm_trials = _complete_arm(folder)
        except DamagedStore as exc:
            rows.append({"arm": arm, "status": "damaged",
                         "cause": f"{exc}; move {folder} away to measure the arm again"})
            continue
        rows.append({"arm": arm, "status": "complete", "cause": None, **_flat(meta)})
        environment[arm] = meta.get("environment", {})
        requests.append(arm_requests.assign(arm=arm))
        trials.append(arm_trials.assign(arm=arm))
    stored = {r["arm"] for r in rows}
    for kind, pattern, keys in (("failed", "failures/*/failure.json", ("arm", "cause")),
                                ("not applicable", "skipped/*.json", ("arm", "reason"))):
        for record_file in sorted(store.path.glob(pattern)):
            try:
                meta = read_record(record_file, *keys)
            except DamagedStore as exc:
                rows.append({"arm": record_file.parent.name if kind == "failed" else record_file.stem,
                             "status": "damaged", "cause": str(exc)})
                continue
            if meta["arm"] in stored:  # a complete (or damaged) arm outranks its failures and skips
                continue
            rows = [r for r in rows if r["arm"] != meta["arm"]]  # the latest failure of an arm that never completed
            if kind == "failed":
                rows.append({"arm": meta["arm"], "status": "failed", "cause": meta["cause"],
                             "log_tail": meta.get("log_tail", ""), "evidence": str(record_file.parent), **_flat(meta)})
            else:
                rows.append({"arm": meta["arm"], "status": "not applicable", "cause": meta["reason"], **_flat(meta)})
    order = list(spec.get("arms", {}))
    arms = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["arm", "status"])  # an experiment with no arm yet
    if not arms.empty:
        arms["_order"] = arms.arm.map(lambda a: order.index(a) if a in order else len(order))
        arms = arms.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    return Results(name, store.path, spec, arms,
                   pd.concat(requests, ignore_index=True) if requests else pd.DataFrame(),
                   _with_speculation_columns(_with_cache_columns(pd.concat(trials, ignore_index=True)))
                   if trials else pd.DataFrame(), environment)


def _with_cache_columns(trials: pd.DataFrame) -> pd.DataFrame:
    """The prefix cache's share of each trial's prompt tokens and the prefill tokens left to compute, from the
    engine's counters (vLLM counts the prompt tokens it received, queried in the cache and found there; with
    the cache off it queries none, so it served none)."""
    if not {"prefix_cache_queries", "prefix_cache_hits", "engine_prompt_tokens"} <= set(trials):
        return trials
    queries, hits, prompt = trials.prefix_cache_queries, trials.prefix_cache_hits, trials.engine_prompt_tokens
    hit_pct = (100 * hits / queries.where(queries > 0)).where(queries > 0, 0.0).where(prompt > 0)
    return trials.assign(prefix_hit_pct=hit_pct, prefill_tokens_computed=prompt - hits)


def _with_speculation_columns(trials: pd.DataFrame) -> pd.DataFrame:
    """Speculative decoding in each trial, from vLLM's counters: the share of drafted tokens the target model
    accepted, and the mean accepted length (1 + accepted per draft: the tokens one verifying step yields, as
    vLLM's own log reports it); empty where an arm drafted nothing."""
    if not {"spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"} <= set(trials):
        return trials
    drafts, drafted, accepted = trials.spec_drafts, trials.spec_draft_tokens, trials.spec_accepted_tokens
    return trials.assign(spec_acceptance_pct=100 * accepted / drafted.where(drafted > 0),
                         spec_accepted_length=1 + accepted / drafts.where(drafts > 0))


def _flat(meta: dict) -> dict:
    flat = {f"knob.{k}": v for k, v in meta.get("spec", {}).get("knobs", {}).items()}
    flat.update(meta.get("facts", {}))
    for key in ("seconds", "recorded_utc"):
        if key in meta:
            flat[key] = meta[key]
    return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in flat.items()}
