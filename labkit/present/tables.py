"""Tables for people: values with their 95 % intervals in one cell, arms in the experiment's order (never
sorted as text: "max_num_seqs=32" does not come before "max_num_seqs=4")."""
from __future__ import annotations

import pandas as pd

from labkit.analyze import drift, noise, stats
from labkit.shown import Whole, cell, change as relative, whole, with_detail  # cell: the tables' value cell, read from here too


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


def reference_arm(record: pd.DataFrame) -> str | None:
    """The arm a record compares against: the one ab_record names, else the first arm with no verdict."""
    if record.attrs.get("reference"):
        return record.attrs["reference"]
    judged = set(record.dropna(subset=["verdict"]).arm) if "verdict" in record else set()
    return next((a for a in dict.fromkeys(record.arm) if a not in judged), None)


def _judged(r) -> bool:
    return isinstance(getattr(r, "verdict", None), str)


def _notes(part: pd.DataFrame) -> str:
    return stats.joined_cautions(part["caution"]) if "caution" in part else ""


def record_table(record: pd.DataFrame, metrics: list[str] | None = None) -> Whole:
    """stats.ab_record at a glance: one row per load and compared arm (in the record's order), for each metric
    (`metrics`, default: all the record holds) the change against the reference arm in percent with its 95 %
    interval and the verdict, in one cell; a caution column (GPU clocks, host load) only where the machine
    moved between the arms. Behind it (collapsed in HTML, after it as text), `record_detail`: every load, arm
    and metric with its value. A record with nothing compared shows its values instead."""
    keys = [k for k in ("load", "arm") if k in record]
    names = list(metrics) if metrics else list(dict.fromkeys(record.metric))
    reference = reference_arm(record)
    detail = record_detail(record)
    rows = []
    for key, part in record.groupby(keys, sort=False):
        judged = [r for r in part.itertuples() if _judged(r) and r.metric in names]
        if not judged:  # the reference arm, or an arm of a load without it: its values are in the detail
            continue
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for r in judged:
            row[f"{r.metric} vs {reference}"] = f"{relative(r.change, r.change_ci_low, r.change_ci_high)} {r.verdict}"
        if notes := _notes(part):
            row["caution"] = notes
        rows.append(row)
    if not rows:  # nothing compared: the values are the headline
        return with_detail(_values(record, names, keys), None, "",
                           f"Values with their 95 % intervals; nothing was compared with {reference}.")
    headline = pd.DataFrame(rows)
    if "caution" in headline:
        headline["caution"] = headline["caution"].fillna("")
    headline = headline.set_index(keys).fillna("not compared")
    caption = (f"Change against {reference} in % with its 95 % interval, and the verdict, per "
               f"{' and '.join(keys)}; every value is in the detail below.")
    return with_detail(headline, detail, f"Every value, change and verdict ({len(detail)} rows: one per "
                       f"{', '.join(keys)} and metric)", caption)


def record_detail(record: pd.DataFrame) -> Whole:
    """stats.ab_record in full for people: one row per load, arm and metric (in the record's order), the
    value with its 95 % interval, the change against the reference with its interval, the verdict, and a
    caution column only where the machine moved; the reference arm's rows say so, with no empty cells."""
    reference = reference_arm(record)
    keys = [k for k in ("load", "arm", "metric") if k in record]
    rows = []
    for r in record.itertuples():
        row = {k: getattr(r, k) for k in keys}
        row["value [95 % interval]"] = cell(r.value, r.ci_low, r.ci_high)
        judged = _judged(r)
        row[f"change vs {reference} [95 % interval]"] = (relative(r.change, r.change_ci_low, r.change_ci_high)
                                                          if judged else "reference" if r.arm == reference else "")
        row["verdict"] = r.verdict if judged else ""
        if "caution" in record and isinstance(getattr(r, "caution", None), str):
            row["caution"] = r.caution
        rows.append(row)
    table = pd.DataFrame(rows)
    if "caution" in table:
        table["caution"] = table["caution"].fillna("")
    return whole(table.set_index(keys))


def _values(record: pd.DataFrame, names: list[str], keys: list[str]) -> pd.DataFrame:
    """One row per load and arm: each metric's value with its 95 % interval."""
    rows = []
    for key, part in record.groupby(keys, sort=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row.update({r.metric: cell(r.value, r.ci_low, r.ci_high) for r in part.itertuples() if r.metric in names})
        rows.append(row)
    return pd.DataFrame(rows).set_index(keys).fillna("n/a")


ADVICE_COLOURS = {stats.BETTER: "background-color: #c8e6c9", stats.WORSE: "background-color: #ffcdd2",
                  stats.NO_DIFFERENCE: "color: #616161", stats.TOO_FEW: "color: #616161",
                  stats.TOO_NOISY: "background-color: #ffe0b2", "consider it": "background-color: #c8e6c9",
                  "choose by your SLO": "background-color: #fff9c4", noise.ADVICE: "background-color: #ffe0b2",
                  drift.ADVICE: "background-color: #ffe0b2", drift.DRIFT_ADVICE: "color: #616161"}


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
