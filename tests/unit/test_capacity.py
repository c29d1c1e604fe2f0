"""Capacity under an SLO: the dataclass's checks, replicas from capacities (bands, no capacity, bad demand), and
capacities read from committed stores with the SLO search's rule."""
import math
from dataclasses import replace

import pandas as pd
import pytest

import labkit as lk
from labkit.analyze import capacity, slo, stats
from labkit.analyze.capacity import Capacity
from labkit.errors import BadParameter

H200 = "data/baselines/h200/results"


def test_a_capacity_that_cannot_be_read_is_refused_naming_every_problem():
    with pytest.raises(BadParameter) as refused:
        Capacity("a", "users", 3, 4, 2, gpus_per_engine=0)
    said = str(refused.value)
    assert "3 problems" in said and "unit must be 'clients' or 'requests/s'" in said
    assert "gpus_per_engine must be a whole number >= 1" in said and "low <= value <= high" in said
    with pytest.raises(BadParameter, match="None together"):
        Capacity("a", "clients", None, 2, None)
    with pytest.raises(BadParameter, match="value must be a finite number > 0"):
        Capacity("a", "clients", 0, 0, 4)
    assert not Capacity("a", "clients", None, None, None).met


def test_replicas_are_the_demand_over_one_engines_capacity_rounded_up_with_the_band_from_its_band():
    table = capacity.replicas_needed([Capacity("tp2", "clients", 8, 8, 16, gpus_per_engine=2),
                                      Capacity("tp1", "clients", 30, 25, 30)], users=100).set_index("arm")
    assert table.loc["tp2", ["replicas", "replicas_low", "replicas_high"]].tolist() == [13, 7, 13]  # 100/8, 100/16
    assert table.loc["tp2", ["gpus", "gpus_low", "gpus_high"]].tolist() == [26, 14, 26]  # two GPUs an engine
    assert table.loc["tp1", ["replicas", "replicas_low", "replicas_high"]].tolist() == [4, 4, 4]  # 100/30, 100/25
    assert table.loc["tp2", "per engine (clients)"] == 8
    exact = capacity.replicas_needed(Capacity("a", "requests/s", 0.3, 0.3, 0.3), rate=2.1)
    assert exact.replicas[0] == 7  # 2.1 / 0.3 is 7.000000000000001 in floats: not 8 replicas
    assert capacity.replicas_needed(Capacity("a", "clients", 64, 64, 64), users=3).replicas[0] == 1


def test_the_table_says_it_is_an_estimate_and_an_arm_without_capacity_gets_no_number():
    table = capacity.replicas_needed([Capacity("ok", "clients", 4, 4, 8),
                                      Capacity("none", "clients", None, None, None, note="")], users=10)
    assert "estimate" in table._caption and "scale linearly" in table._caption and "10 concurrent clients" in table._caption
    row = table.set_index("arm").loc["none"]
    assert pd.isna(row.replicas) and pd.isna(row.gpus) and row.note.startswith("no load met the SLO")
    assert "estimate" in repr(table)  # said in the text form too


def test_bad_demand_is_refused_naming_every_problem():
    caps = [Capacity("c", "clients", 4, 4, 8), Capacity("r", "requests/s", 2.0, 2.0, 3.0)]
    for kwargs, said in (({}, "exactly one; got neither"), ({"users": 1, "rate": 1}, "exactly one; got users, rate"),
                         ({"users": 0}, "users must be a finite number > 0"),
                         ({"users": float("nan")}, "users must be a finite number > 0")):
        with pytest.raises(BadParameter, match=said):
            capacity.replicas_needed(caps[:1], **kwargs)
    with pytest.raises(BadParameter) as refused:
        capacity.replicas_needed(caps, rate=-1)
    assert "2 problems" in str(refused.value) and "'c' was measured in clients, not requests/s" in str(refused.value)
    with pytest.raises(BadParameter, match="at least one Capacity"):
        capacity.replicas_needed([], users=5)


@pytest.fixture(scope="module")
def graphs():
    return lk.load("cuda-graphs", H200)  # loads batch1, c8, c16, c64: closed loops of 1, 8, 16 and 64 clients


def test_capacity_from_stored_concurrencies_is_the_slo_searchs_answer_with_its_band(graphs):
    slos = {"tpot_p99_ms": 6.5}
    assert capacity.load_points(graphs) == {"batch1": 1, "c8": 8, "c16": 16, "c64": 64}
    found = {c.arm: c for c in capacity.capacities_from_points(graphs, slos)}
    # default: TPOT P99 up to 16 clients stays under 6.5 ms (c16's interval ends at 5.1), c64's reaches 7.2
    assert (found["default"].value, found["default"].low, found["default"].high) == (8, 8, 16)
    assert found["default"].unit == "clients" and found["default"].gpus_per_engine == 1
    assert "above 16 clients tpot_p99_ms goes over its limit first" in found["default"].note
    # the same answer the rule gives on the same summaries
    measured = {}
    for load, clients in capacity.load_points(graphs).items():
        s = stats.summarize(graphs.select(load), ["tpot_p99_ms"]).set_index(["arm", "metric"])
        measured[clients] = {"tpot_p99_ms": tuple(s.loc[("default", "tpot_p99_ms"), ["value", "ci_low", "ci_high"]])}
    rule = slo.from_points(measured, slos)
    assert (rule.answer, rule.largest_meeting) == (found["default"].value, found["default"].high)
    # eager decodes one user at over 6.5 ms a token: nothing met, and the table says so
    assert not found["eager"].met and found["eager"].note.startswith("no load met the SLO")
    assert "1 client," in found["eager"].note
    table = capacity.replicas_needed(list(found.values()), users=100).set_index("arm")
    assert table.loc["default", "replicas"] == 13 and table.loc["default", "replicas_low"] == 7
    assert pd.isna(table.loc["eager", "replicas"]) and table.loc["eager", "note"].startswith("no load met the SLO")


def test_a_replica_arms_engine_counts_its_gpus():
    parallel = lk.load("parallelism", "data/baselines/h200x2/results")
    found = {c.arm: c for c in capacity.capacities_from_points(parallel, {"tpot_p99_ms": 15})}
    assert found["dp2"].gpus_per_engine == 2 and found["tp1"].gpus_per_engine == 1
    assert found["dp2"].high == 64 and "extend the grid" in found["dp2"].note  # even 64 clients met


def test_loads_that_are_no_capacity_points_are_refused_naming_each(graphs):
    workloads = dict(graphs.spec["workloads"])
    workloads["c16"] = {**workloads["c16"], "arrival": {"kind": "Poisson", "rate": 4.0, "burstiness": 1.0}}
    workloads["c8"] = {**workloads["c8"], "prompt_len": {"kind": "Fixed", "n": 4096}}
    changed = replace(graphs, spec={**graphs.spec, "workloads": workloads})
    with pytest.raises(BadParameter) as refused:
        capacity.load_points(changed, ["batch1", "c8", "c16", "nope"])
    said = str(refused.value)
    assert "no load 'nope'" in said and "mix units" in said and "load 'c8' sends other requests" in said
    with pytest.raises(BadParameter, match="no complete arm 'nope'"):
        capacity.capacity_from_points(graphs, "nope", {"tpot_p99_ms": 6.5})
    with pytest.raises(BadParameter, match="is no metric"):
        capacity.capacity_from_points(graphs, "default", {"tpot_p99": 6.5})


def test_a_stored_load_search_is_a_capacity_and_plans_replicas():
    import json

    from labkit.analyze import capacity, load_search as ls

    def stored(tbt_of_clients):  # a search on a fake engine, as the arm's load_search fact stores it
        def evaluate(rung, level):
            tbt = tbt_of_clients(level)
            return ls.Probe(rung, level, {"tbt_p99_ms": (tbt, tbt, tbt)}, trials=2, requests=4 * level)
        return json.dumps({"default": ls.bracket_search(evaluate, "clients", list(range(1, 65)),
                                                        {"tbt_p99_ms": 50}).to_dict()})

    class Results:
        name = "searched"
        arms = pd.DataFrame([{"arm": "small", "status": "complete", "load_search": stored(lambda c: 5 + 2 * c)},
                             {"arm": "slow", "status": "complete", "load_search": stored(lambda c: 60 + c)}])

    small, slow = capacity.capacities_from_searches(Results())
    assert (small.arm, small.unit, small.high) == ("small", "clients", 22.0)  # 5 + 2 x 22 = 49 ms: the last to meet
    assert small.value == small.low < small.high and "tbt_p99_ms" in small.note and "probes on one engine" in small.note
    assert not slow.met and "already broken at the smallest load" in slow.note
    plan = capacity.replicas_needed([small, slow], users=1000)
    row = plan.set_index("arm").loc["small"]
    assert row.replicas == math.ceil(1000 / small.value) and row.replicas_low == math.ceil(1000 / 22)
    assert "no load met the SLO" in plan.set_index("arm").loc["slow"].note
