"""Summaries and A/B verdicts on constructed results (no engine, no disk)."""
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.analyze import stats
from labkit.errors import BadParameter
from labkit.store import Results

TRIALS = 3
PER_TRIAL = 60


def _requests(arm, gen, ttft_scale=1.0, tpot_scale=1.0, itl=None):
    rows = []
    for trial in range(TRIALS):
        for i in range(PER_TRIAL):
            ttft = 100.0 * ttft_scale * gen.lognormal(0, 0.1)
            tpot = 10.0 * tpot_scale * gen.lognormal(0, 0.1)
            gaps = itl(trial, i) if itl else list(tpot * gen.lognormal(0, 0.05, size=5))
            rows.append({"arm": arm, "trial": trial, "ttft_ms": ttft, "tpot_ms": tpot,
                         "e2e_ms": ttft + tpot * len(gaps), "itl_ms": gaps, "prompt_tokens": 64,
                         "output_tokens": len(gaps) + 1})
    return rows


def _trials(arm, tok_s):
    return [{"arm": arm, "trial": t, "output_tok_s": v, "total_tok_s": 3 * v, "request_s": v / 10,
             "preemptions": 0} for t, v in enumerate(tok_s)]


def make_results(arm_specs, statuses=None):
    """arm_specs: arm -> (request rows, trial rows)."""
    requests, trials = [], []
    for rows, trial_rows in arm_specs.values():
        requests += rows
        trials += trial_rows
    statuses = statuses or {}
    arms = pd.DataFrame([{"arm": a, "status": statuses.get(a, "complete")} for a in arm_specs])
    return Results("fake", Path("/nonexistent"), {"arms": {a: {} for a in arm_specs}}, arms,
                   pd.DataFrame(requests), pd.DataFrame(trials), {})


@pytest.fixture(scope="module")
def pair():
    """Two arms only: summaries and arm tables bootstrap every arm, so keep them small."""
    gen = np.random.default_rng(1)
    return make_results({
        "base": (_requests("base", gen), _trials("base", [1000, 1010, 990, 1005, 995])),
        "fast": (_requests("fast", gen, ttft_scale=0.7, tpot_scale=0.7),
                 _trials("fast", [1400, 1410, 1390, 1405, 1395])),
        "broken": ([], []),
    }, statuses={"broken": "failed"})


@pytest.fixture(scope="module")
def results():
    gen = np.random.default_rng(0)
    return make_results({
        "base": (_requests("base", gen), _trials("base", [1000, 1010, 990, 1005, 995])),
        "same": (_requests("same", gen), _trials("same", [1002, 996, 1008, 994, 1001])),
        "fast": (_requests("fast", gen, ttft_scale=0.7, tpot_scale=0.7),
                 _trials("fast", [1400, 1410, 1390, 1405, 1395])),
        "slow": (_requests("slow", gen, ttft_scale=1.5, tpot_scale=1.5),
                 _trials("slow", [600, 610, 590, 605, 595])),
        "plus3": (_requests("plus3", gen, ttft_scale=1.03), _trials("plus3", [1000, 1010, 990, 1005, 995])),
        "broken": ([], []),
    }, statuses={"broken": "failed"})


def test_complete_arms_excludes_failed(results):
    assert results.complete_arms == ["base", "same", "fast", "slow", "plus3"]


def test_summarize_value_inside_ci(pair):
    names = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tbt_p99_ms"]
    table = stats.summarize(pair, names)
    assert len(table) == 2 * len(names)
    assert list(dict.fromkeys(table.arm)) == ["base", "fast"]  # the failed arm has no row
    for row in table.itertuples():
        assert np.isfinite(row.value), row
        assert row.ci_low <= row.value <= row.ci_high, row
        assert row.ci_low < row.ci_high, row
    base = table[(table.arm == "base") & (table.metric == "ttft_p50_ms")].iloc[0]
    assert base.trials == TRIALS and base.n == TRIALS * PER_TRIAL
    assert 90 < base.value < 110
    tok = table[(table.arm == "base") & (table.metric == "output_tok_s")].iloc[0]
    assert tok.value == pytest.approx(1000) and tok.n == 5


def test_summarize_default_metrics(pair):
    one = make_results({"base": (pair.requests[pair.requests.arm == "base"].to_dict("records"),
                                 pair.trials[pair.trials.arm == "base"].to_dict("records"))})
    table = stats.summarize(one)
    assert len(table) == 5 and (table.arm == "base").all()
    assert list(dict.fromkeys(table.metric)) == ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                                 "tbt_p99_ms"]


@pytest.mark.parametrize("name", ["ttft_p50_ms", "tbt_p99_ms"])
def test_faster_candidate_is_better_on_latency(results, name):
    c = stats.compare(results, "base", "fast", name)
    assert c.verdict == "better", c.sentence()
    assert c.rel_change < -0.2 and c.ci_high < 0


@pytest.mark.parametrize("name", ["tpot_p50_ms", "e2e_mean_ms"])
def test_slower_candidate_is_worse_on_latency(results, name):
    c = stats.compare(results, "base", "slow", name)
    assert c.verdict == "worse", c.sentence()
    assert c.rel_change > 0.3 and c.ci_low > 0


@pytest.mark.parametrize("name", ["ttft_p50_ms", "output_tok_s"])
def test_same_distribution_no_detectable_difference(results, name):
    c = stats.compare(results, "base", "same", name)
    assert c.verdict == "no detectable difference", c.sentence()
    assert c.ci_low < 0 < c.ci_high


def test_throughput_higher_is_better(results):
    faster = stats.compare(results, "base", "fast", "output_tok_s")
    assert faster.verdict == "better" and faster.rel_change == pytest.approx(0.4)
    slower = stats.compare(results, "base", "slow", "output_tok_s")
    assert slower.verdict == "worse" and slower.rel_change == pytest.approx(-0.4)
    assert stats.compare(results, "fast", "base", "output_tok_s").verdict == "worse"


def test_threshold_hides_small_true_changes():
    gen = np.random.default_rng(42)
    base = [gen.normal(100, 0.5, 200) for _ in range(3)]
    cand = [g * 1.03 for g in base]  # a true +3 % on a lower-is-better metric
    m = stats.metric("ttft_mean_ms")
    plain = stats.compare_groups(base, cand, m)
    assert plain.verdict == "worse", plain.sentence()
    assert plain.rel_change == pytest.approx(0.03)
    hidden = stats.compare_groups(base, cand, m, threshold=0.05)
    assert hidden.verdict == "no detectable difference"
    assert hidden.sentence().endswith("no detectable difference beyond +/-5%")  # real, but under the threshold
    assert stats.compare_groups(base, cand, m, threshold=0.01).verdict == "worse"
    faster = [g * 0.97 for g in base]
    assert stats.compare_groups(base, faster, m, threshold=0.05).verdict == "no detectable difference"
    assert stats.compare_groups(base, faster, m).verdict == "better"


def test_threshold_on_arms(results):
    # plus3: ttft 3 % slower; the whole CI may not exceed 50 %
    assert stats.compare(results, "base", "plus3", "ttft_mean_ms", threshold=0.5).verdict == \
        "no detectable difference"


def test_compare_missing_arm(results):
    with pytest.raises(BadParameter, match="nope"):
        stats.compare(results, "base", "nope", "ttft_p50_ms")
    with pytest.raises(BadParameter, match="broken"):
        stats.compare(results, "broken", "base", "ttft_p50_ms")


def test_unknown_metric(results):
    with pytest.raises(BadParameter, match="ttft_p42_ms"):
        stats.compare(results, "base", "fast", "ttft_p42_ms")
    with pytest.raises(BadParameter):
        stats.summarize(results, ["latency"])


def test_token_metrics_pool_itl_lists():
    # trial 0: one request with 1 gap of 100 ms, one with 9 gaps of 10 ms
    lists = {(0, 0): [100.0], (0, 1): [10.0] * 9, (1, 0): [20.0, 30.0], (1, 1): [float("nan"), 40.0]}
    rows = []
    for (trial, i), gaps in lists.items():
        rows.append({"arm": "a", "trial": trial, "ttft_ms": 1.0, "tpot_ms": 1.0, "e2e_ms": 1.0, "itl_ms": gaps,
                     "prompt_tokens": 4, "output_tokens": len(gaps) + 1})
    res = make_results({"a": (rows, _trials("a", [1.0]))})
    m = stats.metric("tbt_mean_ms")
    data = stats.groups(res, "a", m)
    assert len(data) == 2
    assert sorted(data[0].tolist()) == sorted([100.0] + [10.0] * 9)
    assert sorted(data[1].tolist()) == [20.0, 30.0, 40.0]  # NaN gaps dropped
    pooled = (100 + 90 + 20 + 30 + 40) / 13
    assert stats.point(data, m) == pytest.approx(pooled)  # not the mean of per-request means
    row = stats.summarize(res, ["tbt_mean_ms"]).iloc[0]
    assert row.n == 13 and row.value == pytest.approx(pooled)
    assert stats.point(stats.groups(res, "a", stats.metric("tbt_p50_ms")), stats.metric("tbt_p50_ms")) == 10.0


def test_request_metrics_group_by_trial(results):
    data = stats.groups(results, "base", stats.metric("ttft_p50_ms"))
    assert len(data) == TRIALS and all(len(g) == PER_TRIAL for g in data)


def test_metric_directions():
    assert stats.metric("output_tok_s").lower_is_better is False
    assert stats.metric("ttft_p99_ms").lower_is_better is True
    assert stats.metric("tbt_p99_ms").level == "token" and stats.metric("tbt_p99_ms").percentile == 99


def test_replicates_reproducible_and_empty():
    m = stats.metric("ttft_p50_ms")
    data = [np.arange(10.0), np.arange(10.0, 30.0)]
    assert np.array_equal(stats.replicates(data, m, n_boot=50, seed=3), stats.replicates(data, m, n_boot=50, seed=3))
    assert np.isnan(stats.replicates([], m, n_boot=5)).all()
    assert np.isnan(stats.point([], m))


def test_compare_arms_table(pair):
    comparisons = stats.compare_arms(pair, "base", metrics=["output_tok_s", "ttft_p50_ms"])
    assert str(comparisons).splitlines()[1].startswith("fast vs base: ttft_p50_ms: ")
    assert str(comparisons).splitlines()[1].endswith(": better")
    table = comparisons.table()
    assert table.arm.tolist() == ["fast", "fast"] and table.metric.tolist() == ["output_tok_s", "ttft_p50_ms"]
    assert (table.vs == "base").all()
    fast = table[(table.arm == "fast") & (table.metric == "ttft_p50_ms")].iloc[0]
    assert fast.verdict == "better"


def test_sentence_mentions_verdict(results):
    c = stats.compare(results, "base", "slow", "ttft_p50_ms")
    assert c.sentence().startswith("ttft_p50_ms: ") and c.sentence().endswith("worse")


def test_one_trial_level_value_is_too_few_to_judge():
    m = stats.metric("output_tok_s")
    c = stats.compare_groups([np.array([500.0])], [np.array([400.0])], m, threshold=0.05)
    assert c.verdict == "too few trials" and c.rel_change == pytest.approx(-0.2)
    assert np.isnan(c.ci_low) and np.isnan(c.ci_high)
    # request-level metrics of one trial still have the requests' spread to judge by
    gen = np.random.default_rng(0)
    slow = stats.compare_groups([gen.normal(10, 0.1, 50)], [gen.normal(20, 0.1, 50)], stats.metric("tpot_p50_ms"))
    assert slow.verdict == "worse"


def test_t_quantiles_match_the_published_table():
    from labkit.analyze.stats import t_quantile
    for df, published in ((1, 12.706), (2, 4.303), (10, 2.228), (11, 2.201), (20, 2.086), (30, 2.042), (120, 1.980)):
        assert t_quantile(df) == pytest.approx(published, abs=0.001)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_block_statistics_are_numpys_percentile_and_mean_of_each_run():
    values = np.random.default_rng(3).lognormal(size=31)
    sizes = np.array([1, 5, 10, 15])
    runs = np.split(values, np.cumsum(sizes)[:-1])
    for name in ("ttft_p99_ms", "tpot_p50_ms", "e2e_p50_ms"):
        m = stats.METRICS[name]
        assert np.allclose(stats._row_stats(values, sizes, m), [np.percentile(r, m.percentile) for r in runs])
    mean = dataclasses.replace(stats.METRICS["tpot_p50_ms"], percentile=None)
    assert np.allclose(stats._row_stats(values, sizes, mean), [r.mean() for r in runs])


@pytest.mark.parametrize("name", ["ttft_p99_ms", "tpot_p50_ms"])
def test_small_samples_resampled_in_blocks_give_the_intervals_of_one_draw_per_replicate(name, monkeypatch):
    """The vectorised bootstrap of small samples draws the same two-level resamples as the per-replicate loop:
    their replicates have the same centre and spread (a tail percentile of 120 values takes few distinct values,
    so single quantiles of the replicates jump between them; the moments do not)."""
    rng = np.random.default_rng(7)
    data = [rng.lognormal(size=40) * (1 + 0.05 * i) for i in range(3)]
    m = stats.METRICS[name]
    blocks = stats.replicates(data, m, n_boot=4000)
    monkeypatch.setattr(stats, "VECTORISED_UP_TO", 0)  # the per-replicate loop
    loop = stats.replicates(data, m, n_boot=4000)
    assert abs(blocks.mean() - loop.mean()) <= 0.02 * loop.mean(), (blocks.mean(), loop.mean())
    assert abs(blocks.std() - loop.std()) <= 0.1 * loop.std(), (blocks.std(), loop.std())


@pytest.mark.parametrize("margin_sd", [8.0, 0.0])  # 0: most replicates fall outside the window, drawn in full
def test_many_values_drawn_near_the_percentile_give_the_intervals_of_drawing_them_all(margin_sd, monkeypatch):
    """The windowed bootstrap of a tail percentile of many values (labkit.analyze.quantile_bootstrap) has the
    replicate distribution of the plain two-level draw, also where its window misses and the rest is drawn."""
    from labkit.analyze import quantile_bootstrap
    rng = np.random.default_rng(11)
    data = [rng.lognormal(size=3000) * (1 + 0.03 * i) for i in range(4)]
    m = stats.METRICS["tbt_p99_ms"]
    monkeypatch.setattr(quantile_bootstrap, "MARGIN_SD", margin_sd)
    windowed = quantile_bootstrap.windowed_replicates(data, m.percentile, 3000, np.random.default_rng(1))
    assert windowed is not None
    monkeypatch.setattr(stats, "windowed_replicates", lambda *args: None)  # every value drawn
    plain = stats.replicates(data, m, n_boot=3000, seed=1)
    assert abs(windowed.mean() - plain.mean()) <= 0.01 * plain.mean(), (windowed.mean(), plain.mean())
    assert abs(windowed.std() - plain.std()) <= 0.1 * plain.std(), (windowed.std(), plain.std())
    for q in (0.025, 0.5, 0.975):
        assert abs(np.quantile(windowed, q) - np.quantile(plain, q)) <= 0.02 * plain.mean(), q


def test_a_percentile_of_trials_too_far_apart_for_a_narrow_window_draws_every_value():
    from labkit.analyze import quantile_bootstrap
    rng = np.random.default_rng(5)
    data = [rng.lognormal(size=2000), rng.lognormal(size=2000) * 3]  # the trials' P50s lie far apart
    assert quantile_bootstrap.windowed_replicates(data, 50.0, 100, rng) is None
    assert np.isfinite(stats.replicates(data, stats.METRICS["tbt_p50_ms"], n_boot=100)).all()


def test_itl_is_vllm_bench_serves_gap_between_chunks_where_tbt_counts_each_token():
    """Tokens that arrive in one chunk share a stamp: TBT counts a 0 ms gap for each, ITL (as vllm bench serve's
    client stamps chunks) one gap per chunk; with one token per chunk the two agree."""
    stamps = [0.100, 0.110, 0.110, 0.110, 0.125]  # the first chunk, a chunk of three tokens, one more
    assert np.allclose(stats.chunk_gaps(stamps), [10.0, 15.0])
    assert np.allclose(stats.chunk_gaps([0.1, 0.2, 0.4]), [100.0, 200.0]) and len(stats.chunk_gaps([0.1])) == 0
    requests = pd.DataFrame([{"arm": "a", "trial": 0, "token_s": stamps, "itl_ms": list(np.diff(stamps) * 1e3)}])
    results = Results("r", None, {}, pd.DataFrame([{"arm": "a", "status": "complete"}]), requests, pd.DataFrame(), {})
    assert np.allclose(stats.groups(results, "a", stats.METRICS["itl_p50_ms"])[0], [10.0, 15.0])
    assert len(stats.groups(results, "a", stats.METRICS["tbt_p50_ms"])[0]) == 4
    assert "vllm bench serve" in stats.METRICS["itl_p99_ms"].meaning


def test_differences_are_in_the_metrics_own_unit_with_an_interval():
    gen = np.random.default_rng(1)
    rows = [{"arm": arm, "load": "c4", "trial": t, "ttft_ms": float(base + gen.normal(0, 0.5)), "request": i}
            for arm, base in (("a", 20.0), ("b", 26.0)) for t in range(3) for i in range(30)]
    results = Results("r", None, {}, pd.DataFrame([{"arm": a, "status": "complete"} for a in "ab"]),
                      pd.DataFrame(rows), pd.DataFrame([{"arm": a, "load": "c4", "trial": t} for a in "ab" for t in range(3)]), {})
    table = stats.differences(results, "a", "b", ["ttft_p50_ms"])
    row = table.iloc[0]
    assert row.load == "c4" and 5.5 < row.added < 6.5 and row.added_low < row.added < row.added_high
    assert row.added_high - row.added_low < 1.0


def test_an_arms_cautions_are_said_once_across_its_metrics():
    cautions = pd.Series(["host load: 1.1 against 0.9; repeat moved tpot -5%", "host load: 1.1 against 0.9", None])
    assert stats.joined_cautions(cautions) == "host load: 1.1 against 0.9; repeat moved tpot -5%"
