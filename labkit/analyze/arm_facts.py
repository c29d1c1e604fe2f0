"""One arm's recorded fact (a column of `results.arms`), as the analyses read it."""
from __future__ import annotations

import pandas as pd


def arm_fact(results, arm: str, column: str):
    """The arm's value of `column` in `results.arms`; None where the column, the arm or the value is missing."""
    arms = getattr(results, "arms", None)
    if arms is None or column not in arms:
        return None
    value = arms.loc[arms.arm == arm, column]
    if not len(value) or (not isinstance(value.iloc[0], (list, str)) and pd.isna(value.iloc[0])):
        return None
    return value.iloc[0]
