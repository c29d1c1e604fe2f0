"""The SLO search on synthetic response curves: monotone, noisy, never-meets, always-meets."""
import numpy as np
import pandas as pd
import pytest

from labkit.analyze import slo
from labkit.errors import BadParameter

GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def curve(tbt_of_batch, ttft_of_batch=lambda b: 10.0, spread=0.0):
    calls = []

    def evaluate(batch):
        calls.append(batch)
        tbt, ttft = tbt_of_batch(batch), ttft_of_batch(batch)
        return {"tbt_p99_ms": (tbt, tbt * (1 - spread), tbt * (1 + spread)),
                "ttft_p99_ms": (ttft, ttft * (1 - spread), ttft * (1 + spread))}
    return evaluate, calls


def test_monotone_curve_finds_the_edge_in_log_steps_and_backs_off():
    evaluate, calls = curve(lambda b: 5 + 0.5 * b)  # 5.5 ms at 1 ... 37 ms at 64, 69 ms at 128
    result = slo.search(evaluate, GRID, {"tbt_p99_ms": 50})
    assert result.largest_meeting == 64 and result.answer == 32
    assert result.binding_constraint == "tbt_p99_ms"
    assert result.engine_starts == len(set(calls)) <= int(np.ceil(np.log2(len(GRID)))) + 1
    assert "max_num_seqs=32" in result.sentence()


def test_the_binding_constraint_is_the_one_that_fails_first():
    evaluate, _ = curve(lambda b: 5 + 0.1 * b, ttft_of_batch=lambda b: 20 * b)
    result = slo.search(evaluate, GRID, {"tbt_p99_ms": 50, "ttft_p99_ms": 400})
    assert result.largest_meeting == 16 and result.binding_constraint == "ttft_p99_ms"


def test_noise_counts_against_a_setting():
    # 64 meets on its point estimate (37 ms) but its CI reaches past 40: not a safe setting
    evaluate, _ = curve(lambda b: 5 + 0.5 * b, spread=0.15)
    result = slo.search(evaluate, GRID, {"tbt_p99_ms": 40})
    assert result.largest_meeting == 32 and result.answer == 16


def test_never_meets_and_always_meets():
    never, _ = curve(lambda b: 100.0)
    result = slo.search(never, GRID, {"tbt_p99_ms": 50})
    assert result.answer is None and result.binding_constraint == "tbt_p99_ms"
    assert "no max_num_seqs" in result.sentence() and result.engine_starts <= 5
    always, _ = curve(lambda b: 1.0)
    result = slo.search(always, GRID, {"tbt_p99_ms": 50})
    assert result.largest_meeting == 256 and result.answer == 128 and "extend the grid" in result.note


def test_bad_slos_are_refused_before_any_measurement():
    evaluate, calls = curve(lambda b: 1.0)
    for bad in ({}, {"output_tok_s": 100}, {"tbt_p99_ms": 0}, {"nonsense": 1}):
        with pytest.raises(BadParameter):
            slo.search(evaluate, GRID, bad)
    with pytest.raises(BadParameter):
        slo.search(evaluate, [0, 1], {"tbt_p99_ms": 1})
    assert calls == []


def test_goodput_counts_only_requests_within_every_slo():
    requests = pd.DataFrame({"ttft_ms": [10, 20, 300, 15], "tpot_ms": [5, 5, 5, 50],
                             "itl_ms": [[5, 5, 6], [5, 80, 5], [5, 5], [50, 50]]})
    assert slo.goodput(requests, {"ttft_p99_ms": 100}, 2.0) == 1.5
    assert slo.goodput(requests, {"ttft_p99_ms": 100, "tbt_p99_ms": 40}, 1.0) == 1.0


def test_stored_points_answer_with_the_searchs_rule_the_prefix_that_meets_backed_off_one_notch():
    from labkit.analyze.slo import from_points
    point = lambda high: {"tbt_p99_ms": (high * 0.9, high * 0.8, high)}
    measured = {1: point(10), 2: point(20), 4: point(30), 8: point(60), 16: point(40)}  # 16 meets again: noise
    found = from_points(measured, {"tbt_p99_ms": 50})
    assert (found.answer, found.largest_meeting, found.binding_constraint) == (2, 4, "tbt_p99_ms")
    assert found.engine_starts == 0 and found.from_store == 5
    none = from_points(measured, {"tbt_p99_ms": 5})
    assert none.answer is None and "1 already violates tbt_p99_ms" in none.note
    loose = from_points(measured, {"tbt_p99_ms": 100})
    assert loose.answer == 8 and loose.largest_meeting == 16 and "extend the grid" in loose.note


def test_a_bad_set_of_slos_is_refused_naming_every_problem_at_once():
    with pytest.raises(BadParameter) as refused:
        slo.check_slos({"nonsense": 1, "output_tok_s": 100, "preemptions": 2, "tbt_p99_ms": 0, "ttft_p99_ms": -3,
                        "e2e_p99_ms": float("nan"), "tpot_p50_ms": 20})
    said = str(refused.value)
    assert "6 problems" in said
    for name in ("'nonsense' is no metric", "'output_tok_s' is not a latency", "'preemptions' is not a latency",
                 "SLO tbt_p99_ms must be", "SLO ttft_p99_ms must be", "SLO e2e_p99_ms must be"):
        assert name in said, said
    assert "tpot_p50_ms" not in said.replace("'tpot_p50_ms'", "")  # the good one is not named as a problem
    with pytest.raises(BadParameter, match="at least one SLO"):
        slo.check_slos({})


def test_a_request_is_good_when_it_meets_every_limit_each_on_its_own_values():
    requests = pd.DataFrame({
        "ttft_ms": [10.0, 20.0, 300.0, 15.0], "tpot_ms": [5.0, 5.0, 5.0, 50.0], "e2e_ms": [100.0, 900.0, 400.0, 50.0],
        "itl_ms": [[5, 5, 6], [5, 80, 5], [5, 5], [50, 50]],
        # stamps: request 0 streams one token per chunk; request 1 gets its tokens in two chunks 0.1 s apart
        "token_s": [[0.0, 0.005, 0.010, 0.016], [0.0, 0.0, 0.1, 0.1], [0.0, 0.005, 0.01], [0.0, 0.05, 0.1]]})
    good = lambda slos: slo.meets_slos(requests, slos).tolist()
    assert good({"ttft_p99_ms": 100}) == [True, True, False, True]  # each request's own TTFT
    assert good({"tpot_p50_ms": 10}) == [True, True, True, False]
    assert good({"e2e_p99_ms": 500}) == [True, False, True, True]
    assert good({"tbt_p99_ms": 40}) == [True, False, True, False]  # each request's own P99 token gap
    assert good({"tbt_p50_ms": 40}) == [True, True, True, False]  # its median gap: the one 80 ms gap is no median
    assert good({"itl_p99_ms": 60}) == [True, False, True, True]  # request 1's one chunk gap is 100 ms
    assert good({"ttft_p99_ms": 100, "tpot_p50_ms": 10, "e2e_p99_ms": 500}) == [True, False, False, False]


def test_one_trials_goodput_counts_the_requests_and_output_tokens_of_good_requests_only():
    requests = pd.DataFrame({"ttft_ms": [10.0, 20.0, 300.0, 15.0], "output_tokens": [100, 50, 400, 10]})
    found = slo.trial_goodput(requests, {"ttft_p99_ms": 100}, 2.0)
    assert found == {"goodput_request_s": 1.5, "goodput_output_tok_s": 80.0, "good_pct": 75.0}
    assert slo.goodput(requests, {"ttft_p99_ms": 100}, 2.0) == 1.5  # the same rule, requests/s only


TRIANGLE = "data/baselines/h200/results"


@pytest.fixture(scope="module")
def triangle():
    import labkit as lk
    return lk.load("batch-triangle", TRIANGLE)


def test_goodput_by_load_on_the_stored_triangle_is_throughput_within_the_slo_with_intervals(triangle):
    loose = slo.goodput_by_load(triangle, {"tbt_p99_ms": 1e6}).set_index("arm")
    assert list(loose.index) == triangle.complete_arms and set(loose.load) == {"default"} and set(loose.trials) == {3}
    assert (loose.goodput_request_s == loose.request_s).all() and (loose.good_pct == 100).all()
    assert (loose.goodput_output_tok_s == loose.output_tok_s).all()
    # the stored trials' own throughput, their mean the value
    trials = triangle.trials.groupby("arm").request_s.mean()
    assert (abs(loose.request_s - trials[loose.index]) < 1e-9).all()

    at_50 = slo.goodput_by_load(triangle, {"tbt_p99_ms": 50}).set_index("arm")
    assert at_50.loc["max_num_seqs=8", "good_pct"] == 100  # a small batch keeps every gap short
    assert at_50.loc["max_num_seqs=64", "good_pct"] < 50 and at_50.loc["max_num_seqs=64", "goodput_request_s"] < 5
    assert (at_50.goodput_request_s <= at_50.request_s).all()
    # every request generates 128 tokens: output goodput is 128 x request goodput
    assert (abs(at_50.goodput_output_tok_s - 128 * at_50.goodput_request_s) < 1e-6).all()
    for name in ("goodput_request_s", "goodput_output_tok_s", "good_pct"):
        assert (at_50[f"{name}_low"] <= at_50[name]).all() and (at_50[name] <= at_50[f"{name}_high"]).all()
    noisy = at_50.loc["max_num_seqs=128"]
    assert noisy.goodput_request_s_high - noisy.goodput_request_s_low > 1  # trials that differ: an interval
    assert slo.goodput_by_arm is slo.goodput_by_load  # the notebooks' name is the same table


def test_goodput_by_load_has_a_row_per_load_and_arm_and_refuses_bad_slos():
    import labkit as lk
    parallel = lk.load("parallelism", "data/baselines/h200x2/results")
    table = slo.goodput_by_load(parallel, {"ttft_p99_ms": 500, "tpot_p99_ms": 30})
    assert sorted(zip(table.load, table.arm)) == [("loaded", "dp2"), ("loaded", "tp1"), ("single", "dp2"),
                                                  ("single", "tp1")]
    with pytest.raises(BadParameter, match="2 problems"):
        slo.goodput_by_load(parallel, {"tbt_p99_ms": 0, "output_tok_s": 1})


def test_an_arm_that_never_ran_a_load_has_no_row_there_and_no_empty_interval():
    """A load search probes each arm at its own levels (seen on an H100: one arm at 76 clients, the other at 108):
    a complete arm without trials at a load is left out there, not shown as a row of NaN."""
    import warnings
    from dataclasses import replace

    import labkit as lk
    from labkit.analyze import pareto, stats

    parallel = lk.load("parallelism", "data/baselines/h200x2/results")
    unprobed = (parallel.trials.arm == "tp1") & (parallel.trials.load == "single")
    skipped = replace(parallel, trials=parallel.trials[~unprobed],
                      requests=parallel.requests[~((parallel.requests.arm == "tp1")
                                                   & (parallel.requests.load == "single"))])
    assert skipped.select("single").measured_arms == ["dp2"] and skipped.measured_arms == skipped.complete_arms
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an empty slice's mean or quantile would warn
        table = slo.goodput_by_load(skipped, {"ttft_p99_ms": 500, "tpot_p99_ms": 30})
        points = pareto.pareto_points(skipped)
        summary = stats.summarize(skipped.select("single"), ["output_tok_s"])
    assert sorted(zip(table.load, table.arm)) == [("loaded", "dp2"), ("loaded", "tp1"), ("single", "dp2")]
    assert table.notna().all().all() and (table.goodput_output_tok_s <= table.output_tok_s + 1e-9).all()
    assert sorted(zip(points.load, points.arm)) == sorted(zip(table.load, table.arm))
    assert list(summary.arm) == ["dp2"] and summary.value.notna().all()
