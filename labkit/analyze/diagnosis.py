"""A diagnosis read from its stored experiment: each one-change arm against the current launch on the target
metric (ranked, with its interval and verdict), and the path from the current launch to the combined one as
a waterfall: each change's own measured effect, then what combining them added or took back (gains do not
simply add up, and the waterfall shows by how much)."""
from __future__ import annotations

import pandas as pd

from labkit.analyze import stats


def ranked_changes(results, current: str, target: str, changes: dict[str, dict]) -> pd.DataFrame:
    """One row per measured change: what it changes and why it was tried, the target metric with its 95 %
    interval, the change against the current launch with its interval, and the verdict; best first."""
    m = stats.metric(target)
    rows = []
    for arm, about in changes.items():
        if arm not in results.complete_arms or current not in results.complete_arms:
            rows.append({"arm": arm, **about, "verdict": "not measured"})
            continue
        c = stats.compare(results, current, arm, target)
        rows.append({"arm": arm, **about, target: c.candidate, "change": c.rel_change, "ci_low": c.ci_low,
                     "ci_high": c.ci_high, "verdict": c.verdict})
    table = pd.DataFrame(rows)
    if "change" in table:
        gain = -table.change if m.lower_is_better else table.change
        table = table.assign(_gain=gain.fillna(-float("inf"))).sort_values("_gain", ascending=False).drop(columns="_gain")
    return table.reset_index(drop=True)


def waterfall(results, current: str, helped: list[str], combined: str | None, target: str,
              recommended: str | None = None) -> pd.DataFrame:
    """The steps from the current launch on the target metric: the current value, each helpful change's own
    effect (measured alone), the interaction (the measured combination minus the sum of the alone-effects)
    and the combination's value; then the recommended launch (default: the combination, else the best
    single change) when it is another one, e.g. a single change that beat the combination."""
    m = stats.metric(target)
    arms = [a for a in dict.fromkeys([current, *helped, combined, recommended]) if a in results.complete_arms]
    value = {arm: stats.point(stats.groups(results, arm, m), m) for arm in arms}
    rows = [{"step": f"current launch ({current})", "kind": "total", "value": value[current]}]
    rows += [{"step": arm, "kind": "change", "value": value[arm] - value[current]} for arm in helped if arm in value]
    if combined in value:
        alone = sum(value[arm] - value[current] for arm in helped if arm in value)
        rows.append({"step": "combining them", "kind": "change", "value": value[combined] - value[current] - alone})
        rows.append({"step": f"combined ({combined})", "kind": "total", "value": value[combined]})
    singles = [arm for arm in helped if arm in value]
    recommended = recommended or (combined if combined in value else
                                  min(singles, key=lambda a: value[a] if m.lower_is_better else -value[a])
                                  if singles else None)
    if recommended in value and recommended != combined:
        rows.append({"step": f"recommended ({recommended})", "kind": "total", "value": value[recommended]})
    return pd.DataFrame(rows)
