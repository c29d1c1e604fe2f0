"""Plots: pure functions of stored results (never of live engines), returning matplotlib figures."""
from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use(matplotlib.get_backend())  # respect the notebook's inline backend; Agg when headless
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
import numpy as np
import pandas as pd
import seaborn as sns

from labkit.analyze.stats import METRICS, metric, summarize
from labkit.errors import BadParameter
from labkit.spec.numbers import POSITIVE, check_numbers

WIDTH_IN = 10.0  # a JupyterLab notebook's output width at matplotlib's 100 dpi: every figure uses all of it


def arm_comparison(results, metrics: list[str] | None = None, summary: pd.DataFrame | None = None):
    """One panel per metric: each arm's value with its 95 % confidence interval."""
    summary = summary if summary is not None else summarize(results, metrics)
    names = list(dict.fromkeys(summary.metric))
    fig, axes = plt.subplots(1, len(names), figsize=(WIDTH_IN, 3.6), squeeze=False)
    palette = sns.color_palette("colorblind", summary.arm.nunique())
    for ax, name in zip(axes[0], names):
        part = summary[summary.metric == name]
        x = np.arange(len(part))
        err = np.vstack([part.value - part.ci_low, part.ci_high - part.value])
        ax.bar(x, part.value, yerr=err, capsize=4, color=palette[:len(part)])
        ax.set_xticks(x, part.arm, rotation=30, ha="right")
        better = "lower is better" if METRICS[name].lower_is_better else "higher is better"
        ax.set_title(f"{name}\n({better})", fontsize=9)
    fig.tight_layout()
    return fig


def latency_cdf(results, column: str = "ttft_ms"):
    """Cumulative distribution of a per-request latency (or of every inter-token gap with 'itl_ms')."""
    latencies = [c for c in results.requests.columns if c.endswith("_ms")]
    if column not in latencies:
        raise BadParameter(f"no per-request latency {column!r}; the results hold {latencies}")
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    for arm in results.complete_arms:
        frame = results.requests[results.requests.arm == arm]
        values = (np.concatenate([np.asarray(v, float) for v in frame[column]]) if column == "itl_ms"
                  else frame[column].to_numpy(float))
        values = np.sort(values[~np.isnan(values)])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=arm)
    ax.set_xlabel(column.replace("_ms", " (ms)"))
    ax.set_ylabel("fraction of " + ("tokens" if column == "itl_ms" else "requests"))
    ax.set_xscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def metric_by_load(results, metric_name: str, loads: list[str] | None = None):
    """One line per arm across the loads (e.g. TPOT against concurrency): cliffs show as jumps."""
    loads = loads or results.loads
    rows = []
    for load in loads:
        part = summarize(results.select(load), [metric_name])
        rows.append(part.assign(load=load))
    frame = pd.concat(rows)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    for arm, part in frame.groupby("arm", sort=False):
        x = [loads.index(load) for load in part.load]
        ax.errorbar(x, part.value, yerr=[part.value - part.ci_low, part.ci_high - part.value], marker="o",
                    capsize=3, label=arm)
    ax.set_xticks(range(len(loads)), loads)
    ax.set_ylabel(metric_name)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def batch_triangle(results, arms: dict[str, int], x: str = "tbt_p99_ms", slo: float | None = None):
    """Throughput against tail latency, one point per batch setting; settings that preempted are red crosses.
    Points that land on each other share one label ("64 = 128 = default"), so labels never run together."""
    check_numbers("batch_triangle", {"slo": (slo, dict(POSITIVE, allow_none=True))})
    summary = summarize(results, ["output_tok_s", x]).pivot(index="arm", columns="metric", values="value")
    preempted = results.trials.groupby("arm").preemptions.sum()
    points = [(str(batch), summary.loc[arm, x], summary.loc[arm, "output_tok_s"], preempted.get(arm, 0) > 0)
              for arm, batch in arms.items() if arm in summary.index]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.6))
    for _, px, py, hot in points:
        ax.scatter(px, py, color="tab:red" if hot else "tab:blue", marker="x" if hot else "o")
    span_x = np.ptp([p[1] for p in points]) or 1.0
    span_y = np.ptp([p[2] for p in points]) or 1.0
    groups: list[list] = []  # points within 3 % of both axes' spans are one place on the plot
    for label, px, py, _ in points:
        near = next((g for g in groups if abs(g[1] - px) < 0.03 * span_x and abs(g[2] - py) < 0.03 * span_y), None)
        if near:
            near[0].append(label)
        else:
            groups.append([[label], px, py])
    for labels, px, py in groups:
        ax.annotate(" = ".join(labels), (px, py), fontsize=8, xytext=(5, 3), textcoords="offset points")
    handles = [Line2D([], [], marker="x", color="tab:red", linestyle="none", label="preempted requests")]
    if slo:
        handles.insert(0, ax.axvline(slo, color="gray", linestyle="--", label=f"SLO: {x} = {slo:g}"))
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_xlabel(f"{x}: {METRICS[x].meaning}")
    ax.set_ylabel("output tokens per second")
    ax.set_title("Batch triangle: throughput against tail latency, one point per max_num_seqs", fontsize=10)
    fig.tight_layout()
    return fig


def tbt_timeline(results, arm: str, trial: int = 0):
    """Every stream gap on the trial's clock, with the long prompts' prefill windows shaded."""
    from labkit.analyze.interference import prefill_windows, stream_gaps

    gaps = stream_gaps(results, arm)
    gaps = gaps[gaps.trial == trial]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.4))
    for w in prefill_windows(results, arm).query("trial == @trial").itertuples():
        ax.axvspan(w.start_s, w.end_s, color="tab:orange", alpha=0.25)
    ax.scatter(gaps.end_s, gaps.gap_ms, s=4, c=np.where(gaps.inside, "tab:red", "tab:blue"))
    ax.set_xlabel("trial time (s); shaded: a long prompt in prefill")
    ax.set_ylabel("stream TBT (ms)")
    ax.set_yscale("log")
    ax.set_title(arm, fontsize=9)
    fig.tight_layout()
    return fig


def tradeoff(table: pd.DataFrame, x: str, y: str):
    """One point per arm: what one side gains, the other pays."""
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    ax.scatter(table[x], table[y])
    for row in table.itertuples():
        ax.annotate(row.arm, (getattr(row, x), getattr(row, y)), fontsize=8, xytext=(4, 2), textcoords="offset points")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.tight_layout()
    return fig


def by_load(table: pd.DataFrame, x: str, metrics: list[str], labels: dict[str, str] | None = None,
            floors: dict[str, pd.Series] | None = None, marks: dict[str, tuple[float, str]] | None = None,
            logx: bool = False):
    """One panel per metric against the quantity `x` the loads differ in (from `stats.by_load`), with 95 %
    intervals; `floors` draws a physical floor under a metric, `marks` a vertical line (position, label)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(WIDTH_IN, 3.6), squeeze=False)
    for ax, name in zip(axes[0], metrics):
        ax.errorbar(table[x], table[name], yerr=[table[name] - table[f"{name}_low"], table[f"{name}_high"] - table[name]],
                    marker="o", capsize=3, label="measured")
        if floors and name in floors:
            ax.plot(table[x], floors[name], linestyle=":", color="gray", label="hardware floor")
        if marks and name in marks:
            ax.axvline(marks[name][0], color="gray", linestyle="--", label=marks[name][1])
        if (floors and name in floors) or (marks and name in marks):
            ax.legend(fontsize=8)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel((labels or {}).get(name, name))
    fig.tight_layout()
    return fig


def waterfall(path: pd.DataFrame, metric_name: str):
    """The diagnosis path as a waterfall: totals as full bars (the current and the recommended launch), each
    change as a floating bar from the running value, green where it lowers a lower-is-better metric."""
    lower_is_better = metric(metric_name).lower_is_better
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    running = 0.0
    for i, row in enumerate(path.itertuples()):
        if row.kind == "total":
            ax.bar(i, row.value, color="0.55")
            running = row.value
            label_y = row.value
        else:
            good = (row.value < 0) == lower_is_better
            ax.bar(i, row.value, bottom=running, color="tab:green" if good else "tab:red")
            running += row.value
            label_y = max(running, running - row.value)
        ax.annotate(f"{row.value:+.3g}" if row.kind != "total" else f"{row.value:.3g}", (i, label_y),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(path)), [textwrap.fill(s, 16) for s in path.step], fontsize=8)
    ax.set_ylabel(metric(metric_name).meaning)
    ax.set_title(f"From the current launch to the recommended one: {metric_name}")
    fig.tight_layout()
    return fig
