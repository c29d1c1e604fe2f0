"""The speculative-decoding reading (labkit.analyze.speculation) on hand-made records: pure logic."""
import pandas as pd

from labkit.analyze.speculation import k_schedule, load_shape, recommend_k, speculative_k, stops_paying
from labkit.analyze.stats import BETTER, NO_DIFFERENCE, WORSE

KS = {"k0": 0, "k1": 1, "k3": 3}
SHAPES = {"copy_c1": ("copy", 1), "copy_c8": ("copy", 8), "copy_c32": ("copy", 32)}


def record(rows):
    """An ab_record's output_tok_s rows: (load, arm, value, change, verdict); k0 is the reference."""
    out = [{"load": load, "arm": "k0", "metric": "output_tok_s", "value": 100.0, "verdict": None}
           for load in dict.fromkeys(r[0] for r in rows)]
    out += [{"load": load, "arm": arm, "metric": "output_tok_s", "value": value, "change": change,
             "change_ci_low": change - 0.05, "change_ci_high": change + 0.05, "verdict": verdict}
            for load, arm, value, change, verdict in rows]
    return pd.DataFrame(out)


def test_the_fastest_better_k_is_recommended_and_none_better_keeps_speculation_off():
    plan = recommend_k(record([
        ("copy_c1", "k1", 130.0, 0.30, BETTER), ("copy_c1", "k3", 160.0, 0.60, BETTER),
        ("copy_c8", "k1", 110.0, 0.10, BETTER), ("copy_c8", "k3", 105.0, 0.05, NO_DIFFERENCE),
        ("copy_c32", "k1", 95.0, -0.05, WORSE), ("copy_c32", "k3", 80.0, -0.20, WORSE)]), KS, SHAPES)
    assert plan.set_index("load")["recommended k"].to_dict() == {"copy_c1": 3, "copy_c8": 1, "copy_c32": 0}
    assert plan.set_index("load").loc["copy_c32", "output_tok_s change [95 % interval]"] == "keep speculation off"
    assert plan.set_index("load").loc["copy_c1", "k=3"] == BETTER
    paying = stops_paying(plan).set_index("k")
    assert paying.loc[3, "pays up to (clients)"] == 1 and paying.loc[3, "stops paying at (clients)"] == 8
    assert paying.loc[1, "pays up to (clients)"] == 8 and paying.loc[1, "stops paying at (clients)"] == 32
    assert k_schedule(plan, "copy", 64) == [(1, 7, 3), (8, 31, 1), (32, 64, 0)]


def test_equal_recommendations_of_neighbouring_batches_make_one_range():
    plan = recommend_k(record([("copy_c1", "k3", 150.0, 0.5, BETTER), ("copy_c8", "k3", 120.0, 0.2, BETTER),
                               ("copy_c32", "k3", 90.0, -0.1, WORSE)]), KS, SHAPES)
    assert k_schedule(plan, "copy", 32) == [(1, 31, 3), (32, 32, 0)]


def test_an_arms_k_and_a_loads_task_and_clients_come_from_the_stored_spec():
    assert speculative_k({}) == 0 and speculative_k({"speculative": {"num_speculative_tokens": 5}}) == 5
    assert load_shape({"prompt_len": {"kind": "ChatText", "task": "quote"}, "arrival": {"kind": "Concurrency", "n": 8}}) \
        == ("quote", 8)
    assert load_shape({"prompt_len": {"kind": "Fixed", "n": 8}, "arrival": {"kind": "Burst"}}) == ("ids", None)


def test_a_batch_too_noisy_to_judge_gets_no_recommendation_and_its_neighbours_cover_it():
    from labkit.analyze.stats import TOO_NOISY
    plan = recommend_k(record([("copy_c1", "k3", 150.0, 0.5, BETTER), ("copy_c8", "k3", 120.0, 0.2, TOO_NOISY),
                               ("copy_c32", "k3", 90.0, -0.1, WORSE)]), KS, SHAPES).set_index("load")
    assert plan["recommended k"].isna().tolist() == [False, True, False]
    assert plan.loc["copy_c8", "output_tok_s change [95 % interval]"].startswith(TOO_NOISY)
    assert k_schedule(plan.reset_index(), "copy", 32) == [(1, 31, 3), (32, 32, 0)]


def test_the_larger_shape_is_measured_at_each_batch_and_each_batch_times_k_plus_one():
    from labkit.analyze.speculation_estimate import verification_batches
    assert verification_batches([1, 8], [1, 3]) == [1, 2, 4, 8, 16, 32]


def test_tokens_per_step_and_extra_time_come_from_the_step_and_token_times():
    from labkit.analyze.speculation_estimate import step_yield_and_extra
    tau, extra = step_yield_and_extra(step=(6.0, 5.0, 7.0), per_token=(2.0, 1.0, 4.0), verify_step=(2.0, 1.5, 2.5))
    assert tau == (3.0, 5.0 / 4.0, 7.0) and extra == (4.0, 2.5, 5.5)
    # a plain step of as many tokens slower than the speculating one: speculation's own work counts as none
    _tau, extra = step_yield_and_extra(step=(6.0, 5.0, 7.0), per_token=(2.0, 1.0, 4.0), verify_step=(6.5, 6.0, 7.0))
    assert extra == (0.0, 0.0, 1.0)


def test_the_estimate_combines_acceptance_and_step_cost_and_names_the_likely_outcome():
    from labkit.analyze.speculation_estimate import COSTS, PAYS, UNCLEAR, estimate
    exact = lambda v: (v, v, v)
    # plain step 10 ms at batch 1, 12 ms at batch 4 (k = 3): 3 tokens per step and 3 ms extra -> 3 x 10 / 15
    steps = {1: exact(10.0), 4: exact(12.0), 8: exact(20.0), 32: exact(80.0), 2: (10.0, 9.0, 11.0)}
    rows = [{"task": "copy", "clients": 1, "k": 3, "tau": exact(3.0), "extra": exact(3.0)},
            {"task": "copy", "clients": 8, "k": 3, "tau": exact(1.2), "extra": exact(3.0)},
            {"task": "open", "clients": 1, "k": 1, "tau": exact(1.05), "extra": exact(0.5)},
            {"task": "open", "clients": 16, "k": 1, "tau": exact(1.05), "extra": exact(0.5)}]  # 16, 32: not measured
    table = estimate(rows, steps).set_index(["task", "clients"])
    assert len(table) == 3
    assert table.loc[("copy", 1), "estimated output tok/s change [band]"] == "+100.0% [+100.0%, +100.0%]"
    assert table.loc[("copy", 1), "estimate"] == PAYS
    assert table.loc[("copy", 8), "estimate"] == COSTS  # 1.2 x 20 / 83
    # 1.05 x 10 / (10 + 0.5) = 0 %, and the plain step's interval at batch 2 spans both sides
    assert table.loc[("open", 1), "estimate"] == UNCLEAR
