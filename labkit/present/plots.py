"""Plots: pure functions of stored results (never of live engines), returning matplotlib figures."""
from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use(matplotlib.get_backend())  # respect the notebook's inline backend; Agg when headless
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, ScalarFormatter
import numpy as np
import pandas as pd
import seaborn as sns

from labkit.analyze.stats import METRICS, metric, summarize
from labkit.errors import BadParameter
from labkit.shown import number, signed
from labkit.spec.numbers import POSITIVE, check_numbers

WIDTH_IN = 10.0  # a JupyterLab notebook's output width at matplotlib's 100 dpi: every figure uses all of it
UNITS = (("_ms", "ms"), ("_tok_s", "tokens/s"), ("request_s", "requests/s"), ("_pct", "%"))


def unit(name: str) -> str:
    """The unit a metric or column is measured in, read from its name ('' for a count)."""
    return next((u for suffix, u in UNITS if name.endswith(suffix)), "")


def label(name: str) -> str:
    """A metric in words with its unit, for an axis or a title: 'P99 time to first token (ms)'."""
    if name in METRICS:
        words = METRICS[name].meaning
    else:  # a column of the lab's own tables: its unit suffix becomes the unit in brackets
        suffix = next((sfx for sfx, _ in UNITS if name.endswith(sfx)), "")
        words = name[: len(name) - len(suffix)].replace("_", " ").strip()
    said = "per second" in words or words.endswith("%")  # the meaning already names its unit
    return f"{words} ({unit(name)})" if unit(name) and not said else words


def short_label(name: str) -> str:
    """A metric as an axis names it: 'TPOT P50 (ms)', 'output tokens/s'; the title says it in words."""
    m = METRICS.get(name)
    if m is None or m.level == "trial":
        return label(name) if m is None else m.meaning.replace(" per second", "/s")
    stat = f"P{m.percentile:g}" if m.percentile is not None else "mean"
    return f"{name.split('_')[0].upper()} {stat} ({unit(name)})"


def wrap_label(text: str, width: int = 16) -> str:
    """A tick label on lines of about `width`, broken at spaces or after underscores, never inside a word."""
    words = text.replace("_", "_\0").replace(" ", " \0").split("\0")
    lines, line = [], ""
    for word in words:
        if line and len(line) + len(word) > width:
            lines.append(line.rstrip())
            line = ""
        line += word
    return "\n".join([*lines, line.rstrip()])


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
        ax.set_title(f"{textwrap.fill(label(name), 34)}\n({better})", fontsize=9)
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
    """Each arm's value with its 95 % interval at every load, as points grouped by load (the loads are
    categories, not a scale: no line joins them); a cliff shows as one arm's point far from the others."""
    loads = loads or results.loads
    frame = pd.concat([summarize(results.select(load), [metric_name]).assign(load=load) for load in loads])
    arms = list(dict.fromkeys(frame.arm))
    palette = sns.color_palette("colorblind", len(arms))
    width = 0.7 / max(1, len(arms))
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    for i, arm in enumerate(arms):
        part = frame[frame.arm == arm]
        x = [loads.index(load) - 0.35 + width * (i + 0.5) for load in part.load]
        ax.errorbar(x, part.value, yerr=[part.value - part.ci_low, part.ci_high - part.value], marker="o",
                    linestyle="none", capsize=3, color=palette[i], label=arm)
    ax.set_xticks(range(len(loads)), loads)
    for edge in range(1, len(loads)):
        ax.axvline(edge - 0.5, color="0.9", linewidth=1, zorder=0)
    ax.set_xlabel("load")
    ax.set_ylabel(short_label(metric_name))
    better = "lower is better" if METRICS[metric_name].lower_is_better else "higher is better"
    ax.set_title(f"{label(metric_name)} by load, each arm with its 95 % interval ({better})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the points, never on them
    fig.tight_layout()
    return fig


def label_points(ax, points: list[tuple[str, float, float]], joiner: str = " = ", near: tuple[float, float] = (0.03, 0.03),
                 **style):
    """Name each (name, x, y) point beside it; points within `near` (shares of the axes' x and y spans, read
    once the data is drawn) are one place on the plot and share one label ("64 = 128 = default"), so labels
    never run together."""
    span_x = float(np.ptp(ax.get_xlim())) * near[0]
    span_y = float(np.ptp(ax.get_ylim())) * near[1]
    groups: list[list] = []
    for name, px, py in points:
        near_by = next((g for g in groups if abs(g[1] - px) < span_x and abs(g[2] - py) < span_y), None)
        if near_by:
            near_by[0].append(name)
        else:
            groups.append([[name], px, py])
    for labels, px, py in groups:
        ax.annotate(joiner.join(labels), (px, py), fontsize=8, xytext=(5, 3), textcoords="offset points", **style)


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
    label_points(ax, [(name, px, py) for name, px, py, _ in points])
    handles = [Line2D([], [], marker="x", color="tab:red", linestyle="none", label="preempted requests")]
    if slo:
        handles.insert(0, ax.axvline(slo, color="gray", linestyle="--", label=f"SLO: {x} = {slo:g}"))
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_xlabel(label(x))
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
    ax.set_ylabel("gap between a stream's tokens (ms)")
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
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(y))
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
        if (floors and name in floors) or (marks and name in marks):  # under the panel: never on the data
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
        if logx:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())  # 32, not 2^5
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel((labels or {}).get(name, short_label(name)))
    fig.tight_layout()
    return fig


def waterfall(path: pd.DataFrame, metric_name: str):
    """The diagnosis path (labkit.analyze.diagnosis.waterfall) on the target metric: the current launch and the
    recommended one as full bars; between them each change as measured alone, floating from the current
    launch's value to its own. The changes were measured one at a time from the same launch, so they are not
    stacked: their sum is not a launch anyone measured and can pass below zero. What combining them gave
    against that sum is said in the title."""
    lower_is_better = metric(metric_name).lower_is_better
    totals = path[path.kind == "total"]
    start = float(totals.value.iloc[0])
    shown = path[(path.kind == "total") | (path.step != "combining them")].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.2))
    for i, row in enumerate(shown.itertuples()):
        if row.kind == "total":
            ax.bar(i, row.value, color="0.55")
            top, text = row.value, number(float(row.value))
        else:
            good = (row.value < 0) == lower_is_better
            ax.bar(i, row.value, bottom=start, color="tab:green" if good else "tab:red", alpha=0.8)
            top, text = max(start, start + row.value), f"{signed(row.value)} alone"
        ax.annotate(text, (i, top), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.axhline(start, color="0.55", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(shown)), [wrap_label(s) for s in shown.step], fontsize=8)
    ax.set_ylabel(short_label(metric_name))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels above the tallest bar
    alone = path[(path.kind == "change") & (path.step != "combining them")].value.sum()
    title = f"From the current launch to the recommended one: {label(metric_name)}"
    combined = path[path.step.str.startswith("combined")]
    if len(combined):
        together = float(combined.value.iloc[0]) - start
        title += (f"\ntogether the changes moved it {signed(together)}; "
                  f"one at a time they add up to {signed(alone)}")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def pareto(points: pd.DataFrame):
    """The Pareto front (labkit.analyze.pareto.pareto_points): output tokens/s per GPU against output tokens/s
    per user, one point per arm and load with both 95 % intervals, labelled "arm · load" (the arm alone where
    there is one load, named in the title). The front's points
    are joined from the fastest per user to the most per GPU; dominated points are faded (another point is at
    least as fast per user and gives at least as much per GPU)."""
    from labkit.analyze.pareto import point_name

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.6))
    for is_dominated, style in ((True, dict(color="0.6", alpha=0.45)), (False, dict(color="tab:blue"))):
        part = points[points.dominated == is_dominated]
        ax.errorbar(part.output_tok_s_per_user, part.output_tok_s_per_gpu,
                    xerr=[part.output_tok_s_per_user - part.output_tok_s_per_user_low,
                          part.output_tok_s_per_user_high - part.output_tok_s_per_user],
                    yerr=[part.output_tok_s_per_gpu - part.output_tok_s_per_gpu_low,
                          part.output_tok_s_per_gpu_high - part.output_tok_s_per_gpu],
                    marker="o", linestyle="none", capsize=2, **style)
    front = points[~points.dominated].sort_values("output_tok_s_per_user")
    ax.plot(front.output_tok_s_per_user, front.output_tok_s_per_gpu, color="tab:blue", linewidth=1.2)
    ax.margins(x=0.2, y=0.08)  # room for the labels right of the points
    one_load = points.load.nunique() == 1  # then the load is said once, in the title
    for is_dominated, colour in ((True, "0.5"), (False, "black")):
        part = points[points.dominated == is_dominated]
        # a label runs right of its point: points level with each other and near along x share one
        label_points(ax, [(r.arm if one_load else point_name(r.arm, r.load), r.output_tok_s_per_user,
                           r.output_tok_s_per_gpu) for r in part.itertuples()], near=(0.15, 0.04), color=colour)
    handles = [Line2D([], [], color="tab:blue", marker="o", label="the Pareto front"),
               Line2D([], [], color="0.6", alpha=0.45, marker="o", linestyle="none",
                      label="dominated: another point is\nfaster per user and gives\nmore per GPU")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside, never on the data
    ax.set_xlabel("output tokens per second per user (1000 / median TPOT)")
    ax.set_ylabel("output tokens per second per GPU")
    each = f"one point per arm (load {points.load.iloc[0]})" if one_load else "one point per arm and load"
    ax.set_title(f"Throughput per GPU against speed per user, {each}, with 95 % intervals", fontsize=10)
    fig.tight_layout()
    return fig


def goodput_curve(goodput: pd.DataFrame, levels: dict[str, tuple[str, float]]):
    """Throughput and goodput (labkit.analyze.slo.goodput_by_load: output tokens/s of all requests, and of those
    that met every SLO) against the load each was measured at (`levels`: load -> (kind, level), e.g.
    labkit.analyze.load_search.probe_levels), one colour per arm with 95 % intervals. The loads of a search are
    numbers on one axis, so points are joined: where goodput leaves throughput, requests start to miss the SLO."""
    rows = goodput[goodput.load.isin(levels)].copy()
    if rows.empty:
        raise BadParameter("no load of this goodput table was probed by the search: pass the search's own levels")
    kinds = {levels[load][0] for load in rows.load}
    rows["level"] = [levels[load][1] for load in rows.load]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.2))
    for colour, (arm, part) in zip(sns.color_palette(n_colors=rows.arm.nunique()), rows.groupby("arm", sort=False)):
        part = part.sort_values("level")
        for name, style in (("output_tok_s", dict(linestyle="--", alpha=0.6)), ("goodput_output_tok_s", {})):
            low, high = part[f"{name}_low"], part[f"{name}_high"]
            ax.errorbar(part.level, part[name], yerr=[(part[name] - low).fillna(0), (high - part[name]).fillna(0)],
                        marker="o", capsize=2, color=colour,
                        label=f"{arm}: {'goodput' if name.startswith('goodput') else 'all requests'}", **style)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 8 clients, not 8.0
    ax.set_xlabel("concurrent clients" if kinds == {"clients"} else "requests per second (Poisson)"
                  if kinds == {"rate"} else "load level")
    ax.set_ylabel("output tokens per second")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside, never on the data
    ax.set_title("Output tokens/s of every request (dashed) and of those within every SLO (goodput), "
                 "per probed load, with 95 % intervals", fontsize=10)
    fig.tight_layout()
    return fig
