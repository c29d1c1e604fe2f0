"""The prefix-cache analysis on constructed results: two layouts of the same tokens on one engine (no engine)."""
import numpy as np
import pandas as pd
import pytest

from labkit.analyze import prefix_cache, stats
from labkit.errors import BadParameter
from labkit.store import Results, _with_cache_columns


def results():
    """Shared-first prompts: 5/6 of 288 tokens from the cache, TTFT 7 ms; shared-last: none, TTFT 27 ms."""
    gen = np.random.default_rng(3)
    requests, trials = [], []
    for load, ttft, hits in (("shared_first", 7.0, 3840.0), ("shared_last", 27.0, 0.0)):
        for trial in range(3):
            for i in range(16):
                requests.append({"arm": "on", "load": load, "trial": trial, "ttft_ms": ttft * gen.lognormal(0, 0.05),
                                 "prompt_tokens": 288, "itl_ms": [1.0]})
            trials.append({"arm": "on", "load": load, "trial": trial, "output_tok_s": 100.0 + trial,
                           "prefix_cache_queries": 4608.0, "prefix_cache_hits": hits, "engine_prompt_tokens": 4608.0})
    arms = pd.DataFrame([{"arm": "on", "status": "complete"}])
    return Results("pc", None, {}, arms, pd.DataFrame(requests), _with_cache_columns(pd.DataFrame(trials)), {})


def test_cache_table_sets_what_was_prefilled_against_what_was_sent():
    table = prefix_cache.cache_table(results()).set_index(["load", "metric"])
    assert table.loc[("shared_first", "prefix_hit_pct"), "value"] == pytest.approx(83.33, rel=1e-3)
    assert table.loc[("shared_first", "prefill_tokens_computed"), "value"] == 768
    assert table.loc[("shared_last", "prefill_tokens_computed"), "value"] == 4608
    assert (table.prompt_tokens_sent == 16 * 288).all()
    assert table.loc[("shared_first", "prefix_hit_pct"), "shown"].startswith("83.33 [")


def test_the_layout_conclusion_gives_the_hit_rates_and_the_ttft_change_with_its_interval():
    sentence = prefix_cache.layout_conclusion(results(), "on", "shared_first", "shared_last")
    assert sentence.startswith("on: shared segments first, the cache served 83 % of prompt tokens (against 0 %")
    c = prefix_cache.compare_loads(results(), "on", "shared_last", "shared_first")
    assert c.verdict == "better" and c.rel_change == pytest.approx(7 / 27 - 1, abs=0.05)
    assert "ttft_p50_ms -7" in sentence and "better" in sentence


def test_the_knee_is_the_pool_over_the_prefix():
    assert prefix_cache.working_set_knee(16384, 640) == pytest.approx(25.6)
    with pytest.raises(BadParameter):
        prefix_cache.working_set_knee(0, 640)


def test_by_load_puts_each_load_at_its_quantity():
    table = stats.by_load(results(), "on", {"shared_last": 0, "shared_first": 240}, ["prefix_hit_pct"], x="cached")
    assert table.cached.tolist() == [0, 240] and table.prefix_hit_pct.round(2).tolist() == [0.0, 83.33]
    assert (table.prefix_hit_pct_low <= table.prefix_hit_pct).all()


def test_results_without_the_counters_say_so():
    plain = Results("x", None, {}, pd.DataFrame([{"arm": "a", "status": "complete"}]), pd.DataFrame(),
                    pd.DataFrame({"arm": ["a"], "output_tok_s": [1.0]}), {})
    with pytest.raises(BadParameter, match="no prefix-cache counters"):
        prefix_cache.cache_table(plain)


def test_hit_rate_is_the_share_served_over_the_trials():
    assert prefix_cache.hit_rate(results(), "shared_first", "on") == pytest.approx(83.33, rel=1e-3)
    assert prefix_cache.hit_rate(results(), "shared_last", "on") == 0.0
