"""Arms at once on one host (Experiment.run(parallel=2)) on the real CPU engine: each on a core of its own,
both at the same time, stored exactly as arms run one at a time, and a verdict between them that says so."""
import datetime as dt
import os

import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.suite.parameters import SMOKE_OVERRIDES

pytestmark = pytest.mark.engine

WORKLOAD = lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst())
PROTOCOL = lk.Protocol(trials=2, warmup_requests=2)
ARMS = {"two": {"max_num_seqs": 2}, "four": {"max_num_seqs": 4}}


@pytest.fixture(scope="module")
def at_once(tmp_path_factory):
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))  # a test process bound to a share of the cores widens it
    try:
        if len(os.sched_getaffinity(0)) < 2:
            pytest.skip("two arms at once need two cores")
        root = tmp_path_factory.mktemp("results")
        parallel = lk.Experiment("at-once", ARMS, WORKLOAD, model="tiny-llama", base=SMOKE_OVERRIDES,
                                 protocol=PROTOCOL, results_dir=root).run(progress=False, parallel=2)
        # the same arm one at a time, to hold the stored schema against
        alone = lk.Experiment("one-at-a-time", {"two": ARMS["two"]}, WORKLOAD, model="tiny-llama",
                              base=SMOKE_OVERRIDES, protocol=PROTOCOL, results_dir=root).run(progress=False)
        return parallel, alone
    finally:
        os.sched_setaffinity(0, own)


def _span(facts, arm):
    row = facts.set_index("arm").loc[arm]
    end = dt.datetime.fromisoformat(row.recorded_utc)
    return end - dt.timedelta(seconds=float(row.seconds)), end


def test_both_arms_ran_at_the_same_time_each_on_a_core_of_its_own(at_once):
    results, _ = at_once
    assert set(results.complete_arms) == set(ARMS), results.arms[["arm", "status", "cause"]]
    facts = results.facts("placed_on", "arms_at_once", "node", "seconds", "recorded_utc")
    assert sorted(facts.placed_on) == ["cores 0", "cores 1"]
    assert set(facts.arms_at_once) == {2} and set(facts.node) == {"local"}
    (a_start, a_end), (b_start, b_end) = _span(facts, "two"), _span(facts, "four")
    assert max(a_start, b_start) < min(a_end, b_end), facts  # their times overlap: they ran at once
    for arm in ARMS:  # vLLM bound each engine's threads to the arm's own core
        core = facts.set_index("arm").loc[arm, "placed_on"].split()[-1]
        assert results.environment[arm]["tuning_variables"].get("VLLM_CPU_OMP_THREADS_BIND") == core


def test_arms_at_once_are_stored_as_arms_one_at_a_time_are(at_once):
    parallel, alone = at_once
    assert set(parallel.trials.columns) == set(alone.trials.columns)
    assert set(parallel.requests.columns) == set(alone.requests.columns)
    assert set(parallel.arms.columns) == set(alone.arms.columns)
    assert alone.facts("placed_on", "arms_at_once").iloc[0][["placed_on", "arms_at_once"]].tolist() == [
        "the whole machine", 1]
    assert len(parallel.requests) == 2 * len(alone.requests)


def test_a_verdict_between_arms_at_once_says_they_shared_the_host(at_once):
    results, _ = at_once
    c = stats.compare(results, "two", "four", "output_tok_s")
    assert "2 arms at once on this host" in c.caution and "memory bandwidth" in c.caution, c.caution
