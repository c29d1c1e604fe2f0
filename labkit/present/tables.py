"""Tables for people: values with their 95 % intervals in one cell, arms in the experiment's order (never
sorted as text: "max_num_seqs=32" does not come before "max_num_seqs=4")."""
from __future__ import annotations

import pandas as pd


def cell(value: float, low: float, high: float) -> str:
    """'value [low, high]', four significant digits each."""
    return f"{value:.4g} [{low:.4g}, {high:.4g}]"


def with_intervals(summary: pd.DataFrame, arms: list[str]) -> pd.DataFrame:
    """stats.summarize's rows as one row per metric and one column per arm, in `arms` order."""
    cells = summary.assign(cell=[cell(v, lo, hi) for v, lo, hi in zip(summary.value, summary.ci_low, summary.ci_high)])
    table = cells.pivot(index="metric", columns="arm", values="cell")
    metrics = list(dict.fromkeys(summary.metric))
    return table.loc[metrics, [a for a in arms if a in table.columns]].rename_axis(columns=None)
