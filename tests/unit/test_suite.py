"""The unattended suite: which notebooks a selection names, the overrides each one gets, resuming a run, and
the environment it leaves as it found it (papermill is a stand-in here; tests/notebooks runs the real one)."""
import json
import os
from pathlib import Path

import pytest

from labkit import settings
from labkit.errors import BadParameter
from labkit.suite import notebooks as suite
from labkit.suite import parameters

LAUNCH_OVERRIDES_VARIABLE = settings.VARIABLES["launch_overrides"]


def test_suite_selection_and_profiles():
    every = suite.discover()
    assert every[0].name == "00_quickstart.ipynb"
    assert all("L3_kernel" in str(p) for p in suite.discover(["L3"]))
    assert parameters.parameters_for("cpu-smoke", every[0]) == {"smoke": True}
    with pytest.raises(BadParameter, match="names no notebook"):
        suite.discover(["L9"])
    with pytest.raises(BadParameter, match="unknown parameter profile"):
        parameters.parameters_for("tpu", every[0])
    assert suite.default_profile("cpu-intel-xeon") == "cpu-smoke" and suite.default_profile("h200") == "h200"
    # a notebook's own entry overrides "*"; relative paths resolve; a notebook outside notebooks/ gets "*"
    triangle = Path(os.path.relpath(suite.NOTEBOOKS / "L2_engine" / "batch_triangle.ipynb"))
    assert parameters.parameters_for("h200", triangle)["grid"].startswith("8,")
    assert parameters.parameters_for("h200", every[0]) == {}
    assert parameters.parameters_for("cpu-smoke", Path("/elsewhere/x.ipynb")) == {"smoke": True}


def test_executed_copies_are_named_after_their_notebook():
    nb = suite.NOTEBOOKS / "L3_kernel" / "cuda_graphs.ipynb"
    assert suite._slug(nb) == "L3_kernel__cuda_graphs"


def test_parse_overrides():
    assert suite.parse_overrides(["enforce_eager=true", "max_num_seqs=64", "attention_backend=TRITON_ATTN"]) == {
        "enforce_eager": True, "max_num_seqs": 64, "attention_backend": "TRITON_ATTN"}
    assert suite.parse_overrides([]) == {}
    assert suite.parse_overrides(["L3_kernel/profile_hotspots:enforce_eager=true"]) == {
        "L3_kernel/profile_hotspots:enforce_eager": True}


def test_a_scoped_override_reaches_only_the_notebooks_it_names(tmp_path, monkeypatch):
    overrides = {"L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8}
    hotspots, quickstart = suite.discover(["L3_kernel/profile_hotspots"])[0], suite.discover(["00_quickstart"])[0]
    assert suite.overrides_for(overrides, hotspots) == {"enforce_eager": True, "max_num_seqs": 8}
    assert suite.overrides_for(overrides, quickstart) == {"max_num_seqs": 8}
    # a scope outside the run's selection would change nothing: refused before any run folder exists
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    with pytest.raises(BadParameter, match="names none of this run's notebooks"):
        suite.run_suite(["00_quickstart"], "cpu-smoke", overrides=overrides, progress=False)
    with pytest.raises(BadParameter, match="unknown knob"):
        suite.run_suite(["L3_kernel/profile_hotspots"], "cpu-smoke", progress=False,
                        overrides={"L3_kernel/profile_hotspots:eager": True})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("items", [["enforce_eager"], ["=1"], ["L3:=1"]])
def test_an_override_without_a_value_is_a_clear_error(items):
    with pytest.raises(BadParameter, match="KNOB=VALUE"):
        suite.parse_overrides(items)


@pytest.mark.parametrize("items, words", [(["eager=true"], "unknown knob"), (["max_num_seqs=-1"], "whole number >= 1")])
def test_bad_override_fails_before_anything_runs(tmp_path, monkeypatch, items, words):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    with pytest.raises(BadParameter, match=words):
        suite.run_suite(["00_quickstart"], "cpu-smoke", overrides=suite.parse_overrides(items), progress=False)
    assert list(tmp_path.iterdir()) == []  # no run folder was made


def test_resume_runs_only_the_notebooks_of_the_interrupted_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "suite.json").write_text(json.dumps({"profile": "cpu-smoke", "hardware_key": "cpu-x",
                                                "notebooks": ["00_quickstart.ipynb"], "overrides": {"max_num_seqs": 4}}))
    (run / "00_quickstart.status.json").write_text(json.dumps({"status": "ok"}))
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))  # restored after the test
    executed = []
    monkeypatch.setattr("papermill.execute_notebook", lambda nb, *a, **k: executed.append(nb))
    # every notebook of this run is done: nothing executes (the other notebooks are not this run's)
    assert suite.run_suite(run_dir=run, progress=False) == run
    assert executed == []


def test_each_notebook_runs_with_the_overrides_that_reach_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv(LAUNCH_OVERRIDES_VARIABLE, "")  # restored after the test
    seen = {}
    monkeypatch.setattr("papermill.execute_notebook",
                        lambda nb, *a, **k: seen.update({Path(nb).stem: json.loads(os.environ[LAUNCH_OVERRIDES_VARIABLE])}))
    run = suite.run_suite(["00_quickstart", "L3_kernel/profile_hotspots"], "cpu-smoke", progress=False,
                          overrides={"L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8})
    assert seen == {"00_quickstart": {"max_num_seqs": 8}, "profile_hotspots": {"enforce_eager": True, "max_num_seqs": 8}}
    assert os.environ[LAUNCH_OVERRIDES_VARIABLE] == "" and "LABKIT_RESULTS_DIR" not in os.environ  # restored
    assert json.loads((run / "suite.json").read_text())["overrides"] == {
        "L3_kernel/profile_hotspots:enforce_eager": True, "max_num_seqs": 8}


def test_a_resumed_run_keeps_its_overrides(tmp_path):
    (tmp_path / "suite.json").write_text(json.dumps({"profile": "cpu-smoke", "notebooks": ["00_quickstart.ipynb"],
                                                     "overrides": {}}))
    with pytest.raises(BadParameter, match="a resumed run keeps"):
        suite.run_suite(run_dir=tmp_path, progress=False, overrides={"enforce_eager": True})


def test_notebooks_at_once_split_the_cores_into_groups_of_their_own():
    assert suite.core_groups(1, "h200") == [None]  # one at a time: vLLM binds as it would for anyone
    assert suite.core_groups(2, "cpu-x", bind="auto", usable=[0, 1]) == ["0", "1"]
    assert suite.core_groups(3, "cpu-x", bind=None, usable=list(range(8))) == ["0,1,2", "3,4,5", "6,7"]
    assert suite.core_groups(2, "cpu-x", bind="", usable=[2, 5, 6]) == ["2,5", "6"]  # the cores this process may use


def test_bad_jobs_are_refused_with_every_problem_named():
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(BadParameter, match="whole number from 1"):
            suite.core_groups(bad, "cpu-x")
    with pytest.raises(BadParameter) as refused:
        suite.core_groups(4, "h200", bind="0-3", usable=[0, 1])
    assert all(words in str(refused.value) for words in ("GPU machine", "--jobs 2 or fewer", "unset it"))


def test_too_many_jobs_fail_before_any_run_folder_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RUNS_DIR", str(tmp_path))
    with pytest.raises(BadParameter, match="cores"):
        suite.run_suite(["00_quickstart"], "cpu-smoke", progress=False, jobs=len(os.sched_getaffinity(0)) + 1)
    assert list(tmp_path.iterdir()) == []


def test_the_explorer_waits_for_the_notebooks_before_it_when_notebooks_run_at_once():
    quickstart, diagnose, explore, cache = suite.discover(["00_quickstart", "01_diagnose", "explore",
                                                           "L1_business/prefix_cache"])
    order = [quickstart, diagnose, explore, cache]
    assert suite.may_start(cache, order, {quickstart, cache})  # measuring notebooks start as cores free up
    assert not suite.may_start(explore, order, {quickstart, explore})  # the store it reads is being written
    assert suite.may_start(explore, order, {explore, cache})  # those after it do not hold it back


def test_a_notebook_that_runs_alone_waits_for_the_others_and_nothing_starts_beside_it():
    quickstart, shape, cache = suite.discover(["00_quickstart", "L1_business/request_shape",
                                               "L1_business/prefix_cache"])
    order = [quickstart, shape, cache]
    assert shape.name in suite.ALONE
    assert not suite.may_start(shape, order, {quickstart, shape, cache}, running={quickstart})
    assert suite.may_start(shape, order, {shape, cache}, running=set())
    assert not suite.may_start(cache, order, {shape, cache}, running={shape})  # nothing beside it
    assert suite.may_start(cache, order, {quickstart, cache}, running={quickstart})  # the others still pair up


def test_a_stuck_cell_fails_its_attempt_at_the_profiles_limit_and_the_notebook_runs_once_more(tmp_path, monkeypatch):
    """A real kernel: the first attempt's cell outlasts the limit (as a cell whose reply never comes), the
    second finishes; the status says it was retried and why."""
    import json as _json

    import nbformat

    folder = tmp_path / "notebooks"
    folder.mkdir()
    cell = nbformat.v4.new_code_cell("x: int = 1")
    cell.metadata["tags"] = ["parameters"]
    body = ("import os, time\nfirst = not os.path.exists('attempted')\nopen('attempted', 'w').close()\n"
            "time.sleep(60 if first else 0)")
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, folder / "slow.ipynb")
    monkeypatch.setattr(suite, "NOTEBOOKS", folder)
    run = tmp_path / "run"
    run.mkdir()
    error = suite.run_notebook(folder / "slow.ipynb", run, {}, {}, [], settings.current(), cell_limit_s=3)
    status = _json.loads((run / "slow.status.json").read_text())
    assert error is None and status["status"] == "ok", status
    assert status["retried_after"].startswith("CellTimeoutError") and status["seconds"] < 50


def test_a_kernel_that_died_at_its_start_is_started_once_more(tmp_path, monkeypatch):
    """Two kernels started at once can race for the same ports, and one dies before it answers (seen in a clean
    clone's suite: the quickstart failed 2 s in, and explore after it). Nothing ran: the notebook runs once more,
    and its status says why; a second death is the notebook's error."""
    import json as _json

    import nbformat
    import papermill

    folder = tmp_path / "notebooks"
    folder.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), folder / "quick.ipynb")
    monkeypatch.setattr(suite, "NOTEBOOKS", folder)
    starts = []

    def execute(source, output, **_):  # papermill as it answers a kernel that died at its start, then as it runs
        starts.append(output)
        if len(starts) == 1 or "again" in output:
            raise RuntimeError(suite.KERNEL_DIED_AT_START)
        nbformat.write(nbformat.read(source, as_version=4), output)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    run = tmp_path / "run"
    run.mkdir()
    assert suite.run_notebook(folder / "quick.ipynb", run, {}, {}, [], settings.current()) is None
    status = _json.loads((run / "quick.status.json").read_text())
    assert status["status"] == "ok" and status["retried_after"] == f"RuntimeError: {suite.KERNEL_DIED_AT_START}"
    assert len(starts) == 2

    (folder / "quick.ipynb").rename(folder / "again.ipynb")  # this one dies at every start
    error = suite.run_notebook(folder / "again.ipynb", run, {}, {}, [], settings.current())
    assert error == f"RuntimeError: {suite.KERNEL_DIED_AT_START}" and len(starts) == 4
