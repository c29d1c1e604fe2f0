"""The load search on fakes: bracket then bisect over a ladder of loads, the backed-off answer, the binding
constraint, ranges that cannot bracket, saturation as a violation, the probes counted; the spec's refusals."""
import json
import math

import numpy as np
import pandas as pd
import pytest

import labkit as lk
from labkit.analyze import load_search as ls
from labkit.errors import BadParameter

CLIENTS = lk.LoadSearch({"tbt_p99_ms": 50}, clients=(1, 256)).levels()


def fake(tbt_of_load, ttft_of_load=lambda c: 10.0, spread=0.0, saturates_above=math.inf):
    calls = []

    def evaluate(rung, level):
        calls.append(level)
        tbt, ttft = tbt_of_load(level), ttft_of_load(level)
        m = {"tbt_p99_ms": (tbt, tbt * (1 - spread), tbt * (1 + spread)),
             "ttft_p99_ms": (ttft, ttft * (1 - spread), ttft * (1 + spread))}
        return ls.Probe(rung, level, m, saturated=level > saturates_above, trials=2, requests=10)
    return evaluate, calls


def test_the_ladder_is_whole_for_clients_and_geometric_for_rates():
    assert CLIENTS[:8] == [1, 2, 3, 4, 5, 6, 7, 8] and CLIENTS[-1] == 256 and 16 in CLIENTS and 32 in CLIENTS
    rates = lk.LoadSearch({"tbt_p99_ms": 50}, rate=(0.5, 10)).levels()
    assert rates[0] == 0.5 and rates[-1] == 10.0 and rates[4] == 1.0
    assert all(1.1 < b / a < 1.3 for a, b in zip(rates, rates[1:-1]))  # a notch is about 19 %


def test_it_grows_by_doubling_until_broken_then_bisects_and_backs_off():
    evaluate, calls = fake(lambda c: 5 + 2 * c)  # 50 ms reached at 22.5 clients
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    assert calls[:6] == [1, 2, 4, 8, 16, 32]  # bracket: grown by doubling until 32 breaks
    assert set(calls[6:]) < {19, 23, 27}  # bisected between 16 and 32 only
    assert result.largest_meeting == 19 and result.answer == 16  # backed off one notch on the ladder
    assert result.binding_constraint == "tbt_p99_ms" and result.bracketed and result.note == ""
    assert result.probes_used == len(calls) == len(set(calls)) <= ls.most_probes(CLIENTS)
    assert "clients=16 clients" in result.sentence() and "binding constraint: tbt_p99_ms" in result.sentence()


def test_the_binding_constraint_is_the_one_broken_first():
    evaluate, _ = fake(lambda c: 5.0, ttft_of_load=lambda c: 100 * c)
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50, "ttft_p99_ms": 1000})
    assert result.largest_meeting == 10 and result.answer == 8 and result.binding_constraint == "ttft_p99_ms"


def test_noise_counts_against_a_load():
    evaluate, _ = fake(lambda c: 5 + 2 * c, spread=0.2)  # 19 clients: 43 ms, but its interval reaches 52
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    assert result.largest_meeting == 16 and result.answer == 13


def test_already_broken_at_the_smallest_load_has_no_answer_and_says_so():
    evaluate, calls = fake(lambda c: 100.0)
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    assert calls == [1] and result.answer is None and result.largest_meeting is None and not result.bracketed
    assert "already broken at the smallest load (1 clients: tbt_p99_ms)" in result.note
    assert result.binding_constraint == "tbt_p99_ms" and "no clients answer" in result.sentence()


def test_never_broken_at_the_largest_load_has_no_silent_answer():
    evaluate, calls = fake(lambda c: 1.0)
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    assert calls == [1, 2, 4, 8, 16, 32, 64, 128, 256] and result.probes_used == 9
    assert result.answer is None and result.largest_meeting == 256 and not result.bracketed
    assert "never broken at the largest load" in result.note and "extend" in result.note


def test_a_saturated_probe_violates_every_slo():
    rates = lk.LoadSearch({"ttft_p99_ms": 500}, rate=(1, 64)).levels()
    evaluate, calls = fake(lambda r: 1.0, ttft_of_load=lambda r: 10.0, saturates_above=6)  # latencies look fine
    result = ls.bracket_search(evaluate, "rate", rates, {"ttft_p99_ms": 500})
    assert result.binding_constraint == ls.SATURATED and result.largest_meeting == 5.66 and result.answer == 4.76
    assert [p.saturated for p in result.probes] == [r > 6 for r in calls]
    table = result.table()
    assert (table.loc[table.saturated == "yes", "meets"] == "no").all()
    assert "rate=4.76 requests/s" in result.sentence()


def test_bad_slos_are_refused_before_any_probe():
    evaluate, calls = fake(lambda c: 1.0)
    for bad in ({}, {"output_tok_s": 10}, {"nonsense_ms": 1}, {"tbt_p99_ms": 0}, {"tbt_p99_ms": float("nan")}):
        with pytest.raises(BadParameter):
            ls.bracket_search(evaluate, "clients", CLIENTS, bad)
    assert calls == []


def _judged(sent, done, times):
    """The first time the rule calls the probe saturated, or None."""
    return next((t for t in times if ls.saturated(sent, np.where(done < t, done, np.nan), t)), None)


def test_saturation_is_a_queue_that_keeps_growing_not_one_that_stands_high():
    flagged = {0.1: 0, 0.5: 0, 1.0: 0}
    for seed in range(120):  # engines that hold their rate, with long and spread latencies
        rng = np.random.default_rng(seed)
        rate, median, sigma = rng.choice([2, 5, 20, 50]), rng.choice([0.2, 2.0, 5.0]), rng.choice([0.1, 0.5, 1.0])
        sent = np.cumsum(rng.exponential(1 / rate, 30 * rate))
        flagged[sigma] += _judged(sent, sent + rng.lognormal(np.log(median), sigma, len(sent)),
                                  np.arange(0.5, 30, 0.25)) is not None
    assert flagged[0.1] == flagged[0.5] == 0 and flagged[1.0] <= 4
    for over in (2, 8):  # an engine that serves requests one after the other at 1/over of the rate
        for seed in range(10):
            rng = np.random.default_rng(seed)
            sent = np.cumsum(rng.exponential(1 / 20, 600))
            done, free = np.empty(len(sent)), 0.0
            for i, s in enumerate(sent):
                free = max(free, s) + rng.exponential(over / 20)
                done[i] = free + 0.3
            found = _judged(sent, done, np.arange(0.5, 30, 0.25))
            assert found is not None and found < 20
    assert not ls.saturated([0.1, 0.2], [np.nan, np.nan], 1.0)  # too little to judge


def test_a_probe_is_measured_as_the_stored_summary_measures_it():
    rows = [[{"ttft_ms": t, "itl_ms": [1.0, 2.0, float(t)]} for t in range(1, 21)] for _ in range(2)]
    m = ls.measure(rows, ["ttft_p99_ms", "tbt_p99_ms", "e2e_p99_ms"])
    value, low, high = m["ttft_p99_ms"]
    assert value == pytest.approx(np.percentile(list(range(1, 21)) * 2, 99)) and low <= value <= high
    assert m["tbt_p99_ms"][0] > 2 and all(math.isnan(x) for x in m["e2e_p99_ms"])  # no e2e column: NaN, no SLO met


def test_the_result_survives_the_store_and_reads_back_as_a_table():
    evaluate, _ = fake(lambda c: 5 + 2 * c)
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    stored = json.loads(json.dumps(result.to_dict()))
    assert stored["probes_used"] == result.probes_used and stored["answer"] == 16
    again = ls.LoadSearchResult.from_dict(stored)
    assert again.answer == 16 and again.probes[0].measurement == result.probes[0].measurement
    arms = pd.DataFrame([{"arm": "a", "status": "complete", "load_search": json.dumps({"default": stored})}])

    class Stored:
        name = "x"
    Stored.arms = arms
    table = ls.search_table(Stored())
    assert list(table.columns[:4]) == ["arm", "search", "probe", "clients"]
    assert len(table) == result.probes_used and table.loc[table.recommended == "yes", "clients"].tolist() == [16]
    assert "[" in table["tbt_p99_ms (limit 50)"][0] and ls.search_result(Stored()).answer == 16
    assert "clients=16" in repr(table) or "16" in repr(table)


def test_the_spec_refuses_every_problem_at_once_before_any_engine():
    with pytest.raises(BadParameter) as found:
        lk.LoadSearch({"nonsense_ms": 5, "tbt_p99_ms": -1, "output_tok_s": 3}, clients=(8, 8), requests=0)
    text = str(found.value)
    for part in ("unknown SLO metric 'nonsense_ms'", "SLO tbt_p99_ms", "output_tok_s is no latency",
                 "low end must be below its high end", "requests must be"):
        assert part in text, text
    for kwargs in (dict(clients=(0, 8)), dict(rate=(-1, 4)), dict(rate=(4, 1)), dict(clients=(1, 2), rate=(1, 2)),
                   dict(), dict(clients=(1.5, 8)), dict(clients=8)):
        with pytest.raises(BadParameter):
            lk.LoadSearch({"tbt_p99_ms": 50}, **kwargs)


def test_the_spec_travels_as_plain_data_and_sizes_its_probes():
    search = lk.LoadSearch({"tpot_p50_ms": 40}, rate=(0.5, 8), prompt_len=lk.Uniform(10, 20), output_len=16,
                           requests=10, seconds=5)
    again = lk.LoadSearch.from_dict(json.loads(json.dumps(search.to_dict())))
    assert again == search and again.levels() == search.levels()
    assert search.probe_requests(0.5) == 10 and search.probe_requests(8.0) == 40  # 5 s of the rate
    assert search.probe(8.0).arrival == lk.Poisson(8.0) and search.longest_request() <= 36
    closed = lk.LoadSearch({"tbt_p99_ms": 50}, clients=(1, 16), requests=8, per_client=3)
    assert closed.probe_requests(1) == 8 and closed.probe_requests(16) == 48
    assert closed.probe(4).arrival == lk.Concurrency(4)
    assert lk.LoadSearch.load_name("clients", 8) == "c8" and lk.LoadSearch.load_name("rate", 4.0, "s") == "s.rate=4"


def test_an_experiment_takes_a_search_as_its_load(tmp_path):
    search = lk.LoadSearch({"tbt_p99_ms": 50}, clients=(1, 8), prompt_len=16, output_len=8)
    exp = lk.Experiment("search", {"a": {}}, search, model="tiny-llama", results_dir=tmp_path)
    assert exp._workload_dicts()["default"]["kind"] == "LoadSearch"
    too_long = lk.Experiment("long", {"a": {"max_model_len": 16}}, search, model="tiny-llama", results_dir=tmp_path)
    with pytest.raises(BadParameter, match="max_model_len"):  # refused before any engine starts
        too_long.run(progress=False)
    with pytest.raises(BadParameter, match="offline"):
        lk.Experiment("offline", {"a": {}}, search, model="tiny-llama", context="offline", results_dir=tmp_path)


def test_an_arm_line_counts_a_search_s_probes():
    from labkit.experiment import _trials_text

    facts = {"trials_run": 15, "load_search": {"mid": {"probes_used": 7}, "flood": {"probes_used": 1}}}
    assert _trials_text(facts, lk.Protocol(trials=2), 3) == \
        "15 trial(s) over 9 load(s), 8 of them probed by 2 load search(es) on this engine"


def test_probe_levels_map_each_stored_probe_load_to_its_level_and_the_curve_draws_them():
    import matplotlib

    matplotlib.use("Agg")
    from labkit.present import plots

    evaluate, _ = fake(lambda c: 5 + 2 * c)
    result = ls.bracket_search(evaluate, "clients", CLIENTS, {"tbt_p99_ms": 50})
    for probe in result.probes:
        probe.load = f"clients.c{probe.level}"

    class Stored:
        name = "x"
        arms = pd.DataFrame([{"arm": "a", "status": "complete",
                              "load_search": json.dumps({"clients": result.to_dict()})}])
    levels = ls.probe_levels(Stored(), "clients")
    assert levels == {p.load: ("clients", float(p.level)) for p in result.probes} and ls.probe_levels(Stored()) == {}
    loads = list(levels)[:3]
    goodput = pd.DataFrame({"load": loads, "arm": "a", **{f"{n}{s}": [100.0, 200.0, 250.0] if n == "output_tok_s"
                                                          else [100.0, 180.0, 120.0]
                                                          for n in ("output_tok_s", "goodput_output_tok_s")
                                                          for s in ("", "_low", "_high")}})
    fig = plots.goodput_curve(goodput, levels)
    lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) == 3]
    assert sorted(lines[0].get_xdata()) == sorted(levels[load][1] for load in loads)
    assert fig.axes[0].get_xlabel() == "concurrent clients"
    with pytest.raises(BadParameter, match="no load of this goodput table was probed"):
        plots.goodput_curve(goodput.assign(load="other"), levels)


def test_the_slos_goodput_is_read_at_are_the_load_searches_own():
    from types import SimpleNamespace

    slos = {"ttft_p99_ms": 1000.0, "tpot_p99_ms": 50.0}
    clients = lk.LoadSearch(slos, clients=(1, 64)).to_dict()
    rate = lk.LoadSearch(slos, rate=(1.0, 8.0)).to_dict()
    stored = lambda **workloads: SimpleNamespace(spec={"workloads": workloads})
    assert ls.stored_slos(stored(clients=clients, rate=rate)) == slos
    assert ls.stored_slos(stored(default=lk.Workload.closed_loop(8, 16, 8, 2).to_dict())) == {}  # no search: none
    other = lk.LoadSearch({"ttft_p99_ms": 500.0}, rate=(1.0, 8.0)).to_dict()
    assert ls.stored_slos(stored(clients=clients, rate=other)) == {}  # two sets: goodput is read per search
