"""Baseline comparison, report and journal on constructed suite runs (no engine)."""
import json
import re

import numpy as np
import pandas as pd
import pytest

from labkit.suite import baseline, journal, runs
from labkit import cli
from labkit.errors import BadParameter, StoreConflict
from labkit.store import ExperimentStore

ENV = {"hardware_key": "h200", "gpus": ["NVIDIA H200"], "driver": "580", "packages": {"vllm": "0.26.0"},
       "tuning_variables": {}}


def make_run(path, experiments, hardware="h200", env=None, trials=3, load=None, knobs=None, other_cores=None):
    """A suite run folder: suite.json and a store per experiment, an arm's values drawn around its (TPOT,
    tok/s) with its seed; `load` names the load (or {arm: load}), `knobs` gives an arm its launch knobs,
    `other_cores` the trials' host load."""
    path.mkdir(parents=True)
    (path / "suite.json").write_text(json.dumps({"profile": "h200", "hardware_key": hardware,
                                                 "environment": env or ENV}))
    for name, arms in experiments.items():
        store = ExperimentStore(name, path / "results")
        store.begin({"name": name, "arms": {arm: {} for arm in arms}})
        for arm, (tpot, tok_s, seed) in arms.items():
            rng = np.random.default_rng(seed)
            arm_load = load.get(arm) if isinstance(load, dict) else load
            work = store.new_workdir(arm)
            rows = [{"request": i, "trial": t, "ttft_ms": 50 + rng.normal(0, 1), "tpot_ms": tpot * (1 + rng.normal(0, 0.01)),
                     "e2e_ms": 500.0, "itl_ms": list(tpot * (1 + rng.normal(0, 0.01, 8))), "prompt_tokens": 128,
                     "output_tokens": 9, **({"load": arm_load} if arm_load else {})}
                    for t in range(trials) for i in range(40)]
            pd.DataFrame(rows).to_parquet(work / "requests.parquet")
            pd.DataFrame([{"trial": t, "output_tok_s": tok_s * (1 + rng.normal(0, 0.005)), **({"load": arm_load} if arm_load else {}),
                           **({"host_other_cores": other_cores} if other_cores is not None else {})}
                          for t in range(trials)]
                         ).to_parquet(work / "trials.parquet")
            store.commit_arm(arm, work, {"arm": arm, "spec": {"knobs": (knobs or {}).get(arm, {})}, "facts": {},
                                         "environment": ENV})
    return path


def verdicts(table, experiment, metric):
    return set(table[(table.experiment == experiment) & (table.metric == metric)].verdict)


def test_regression_improvement_and_noise(tmp_path):
    base = make_run(tmp_path / "base", {"slow": {"a": (10.0, 1000.0, 1)}, "fast": {"a": (10.0, 1000.0, 2)},
                                        "same": {"a": (10.0, 1000.0, 3)}, "small": {"a": (10.0, 1000.0, 4)}})
    run = make_run(tmp_path / "run", {"slow": {"a": (11.5, 850.0, 5)}, "fast": {"a": (8.5, 1150.0, 6)},
                                      "same": {"a": (10.0, 1000.0, 7)}, "small": {"a": (10.3, 970.0, 8)}})
    table = baseline.compare_runs(run, base, threshold=0.05)
    assert verdicts(table, "slow", "tpot_p50_ms") == {"regression"}
    assert verdicts(table, "slow", "output_tok_s") == {"regression"}
    assert verdicts(table, "fast", "tpot_p50_ms") == {"improvement"}
    assert verdicts(table, "fast", "output_tok_s") == {"improvement"}
    assert verdicts(table, "same", "tpot_p50_ms") == {"no detectable change"}
    # a real 3 % change is below the 5 % threshold: not a regression
    assert verdicts(table, "small", "tpot_p50_ms") == {"no detectable change"}
    assert verdicts(baseline.compare_runs(run, base, threshold=0.0), "small", "tpot_p50_ms") == {"regression"}


def test_missing_and_new_experiments_and_failed_arms(tmp_path):
    base = make_run(tmp_path / "base", {"gone": {"a": (10.0, 1000.0, 1)}, "both": {"a": (10.0, 1000.0, 2),
                                                                                  "b": (10.0, 1000.0, 3)}})
    run = make_run(tmp_path / "run", {"added": {"a": (10.0, 1000.0, 4)}, "both": {"a": (10.0, 1000.0, 5)}})
    table = baseline.compare_runs(run, base)
    assert set(table[table.experiment == "gone"].verdict) == {"missing in this run"}
    assert set(table[table.experiment == "added"].verdict) == {"new: no baseline"}
    lost = table[(table.experiment == "both") & (table.arm == "b")]
    assert list(lost.verdict) == ["regression"] and "not in this run" in lost.note.iloc[0]


def test_different_hardware_is_refused(tmp_path):
    base = make_run(tmp_path / "base", {"x": {"a": (10.0, 1000.0, 1)}}, hardware="h100-80gb-hbm3")
    run = make_run(tmp_path / "run", {"x": {"a": (10.0, 1000.0, 2)}})
    with pytest.raises(BadParameter, match="same hardware"):
        baseline.compare_runs(run, base)


def test_exit_status_and_report(tmp_path):
    base = make_run(tmp_path / "base", {"e": {"a": (10.0, 1000.0, 1)}})
    worse = make_run(tmp_path / "worse", {"e": {"a": (12.0, 800.0, 2)}})
    same = make_run(tmp_path / "same", {"e": {"a": (10.0, 1000.0, 3)}})
    assert cli.main(["compare", str(worse), "--baseline", str(base)]) == cli.EXIT_REGRESSION
    report = (worse / "report.html").read_text()
    assert 'class="regression"' in report and "<img src=\"data:image/png;base64," in report
    assert "change [95 % interval]" in report and re.search(r"<td>[+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\]</td>", report)
    assert "ci_low" not in report  # the change and its interval in one cell, in percent
    assert cli.main(["compare", str(same), "--baseline", str(base)]) == 0
    (same / "x.status.json").write_text(json.dumps({"notebook": "x", "status": "failed", "error": "boom"}))
    assert cli.main(["compare", str(same), "--baseline", str(base)]) == cli.EXIT_NOTEBOOK_FAILED


def test_control_arms_that_moved_are_named(tmp_path, capsys):
    # the H200 demonstration's shape: an enforce_eager override changes the `graphs` arm, while the `eager`
    # arm is launched exactly as in the baseline; it moved anyway (the host was busy), and the report says so
    base = make_run(tmp_path / "base", {"hot": {"eager": (20.0, 580.0, 1), "graphs": (5.0, 1400.0, 2)}},
                    knobs={"eager": {"enforce_eager": True}}, other_cores=0.3)
    eager_everywhere = {"eager": {"enforce_eager": True}, "graphs": {"enforce_eager": True}}
    drifted = make_run(tmp_path / "drifted", {"hot": {"eager": (32.0, 360.0, 3), "graphs": (30.0, 250.0, 4)}},
                       knobs=eager_everywhere, other_cores=11.0)
    steady = make_run(tmp_path / "steady", {"hot": {"eager": (20.0, 580.0, 5), "graphs": (20.0, 580.0, 6)}},
                      knobs=eager_everywhere, other_cores=0.6)
    table = baseline.compare_runs(drifted, base)
    assert set(table[table.arm == "eager"].configuration) == {"same"}
    assert set(table[table.arm == "graphs"].configuration) == {"changed"}
    assert "hot/eager" in baseline.caution(table) and "hot/graphs" not in baseline.caution(table)
    assert baseline.caution(baseline.compare_runs(steady, base)) is None
    # the busy host shows among the environment's changes; a 0.3-core difference is not a change
    assert runs.environment_diff(drifted, base).set_index("what").loc[runs.HOST_LOAD].tolist() == [0.3, 11.0]
    assert runs.HOST_LOAD not in set(runs.environment_diff(steady, base).what)
    # a rerun with no configuration change (an upgrade) has no controls: every move is the finding
    assert baseline.caution(baseline.compare_runs(make_run(tmp_path / "upgrade", {"hot": {
        "eager": (32.0, 360.0, 7), "graphs": (6.0, 1200.0, 8)}}, knobs={"eager": {"enforce_eager": True}}), base)) is None
    assert cli.main(["compare", str(drifted), "--baseline", str(base)]) == cli.EXIT_REGRESSION
    assert "CAUTION" in capsys.readouterr().out and "Caution:" in (drifted / "report.html").read_text()


def test_pin_never_overwrites(tmp_path):
    run = make_run(tmp_path / "runs" / "r1", {"e": {"a": (10.0, 1000.0, 1)}})
    target = baseline.pin(run, root=tmp_path / "baselines")
    assert (target / "results" / "e" / "arms" / "a" / "arm.json").exists()
    assert baseline.pinned("h200", root=tmp_path / "baselines") == target
    with pytest.raises(StoreConflict):
        baseline.pin(run, root=tmp_path / "baselines")


def test_journal_appends_change_metric_conclusion(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_JOURNAL", str(tmp_path / "journal.jsonl"))
    run = make_run(tmp_path / "run", {"e": {"a": (10.0, 1000.0, 1), "b": (12.0, 800.0, 2)}})
    journal.append(journal.entries_for_run(run, ENV))
    journal.append(journal.entries_for_run(run, ENV))
    table = journal.read()
    assert len(table) == 2 and set(table.experiment) == {"e"}
    assert "b is worse" in table.conclusion.iloc[0] and table.evidence.iloc[0].endswith("results/e")


def test_one_trial_runs_are_judged_with_a_warning_and_throughput_not_at_all(tmp_path):
    base = make_run(tmp_path / "base", {"exp": {"a": (5.0, 1000, 1)}}, trials=1)
    run = make_run(tmp_path / "run", {"exp": {"a": (10.0, 500, 2)}}, trials=1)
    table = baseline.compare_runs(run, base)
    assert verdicts(table, "exp", "output_tok_s") == {"too few trials to judge"}
    assert verdicts(table, "exp", "tpot_p50_ms") == {"regression"}
    assert table.note.str.contains("not between engine starts").all()


def test_experiment_without_a_complete_baseline_arm_is_named(tmp_path):
    base = make_run(tmp_path / "base", {"exp": {}})
    run = make_run(tmp_path / "run", {"exp": {"a": (5.0, 1000, 1)}})
    table = baseline.compare_runs(run, base)
    assert table.verdict.tolist() == ["new: no baseline"] and "no arm completed" in table.note.iloc[0]


def test_loads_are_paired_by_name(tmp_path):
    base = make_run(tmp_path / "base", {"exp": {"a": (5.0, 1000, 1)}}, load="batch1")
    same = make_run(tmp_path / "same", {"exp": {"a": (5.0, 1000, 2)}}, load="batch1")
    other = make_run(tmp_path / "other", {"exp": {"a": (5.0, 1000, 2)}}, load="c64")
    assert set(baseline.compare_runs(same, base).load) == {"batch1"}
    table = baseline.compare_runs(other, base)
    assert table[["experiment", "load", "verdict"]].values.tolist() == [["exp", "batch1", "missing in this run"]]


def test_arms_measured_at_their_own_loads_are_judged_where_both_sides_measured_them(tmp_path):
    """A load search probes each arm at its own levels: an arm with no trials at a load is not judged there
    (seen: compare failed on a capacity run whose arms had probed different rates)."""
    arms = lambda seed: {"a": (5.0, 1000, seed), "b": (5.0, 1000, seed + 1), "c": (5.0, 1000, seed + 2)}
    base = make_run(tmp_path / "base", {"exp": arms(1)}, load={"a": "r4", "b": "r8", "c": "r4"})
    run = make_run(tmp_path / "run", {"exp": arms(4)}, load={"a": "r8", "b": "r4", "c": "r4"})
    table = baseline.compare_runs(run, base)
    judged = table[table.metric.notna()]
    assert set(zip(judged.load, judged.arm)) == {("r4", "c")} and set(judged.verdict) == {"no detectable change"}
    named = table[table.metric.isna()].set_index(["load", "arm"]).verdict.to_dict()
    assert named == {("r4", "a"): "missing in this run", ("r4", "b"): "new: no baseline",
                     ("r8", "a"): "new: no baseline", ("r8", "b"): "missing in this run"}


def test_replicates_hold_the_noise_between_runs(tmp_path):
    # the H200 demonstration's shape: an arm launched the same way twice ran 9 % apart (a host-bound arm
    # between machines); one baseline run calls a rerun between the two a change, the replicated baseline
    # does not, while a large change still counts
    first = make_run(tmp_path / "first", {"e": {"a": (7.1, 2180.0, 1), "g": (5.0, 1400.0, 2)}})
    second = make_run(tmp_path / "second", {"e": {"a": (7.7, 1980.0, 3), "g": (5.0, 1380.0, 4)}})
    rerun = make_run(tmp_path / "rerun", {"e": {"a": (6.8, 2300.0, 5), "g": (17.0, 440.0, 6)}})
    alone = baseline.compare_runs(rerun, second)
    assert verdicts(alone, "e", "output_tok_s") == {"improvement", "regression"}  # a: +16 %, g: -68 %
    table = baseline.compare_runs(rerun, [second, first]).set_index(["arm", "metric"])
    assert set(table.baseline_runs) == {2}
    assert table.loc[("a", "output_tok_s"), "verdict"] == "no detectable change"
    assert table.loc[("a", "tpot_p50_ms"), "verdict"] == "no detectable change"
    assert table.loc[("g", "output_tok_s"), "verdict"] == "regression"
    assert table.loc[("g", "tpot_p50_ms"), "verdict"] == "regression"
    # the baseline value is the runs' pooled value, and the interval is wider than one run's
    assert 1980 < table.loc[("a", "output_tok_s"), "baseline"] < 2180
    wide = table.loc[("a", "output_tok_s")]
    narrow = alone.set_index(["arm", "metric"]).loc[("a", "output_tok_s")]
    assert wide.ci_high - wide.ci_low > 5 * (narrow.ci_high - narrow.ci_low)


def test_a_replicate_counts_only_for_arms_launched_alike(tmp_path):
    first = make_run(tmp_path / "first", {"e": {"a": (7.0, 2000.0, 1), "b": (7.0, 2000.0, 2)}})
    # this replicate ran arm b with another launch: it is no replicate of b, and one trial of throughput
    # per run is judgeable from two runs' values
    other = make_run(tmp_path / "other", {"e": {"a": (7.0, 2010.0, 3), "b": (7.0, 2000.0, 4)}},
                     knobs={"b": {"max_num_seqs": 8}})
    rerun = make_run(tmp_path / "rerun", {"e": {"a": (7.0, 2005.0, 5), "b": (7.0, 2000.0, 6)}})
    table = baseline.compare_runs(rerun, [first, other]).set_index(["arm", "metric"])
    assert table.loc[("a", "output_tok_s"), "baseline_runs"] == 2 and table.loc[("b", "output_tok_s"), "baseline_runs"] == 1
    one = [make_run(tmp_path / f"one{i}", {"e": {"a": (7.0, tok_s, i)}}, trials=1)
           for i, tok_s in enumerate((2000.0, 2020.0, 1990.0))]
    assert verdicts(baseline.compare_runs(one[2], one[0]), "e", "output_tok_s") == {"too few trials to judge"}
    assert verdicts(baseline.compare_runs(one[2], one[:2]), "e", "output_tok_s") == {"no detectable change"}
    with pytest.raises(BadParameter, match="same hardware"):
        baseline.compare_runs(rerun, [first, make_run(tmp_path / "h100", {}, hardware="h100-80gb-hbm3")])


def test_replicates_are_pinned_beside_the_baseline_and_used_by_compare(tmp_path, monkeypatch, capsys):
    root = tmp_path / "baselines"
    first = make_run(tmp_path / "runs" / "r1", {"e": {"a": (7.0, 2180.0, 1)}})
    second = make_run(tmp_path / "runs" / "r2", {"e": {"a": (7.6, 1980.0, 2)}})
    with pytest.raises(BadParameter, match="pin one first"):
        baseline.pin(second, root=root, replicate=True)
    baseline.pin(first, root=root)
    baseline.pin(second, root=root, replicate=True)
    assert baseline.baseline_runs("h200", root=root) == [root / "h200" / "r1", root / "h200" / "r2"]
    assert baseline.pinned("h200", root=root) == root / "h200" / "r1"
    assert json.loads((root / "h200" / "pinned.json").read_text()) == {"run": "r1", "replicates": ["r2"]}
    changed = make_run(tmp_path / "runs" / "r3", {"e": {"a": (7.0, 2100.0, 3)}})
    meta = json.loads((changed / "suite.json").read_text())
    (changed / "suite.json").write_text(json.dumps({**meta, "overrides": {"enforce_eager": True}}))
    with pytest.raises(BadParameter, match="without --override"):
        baseline.pin(changed, root=root, replicate=True)
    assert not (root / "h200" / "r3").exists()
    # a new pinned baseline starts without the old one's replicates
    baseline.pin(changed, root=root)
    assert baseline.baseline_runs("h200", root=root) == [root / "h200" / "r3"]
    # a pointer written before replicates existed still reads
    (root / "h200" / "pinned.json").write_text(json.dumps({"run": "r1"}))
    assert baseline.baseline_runs("h200", root=root) == [root / "h200" / "r1"]
    # the command line compares with the pinned run and its replicates, and writes the report where told
    rerun = make_run(tmp_path / "runs" / "r4", {"e": {"a": (6.9, 2300.0, 4)}})
    report = tmp_path / "elsewhere.html"
    assert cli.main(["compare", str(rerun), "--baseline", str(first), "--baseline", str(second),
                     "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "and 1 replicate run(s): 4 no detectable change" in out
    assert "replicates of it: runs/r2" in report.read_text()
    assert not (rerun / "report.html").exists()
    assert cli.main(["compare", str(rerun), "--baseline", str(second)]) == 0  # +16 % is an improvement alone
    assert "one baseline run" in capsys.readouterr().out
