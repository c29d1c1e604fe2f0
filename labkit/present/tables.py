"""Tables for people: values with their 95 % intervals in one cell, arms in the experiment's order (never
sorted as text: "max_num_seqs=32" does not come before "max_num_seqs=4")."""
from __future__ import annotations

import pandas as pd

from labkit.analyze import noise, stats
from labkit.shown import cell, change as relative  # cell: the tables' value cell, read from here too


class Table:
    """A table for people: coloured HTML in a notebook, the same rows as plain text everywhere else (a stored
    notebook's text/plain, a terminal, a log), never a Styler's object repr. `.data` is the DataFrame."""

    def __init__(self, data: pd.DataFrame, styler):
        self.data, self.styler = data, styler

    def _repr_html_(self) -> str:
        return self.styler.to_html()

    def to_html(self) -> str:
        return self.styler.to_html()

    def __repr__(self) -> str:
        return self.data.to_string(index=False)


def with_intervals(summary: pd.DataFrame, arms: list[str]) -> pd.DataFrame:
    """stats.summarize's rows as one row per metric and one column per arm, in `arms` order."""
    cells = summary.assign(cell=[cell(v, lo, hi) for v, lo, hi in zip(summary.value, summary.ci_low, summary.ci_high)])
    table = cells.pivot(index="metric", columns="arm", values="cell")
    metrics = list(dict.fromkeys(summary.metric))
    return table.loc[metrics, [a for a in arms if a in table.columns]].rename_axis(columns=None)


def record_table(record: pd.DataFrame) -> pd.DataFrame:
    """stats.ab_record as one row per load and arm (in the record's order): per metric its value with the
    interval, and for each compared arm the change with its interval and the verdict, in one cell each; a
    caution column (GPU clocks, host load) only where the machine moved between the arms."""
    rows = []
    for (load, arm), part in record.groupby(["load", "arm"], sort=False):
        row = {"load": load, "arm": arm}
        for r in part.itertuples():
            row[r.metric] = cell(r.value, r.ci_low, r.ci_high)
            change = getattr(r, "change", float("nan"))
            row[f"{r.metric} change"] = ("reference" if pd.isna(change) else
                                         f"{relative(change, r.change_ci_low, r.change_ci_high)} {r.verdict}")
        notes = part["caution"].dropna().unique() if "caution" in part else []
        if len(notes):
            row["caution"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows).set_index(["load", "arm"])


ADVICE_COLOURS = {stats.BETTER: "background-color: #c8e6c9", stats.WORSE: "background-color: #ffcdd2",
                  stats.NO_DIFFERENCE: "color: #616161", stats.TOO_FEW: "color: #616161",
                  stats.TOO_NOISY: "background-color: #ffe0b2", "consider it": "background-color: #c8e6c9",
                  "choose by your SLO": "background-color: #fff9c4", noise.ADVICE: "background-color: #ffe0b2"}


def coloured(table: pd.DataFrame, column: str) -> Table:
    """The table with `column` coloured by verdict or advice, without the index."""
    return Table(table, table.style.map(lambda v: ADVICE_COLOURS.get(v, ""), subset=[column]).hide(axis="index"))


def plain(table: pd.DataFrame) -> Table:
    """The table without its index, as HTML and as plain text."""
    return Table(table, table.style.hide(axis="index"))


def conclusions(record: pd.DataFrame, baseline_arm: str):
    """The record's conclusions as a table: one row per load and compared arm, the metrics it wins and
    loses on against the baseline and the advice, coloured; a caution column only where the machine moved, and
    a "too noisy on" column only where the host's load explains a change."""
    table = stats.arm_outcomes(record, baseline_arm).drop(columns="sentence")
    for column in ("too noisy on", "caution"):
        if not table[column].any():
            table = table.drop(columns=column)
    return coloured(table, "advice")
