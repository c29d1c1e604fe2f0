"""Every notebook in smoke mode on the real CPU engine, through the suite runner (papermill), then checked
with nbval: --nbval-lax re-runs each executed copy and its assertion cells must pass (the store resumes,
so the re-run measures nothing twice). The suite's report, journal and exit status are checked on the
same real run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
IDS = [str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS]

pytestmark = pytest.mark.notebook
JOBS = min(2, len(os.sched_getaffinity(0)))


# ~10 min, and ~1-2 min for each process's share of the nbval re-runs here: a stalled run fails, named, in bounded time
SUITE_LIMIT_S, NBVAL_LIMIT_S = 2400, 900


def bounded(command, limit_s, **kwargs):
    """subprocess.run with a limit that ends the whole tree (the suite's notebook processes, their kernels and
    engines), so a stalled run fails here with its output instead of holding the test session."""
    import psutil

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        for child in [*psutil.Process(proc.pid).children(recursive=True), proc]:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        out, err = proc.communicate()
        err += f"\n[ended after {limit_s} s: still running]"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def labkit(*args, env):
    return bounded([sys.executable, "-m", "labkit.cli", *args], SUITE_LIMIT_S, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    env = {**os.environ, "LABKIT_RUNS_DIR": str(tmp / "runs"), "LABKIT_JOURNAL": str(tmp / "journal.jsonl"),
           "LABKIT_BASELINES_DIR": str(tmp / "baselines")}
    # two notebooks at once, each on a core of its own: a wiring check, not a measurement
    done = labkit("suite", "--profile", "cpu-smoke", "--jobs", str(JOBS), env=env)
    runs = list((tmp / "runs").iterdir())
    assert len(runs) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return runs[0], done, env


def test_suite_runs_every_notebook_and_exits_clean(suite_run):
    run, done, _ = suite_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in run.glob("*.status.json")]
    assert {r["notebook"]: r["status"] for r in records} == {nb: "ok" for nb in IDS}
    if JOBS > 1:  # every notebook ran bound to one of the core groups, and each group was used
        assert len({r["cores"] for r in records}) == JOBS and None not in {r["cores"] for r in records}
    assert "no pinned baseline" in done.stdout and (run / "report.html").exists()
    # the capacity notebook's load searches: its goodput, at their SLOs, is in the report
    assert "Goodput at the load searches' SLOs" in (run / "report.html").read_text()


def test_a_suite_run_names_no_host_and_no_path_of_this_machine(suite_run):
    import gzip
    import re
    import socket

    run, _, _ = suite_run
    def readable(path):
        """A file's text: compressed files decompressed; tables (numbers) and embedded images (base64) left out,
        since a short host name such as "vm" occurs in any binary data by chance."""
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.suffix == ".gz" else b"" if path.suffix == ".parquet" else raw
        return re.sub(rb"(?:[A-Za-z0-9+/=]|\\n){200,}", b"", raw)

    machine = {"hostname": rf"\b{re.escape(socket.gethostname())}\b", "checkout": re.escape(str(ROOT)),
               "home": re.escape(str(Path.home())) + "/", "run": re.escape(str(run))}
    found = {(str(p.relative_to(run)), what) for p in run.rglob("*") if p.is_file()
             for what, pattern in machine.items() if re.search(pattern.encode(), readable(p))}
    assert not found, sorted(found)


@pytest.fixture(scope="module")
def nbval_runs(suite_run, tmp_path_factory):
    """nbval on every executed notebook, in JOBS pytest processes at once, each re-running its share of the
    notebooks one after another (one interpreter's start for many: ~4 s a notebook saved). Each re-run is a
    kernel that reads its own experiment's store in the run (the store resumes: nothing is measured twice, and no
    two re-runs write one store). Returns, per notebook, its cells' outcomes from the JUnit report and the
    output of the process that ran it."""
    import xml.etree.ElementTree as ET
    from concurrent.futures import ThreadPoolExecutor

    run, _, env = suite_run
    env = {**env, "LABKIT_RESULTS_DIR": str(run / "results")}
    reports = tmp_path_factory.mktemp("nbval")

    def nbval(group: int):
        names = [nb.replace("/", "__") for nb in IDS[group::JOBS]]
        report = reports / f"group-{group}.xml"
        done = bounded([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                        f"--junitxml={report}", *names], NBVAL_LIMIT_S, cwd=run, env=env)
        cells = {}
        if report.exists():
            for case in ET.parse(report).iter("testcase"):
                failed = [f"{child.tag}: {child.get('message', '')}\n{(child.text or '')[-1500:]}"
                          for child in case if child.tag in ("failure", "error")]
                cells.setdefault(case.get("classname"), []).append((case.get("name"), failed))
        return {nb: (cells.get(nb.replace("/", "__"), []), done) for nb in IDS[group::JOBS]}

    with ThreadPoolExecutor(JOBS) as pool:
        return {nb: found for group in pool.map(nbval, range(JOBS)) for nb, found in group.items()}


@pytest.mark.parametrize("notebook", IDS)
def test_executed_notebook_passes_nbval(suite_run, nbval_runs, notebook):
    run, _, _ = suite_run
    nb = nbformat.read(run / notebook.replace("/", "__"), as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    cells, done = nbval_runs[notebook]
    assert cells, f"nbval ran no cell of {notebook}:\n" + done.stdout[-4000:] + done.stderr[-2000:]
    failed = [f"{cell}: {why}" for cell, why in cells if why]
    assert not failed, "\n".join(failed)[-6000:]


def test_pinned_run_compared_with_itself_has_no_regression(suite_run):
    run, _, env = suite_run
    assert labkit("baseline", str(run), env=env).returncode == 0
    compared = labkit("compare", str(run), env=env)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-2000:]
    assert "regression" not in compared.stdout.split("report:")[0].replace("0 regression", "")
    journal = [json.loads(line) for line in Path(env["LABKIT_JOURNAL"]).read_text().splitlines()]
    assert {e["experiment"] for e in journal} >= {"quickstart-smoke", "cuda-graphs-smoke"}


def test_source_notebooks_are_clean_and_parameterised():
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path}: papermill needs exactly one cell tagged 'parameters'"
        assert "smoke: bool = False" in tagged[0].source, f"{path}: the parameters cell needs `smoke: bool = False`"
        checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# Checks")]
        assert checks and all("checks" in c.metadata.get("tags", []) for c in checks), \
            f"{path}: the checks cell is tagged 'checks' (a report can leave it out)"
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path} has outputs"
