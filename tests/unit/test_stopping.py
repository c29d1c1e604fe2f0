"""The adaptive-trials stopping rule (labkit.analyze.stopping), on synthetic trial values: each reason, the
per-trial values it judges, the protocol's checks of bad input, and the coverage of the intervals it stops on."""
import json
import math

import numpy as np
import pandas as pd
import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.analyze.stopping import (HEADLINE, arm_reason, difference_interval, interval, reference_values,
                                     stop_reason, trial_values)
from labkit.errors import BadParameter
from labkit.spec.protocol import Protocol

AUTO = Protocol(budget_s=None)


def steady(n, value=100.0, spread=0.001):
    """n per-trial values of every headline metric, alternating +/- spread around value."""
    return {name: [value * (1 + spread * (-1) ** i) for i in range(n)] for name in HEADLINE}


def test_below_the_minimum_it_never_stops_even_when_the_budget_is_spent():
    assert stop_reason(steady(1), Protocol(min_trials=2, budget_s=1.0), elapsed_s=1000.0) is None


def test_precise_values_stop_from_the_third_trial_not_on_a_lucky_pair():
    assert stop_reason(steady(2, spread=1e-6), AUTO) is None  # two values: never "precise"
    assert stop_reason(steady(3), AUTO) == "precise"


def test_one_imprecise_metric_keeps_the_arm_running_until_the_maximum():
    values = steady(3)
    values["tpot_p50_ms"] = [50.0, 100.0, 150.0]  # +/- 124 % at three trials
    assert stop_reason(values, AUTO) is None
    values = {name: v * 2 for name, v in values.items()}  # six trials
    assert stop_reason(values, AUTO) == "maximum"


def test_a_noisy_tail_latency_does_not_hold_the_arm_unless_the_protocol_names_it():
    values = steady(3)
    values["ttft_p99_ms"] = [36.6, 46.1, 41.0]  # a P99 of a handful of requests, as measured on an H200
    assert stop_reason(values, AUTO) == "precise"
    strict = Protocol(budget_s=None, precise_on=("output_tok_s", "ttft_p99_ms"))
    assert stop_reason(values, strict) is None


@pytest.mark.parametrize("bad", [(), ("ttft_p50_ms",), "output_tok_s", None])
def test_precise_on_names_headline_metrics_only(bad):
    with pytest.raises(BadParameter, match="precise_on must name one or more of the headline metrics"):
        Protocol(precise_on=bad)


def test_a_stored_protocol_reads_back_equal():
    protocol = Protocol(precise_on=["output_tok_s"])  # as JSON hands it back
    assert Protocol(**json.loads(json.dumps(protocol.to_dict()))) == protocol


def test_a_metric_with_no_value_is_left_out_of_the_judgement():
    values = steady(3)
    values["tpot_p50_ms"] = [float("nan")] * 3  # one-token outputs have no TPOT
    assert stop_reason(values, AUTO) == "precise"


def test_the_budget_stops_when_one_more_trial_would_pass_the_loads_share():
    noisy = {name: [90.0, 110.0] for name in HEADLINE}
    budget = Protocol(budget_s=100.0)
    assert stop_reason(noisy, budget, elapsed_s=40.0) is None  # a third trial ends near 60 s
    assert stop_reason(noisy, budget, elapsed_s=70.0) == "budget"  # ... near 105 s
    assert stop_reason(noisy, budget, elapsed_s=40.0, loads=2) == "budget"  # two loads: 50 s each
    assert stop_reason(noisy, Protocol(budget_s=None), elapsed_s=1e9) is None


def test_a_verdict_against_the_reference_settled_either_way_stops_the_arm():
    protocol = Protocol(budget_s=None, decide_threshold=0.05)
    noisy = {name: [98.0, 102.0, 99.0, 101.5] for name in HEADLINE}  # not precise to 2 % (about +/- 2.9 %)
    assert stop_reason(noisy, protocol) is None
    far = {name: [150.0, 151.0, 149.0] for name in HEADLINE}  # the arm is 50 % off: beyond the band
    assert stop_reason(noisy, protocol, reference=far) == "decided"
    near = {name: [100.0, 100.2, 99.8, 100.1] for name in HEADLINE}  # within the +/- 5 % band
    assert stop_reason(noisy, protocol, reference=near) == "decided"
    edge = {name: [104.0, 106.0, 105.0] for name in HEADLINE}  # straddles -5 %: not settled
    assert stop_reason(noisy, protocol, reference=edge) is None
    half_known = {**far, "tpot_p50_ms": [150.0]}  # one reference value has no spread: nothing is decided
    assert stop_reason(noisy, protocol, reference=half_known) is None


def test_a_fixed_protocol_runs_exactly_its_number():
    fixed = Protocol(trials=3)
    assert [stop_reason(steady(n), fixed, elapsed_s=1e9) for n in (1, 2, 3)] == [None, None, "fixed"]


def test_the_arm_reads_the_least_settled_reason_of_its_loads():
    assert arm_reason({"a": "precise", "b": "decided"}) == "decided"
    assert arm_reason({"a": "precise", "b": "maximum", "c": "budget"}) == "budget"
    assert arm_reason({"a": "precise"}) == "precise"


def test_the_difference_interval_holds_the_ratio_of_the_means():
    low, high = difference_interval([110, 112, 108], [100, 101, 99])
    assert low < 0.10 < high and high - low < 0.1
    assert difference_interval([110, 110], [100, 100]) == pytest.approx((0.1, 0.1))
    assert difference_interval([110], [100, 101]) == (-math.inf, math.inf)


def test_per_trial_values_are_formed_as_the_statistics_form_them():
    rows = [{"ttft_ms": t, "tpot_ms": 2.0 + i, "itl_ms": [1.0, 2.0 + i]} for i, t in enumerate(range(1, 101))]
    values = trial_values({"output_tok_s": 500.0}, rows)
    assert values["output_tok_s"] == 500.0
    assert values["ttft_p99_ms"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert values["tpot_p50_ms"] == pytest.approx(np.percentile(2.0 + np.arange(100), 50))
    assert values["tbt_p99_ms"] == pytest.approx(np.percentile([g for r in rows for g in r["itl_ms"]], 99))
    assert math.isnan(trial_values({}, [{"ttft_ms": None, "tpot_ms": None, "itl_ms": []}])["tpot_p50_ms"])


def test_the_reference_values_are_read_back_per_load_and_trial():
    class Stored:  # the two tables stats.groups reads, one load
        trials = pd.DataFrame({"arm": ["ref", "ref"], "trial": [0, 1], "output_tok_s": [100.0, 104.0],
                               "load": ["l", "l"]})
        requests = pd.DataFrame({"arm": ["ref"] * 4, "trial": [0, 0, 1, 1], "ttft_ms": [1.0, 3.0, 2.0, 6.0],
                                 "tpot_ms": [1.0] * 4, "itl_ms": [[1.0]] * 4, "load": ["l"] * 4})
        loads = ["l"]

        def per_load(self):
            return [("l", self)]

    found = reference_values(Stored(), "ref")["l"]
    assert found["output_tok_s"] == [100.0, 104.0]
    assert found["ttft_p99_ms"] == pytest.approx([np.percentile([1, 3], 99), np.percentile([2, 6], 99)])


def _simulate_arm(rng, draw, protocol):
    """One arm under the rule: trials until it says stop; its final t interval covers the truth (100)?"""
    values = {"output_tok_s": []}
    while True:
        values["output_tok_s"].append(draw(rng))
        reason = stop_reason(values, protocol)
        if reason:
            mean, half = interval(values["output_tok_s"])
            return abs(mean - 100.0) <= half, len(values["output_tok_s"]), reason


@pytest.mark.parametrize("noise", ["normal", "lognormal"])
def test_the_intervals_the_rule_stops_on_cover_the_true_value_95_percent_of_the_time(noise):
    """Optional stopping favours trials whose spread came out small; over 2,000 simulated arms per noise shape,
    each with a coefficient of variation drawn from 0.5-10 % (seeded), the final 95 % t intervals still cover
    the true mean >= 93 % of the time. (Letting two trials stop as "precise" drops this to about 91 %.)"""
    rng = np.random.default_rng(30)
    covered, counts, reasons = [], [], set()
    for cv in rng.uniform(0.005, 0.10, size=2000):
        if noise == "normal":
            draw = lambda r, cv=cv: r.normal(100.0, 100.0 * cv)  # noqa: E731
        else:  # right-skewed, as latencies are; its mean is 100
            sigma = math.sqrt(math.log(1 + cv * cv))
            draw = lambda r, s=sigma: 100.0 * math.exp(r.normal(-s * s / 2, s))  # noqa: E731
        hit, n, reason = _simulate_arm(rng, draw, AUTO)
        covered.append(hit)
        counts.append(n)
        reasons.add(reason)
    assert np.mean(covered) >= 0.93, f"coverage {np.mean(covered):.3f}"
    assert reasons == {"precise", "maximum"}  # both ways of stopping were exercised
    assert 3 <= np.mean(counts) < 6  # and the rule saved trials against the maximum


BAD = {
    "a precision of zero": (dict(precision=0), "0.02 for +/-2 %"),
    "a negative precision": (dict(precision=-0.02), "0.02 for +/-2 %"),
    "a precision that is not a number": (dict(precision=float("nan")), "0.02 for +/-2 %"),
    "an infinite precision": (dict(precision=float("inf")), "0.02 for +/-2 %"),
    "a precision given as True": (dict(precision=True), "0.02 for +/-2 %"),
    "a maximum below the minimum": (dict(min_trials=4, max_trials=3), "raise max_trials to at least 4"),
    "a minimum of zero": (dict(min_trials=0), "min_trials must be a whole number >= 1"),
    "a budget of zero": (dict(budget_s=0), "seconds of trial time per arm"),
    "a budget given as text": (dict(budget_s="600"), "seconds of trial time per arm"),
    "trials given as text other than auto": (dict(trials="many"), '"auto" for adaptive trials'),
    "trials of zero": (dict(trials=0), '"auto" for adaptive trials'),
    "trials given as True": (dict(trials=True), '"auto" for adaptive trials'),
    "trials given as a float": (dict(trials=2.0), '"auto" for adaptive trials'),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_protocol_is_refused_naming_the_fix(case):
    kwargs, words = BAD[case]
    with pytest.raises(lk.BadParameter) as caught:
        Protocol(**kwargs)
    assert words in str(caught.value)


def test_every_problem_of_a_protocol_is_named_at_once():
    with pytest.raises(lk.BadParameter) as caught:
        Protocol(precision=0, min_trials=0, budget_s=-1)
    assert all(words in str(caught.value) for words in ("precision", "min_trials", "budget_s"))


def test_a_reference_arm_the_experiment_lacks_is_refused_before_any_engine():
    with pytest.raises(lk.BadParameter, match="decide_against names arm 'nope'"):
        lk.Experiment("e", {"a": {}, "b": {}}, lk.Workload.closed_loop(4, 16, 4, 2), model="tiny-llama",
                      protocol=Protocol(decide_against="nope"))


@pytest.mark.parametrize("protocol", [Protocol(), Protocol(trials=3), Protocol(trials=2, precision=0.05),
                                      Protocol(precision=0.01, max_trials=10, budget_s=None, decide_against="a")])
def test_a_stored_protocol_round_trips(protocol):
    assert Protocol(**protocol.to_dict()) == protocol


def test_a_fixed_protocol_is_stored_as_before_adaptive_trials():
    """Stored arms are resumed (and compared with baselines) by their spec's hash: a fixed protocol's dict keeps
    the keys it had, so arms measured before stay resumable."""
    assert Protocol(trials=3, warmup_requests=4).to_dict() == {
        "trials": 3, "warmup_requests": 4, "kv_sample_interval_s": 0.25, "profile_requests": 0, "temperature": None}
    assert Protocol().to_dict()["trials"] == "auto" and "precision" in Protocol().to_dict()


def test_the_most_trials_is_the_maximum_when_adaptive():
    assert Protocol().most_trials == 6 and Protocol(trials=3).most_trials == 3


def test_headline_metrics_are_the_verdicts():
    assert HEADLINE == stats.VERDICT_METRICS


def test_the_arms_complete_line_says_how_many_trials_ran_and_why_they_stopped():
    from labkit.experiment import _trials_text

    assert _trials_text({}, Protocol(trials=3), 2) == "3 trial(s) x 2 load(s)"  # the fixed protocol's line, as before
    assert _trials_text({"trials_run": 4, "stopped": "precise"}, Protocol(), 1) == \
        "4 trial(s) over 1 load(s) (stopped: precise)"
    assert _trials_text({"trials_run": 9, "stopped": "maximum", "stopped_by_load": {"a": "precise", "b": "maximum"}},
                        Protocol(), 2) == "9 trial(s) over 2 load(s) (stopped: a precise, b maximum)"


def test_the_protocols_headline_metrics_are_the_verdicts():
    from labkit.spec.protocol import HEADLINE_METRICS, PRECISE_ON

    assert list(HEADLINE_METRICS) == stats.VERDICT_METRICS == HEADLINE and set(PRECISE_ON) <= set(HEADLINE)
