"""Plots draw what the results hold: one panel per metric, bars at the summary values, preempting settings
marked, one curve per arm, prefill windows shaded (constructed results, Agg backend, no engine)."""
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from labkit.present import plots  # noqa: E402
from labkit.store import Results  # noqa: E402

from test_interference import constructed  # noqa: E402


def results(arms=("b4", "b8"), preempting=("b8",), loads=("c1",)):
    gen = np.random.default_rng(0)
    requests, trials = [], []
    for scale, arm in enumerate(arms, start=1):
        for load in loads:
            for trial in range(3):
                for i in range(20):
                    gaps = list(5.0 * scale * gen.lognormal(0, 0.05, size=8))
                    requests.append({"arm": arm, "load": load, "trial": trial, "request": i, "ttft_ms": 50.0 * scale,
                                     "tpot_ms": float(np.mean(gaps)), "e2e_ms": 50.0 * scale + sum(gaps),
                                     "itl_ms": gaps, "prompt_tokens": 32, "output_tokens": 9})
                trials.append({"arm": arm, "load": load, "trial": trial, "output_tok_s": 100.0 * scale + trial,
                               "preemptions": 2 if arm in preempting else 0})
    frame = pd.DataFrame([{"arm": a, "status": "complete"} for a in arms])
    return Results("plots", None, {"arms": {a: {} for a in arms}}, frame, pd.DataFrame(requests),
                   pd.DataFrame(trials), {})


def test_arm_comparison_draws_each_metric_with_its_bars_at_the_summary_values():
    summary = pd.DataFrame([
        {"arm": "a", "metric": "output_tok_s", "value": 100.0, "ci_low": 90.0, "ci_high": 110.0},
        {"arm": "b", "metric": "output_tok_s", "value": 150.0, "ci_low": 140.0, "ci_high": 160.0},
        {"arm": "a", "metric": "ttft_p50_ms", "value": 20.0, "ci_low": 19.0, "ci_high": 21.0},
        {"arm": "b", "metric": "ttft_p50_ms", "value": 30.0, "ci_low": 28.0, "ci_high": 32.0}])
    fig = plots.arm_comparison(None, summary=summary)
    throughput, ttft = fig.axes
    assert [bar.get_height() for bar in throughput.patches] == [100.0, 150.0]
    assert [bar.get_height() for bar in ttft.patches] == [20.0, 30.0]
    assert "higher is better" in throughput.get_title() and "lower is better" in ttft.get_title()
    assert [t.get_text() for t in throughput.get_xticklabels()] == ["a", "b"]


def test_batch_triangle_marks_the_preempting_setting_and_draws_the_slo():
    fig = plots.batch_triangle(results(), {"b4": 4, "b8": 8}, slo=30.0)
    ax = fig.axes[0]
    colours = [to_hex(c.get_facecolor()[0] if len(c.get_facecolor()) else c.get_edgecolor()[0])
               for c in ax.collections]
    assert colours == [to_hex("tab:blue"), to_hex("tab:red")]
    assert [t.get_text() for t in ax.texts] == ["4", "8"]
    twin = results()
    for table in (twin.requests, twin.trials):  # b8 measured exactly as b4: the two points coincide
        table.update(table[table.arm == "b4"].assign(arm="b8").set_index(table.index[table.arm == "b8"]))
    same = plots.batch_triangle(twin, {"b4": 4, "b8": 8})
    assert [t.get_text() for t in same.axes[0].texts] == ["4 = 8"]  # one place, one label: no overlap
    assert ax.get_lines()[0].get_xdata()[0] == 30.0
    # the points sit at the arms' throughput: 100, 101, 102 tok/s for b4 -> 101 (mean of trials)
    assert ax.collections[0].get_offsets()[0][1] == pytest.approx(101.0)


def test_latency_cdf_has_one_curve_per_arm_reaching_one():
    fig = plots.latency_cdf(results(), "itl_ms")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["b4", "b8"]
    assert all(line.get_ydata()[-1] == pytest.approx(1.0) for line in lines)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_ylabel() == "fraction of tokens"


def test_metric_by_load_puts_the_loads_on_the_x_axis():
    fig = plots.metric_by_load(results(loads=("c1", "c8")), "output_tok_s")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c1", "c8"]
    assert ax.get_legend_handles_labels()[1] == ["b4", "b8"]


def test_tbt_timeline_shades_the_prefill_window_and_reds_the_gaps_inside():
    fig = plots.tbt_timeline(constructed(), "a")
    ax = fig.axes[0]
    assert len(ax.patches) == 1  # one long prompt in prefill
    colours = [to_hex(c) for c in ax.collections[0].get_facecolor()]
    assert colours.count(to_hex("tab:red")) == 2 * 5  # the gaps that ended inside the window


def test_tradeoff_labels_every_arm():
    table = pd.DataFrame({"arm": ["x", "y"], "gain": [1.0, 2.0], "cost": [3.0, 1.0]})
    ax = plots.tradeoff(table, "gain", "cost").axes[0]
    assert [t.get_text() for t in ax.texts] == ["x", "y"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("gain", "cost")


def test_by_load_draws_each_metric_against_the_quantity_with_its_floor_and_mark():
    table = pd.DataFrame({"prompt_tokens": [256, 1024], "ttft_p50_ms": [10.0, 30.0], "ttft_p50_ms_low": [9.0, 28.0],
                          "ttft_p50_ms_high": [11.0, 33.0]})
    fig = plots.by_load(table, "prompt_tokens", ["ttft_p50_ms"], floors={"ttft_p50_ms": pd.Series([2.0, 8.0])},
                        marks={"ttft_p50_ms": (512, "knee")})
    ax = fig.axes[0]
    assert ax.get_legend_handles_labels()[1] == ["hardware floor", "knee", "measured"]
    floor = next(line for line in ax.get_lines() if line.get_linestyle() == ":")
    assert list(floor.get_ydata()) == [2.0, 8.0] and ax.get_xlabel() == "prompt tokens"


def test_loads_are_categories_each_arm_a_point_with_its_interval_and_no_line_joining_them():
    ax = plots.metric_by_load(results(loads=("c1", "c8")), "tpot_p50_ms").axes[0]
    for container in ax.containers:  # one errorbar per arm
        assert container.lines[0].get_linestyle() == "None"
    offsets = [container.lines[0].get_xdata()[0] for container in ax.containers]
    assert offsets[0] < 0 < offsets[1]  # the arms of a load side by side around it, not on top of each other
    assert ax.get_ylabel() == "TPOT P50 (ms)" and "time per output token" in ax.get_title()
    assert ax.get_legend()._bbox_to_anchor is not None  # beside the axes, off the data


def test_axes_say_what_they_show_in_words_and_units():
    assert plots.label("ttft_p99_ms") == "P99 time to first token (ms)"
    assert plots.label("output_tok_s") == "output tokens per second"
    assert plots.label("long_ttft_p50_ms") == "long ttft p50 (ms)"
    assert plots.short_label("tbt_p99_ms") == "TBT P99 (ms)" and plots.short_label("request_s") == "completed requests/s"
    assert plots.wrap_label("default_attention_backend") == "default_\nattention_\nbackend"  # never inside a word


def test_the_waterfall_floats_each_change_from_the_current_launch_and_never_passes_below_zero():
    path = pd.DataFrame([
        {"step": "current launch (current)", "kind": "total", "value": 26.0},
        {"step": "no_enforce_eager", "kind": "change", "value": -21.2},
        {"step": "default_attention_backend", "kind": "change", "value": -9.4},
        {"step": "combining them", "kind": "change", "value": 9.6},
        {"step": "combined (combined)", "kind": "total", "value": 5.0}])
    ax = plots.waterfall(path, "tpot_p50_ms").axes[0]
    bars = ax.patches
    assert len(bars) == 4  # the interaction is said in the title, not drawn as a step of its own
    assert all(bar.get_y() >= 0 and bar.get_y() + bar.get_height() >= 0 for bar in bars)
    assert [round(b.get_y() + b.get_height(), 1) for b in bars[1:3]] == [4.8, 16.6]  # each alone, from 26
    assert "one at a time they add up to -30.6" in ax.get_title() and ax.get_ylabel() == "TPOT P50 (ms)"
    assert ax.get_ylim()[0] == 0
