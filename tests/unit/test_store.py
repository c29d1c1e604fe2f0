"""The append-only experiment store: names, commits, conflicts, failures and loading back."""
import json
import os
import re
import subprocess
import sys

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from labkit.errors import BadParameter, DamagedStore, StoreConflict, StoreUnwritable
from labkit.files import write_table
from labkit.store import ExperimentStore, check_name, load, requests_to_store, token_gaps, with_token_gaps

SPEC_A = {"knobs": {"max_num_seqs": 8}, "workload": {"num_requests": 4}, "model": "tiny-llama"}


def _workdir(store, arm, ttft=(10.0, 12.0)):
    work = store.new_workdir(arm)
    pd.DataFrame({"trial": [0] * len(ttft), "ttft_ms": list(ttft), "itl_ms": [[1.0, 2.0]] * len(ttft)}) \
        .to_parquet(work / "requests.parquet")
    pd.DataFrame({"trial": [0], "output_tok_s": [123.0]}).to_parquet(work / "trials.parquet")
    (work / "engine.log").write_text(f"log of {arm}\n")
    return work


def _meta(arm, spec=SPEC_A, **extra):
    return {"arm": arm, "spec": spec, "facts": {"attention_backend": "CPU_ATTN"}, "seconds": 1.5, **extra}


@pytest.mark.parametrize("name", ["../x", "", "a/b", ".hidden", "..", "with space", "x\n"])
def test_check_name_rejects(name):
    with pytest.raises(BadParameter):
        check_name(name, "experiment")
    with pytest.raises(BadParameter):
        ExperimentStore(name, root="/tmp")


@pytest.mark.parametrize("name", ["baseline", "max_num_seqs=32", "a-b.c+d_E9"])
def test_check_name_accepts(name):
    assert check_name(name, "arm") == name


def test_begin_writes_experiment_json_once(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({"version": 1, "arms": {"a": {}}})
    path = tmp_path / "exp" / "experiment.json"
    first = path.read_text()
    assert json.loads(first) == {"version": 1, "arms": {"a": {}}}
    stamp = path.stat().st_mtime_ns
    store.begin({"version": 2})
    assert path.read_text() == first and path.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "exp").iterdir()] == ["experiment.json"]  # no temp files left


def test_commit_arm_moves_workdir(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    work = _workdir(store, "a")
    target = store.commit_arm("a", work, _meta("a"))
    assert target == tmp_path / "exp" / "arms" / "a"
    assert not work.exists()
    assert {p.name for p in target.iterdir()} == {"arm.json", "requests.parquet", "trials.parquet", "engine.log"}
    assert json.loads((target / "arm.json").read_text())["spec"] == SPEC_A


def test_second_commit_conflicts_without_touching_the_first(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    target = store.commit_arm("a", _workdir(store, "a"), _meta("a"))
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    second = _workdir(store, "a", ttft=(99.0,))
    with pytest.raises(StoreConflict):
        store.commit_arm("a", second, _meta("a", spec={"other": True}))
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert second.exists() and (second / "requests.parquet").exists()  # the new measurement is kept


def test_an_empty_arm_folder_gives_way_but_one_with_files_does_not(tmp_path):
    """An empty folder where an arm goes (a copy of a tree whose store moved away keeps such folders) holds
    no measurement: the commit takes its place. A folder holding anything is never replaced."""
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    store.arm_dir("a").mkdir(parents=True)
    assert (store.commit_arm("a", _workdir(store, "a"), _meta("a")) / "arm.json").exists()
    store.arm_dir("b").mkdir(parents=True)
    (store.arm_dir("b") / "notes.txt").write_text("kept")
    work = _workdir(store, "b")
    with pytest.raises(StoreConflict):
        store.commit_arm("b", work, _meta("b"))
    assert (store.arm_dir("b") / "notes.txt").read_text() == "kept" and work.exists()


def test_check_resumable(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    assert store.check_resumable("a", SPEC_A) is False
    store.commit_arm("a", _workdir(store, "a"), _meta("a"))
    assert store.check_resumable("a", dict(SPEC_A)) is True
    changed = {**SPEC_A, "knobs": {"max_num_seqs": 16}, "extra": 1}
    with pytest.raises(StoreConflict) as info:
        store.check_resumable("a", changed)
    message = str(info.value)
    assert "'knobs'" in message and "'extra'" in message
    assert "'model'" not in message and "'workload'" not in message


def test_record_failure_never_overwrites(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    first = store.record_failure("b", _workdir(store, "b"), _meta("b", cause="out_of_memory"))
    second = store.record_failure("b", _workdir(store, "b"), _meta("b", cause="timeout"))
    assert first != second
    assert first.exists() and second.exists()
    folders = sorted((tmp_path / "exp" / "failures").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("b-") for f in folders)
    causes = sorted(json.loads((f / "failure.json").read_text())["cause"] for f in folders)
    assert causes == ["out_of_memory", "timeout"]


def test_record_skip_keeps_the_first(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    store.record_skip("c", {"arm": "c", "reason": "first"})
    store.record_skip("c", {"arm": "c", "reason": "second"})
    assert json.loads((tmp_path / "exp" / "skipped" / "c.json").read_text())["reason"] == "first"


def _populated(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({"arms": {"skip": {}, "fail": {}, "ok": {}, "recovered": {}}})
    store.commit_arm("ok", _workdir(store, "ok", ttft=(10.0, 11.0, 12.0)), _meta("ok"))
    store.record_failure("fail", _workdir(store, "fail"), _meta("fail", cause="timeout", log_tail="old"))
    store.record_failure("fail", _workdir(store, "fail"),
                         _meta("fail", cause="out_of_memory", log_tail="CUDA out of memory"))
    # an arm that failed once and then completed counts as complete
    store.record_failure("recovered", _workdir(store, "recovered"), _meta("recovered", cause="timeout"))
    store.commit_arm("recovered", _workdir(store, "recovered", ttft=(20.0,)), _meta("recovered"))
    store.record_skip("skip", {"arm": "skip", "reason": "cuda_graphs=True: needs an NVIDIA GPU",
                               "spec": {"knobs": {"cuda_graphs": True}}})
    return store


def test_load(tmp_path):
    _populated(tmp_path)
    results = load("exp", root=tmp_path)
    arms = results.arms.set_index("arm")
    assert results.arms.arm.tolist() == ["skip", "fail", "ok", "recovered"]  # the spec's order
    assert arms.loc["ok", "status"] == "complete" and arms.loc["recovered", "status"] == "complete"
    assert arms.loc["fail", "status"] == "failed"
    assert arms.loc["fail", "cause"] == "out_of_memory"  # the latest failure
    assert arms.loc["fail", "log_tail"] == "CUDA out of memory"
    assert arms.loc["skip", "status"] == "not applicable"
    assert "NVIDIA GPU" in arms.loc["skip", "cause"]
    assert arms.loc["ok", "knob.max_num_seqs"] == 8 and arms.loc["ok", "attention_backend"] == "CPU_ATTN"
    assert results.complete_arms == ["ok", "recovered"]
    assert len(results.requests) == 4 and set(results.requests.arm) == {"ok", "recovered"}
    assert sorted(results.requests[results.requests.arm == "ok"].ttft_ms) == [10.0, 11.0, 12.0]
    assert list(results.requests.itl_ms.iloc[0]) == [1.0, 2.0]
    assert results.trials.arm.tolist().count("ok") == 1 and "output_tok_s" in results.trials
    assert results.spec == {"arms": {"skip": {}, "fail": {}, "ok": {}, "recovered": {}}}


@pytest.mark.parametrize("damage, words", [
    (lambda arm: (arm / "arm.json").write_text('{"arm": "ok", "spec": {'), "arm.json cannot be read"),
    (lambda arm: (arm / "arm.json").unlink(), "arm.json cannot be read"),
    (lambda arm: (arm / "requests.parquet").write_bytes(b"PAR1 cut"), "requests.parquet cannot be read"),
    (lambda arm: (arm / "trials.parquet").unlink(), "trials.parquet cannot be read"),
    (lambda arm: (arm / "arm.json").write_text('{"arm": "recovered", "spec": {}}'), "is arm 'recovered'"),
    (lambda arm: (arm / "arm.json").write_text('{"arm": "ok"}'), "lacks ['spec']"),
], ids=["cut-short", "missing", "bad-table", "missing-table", "wrong-arm", "edited"])
def test_a_damaged_arm_is_named_and_the_others_stay_readable(tmp_path, damage, words):
    store = _populated(tmp_path)
    damage(store.arm_dir("ok"))
    results = load("exp", root=tmp_path)
    arms = results.arms.set_index("arm")
    assert arms.loc["ok", "status"] == "damaged" and words in arms.loc["ok", "cause"]
    assert "move" in arms.loc["ok", "cause"] and str(store.arm_dir("ok")) in arms.loc["ok", "cause"]
    assert results.complete_arms == ["recovered"] and set(results.requests.arm) == {"recovered"}
    with pytest.raises(DamagedStore, match=re.escape(words)):  # a resumed run stops, never measures over it
        store.check_resumable("ok", SPEC_A)


def test_a_damaged_experiment_record_is_named(tmp_path):
    store = _populated(tmp_path)
    (store.path / "experiment.json").write_text("{")
    with pytest.raises(DamagedStore, match="experiment.json cannot be read"):
        load("exp", root=tmp_path)


def test_a_damaged_failure_record_does_not_hide_the_rest(tmp_path):
    store = _populated(tmp_path)
    latest = sorted((store.path / "failures").glob("fail-*"))[-1]
    (latest / "failure.json").write_text("")
    arms = load("exp", root=tmp_path).arms
    damaged = arms[arms.status == "damaged"]
    assert len(damaged) == 1 and "failure.json cannot be read" in damaged.cause.iloc[0]
    assert set(arms[arms.status == "complete"].arm) == {"ok", "recovered"}


def test_load_empty_experiment(tmp_path):
    ExperimentStore("empty", root=tmp_path).begin({})
    results = load("empty", root=tmp_path)
    assert results.arms.empty and results.requests.empty and results.trials.empty


def test_load_missing_experiment(tmp_path):
    with pytest.raises(BadParameter, match="nothing-here"):
        load("nothing-here", root=tmp_path)


def test_clean_work_removes_only_what_dead_runs_left(tmp_path):
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    ours = _workdir(store, "x")
    assert ours.parent == tmp_path / "exp" / ".work" and f"-{os.getpid()}-" in ours.name
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / "exp" / ".work" / f"y-{holder.pid}-0123abcd"
        dead = tmp_path / "exp" / ".work" / f"z-{_dead_pid()}-0123abcd"
        old_style = tmp_path / "exp" / ".work" / "w-0123abcd"
        for folder in (live, dead, old_style):
            folder.mkdir()
        assert sorted(p.name for p in store.clean_work()) == sorted([ours.name, dead.name, old_style.name])
        assert [p.name for p in (tmp_path / "exp" / ".work").iterdir()] == [live.name]
        assert (tmp_path / "exp" / "experiment.json").exists()
    finally:
        holder.kill()
        holder.wait()


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


HOLD = """
import sys, time
from labkit.store import ExperimentStore
with ExperimentStore("exp", root=sys.argv[1]).lock():
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_run_is_refused_naming_the_holder_and_touches_nothing(tmp_path):
    from labkit import Experiment, Protocol, Workload

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        store = ExperimentStore("exp", root=tmp_path)
        measuring = tmp_path / "exp" / ".work" / f"a-{holder.pid}-0123abcd"
        measuring.mkdir(parents=True)
        (measuring / "engine.log").write_text("the first run's engine at work\n")
        exp = Experiment("exp", {"a": {}}, Workload.closed_loop(4, 16, 4, 2), model="tiny-llama",
                         protocol=Protocol(trials=1, warmup_requests=0), results_dir=tmp_path)
        with pytest.raises(StoreConflict, match=f"being measured by another run \\(pid {holder.pid}, since "):
            exp.run(progress=False)
        assert (measuring / "engine.log").read_text() == "the first run's engine at work\n"
        assert not (tmp_path / "exp" / "experiment.json").exists()
        with pytest.raises(StoreConflict, match="another run"):
            with store.lock():
                pass
    finally:
        holder.kill()
        holder.wait()
    with ExperimentStore("exp", root=tmp_path).lock():  # a dead holder's lock file is simply taken
        assert f"pid {os.getpid()}" in (tmp_path / "exp" / ".lock").read_text()


def test_a_full_disk_while_storing_leaves_no_half_written_arm(tmp_path, monkeypatch):
    import errno

    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    work = _workdir(store, "ok")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("labkit.files.os.replace", disk_full)
    with pytest.raises(StoreUnwritable, match="No space left on device.*stay in"):
        store.commit_arm("ok", work, _meta("ok"))
    assert not store.arm_dir("ok").exists() and store.completed_spec("ok") is None  # resume measures it again
    assert sorted(p.name for p in work.iterdir()) == ["engine.log", "requests.parquet", "trials.parquet"]


def test_a_folder_that_cannot_be_written_is_refused_before_anything_runs(tmp_path):
    from labkit import Experiment, Workload

    exp = Experiment("exp", {"a": {}}, Workload.closed_loop(4, 16, 4, 2), model="tiny-llama",
                     results_dir="/proc/labkit-results")  # read-only even for root
    with pytest.raises(StoreUnwritable, match="cannot write experiment 'exp' under /proc/labkit-results"):
        exp.run(progress=False)


def test_the_cache_share_comes_from_the_engine_counters(tmp_path):
    from labkit.store import _with_cache_columns

    trials = pd.DataFrame({"prefix_cache_queries": [4608.0, 0.0], "prefix_cache_hits": [3840.0, 0.0],
                           "engine_prompt_tokens": [4608.0, 4608.0]})  # cache on, then cache off
    out = _with_cache_columns(trials)
    assert out.prefix_hit_pct.tolist() == [pytest.approx(83.333, rel=1e-4), 0.0]
    assert out.prefill_tokens_computed.tolist() == [768.0, 4608.0]
    assert "prefix_hit_pct" not in _with_cache_columns(pd.DataFrame({"output_tok_s": [1.0]}))


def test_clean_work_keeps_the_folder_about_to_be_taken_over(tmp_path):
    store = ExperimentStore("e", tmp_path)
    early = store.new_workdir("first")  # this process's: cleared, unless it is the plan's early worker
    assert store.clean_work(keep=early) == [] and early.exists()
    assert store.clean_work() == [early] and not early.exists()


REPO = Path(__file__).resolve().parents[2]
# Six requests of the committed H200 cuda-graphs evidence (arm eager) as they were first stored, with both the
# token stamps and the gaps; four of them hold a zero gap (two tokens streamed in one chunk).
BOTH_COLUMNS = Path(__file__).parent / "data" / "h200-cuda-graphs-eager-requests.parquet"


def test_the_gaps_derived_from_the_stamps_are_the_stored_ones_bit_for_bit():
    """On real numbers: the gaps token_gaps derives from the stored stamps equal the gaps the driver stored
    (zero gaps included), and the committed store, which keeps the stamps only, loads those same gaps."""
    stored = pd.read_parquet(BOTH_COLUMNS)
    assert len(stored) == 6 and sum(int((np.asarray(g) == 0).sum()) for g in stored.itl_ms) == 4
    for stamps, gaps in zip(stored.token_s, stored.itl_ms):
        derived = token_gaps(stamps)
        assert derived.dtype == np.float64 and np.array_equal(derived, gaps)  # not just within the rounding: equal
    committed = REPO / "data/baselines/h200/results/cuda-graphs/arms/eager/requests.parquet"
    assert "token_s" in pq.read_schema(committed).names
    eager = with_token_gaps(pd.read_parquet(committed)).set_index(["load", "trial", "request"])
    for row in stored.itertuples():
        loaded = eager.loc[(row.load, row.trial, row.request)]
        assert np.array_equal(loaded.token_s, row.token_s) and np.array_equal(loaded.itl_ms, row.itl_ms)


def test_a_table_with_both_columns_and_one_with_the_stamps_only_load_alike(tmp_path):
    stored = pd.read_parquet(BOTH_COLUMNS)
    store = ExperimentStore("exp", root=tmp_path)
    store.begin({})
    for arm, table in (("old", stored), ("new", requests_to_store(stored))):
        work = store.new_workdir(arm)
        write_table(table, work / "requests.parquet")
        pd.DataFrame({"trial": [0], "output_tok_s": [1.0]}).to_parquet(work / "trials.parquet")
        (work / "engine.log").write_text("")
        store.commit_arm(arm, work, _meta(arm))
    assert "itl_ms" not in pq.read_schema(tmp_path / "exp" / "arms" / "new" / "requests.parquet").names
    requests = load("exp", tmp_path).requests
    old, new = (requests[requests.arm == arm].reset_index(drop=True).drop(columns="arm") for arm in ("old", "new"))
    assert list(old.columns) == list(new.columns) == list(stored.columns)  # the gaps where they were, before the stamps
    lists = ["itl_ms", "token_s"]
    pd.testing.assert_frame_equal(old.drop(columns=lists), new.drop(columns=lists), check_exact=True)
    for column in lists:
        assert all(np.array_equal(a, b) for a, b in zip(old[column], new[column]))


def test_speculative_decoding_counters_become_acceptance_and_accepted_length():
    import pandas as pd

    from labkit.store import _with_speculation_columns

    trials = pd.DataFrame({"spec_drafts": [10.0, 0.0], "spec_draft_tokens": [30.0, 0.0],
                           "spec_accepted_tokens": [12.0, 0.0]})
    out = _with_speculation_columns(trials)
    assert out.spec_acceptance_pct[0] == 40.0 and out.spec_accepted_length[0] == pytest.approx(2.2)  # 1 + 12 / 10
    assert out.spec_acceptance_pct.isna()[1] and out.spec_accepted_length.isna()[1]  # drafted nothing
    assert "spec_acceptance_pct" not in _with_speculation_columns(trials.drop(columns="spec_drafts"))
