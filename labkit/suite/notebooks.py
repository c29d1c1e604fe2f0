"""The lab's second use: rerun every notebook unattended after a hardware, driver or vLLM upgrade.

A suite run is one folder, data/runs/<UTC time>-<hardware>/, holding the executed notebooks (a failing
one keeps papermill's copy with its error), their results (results/, a store of its own, so a new run
never resumes from an old one), status.json per notebook and suite.json. A run is resumed by naming its
folder: notebooks already done are skipped and an interrupted experiment resumes inside its store.

Launch overrides (`--override enforce_eager=true`) force knobs onto every arm of every experiment: the way
to rerun the suite with one deliberate change and see what it does to each experiment. An override scoped
to a selection (`--override L3_kernel/profile_hotspots:enforce_eager=true`) changes only those notebooks,
and the others are the comparison's controls: they should show no detectable change.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter, DamagedStore
from labkit.spec.knobs import check_knobs
from labkit.suite.parameters import PROFILES, check_parameters, parameters_for
from labkit.files import make_portable, new_folder, portable, without_widget_state, write_json_atomic
from labkit.store import read_record
from labkit.redact import REDACTED, redact, redact_text, secret_values

NOTEBOOKS = settings.NOTEBOOKS

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


def run_suite(selection: list[str] | None = None, profile: str | None = None, run_dir: str | Path | None = None,
              progress: bool = True, overrides: dict | None = None) -> Path:
    """Execute the notebooks one by one; a failure is recorded and the suite goes on. Returns the run folder."""
    import papermill
    from tqdm.auto import tqdm

    from labkit.measure.environment import fingerprint, hardware_key

    hardware = hardware_key()
    if run_dir:
        run = Path(run_dir)
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
        write_json_atomic(run / "suite.json", {"profile": profile, "hardware_key": hardware, "started_utc": stamp,
                                               "notebooks": [str(p.relative_to(NOTEBOOKS)) for p in notebooks],
                                               "overrides": overrides, "environment": fingerprint()})
    suite_settings = settings.current().replace(results_dir=run / "results")  # the run's own store
    bar = tqdm(notebooks, desc="suite", unit="notebook", disable=not progress)
    for nb in bar:
        status_file = run / f"{_slug(nb)}.status.json"
        if status_file.exists() and _status(status_file) == "ok":  # a damaged record runs the notebook again
            continue
        bar.set_postfix_str(nb.name)
        started, error = time.monotonic(), None
        secrets = secret_values(overrides)  # a kernel's output may echo an override's secret without its name
        try:  # the kernel starts with this notebook's settings in its environment
            with settings.exported(suite_settings.replace(launch_overrides=overrides_for(overrides, nb))):
                papermill.execute_notebook(str(nb), str(run / f"{_slug(nb)}.ipynb"),
                                           parameters=parameters_for(profile, nb), cwd=str(nb.parent),
                                           kernel_name="python3", progress_bar=False)
        except Exception as exc:  # papermill keeps the executed copy with the failing cell; the suite goes on
            error = f"{type(exc).__name__}: {str(exc)[-2000:]}"
            bar.write(redact_text(f"{nb.relative_to(NOTEBOOKS)} failed: {error.splitlines()[0][:200]}", secrets))
        executed = run / f"{_slug(nb)}.ipynb"
        if executed.exists():  # tracebacks and logs in its outputs name this machine's paths
            make_portable(executed, secrets=secrets)
            without_widget_state(executed)
        write_json_atomic(status_file, {"notebook": str(nb.relative_to(NOTEBOOKS)), "status": "failed" if error else "ok",
                                        "error": error and portable(error), "seconds": time.monotonic() - started},
                          secrets=secrets)
    return run


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
