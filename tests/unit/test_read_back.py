"""Stored data read back never lies: a damaged file on either side of a comparison, in the journal or in one
experiment among many is named (exit 2 for a command) and the readable rest is shown; never a regression,
never "new: no baseline"."""
import json

import pytest

from labkit import cli, settings
from labkit.suite import baseline, journal, notebooks
from labkit.suite.baseline import DAMAGED

from test_baseline import make_run

EXPERIMENTS = {"first": {"a": (10.0, 1000.0, 1), "b": (10.0, 1000.0, 2)}, "second": {"a": (10.0, 1000.0, 3)}}


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def empty(path):
    path.write_bytes(b"")


def remove(path):
    path.unlink()


DAMAGES = [truncate, empty, remove]
FILES = ["results/first/experiment.json", "results/first/arms/b/arm.json", "results/first/arms/b/requests.parquet",
         "results/first/arms/b/trials.parquet"]


@pytest.fixture
def pair(tmp_path):
    return make_run(tmp_path / "run", EXPERIMENTS), make_run(tmp_path / "base", EXPERIMENTS)


@pytest.mark.parametrize("side", ["run", "base"])
@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_file_on_either_side_is_named_and_the_rest_judged(pair, side, damage, file):
    run, base = pair
    damage((run if side == "run" else base) / file)
    table = baseline.compare_runs(run, base, metrics=["output_tok_s"])
    damaged = table[table.verdict == DAMAGED]
    assert len(damaged) >= 1 and damaged.note.str.contains("this run" if side == "run" else "the baseline").all()
    assert not (table.verdict.isin(["regression", "new: no baseline", "missing in this run"])).any(), table
    assert set(table[table.experiment == "second"].verdict) == {"no detectable change"}  # the readable rest


def test_compare_names_the_damage_exits_2_and_reports_the_rest(pair, capsys, tmp_path):
    run, base = pair
    truncate(run / "results/first/experiment.json")
    code = cli.main(["compare", str(run), "--baseline", str(base), "--report", str(tmp_path / "r.html")])
    out = capsys.readouterr()
    assert code == cli.EXIT_BAD_INPUT and "DAMAGED first" in out.out and "cannot be read" in out.err
    report = (tmp_path / "r.html").read_text()
    assert "Cannot be read" in report and "<h2>second</h2>" in report


def test_a_damaged_notebook_record_is_named_not_a_raw_error(pair, capsys, tmp_path):
    run, base = pair
    (run / "L1__x.status.json").write_text('{"notebook": "L1/x.ipy')
    (run / "L1__y.status.json").write_text(json.dumps({"notebook": "L1/y.ipynb", "status": "ok", "error": None}))
    found = notebooks.statuses(run)
    assert [s["status"] for s in found] == ["damaged", "ok"] and "L1__x.status.json" in found[0]["error"]
    assert cli.main(["compare", str(run), "--baseline", str(base), "--report", str(tmp_path / "r.html")]) == 2
    assert "DAMAGED" in capsys.readouterr().out


def test_an_empty_results_folder_is_not_an_error_and_not_a_pass(pair):
    run, base = pair
    for folder in sorted((run / "results").rglob("*"), reverse=True):
        folder.unlink() if folder.is_file() else folder.rmdir()
    table = baseline.compare_runs(run, base)
    assert set(table.verdict) == {"missing in this run"}


def test_journal_lines_cut_short_are_named_and_the_next_entry_kept(tmp_path, capsys):
    path = tmp_path / "journal.jsonl"
    with settings.use(settings.current().replace(journal=path)):
        journal.append([{"experiment": "one", "conclusion": "kept"}])
        with open(path, "a") as f:
            f.write('{"experiment": "cut sh')  # a write cut off by a full disk or a kill
        journal.append([{"experiment": "two", "conclusion": "kept too"}])
        table = journal.read()
        assert list(table.experiment) == ["one", "two"]
        assert table.attrs["damaged"] == [f"{path} line 2: not JSON (Unterminated string starting at)"]
        assert cli.main(["journal"]) == cli.EXIT_BAD_INPUT
        out = capsys.readouterr()
        assert "kept too" in out.out and "line 2" in out.err


def test_the_explorer_names_a_damaged_experiment_and_keeps_the_others(tmp_path):
    from labkit.present import explore

    run = make_run(tmp_path / "run", EXPERIMENTS)
    truncate(run / "results/second/experiment.json")
    explorer = explore.Explorer({"here": run / "results"}, "first")
    assert set(explorer.experiment.options) == {"first", "second"} and explorer.table is not None
    explorer.experiment.value = "second"
    assert explorer.table is None and explorer.figure is None and explorer.arms.options == ()
    assert "second cannot be read" in explorer.message and "experiment.json" in explorer.message
    explorer.experiment.value = "first"
    assert explorer.table is not None and set(explorer.table.arm) == {"a", "b"}


def test_the_explorer_on_an_empty_results_folder_says_so(tmp_path):
    from labkit.present import explore

    run = make_run(tmp_path / "run", EXPERIMENTS)
    (tmp_path / "empty").mkdir()
    explorer = explore.Explorer({"here": run / "results", "empty": tmp_path / "empty"})
    explorer.root.value = "empty"
    assert "no stored experiment" in explorer.message


def test_a_notebook_of_the_run_without_a_record_is_not_counted_as_passed(pair, capsys, tmp_path):
    run, base = pair
    meta = json.loads((run / "suite.json").read_text())
    (run / "suite.json").write_text(json.dumps({**meta, "notebooks": ["L1_business/prefix_cache.ipynb"]}))
    found = notebooks.statuses(run)
    assert [(s["notebook"], s["status"]) for s in found] == [("L1_business/prefix_cache.ipynb", "not run")]
    code = cli.main(["compare", str(run), "--baseline", str(base), "--report", str(tmp_path / "r.html")])
    assert code == cli.EXIT_NOTEBOOK_FAILED
