"""The results explorer (ipywidgets; no engine needed): pick stored results (this checkout's, or the committed
baselines of any hardware), an experiment, arms, a load and a metric, and read the values with their 95 %
intervals and verdicts against a reference arm beside a plot, or (view "Pareto front") every chosen arm and load as
a point of tok/s per user against tok/s per GPU. A batch-triangle result gets an SLO slider that
recomputes the answer, the goodput and the binding constraint from the stored requests; a chunked-prefill
result a timeline whose window can be moved; a second set of results (another hardware) can be set beside.

`Explorer` keeps what it last showed (`table`, `figure`, `answer`), so a test can move a widget and read what
changed; `lk.explore()` builds one and returns it (a notebook shows it as its widget).
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from labkit import settings
from labkit.analyze import pareto, slo, stats
from labkit.errors import BadParameter, LabkitError
from labkit.suite.runs import experiments_under
from labkit.present import plots
from labkit.present.tables import cell, coloured, plain
from labkit.shown import change as relative, whole
from labkit.store import Results, load

NONE = "(none)"
BY_METRIC, FRONT = "by metric", "Pareto front"
def result_roots() -> dict[str, Path]:
    """Folders of stored results by label: this checkout's, then every committed baseline's (by hardware)."""
    current = settings.current()
    found = {"this checkout": current.results_dir}
    for folder in sorted(current.baselines_dir.glob("**/results")):
        found[root_label(folder.parent.relative_to(current.baselines_dir))] = folder
    return {label: folder for label, folder in found.items() if any(folder.glob("*/experiment.json"))}




def only_arms(results: Results, arms: list[str]) -> Results:
    """The same results restricted to some arms (every statistic bootstraps each arm: fewer arms, less work)."""
    keep = results.arms.arm.isin(arms)
    return Results(results.name, results.path, results.spec, results.arms[keep],
                   results.requests[results.requests.arm.isin(arms)], results.trials[results.trials.arm.isin(arms)],
                   {a: e for a, e in results.environment.items() if a in arms})


def values_table(results: Results, metric_name: str, reference: str) -> pd.DataFrame:
    """Per arm in the experiment's order: "value [low, high]" with the 95 % interval, the change against the
    reference arm with its interval, the verdict, and a caution column where the machine moved (GPU clocks,
    host load)."""
    record = stats.ab_record(results, reference, [metric_name])
    order = [a for a in results.arms.arm if a in set(record.arm)]
    rows = []
    for arm in order:
        r = record[record.arm == arm].iloc[0]
        row = {"arm": arm, metric_name: cell(r.value, r.ci_low, r.ci_high)}
        if arm != reference and pd.notna(r.get("change")):
            row.update(change=relative(r.change, r.change_ci_low, r.change_ci_high), verdict=r.verdict,
                       caution=r.get("caution") if isinstance(r.get("caution"), str) else "")
        else:
            row.update(change="reference", verdict="", caution="")
        rows.append(row)
    table = pd.DataFrame(rows, columns=["arm", metric_name, "change", "verdict", "caution"])
    return table if table.caution.astype(bool).any() else table.drop(columns="caution")


def styled(table: pd.DataFrame):
    """The values table with its verdicts coloured (pandas Styler), without the index."""
    return coloured(table, "verdict")


def triangle_arms(results: Results) -> dict[str, int]:
    """A batch triangle's arms (max_num_seqs=N) and their batch sizes; empty for any other experiment."""
    return {arm: int(m.group(1)) for arm in results.complete_arms if (m := re.fullmatch(r"max_num_seqs=(\d+)", arm))}


def slo_answer(results: Results, metric_name: str, limit: float, summary: pd.DataFrame | None = None) -> dict:
    """From stored points, with the rule of the notebook's search (labkit.analyze.slo.from_points): the largest
    batch whose interval of the metric stays within the limit, with every smaller one, backed off one notch;
    the constraint that binds above it; and every arm's goodput. Nothing is measured again (`summary`, the
    metric's stats.summarize, is reused when given: moving the limit then costs no bootstrap)."""
    slo.check_slo_limits({metric_name: limit})
    batches = triangle_arms(results)
    summary = (summary if summary is not None else stats.summarize(results, [metric_name])).set_index("arm")
    found = slo.from_points({b: {metric_name: tuple(summary.loc[arm, ["value", "ci_low", "ci_high"]])}
                             for arm, b in batches.items()}, {metric_name: limit})
    goodput = slo.goodput_by_load(results, {metric_name: limit})
    return {"answer": found.answer, "largest_meeting": found.largest_meeting, "binding": found.binding_constraint,
            "goodput_request_s": goodput.set_index("arm").goodput_request_s.round(2).to_dict(),
            "goodput": goodput_table(goodput, found.answer),
            "sentence": f"{stats.metric(metric_name).meaning} <= {limit:.3g} ms: " + found.sentence()}


GOODPUT_COLUMNS = {"request_s": "requests/s", "goodput_request_s": "goodput (requests/s)",
                   "goodput_output_tok_s": "goodput (output tokens/s)", "good_pct": "share good (%)"}


def goodput_table(goodput: pd.DataFrame, answer: int | None) -> pd.DataFrame:
    """Per arm (and load, where there are several): requests/s, the requests/s and output tokens/s that met
    the SLO (goodput) and the share of requests that met it, each "value [low, high]" with its 95 % interval
    over trials (slo.goodput_by_load); the recommended arm marked."""
    keys = ["load", "arm"] if goodput.load.nunique() > 1 else ["arm"]
    table = goodput[keys].copy()
    for name, shown in GOODPUT_COLUMNS.items():
        table[shown] = [cell(v, lo, hi) for v, lo, hi in zip(goodput[name], goodput[f"{name}_low"], goodput[f"{name}_high"])]
    table["recommended"] = ["yes" if answer is not None and arm == f"max_num_seqs={answer}" else "" for arm in table.arm]
    return whole(table.reset_index(drop=True))


def front_table(points: pd.DataFrame) -> pd.DataFrame:
    """The Pareto points as read: arm, load, GPUs, tok/s per user and per GPU each "value [low, high]" (95 %), and
    whether the point is on the front or which point beats it on both."""
    table = points[["arm", "load", "gpus"]].copy()
    for axis in ("user", "gpu"):
        name = f"output_tok_s_per_{axis}"
        table[f"output tok/s per {axis.upper() if axis == 'gpu' else axis}"] = [
            cell(v, lo, hi) for v, lo, hi in zip(points[name], points[f"{name}_low"], points[f"{name}_high"])]
    table["front"] = ["on the front" if not d else f"beaten by {by}" if by else "dominated"
                      for d, by in zip(points.dominated, points.dominated_by)]
    return whole(table.reset_index(drop=True))


def root_label(relative: Path) -> str:
    """A results folder under the baselines as its hardware and date: 'h200 · suite run 2026-11-29 22:55 UTC'."""
    parts = []
    for part in relative.parts:
        stamp = re.fullmatch(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})\d*Z(?:-.*)?", part)
        parts.append(f"run {stamp[1]}-{stamp[2]}-{stamp[3]} {stamp[4]}:{stamp[5]} UTC" if stamp else part)
    return " · ".join(parts)


class Explorer:
    """The widgets and what they last showed."""

    def __init__(self, roots: dict[str, Path] | None = None, experiment: str | None = None):
        import ipywidgets as w

        self.roots = roots if roots is not None else result_roots()
        if not self.roots:
            raise BadParameter("no stored results to explore: run an experiment (its results go under data/results/) "
                               "or pass roots={'label': folder}")
        holding = [label for label, folder in self.roots.items()
                   if experiment is None or experiment in experiments_under(folder)]
        if not holding:  # a named experiment opens the first results that hold it
            raise BadParameter(f"no stored experiment {experiment!r} in {list(self.roots)}; stored there: "
                               f"{sorted({e for f in self.roots.values() for e in experiments_under(f)})}")
        self.table = self.figure = self.answer = self.message = self._widget = None
        self.busy = False  # True while a pick is computed (its "working" line is on screen)
        self._quiet, self._timeline, self._slo_unset, self._slo_metric = False, False, False, None
        self._shown: dict[tuple, tuple] = {}  # what a selection showed: moving the SLO or window reuses it
        self.root = w.Dropdown(options=list(self.roots), value=holding[0], description="results")
        self.beside = w.Dropdown(options=[NONE, *self.roots], description="beside")
        self.experiment = w.Dropdown(description="experiment")
        self.arms = w.SelectMultiple(description="arms", rows=6)
        self.load = w.Dropdown(description="load")
        self.metric = w.Dropdown(options=sorted(stats.METRICS), value="tpot_p50_ms", description="metric")
        self.view = w.Dropdown(options=[BY_METRIC, FRONT], value=BY_METRIC, description="view")
        self.slo = w.FloatSlider(description="SLO (ms)", min=0.0, max=1.0, step=0.1, continuous_update=False,
                                 style={"description_width": "initial"}, layout=w.Layout(width="32em"))
        self.window = w.FloatRangeSlider(description="window (s)", min=0.0, max=1.0, step=0.05,
                                         continuous_update=False)
        self.out = w.Output()
        self.root.observe(lambda _: self._pick_root(), "value")
        self.experiment.observe(lambda _: self._pick_experiment(), "value")
        for control in (self.arms, self.load, self.metric, self.view, self.beside, self.slo, self.window):
            control.observe(lambda _: self.refresh(), "value")
        self._pick_root(experiment)

    def widget(self):
        import ipywidgets as w
        if self._widget is None:
            self._widget = w.VBox([w.HBox([self.root, self.beside, self.view]),
                                   w.HBox([self.experiment, self.load, self.metric]),
                                   w.HBox([self.arms, w.VBox([self.slo, self.window])]), self.out])
        return self._widget

    def _ipython_display_(self):
        """A notebook shows the explorer as its widget."""
        from IPython.display import display
        display(self.widget())

    def results(self, label: str | None = None) -> Results:
        return load(self.experiment.value, self.roots[label or self.root.value])

    def _pick_root(self, experiment: str | None = None):
        names = experiments_under(self.roots[self.root.value])
        self._quiet = True
        self.experiment.options = names
        self._quiet = False
        if not names:
            self._say(f"no stored experiment in {self.roots[self.root.value]}: pick other results")
            return
        self.experiment.value = experiment if experiment in names else names[0]
        self._pick_experiment()

    def _pick_experiment(self):
        try:
            results = self.results()
        except LabkitError as exc:  # one damaged experiment among many: say so, the others stay a pick away
            self._quiet, self.arms.options, self._quiet = True, (), False
            self._say(f"{self.experiment.value} cannot be read: {exc}")
            return
        if not results.complete_arms:
            self._quiet, self.arms.options, self._quiet = True, (), False
            self._say(f"{self.experiment.value}: no complete arm to show", results.facts("cause"))
            return
        self._quiet = True
        self.arms.options = results.complete_arms
        self.arms.value = tuple(results.complete_arms)
        self.load.options = results.loads or ["(all)"]
        self.load.value = self.load.options[0]
        is_triangle = bool(triangle_arms(results))
        self.slo.layout.display = None if is_triangle else "none"
        if is_triangle:
            self.metric.value = "tbt_p99_ms"
            self._slo_unset = True  # the slider's range comes from the first summary (refresh)
        parts = set(results.requests.get("part", pd.Series(dtype=str)).dropna())
        self._timeline = {"streams", "long"} <= parts  # streams with long prompts injected: chunked prefill
        self.window.layout.display = None if self._timeline else "none"
        if self._timeline:
            self.window.max = float(results.trials.duration_s.max())
            self.window.value = (0.0, self.window.max)
        self._quiet = False
        self.refresh()

    def refresh(self):
        if self._quiet or not self.arms.value:
            return
        results = only_arms(self.results(), list(self.arms.value))
        if self.load.value in results.loads:
            part = results.select(self.load.value)
        else:
            part = results
        order = [a for a in results.complete_arms if a in self.arms.value]
        reference = results.reference_arm if results.reference_arm in order else order[0]
        if self.view.value == FRONT:
            self._show_front(results, order)
            return
        key = (self.root.value, self.beside.value, self.experiment.value, self.load.value, tuple(order),
               self.metric.value)
        if key not in self._shown:
            # seconds of bootstrap on a large store: the previous pick must not stay on screen meanwhile
            self._say(f"working: {self.metric.value} of {len(order)} arm(s) of {self.experiment.value}"
                      f"{f', load {self.load.value}' if self.load.value in results.loads else ''} ...")
            self.busy = True
            summary = stats.summarize(part, [self.metric.value])
            table = values_table(part, self.metric.value, reference).assign(results=self.root.value)
            if self.beside.value != NONE and self.experiment.value in experiments_under(self.roots[self.beside.value]):
                try:
                    other = self.results(self.beside.value)
                except LabkitError as exc:  # the comparison side cannot be read: named in the table, not a crash
                    other, table = None, pd.concat([table, pd.DataFrame([{"arm": "", "verdict": f"cannot be read: {exc}",
                                                                          "results": self.beside.value}])])
                arms = [a for a in order if a in other.complete_arms] if other is not None else []
                if arms:
                    other = only_arms(other, arms)
                    other = other.select(self.load.value) if self.load.value in other.loads else other
                    same = reference if reference in arms else arms[0]
                    table = pd.concat([table, values_table(other, self.metric.value, same).assign(results=self.beside.value)])
            figure = (plots.tbt_timeline(results, reference) if self._timeline
                      else plots.arm_comparison(part, [self.metric.value], summary))
            plt.close(figure)  # shown through the Output widget, not by the inline backend a second time
            self._shown[key] = (table.reset_index(drop=True), summary, figure)
            self.busy = False
        self.table, summary, self.figure = self._shown[key]
        if self._timeline:
            self.figure.axes[0].set_xlim(*self.window.value)
        latency = stats.metric(self.metric.value).lower_is_better and self.metric.value.endswith("_ms")
        if triangle_arms(part) and latency:  # an SLO is an upper limit on a latency
            if self._slo_unset or self._slo_metric != self.metric.value:  # the slider spans the metric's range
                self._quiet, self._slo_unset, self._slo_metric = True, False, self.metric.value
                self.slo.description = f"SLO: {stats.metric(self.metric.value).meaning} <= (ms)"
                self.slo.max = float(2 * summary.ci_high.max())
                self.slo.step = self.slo.max / 200
                self.slo.value = float(summary.value.median())
                self._quiet = False
            self.slo.layout.display = None
            self.answer = slo_answer(part, self.metric.value, self.slo.value, summary)
        else:
            self.slo.layout.display = "none"
            self.answer = None
        self._show()

    def _show_front(self, results: Results, order: list[str]):
        """The chosen arms at every load as Pareto points (labkit.analyze.pareto), their table and plot."""
        key = (FRONT, self.root.value, self.experiment.value, tuple(order))
        if key not in self._shown:
            self._say(f"working: the Pareto front of {len(order)} arm(s) of {self.experiment.value} ...")
            self.busy = True
            points = pareto.pareto_points(results)
            figure = plots.pareto(points)
            plt.close(figure)
            self._shown[key] = (front_table(points), None, figure)
            self.busy = False
        self.table, _, self.figure = self._shown[key]
        self.slo.layout.display = "none"  # the front is every load's: no SLO or window applies to it
        self.answer = None
        self._show()

    def _say(self, sentence: str, table: pd.DataFrame | None = None):
        """Replace what was shown with a sentence (and a table): nothing of the previous pick stays on screen."""
        self.table, self.message = table, sentence
        self.figure = self.answer = None
        self._replace_output(sentence, *([] if table is None else [table]))

    def _show(self):
        self.message = None
        self._replace_output(*([self.answer["sentence"]] if self.answer else []), styled(self.table),
                             *([plain(self.answer["goodput"])] if self.answer else []), self.figure)

    def _replace_output(self, *items):
        """The output area's whole content at once: a string as printed text, anything else (but None) as displayed. Set as
        the widget's outputs rather than captured (`with out:`): capturing makes a notebook runner that mimics
        the front end (nbclient, under papermill) answer on the kernel's shell socket while it waits there for
        the cell's reply, and a busy machine then missed that reply until the cell's time limit (seen: 3 of 14
        runs of explore.ipynb held 30 s, the limit there)."""
        self.out.outputs = tuple({"output_type": "stream", "name": "stdout", "text": item + "\n"}
                                 if isinstance(item, str) else _display_data(item) for item in items if item is not None)


def _display_data(obj) -> dict:
    """`obj` as a display_data output, formatted as the notebook's kernel formats what it displays (its
    figures as images); outside a kernel, by IPython's plain formatter."""
    from IPython import get_ipython
    from IPython.core.formatters import DisplayFormatter

    shell = get_ipython()
    data, metadata = (shell.display_formatter if shell else DisplayFormatter()).format(obj)
    return {"output_type": "display_data", "data": data, "metadata": metadata}


def explore(experiment: str | None = None, roots: dict[str, Path] | None = None) -> Explorer:
    """The explorer, opened on `experiment` where it is stored: a notebook shows it as its widget, and what it
    shows (table, answer, figure) can be read from it."""
    return Explorer(roots, experiment)
