"""The lab's second use: rerun every notebook unattended after a hardware, driver or vLLM upgrade.

A suite run is one folder, data/runs/<UTC time>-<hardware>/, holding the executed notebooks (a failing
one keeps papermill's copy with its error), their results (results/, a store of its own, so a new run
never resumes from an old one), status.json per notebook and suite.json. A run is resumed by naming its
folder: notebooks already done are skipped and an interrupted experiment resumes inside its store.

Launch overrides (`--override enforce_eager=true`) force knobs onto every arm of every experiment: the way
to rerun the suite with one deliberate change and see what it does to each experiment. An override scoped
to a selection (`--override L3_kernel/profile_hotspots:enforce_eager=true`) changes only those notebooks,
and the others are the comparison's controls: they should show no detectable change.

`--jobs N` runs N notebooks at once on a CPU, each bound to its own share of the cores: a smoke check of
the wiring in about half the time on two cores, whose arms contend with each other (the report says so);
measurements run one notebook at a time, the default.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import time
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter, DamagedStore
from labkit.measure.placement import BIND, split_cores
from labkit.spec.knobs import check_knobs
from labkit.suite.parameters import PROFILES, check_parameters, parameters_for
from labkit.files import make_portable, new_folder, portable, without_widget_state, write_json_atomic
from labkit.store import read_record
from labkit.redact import REDACTED, redact, redact_text, secret_values

NOTEBOOKS = settings.NOTEBOOKS
KERNEL_DIED_AT_START = "Kernel died before replying to kernel_info"  # jupyter_client's words
READERS = ("explore.ipynb",)  # notebooks that read the stores the others write, and measure nothing
# Notebooks whose checks order one arm's loads by their timings (more prompt tokens, a later first token): with
# notebooks at once, the cores other processes kept busy (the sibling notebook's among them) slowed whole short
# trials and turned the order over. Three clean clones failed request_shape so; in the third, the 8-token load's
# fastest request took 884 ms against 100 ms at 64 tokens, its trial beside 0.99 busy cores (the re-measure limit
# is 1.0) with 0.99 of the lab's threads waiting for a CPU, against 0.01 and 0.35. They run with nothing beside them.
ALONE = ("request_shape.ipynb",)
CLUSTER_RECORD = "cluster.json"  # a run made over a Ray cluster (labkit.suite.on_ray): one suite run per hardware

def utc_stamp() -> str:
    """The one clock of run folders: UTC, so runs made on machines in other time zones sort together."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def default_profile(hardware: str) -> str:
    """The parameter profile of a hardware key: cpu-smoke on a CPU, the profile named after the key where
    there is one, else gpu."""
    if hardware.startswith("cpu-"):
        return "cpu-smoke"
    return hardware if hardware in PROFILES else "gpu"


def discover(selection: list[str] | None = None) -> list[Path]:
    """Every notebook (quickstart first, then by layer), or those a selection names: a layer (L3), a
    folder (L3_kernel) or notebook paths. A notebook added later needs no code change."""
    found = sorted((p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts),
                   key=lambda p: (p.parent != NOTEBOOKS, str(p.relative_to(NOTEBOOKS))))
    if not selection:
        return found
    chosen = []
    for item in selection:
        rel = [p for p in found if str(p.relative_to(NOTEBOOKS)).startswith(item)
               or p.parent.name.startswith(item) or str(p) == str(Path(item).resolve())]
        if not rel:
            layers = sorted({p.parent.name.split("_")[0] for p in found if p.parent != NOTEBOOKS})
            raise BadParameter(f"{item!r} names no notebook; layers are {layers}, notebooks are "
                               f"{[str(p.relative_to(NOTEBOOKS)) for p in found]}")
        chosen += [p for p in rel if p not in chosen]
    return chosen


def _slug(notebook: Path) -> str:
    """L3_kernel/cuda_graphs.ipynb -> L3_kernel__cuda_graphs: one flat folder per run."""
    return str(notebook.relative_to(NOTEBOOKS).with_suffix("")).replace("/", "__")


def _scoped(name: str) -> tuple[str, str]:
    """An override's name as (selection, knob): "L3:enforce_eager" -> ("L3", "enforce_eager"), "" when unscoped."""
    scope, _, knob = name.rpartition(":")
    return scope, knob


def parse_overrides(items: list[str]) -> dict:
    """`enforce_eager=true` -> {"enforce_eager": True}, and a scoped one, `L3:enforce_eager=true` ->
    {"L3:enforce_eager": True}: values are JSON where they parse, text otherwise (run_suite checks them)."""
    knobs = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not _scoped(name)[1]:
            raise BadParameter(f"an override is [SELECTION:]KNOB=VALUE, such as enforce_eager=true or "
                               f"L3_kernel/profile_hotspots:enforce_eager=true; got {item!r}")
        try:
            knobs[name] = json.loads(text)
        except json.JSONDecodeError:
            knobs[name] = text
    return knobs


def overrides_for(overrides: dict, notebook: Path) -> dict:
    """The knobs forced onto one notebook's arms: the unscoped overrides and those whose selection names it."""
    knobs = {}
    for name, value in overrides.items():
        scope, knob = _scoped(name)
        if not scope or notebook in discover([scope]):
            knobs[knob] = value
    return knobs


def check_overrides(overrides: dict, notebooks: list[Path]) -> None:
    """Every override is a valid knob for the notebooks it reaches, and a scoped one reaches at least one."""
    for nb in notebooks:
        check_knobs(overrides_for(overrides, nb), "--override")
    for name in overrides:
        scope = _scoped(name)[0]
        if scope and not set(discover([scope])) & set(notebooks):
            raise BadParameter(f"override {name!r}: {scope!r} names none of this run's notebooks "
                               f"{[str(p.relative_to(NOTEBOOKS)) for p in notebooks]}; add it to the selection")


# The longest a cell may take, by profile: only where every cell is short. A smoke cell takes seconds to a few
# minutes; one that passes this is stuck (a kernel idle whose reply never reached papermill, seen on a 2-core CI
# machine), and its notebook runs again. A measuring profile's cells run as long as their arms need.
CELL_LIMITS_S = {"cpu-smoke": 600}  # whole seconds: nbclient takes an integer


def run_suite(selection: list[str] | None = None, profile: str | None = None, run_dir: str | Path | None = None,
              progress: bool = True, overrides: dict | None = None, jobs: int = 1) -> Path:
    """Execute the notebooks, one at a time or `jobs` at once (a CPU's cores split between them, see
    core_groups); a failure is recorded and the suite goes on. Returns the run folder."""
    from tqdm.auto import tqdm

    from labkit.measure.environment import fingerprint, hardware_key

    hardware = hardware_key()
    cores = core_groups(jobs, hardware)  # before anything runs, as every other refusal
    if run_dir:
        run = Path(run_dir)
        if (run / CLUSTER_RECORD).exists():
            raise BadParameter(f"{run} ran on a Ray cluster: resume it there, with --cluster HOST:PORT")
        if not (run / "suite.json").exists():
            raise BadParameter(f"{run} is not a suite run (no suite.json): name a folder `labkit suite` made")
        meta = read_record(run / "suite.json", "profile", "notebooks")
        stored = meta.get("overrides", {})  # as stored: secrets redacted
        if overrides and redact(overrides) != stored:
            raise BadParameter(f"{run} was started with overrides {stored}; a resumed run keeps "
                               "them: start a new run for other overrides")
        if not overrides and REDACTED in json.dumps(stored):
            raise BadParameter(f"{run} was started with overrides that hold a secret, which the lab does not store "
                               f"({stored}): resume it with the same --override options again")
        profile, overrides = meta["profile"], overrides or stored
        notebooks = discover(selection or meta["notebooks"])
    else:
        notebooks = discover(selection)  # bad selections, profiles and overrides fail before anything runs
        profile, overrides = profile or default_profile(hardware), overrides or {}
        for nb in notebooks:  # a profile's value the notebook does not take fails here, not in its kernel
            check_parameters(nb, parameters_for(profile, nb))
        check_overrides(overrides, notebooks)
        stamp = utc_stamp()
        run = new_folder(settings.current().runs_dir, f"{stamp}-{hardware}")  # two suites in one second: two runs
        write_suite_record(run, profile, hardware, stamp, notebooks, overrides, jobs, fingerprint())
    suite_settings = settings.current().replace(results_dir=run / "results")  # the run's own store
    done, work = pending(run, notebooks, profile, overrides)
    secrets = secret_values(overrides)  # a kernel's output may echo an override's secret without its name
    bar = tqdm(total=len(notebooks), initial=len(done), desc="suite", unit="notebook", disable=not progress)
    if cores == [None]:
        for nb, parameters, knobs in work:
            bar.set_postfix_str(nb.name)
            _report(bar, nb, run_notebook(nb, run, parameters, knobs, secrets, suite_settings,
                                          cell_limit_s=CELL_LIMITS_S.get(profile)), secrets)
    else:
        _run_at_once(work, run, secrets, suite_settings, cores, bar, CELL_LIMITS_S.get(profile))
    bar.close()
    return run


def write_suite_record(run: Path, profile: str, hardware: str, stamp: str, notebooks: list[Path], overrides: dict,
                       jobs: int, environment: dict, **more) -> None:
    """The run's suite.json: what a resume, a comparison and the report read back."""
    write_json_atomic(run / "suite.json", {"profile": profile, "hardware_key": hardware, "started_utc": stamp,
                                           "notebooks": [str(p.relative_to(NOTEBOOKS)) for p in notebooks],
                                           "overrides": overrides, "jobs": jobs, "environment": environment, **more})


def pending(run: Path, notebooks: list[Path], profile: str, overrides: dict) -> tuple[list[Path], list[tuple]]:
    """The notebooks a run has done, and the work left: (notebook, its parameters, its overrides) each."""
    done = [nb for nb in notebooks if _status(run / f"{_slug(nb)}.status.json") == "ok"]  # a damaged one runs again
    return done, [(nb, parameters_for(profile, nb), overrides_for(overrides, nb)) for nb in notebooks if nb not in done]


def run_notebook(nb: Path, run: Path, parameters: dict, knobs: dict, secrets: list[str], suite_settings,
                 bind: str | None = None, cell_limit_s: int | None = None) -> str | None:
    """Execute one notebook into the run folder and write its status record; its error, or None. `bind`
    (a VLLM_CPU_OMP_THREADS_BIND value) keeps its engines on cores of their own when notebooks run at once. A
    cell past `cell_limit_s` (the profile's CELL_LIMITS_S) fails the attempt, and the notebook runs once more."""
    import papermill

    started, error, retried = time.monotonic(), None, None
    for attempt in range(2):
        try:  # the kernel starts with this notebook's settings (and cores) in its environment
            with settings.exported(suite_settings.replace(launch_overrides=knobs)), _cores_bound(bind):
                papermill.execute_notebook(str(nb), str(run / f"{_slug(nb)}.ipynb"), parameters=parameters,
                                           cwd=str(nb.parent), kernel_name="python3", progress_bar=False,
                                           execution_timeout=cell_limit_s)
            error = None
        except Exception as exc:  # papermill keeps the executed copy with the failing cell; the suite goes on
            error = f"{type(exc).__name__}: {str(exc)[-2000:]}"
            if attempt == 0 and (type(exc).__name__ == "CellTimeoutError" or KERNEL_DIED_AT_START in str(exc)):
                # a cell timed out: seen on a 2-core machine, a kernel idle, its cell's reply not seen by
                # papermill until the limit (one cause found and removed: output captured into an ipywidgets
                # Output, see present/explore.py); arms already measured are read back from the store, so a
                # second run is cheap. A kernel that died at its start ran nothing: two kernels started at once
                # (notebooks at once) can race for the same ports (seen: the quickstart's kernel, 2 s in)
                retried = error.splitlines()[0][:300]
                continue
        break
    executed = run / f"{_slug(nb)}.ipynb"
    if executed.exists():  # tracebacks and logs in its outputs name this machine's paths
        make_portable(executed, secrets=secrets)
        without_widget_state(executed)
    _write_status(run, nb, error, time.monotonic() - started, bind, secrets, retried)
    return error


def _write_status(run: Path, nb: Path, error: str | None, seconds: float, bind: str | None, secrets,
                  retried: str | None = None, node: str | None = None) -> None:
    write_json_atomic(run / f"{_slug(nb)}.status.json",
                      {"notebook": str(nb.relative_to(NOTEBOOKS)), "status": "failed" if error else "ok",
                       "error": error and portable(error), "seconds": seconds, "cores": bind,
                       **({"retried_after": portable(retried)} if retried else {}),
                       **({"node": node} if node else {})}, secrets=secrets)


@contextlib.contextmanager
def _cores_bound(bind: str | None):
    """VLLM_CPU_OMP_THREADS_BIND=bind for the kernel started inside (nothing when None), then as it was."""
    if bind is None:
        yield
        return
    saved = os.environ.get(BIND)
    os.environ[BIND] = bind
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(BIND, None)
        else:
            os.environ[BIND] = saved


def _report(bar, nb: Path, error: str | None, secrets: list[str]) -> None:
    bar.update()
    if error:
        bar.write(redact_text(f"{nb.relative_to(NOTEBOOKS)} failed: {error.splitlines()[0][:200]}", secrets))


def _run_at_once(work: list, run: Path, secrets: list[str], suite_settings, cores: list[str], bar,
                 cell_limit_s: int | None = None) -> None:
    """Each notebook in a spawned process of its own, as many at once as there are core groups, each on a
    free group; a process that dies without its status record is recorded as the notebook's failure."""
    import multiprocessing
    from multiprocessing.connection import wait

    spawn, free, running, pending = multiprocessing.get_context("spawn"), list(cores), {}, list(work)
    order = [item[0] for item in work]
    try:
        while pending or running:
            unfinished = {item[0] for item in pending} | {entry[1] for entry in running.values()}
            while free and (ready := next((item for item in pending if may_start(
                    item[0], order, unfinished, {entry[1] for entry in running.values()})), None)):
                pending.remove(ready)
                (nb, parameters, knobs), bind = ready, free.pop(0)
                proc = spawn.Process(target=run_notebook, name=f"labkit-suite-{_slug(nb)}",
                                     args=(nb, run, parameters, knobs, secrets, suite_settings, bind, cell_limit_s))
                proc.start()
                running[proc.sentinel] = (proc, nb, bind, time.monotonic())
                bar.set_postfix_str(", ".join(item[1].name for item in running.values()))
            for sentinel in wait(list(running)):
                proc, nb, bind, started = running.pop(sentinel)
                proc.join()
                free.append(bind)
                if proc.exitcode != 0:  # killed, or out of memory: its status (if any) did not see the end
                    _write_status(run, nb, f"the notebook's process ended with exit code {proc.exitcode}",
                                  time.monotonic() - started, bind, secrets)
                _report(bar, nb, read_record(run / f"{_slug(nb)}.status.json", "status").get("error"), secrets)
    finally:  # an interrupted suite ends the notebooks it started (their kernels end their arms)
        for proc, *_ in running.values():
            proc.terminate()
            proc.join(30)


def may_start(nb: Path, order: list[Path], unfinished: set[Path], running: set[Path] = frozenset()) -> bool:
    """Whether a notebook may start beside the `running` ones: a reader of the others' stores (explore) waits for
    every notebook before it in the run's order, so it sees what it would have seen one at a time; a notebook
    that runs ALONE starts when nothing runs, and nothing starts beside it."""
    if any(other.name in ALONE for other in running) or nb.name in ALONE and running:
        return False
    return nb.name not in READERS or not unfinished & set(order[:order.index(nb)])


def core_groups(jobs: int, hardware: str, bind: str | None = None, usable: list[int] | None = None) -> list:
    """The VLLM_CPU_OMP_THREADS_BIND value of each of `jobs` notebooks at once: [None] for one at a time,
    else the cores this process may use, split into that many contiguous groups. Refused on a GPU machine
    (each notebook measures its whole GPU), with more jobs than cores, or beside a binding already set."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BadParameter(f"jobs is how many notebooks run at once, a whole number from 1; got {jobs!r}")
    if jobs == 1:
        return [None]
    usable = sorted(os.sched_getaffinity(0)) if usable is None else usable
    bind = os.environ.get(BIND) if bind is None else bind
    problems = []
    if not hardware.startswith("cpu-"):
        problems.append(f"this is a GPU machine ({hardware}): its notebooks run one at a time, each measuring the "
                        "whole GPU, so leave --jobs at 1")
    if jobs > len(usable):
        problems.append(f"{jobs} notebooks at once need {jobs} cores and this process may use {len(usable)}: "
                        f"use --jobs {len(usable)} or fewer")
    if bind not in (None, "", "auto"):
        problems.append(f"{BIND}={bind!r} is set: --jobs binds each notebook's engines to cores of its own "
                        f"through it, so unset it or leave --jobs at 1")
    if problems:
        raise BadParameter("; ".join(problems))
    return split_cores(usable, jobs)


def _status(path: Path) -> str:
    try:
        return read_record(path, "status")["status"]
    except DamagedStore:
        return "damaged"


def statuses(run: str | Path) -> list[dict]:
    """The status.json records of a suite run's notebooks, in file-name order; one that cannot be read is a
    record of status "damaged" that names the file."""
    found = []
    for path in sorted(Path(run).glob("*.status.json")):
        try:
            found.append(read_record(path, "notebook", "status"))
        except DamagedStore as exc:
            found.append({"notebook": path.name.removesuffix(".status.json"), "status": "damaged", "error": str(exc)})
    try:  # a notebook of the run with no record at all did not finish: never counted as passed
        listed = read_record(Path(run) / "suite.json", "notebooks")["notebooks"]
    except DamagedStore:
        listed = []  # compare names a damaged suite.json itself
    recorded = {p.name.removesuffix(".status.json") for p in Path(run).glob("*.status.json")}
    for notebook in listed:
        if _slug(NOTEBOOKS / notebook) not in recorded:
            found.append({"notebook": notebook, "status": "not run", "error": "no status record: the run ended "
                          "before this notebook finished; finish it with `labkit suite --resume RUN`"})
    return found
