"""Noise-aware verdicts on constructed trials (no engine, no disk): outside load on the host cautions a verdict,
and where it explains the change the verdict is 'too noisy to judge here'; a CPU trial under heavy outside load
is measured again (the retry helper, with a fake trial)."""
import asyncio
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.analyze import noise, stats
from labkit.measure.worker import REMEASURE_MAX_PER_ARM, _trial_with_retry
from labkit.store import Results

CPU = {"cpu_count": 2, "platform": "cpu"}


def _trials(arm, tok_s, loads):
    return [{"arm": arm, "trial": t, "output_tok_s": v, "total_tok_s": 3 * v, "request_s": v / 10, "preemptions": 0,
             "host_other_cores": load} for t, (v, load) in enumerate(zip(tok_s, loads))]


def _requests(arm, ttft_ms, trials=3, per_trial=40, seed=0):
    gen = np.random.default_rng(seed)
    return [{"arm": arm, "trial": t, "ttft_ms": ttft_ms * gen.lognormal(0, 0.05), "tpot_ms": 10.0, "e2e_ms": 100.0,
             "itl_ms": [10.0, 10.0], "prompt_tokens": 64, "output_tokens": 3}
            for t in range(trials) for _ in range(per_trial)]


def results_of(arms: dict, environment=CPU, extra=None):
    """arms: name -> (output tok/s per trial, outside load per trial[, TTFT ms]); `environment` for every arm."""
    trials, requests = [], []
    for i, (arm, spec) in enumerate(arms.items()):
        trials += _trials(arm, spec[0], spec[1])
        requests += _requests(arm, spec[2] if len(spec) > 2 else 100.0, len(spec[0]), seed=i)
    frame = pd.DataFrame(trials)
    for column, values in (extra or {}).items():
        frame[column] = values
    return Results("fake", Path("/nonexistent"), {}, pd.DataFrame([{"arm": a, "status": "complete"} for a in arms]),
                   pd.DataFrame(requests), frame, {a: dict(environment) for a in arms})


# The quickstart seen on a busy 2-core machine: max_num_seqs=32 measured 11.7 % lower output tok/s while other
# processes kept 1.17 cores busy against 0.54-0.79 during the reference arm's trials.
QUICKSTART = {"max_num_seqs=8": ([100.0, 101.0, 99.0], [0.54, 0.62, 0.79]),
              "max_num_seqs=32": ([88.3, 89.0, 87.6], [1.17, 1.16, 1.18])}


def test_the_quickstart_under_more_outside_load_is_too_noisy_to_judge_with_a_caution_naming_the_load():
    res = results_of(QUICKSTART)
    c = stats.compare(res, "max_num_seqs=8", "max_num_seqs=32", "output_tok_s")
    assert c.rel_change == pytest.approx(-0.117, abs=0.002)
    assert c.verdict == stats.TOO_NOISY, c.sentence()
    assert "host load" in c.caution and "0.65" in c.caution and "1.17" in c.caution and "of 2" in c.caution
    assert "rerun on a quiet machine" in c.sentence() and "39% fewer cores free" in c.caution
    assert "can move output_tok_s by -38.5%" in c.too_noisy
    # the same values without the load record are today's "worse": it is the load that changed the verdict
    unrecorded = Results(**{**res.__dict__, "trials": res.trials.drop(columns="host_other_cores")})
    plain = stats.compare(unrecorded, "max_num_seqs=8", "max_num_seqs=32", "output_tok_s")
    assert plain.verdict == stats.WORSE and plain.caution is None


def test_the_quickstart_record_tables_and_conclusion_say_too_noisy_and_what_to_do():
    from labkit.present.tables import conclusions
    res = results_of({name: (*spec, 100.0 if name.endswith("8") else 130.0) for name, spec in QUICKSTART.items()})
    record = stats.ab_record(res, "max_num_seqs=8", ["output_tok_s", "ttft_p99_ms"])
    compared = record.dropna(subset=["verdict"])
    assert set(compared.verdict) == {stats.TOO_NOISY}  # +30 % TTFT is less than 1/0.62 - 1 = +63 %
    assert compared.caution.str.contains("host load").all()
    outcome = stats.arm_outcomes(record, "max_num_seqs=8").iloc[0]
    assert outcome["worse on"] == "" and outcome["too noisy on"] == "output_tok_s, ttft_p99_ms"
    assert outcome.advice == noise.ADVICE == "rerun on a quiet machine"
    line = stats.conclusion(record, "max_num_seqs=8")
    assert line.startswith("max_num_seqs=32: too noisy to judge here on output_tok_s, ttft_p99_ms")
    assert "rerun on a quiet machine" in line and "host load" in line and "worse" not in line
    styler = conclusions(record, "max_num_seqs=8")
    assert list(styler.data.columns) == ["load", "arm", "better on", "worse on", "too noisy on", "advice", "caution"]
    assert "#ffe0b2" in styler.to_html()


@pytest.mark.parametrize("load", [0.1, 1.0])
def test_equal_outside_loads_keep_the_verdict(load):
    res = results_of({"a": ([100.0, 101.0, 99.0], [load] * 3), "b": ([88.3, 89.0, 87.6], [load] * 3)})
    c = stats.compare(res, "a", "b", "output_tok_s")
    assert c.verdict == stats.WORSE
    if load < noise.LOAD_SHARE * 2:
        assert c.caution is None and c.sentence().endswith(": worse")
    else:  # a host half busy during both arms: named, though it cannot tell them apart
        assert "host load" in c.caution and "fewer cores" not in c.caution


def test_a_large_change_under_slightly_different_load_keeps_its_verdict_with_a_caution():
    res = results_of({"a": ([100.0, 101.0, 99.0], [0.6, 0.6, 0.6]), "slow": ([60.0, 61.0, 59.0], [0.9, 0.9, 0.9]),
                      "fast": ([130.0, 131.0, 129.0], [0.9, 0.9, 0.9])})
    slow = stats.compare(res, "a", "slow", "output_tok_s")  # -40 % against 21 % fewer free cores
    assert slow.verdict == stats.WORSE and "host load" in slow.caution and "21% fewer" in slow.caution
    # better under more outside load: the load works against the change, it cannot explain it
    fast = stats.compare(res, "a", "fast", "output_tok_s")
    assert fast.verdict == stats.BETTER and "host load" in fast.caution
    assert stats.arm_outcomes(stats.ab_record(res, "a", ["output_tok_s"]), "a").advice.tolist() == [
        "keep a", "consider it"]


def test_a_gpu_engine_keeps_its_verdict_when_the_host_has_cores_to_spare():
    # 16 cores, 0.1 against 0.5 busy: a caution (the loads differ), but the engine's few busy threads lack nothing
    res = results_of({"a": ([100.0, 101.0, 99.0], [0.1] * 3), "b": ([95.0, 96.0, 94.0], [0.5] * 3)},
                     environment={"cpu_count": 16, "platform": "cuda"})
    c = stats.compare(res, "a", "b", "output_tok_s")
    assert c.verdict == stats.WORSE and "host load" in c.caution and "fewer cores" not in c.caution
    assert noise.engine_cores(res, "a", 16) == 2.0  # the client loop and one engine core
    # ... but a host so busy that the engine's threads lack cores is what a CPU is
    starved = results_of({"a": ([100.0, 101.0, 99.0], [0.1] * 3), "b": ([60.0, 61.0, 59.0], [15.5] * 3)},
                         environment={"cpu_count": 16, "platform": "cuda"})
    assert stats.compare(starved, "a", "b", "output_tok_s").verdict == stats.TOO_NOISY


def test_without_the_core_count_the_load_gap_is_named_but_cannot_decide():
    res = results_of(QUICKSTART, environment={})
    c = stats.compare(res, "max_num_seqs=8", "max_num_seqs=32", "output_tok_s")
    assert c.verdict == stats.WORSE and c.caution.startswith("host load") and "of 2" not in c.caution


def test_counts_the_cores_do_not_drive_are_never_too_noisy():
    m = stats.metric("preemptions")
    res = results_of(QUICKSTART)
    assert noise.explains(res, "max_num_seqs=8", "max_num_seqs=32", m, 0.5) is None
    assert noise.explains(res, "max_num_seqs=8", "max_num_seqs=32", stats.metric("output_tok_s"), -0.117)
    assert noise.explains(res, "max_num_seqs=8", "max_num_seqs=32", stats.metric("output_tok_s"), -0.5) is None


def test_the_gpu_caution_and_the_host_caution_are_joined():
    res = results_of(QUICKSTART, environment={"cpu_count": 16, "platform": "cuda"},
                     extra={"gpu_sm_clock_mhz": [1980.0] * 3 + [1600.0] * 3, "gpu_slowdown": [""] * 6})
    c = stats.compare(res, "max_num_seqs=8", "max_num_seqs=32", "output_tok_s")
    assert c.caution.startswith("SM clock 1980 MHz") and "; host load" in c.caution
    assert c.verdict == stats.WORSE  # clocks caution only: they may be the configuration's own effect


# A smoke run of real_vs_dummy_weights on a busy 2-core machine (2026-12-07): the dummy arm's prefill trial ran beside
# 0.81 busy cores against 0.03 during the real arm's, and its lab threads waited for a CPU 1.02 against 0.21
# threads. TTFT P50 came out +585 %, "worse", far beyond the +67 % the free cores' linear shift allows.
REAL_VS_DUMMY = {"real": ([23.5] * 3, [0.03] * 3, 40.0), "dummy": ([3.3] * 3, [0.81] * 3, 274.0)}
WAITING = {"threads_waiting_for_cpu": [0.21] * 3 + [1.02] * 3}


def test_a_cpu_change_beyond_the_cores_taken_is_too_noisy_where_the_slower_arm_waited_for_a_cpu():
    res = results_of(REAL_VS_DUMMY, extra=WAITING)
    c = stats.compare(res, "real", "dummy", "ttft_p50_ms")
    assert c.rel_change > 5 and c.verdict == stats.TOO_NOISY, c.sentence()
    assert "waited for a CPU 0.21 against 1.02 threads" in c.too_noisy and "reached dummy's trials" in c.too_noisy
    assert "waited for a CPU 0.21 against 1.02 threads" in c.caution
    assert stats.compare(res, "real", "dummy", "output_tok_s").verdict == stats.TOO_NOISY
    # without the waiting recorded, the free cores' bound keeps today's verdict: the waiting is what decides
    unrecorded = results_of(REAL_VS_DUMMY)
    assert stats.compare(unrecorded, "real", "dummy", "ttft_p50_ms").verdict == stats.WORSE


def test_the_waiting_decides_only_the_way_it_points_with_different_loads_and_on_a_cpu():
    # the faster arm waited more: the load worked against the change, the verdict stands
    against = results_of(REAL_VS_DUMMY, extra={"threads_waiting_for_cpu": [1.02] * 3 + [0.21] * 3})
    assert stats.compare(against, "real", "dummy", "ttft_p50_ms").verdict == stats.WORSE
    # equal outside loads: the gap in waiting may be the launches' own threads crowding a core
    equal = results_of({"real": REAL_VS_DUMMY["real"], "dummy": ([3.3] * 3, [0.03] * 3, 274.0)}, extra=WAITING)
    assert stats.compare(equal, "real", "dummy", "ttft_p50_ms").verdict == stats.WORSE
    # a GPU engine keeps the free cores' bound (its few busy threads do not run in lockstep barriers)
    gpu = results_of(REAL_VS_DUMMY, environment={"cpu_count": 2, "platform": "cuda"}, extra=WAITING)
    assert stats.compare(gpu, "real", "dummy", "ttft_p50_ms").verdict == stats.WORSE
    # counts the cores do not drive are never too noisy
    assert noise.explains(results_of(REAL_VS_DUMMY, extra=WAITING), "real", "dummy", stats.metric("preemptions"),
                          0.5) is None


def test_every_verdict_has_a_baseline_mapping_and_a_colour():
    from labkit.present.tables import ADVICE_COLOURS
    from labkit.suite.baseline import _VERDICT
    assert set(_VERDICT) == set(stats.VERDICTS) and set(stats.VERDICTS) <= set(ADVICE_COLOURS)


# --- re-measuring a CPU trial under heavy outside load --------------------------------------------------------

def _fake(loads):
    """A trial function whose attempt n ran under loads[n]; records the attempts asked for."""
    asked = []

    async def run_one(attempt):
        asked.append(attempt)
        return [{"attempt": attempt}], {"trial": 0, "output_tok_s": 100.0, "host_other_cores": loads[attempt]}
    return run_one, asked


def _retry(loads, remeasured, heavy_above=1.0):
    run_one, asked = _fake(loads)
    waits = []

    async def sleep(s):
        waits.append(s)
    rows, summary = asyncio.run(_trial_with_retry(run_one, remeasured, "c4", 0, heavy_above, wait_s=3.0, sleep=sleep))
    return rows, summary, asked, waits


def test_a_trial_under_heavy_outside_load_is_measured_again_and_the_quieter_one_kept():
    remeasured = []
    rows, summary, asked, waits = _retry([1.5, 0.2], remeasured)
    assert asked == [0, 1] and waits == [3.0]
    assert rows == [{"attempt": 1}] and summary["host_other_cores"] == 0.2 and summary["remeasured"] == 1
    assert remeasured == [{"load": "c4", "trial": 0, "host_other_cores": 1.5}]  # the discarded load is kept


def test_a_quiet_trial_or_a_gpu_engine_is_kept_as_measured():
    rows, summary, asked, waits = _retry([0.9], [])  # 0.9 of 2 cores: not more than half
    assert asked == [0] and waits == [] and summary["remeasured"] == 0
    _, summary, asked, _ = _retry([1.9], [], heavy_above=None)  # not a CPU engine: never re-measured
    assert asked == [0] and summary["host_other_cores"] == 1.9


def test_outside_load_counts_against_the_cores_the_arm_may_run_on(monkeypatch):
    """On 2 cores: an arm free to use both re-measures past 1 core of outside load; an arm bound to one core
    only once the other core is full and half of its own is taken too."""
    from labkit.measure import worker

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {0, 1})
    assert worker.remeasure_above("cpu") == 1.0 and worker.remeasure_above("cuda") is None
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {1})
    assert worker.remeasure_above("cpu") == 1.5
    _, summary, asked, _ = _retry([1.2], [], heavy_above=worker.remeasure_above("cpu"))  # the other notebook
    assert asked == [0] and summary["remeasured"] == 0
    _, summary, asked, _ = _retry([1.7, 1.1], [], heavy_above=worker.remeasure_above("cpu"))  # it spills over
    assert asked == [0, 1] and summary["host_other_cores"] == 1.1
    # the suite's notebooks at once are placed by vLLM's own binding, not the affinity: still half the host
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert worker.remeasure_above("cpu") == 1.0


def test_re_measurements_are_bounded_per_arm():
    remeasured = []
    _, summary, asked, waits = _retry([1.9, 1.8, 1.7, 1.6], remeasured)
    assert len(asked) == 1 + REMEASURE_MAX_PER_ARM and summary["host_other_cores"] == 1.7
    assert [r["host_other_cores"] for r in remeasured] == [1.9, 1.8]
    _, summary, asked, _ = _retry([1.9, 0.1], remeasured)  # the arm's re-measurements are spent
    assert asked == [0] and summary["remeasured"] == 0


def test_the_record_table_and_the_explorer_table_carry_the_caution_only_where_the_machine_moved():
    from labkit.present.explore import values_table
    from labkit.present.tables import record_table
    noisy, quiet = results_of(QUICKSTART), results_of({"a": ([100.0, 101.0, 99.0], [0.1] * 3),
                                                       "b": ([88.3, 89.0, 87.6], [0.1] * 3)})
    table = record_table(stats.ab_record(noisy, "max_num_seqs=8", ["output_tok_s"]))
    assert table.loc[("default", "max_num_seqs=32"), "output_tok_s vs max_num_seqs=8"].endswith(stats.TOO_NOISY)
    assert table.loc[("default", "max_num_seqs=32"), "caution"].startswith("host load")
    assert "caution" not in record_table(stats.ab_record(quiet, "a", ["output_tok_s"]))
    explored = values_table(noisy, "output_tok_s", "max_num_seqs=8")
    assert explored.verdict.tolist() == ["", stats.TOO_NOISY] and explored.caution.tolist()[0] == ""
    assert "caution" not in values_table(quiet, "output_tok_s", "a")
