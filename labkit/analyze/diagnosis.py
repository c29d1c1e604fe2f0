"""A diagnosis read from its stored experiment: each one-change arm against the current launch on the target
metric (ranked, with its interval and verdict), and the path from the current launch to the combined one as
a waterfall: each change's own measured effect, then what combining them added or took back (gains do not
simply add up, and the waterfall shows by how much). The target metric decides, but not alone: a change it
cannot see still counts when it wins elsewhere and loses nowhere (a batch limit too small for the load
queues requests: TTFT and throughput show it, TPOT does not), and a launch that wins the target by losing
elsewhere is named as the trade it is."""
from __future__ import annotations

import pandas as pd

from labkit.analyze import stats
from labkit.shown import shows_whole


def side_effects(results, baseline: str, arm: str, target: str) -> tuple[list[str], list[str]]:
    """The headline metrics other than the target on which `arm` is better, and those on which it is worse,
    than `baseline`."""
    verdicts = {name: stats.compare(results, baseline, arm, name).verdict
                for name in stats.VERDICT_METRICS if name != target}
    return ([n for n, v in verdicts.items() if v == stats.BETTER], [n for n, v in verdicts.items() if v == stats.WORSE])


def helps(results, current: str, arm: str, target: str) -> bool:
    """Better than the current launch on the target; or no detectable difference there while better on
    another headline metric and worse on none."""
    verdict = stats.compare(results, current, arm, target).verdict
    if verdict == stats.TOO_NOISY:  # the host's load explains the change: no evidence either way
        return False
    if verdict != stats.NO_DIFFERENCE:
        return verdict == stats.BETTER
    better, worse = side_effects(results, current, arm, target)
    return bool(better) and not worse


def choose(results, singles: list[str], combined: str | None, target: str) -> tuple[str | None, list[str]]:
    """The launch to recommend among the measured helpful changes and their combination, and the trades left
    on the table. One launch beats another when it is better on the target and worse on nothing else; of
    those no other beats, the combination is preferred (every helpful change at once), else the best on the
    target. One that is better on the target than the one chosen, but worse elsewhere, is a trade: named,
    not chosen."""
    finalists = [*singles, *([combined] if combined else [])]
    if not finalists:
        return None, []
    m = stats.metric(target)

    def beats(a, b):
        return stats.compare(results, b, a, target).verdict == stats.BETTER and not side_effects(results, b, a, target)[1]

    unbeaten = [a for a in finalists if not any(beats(b, a) for b in finalists if b != a)]
    value = {arm: stats.point(stats.groups(results, arm, m), m) for arm in unbeaten}
    chosen = combined if combined in unbeaten else min(unbeaten, key=lambda a: value[a] if m.lower_is_better
                                                       else -value[a])
    trades = [f"{arm} alone has the better {target} and is worse on "
              f"{', '.join(side_effects(results, chosen, arm, target)[1])}: choose it by your SLO"
              for arm in unbeaten if arm != chosen and stats.compare(results, chosen, arm, target).verdict == stats.BETTER]
    return chosen, trades


@shows_whole
def ranked_changes(results, current: str, target: str, changes: dict[str, dict]) -> pd.DataFrame:
    """One row per measured change: what it changes and why it was tried, the target metric with its 95 %
    interval, the change against the current launch with its interval, the verdict, and the other headline
    metrics it is better or worse on; best first."""
    m = stats.metric(target)
    rows = []
    for arm, about in changes.items():
        if arm not in results.complete_arms or current not in results.complete_arms:
            rows.append({"arm": arm, **about, "verdict": "not measured"})
            continue
        c = stats.compare(results, current, arm, target)
        better, worse = side_effects(results, current, arm, target)
        rows.append({"arm": arm, **about, target: c.candidate, "change": c.rel_change, "ci_low": c.ci_low,
                     "ci_high": c.ci_high, "verdict": c.verdict, "also better on": ", ".join(better),
                     "also worse on": ", ".join(worse), "caution": c.caution})
    table = pd.DataFrame(rows)
    if "change" in table:
        gain = -table.change if m.lower_is_better else table.change
        table = table.assign(_gain=gain.fillna(-float("inf"))).sort_values("_gain", ascending=False).drop(columns="_gain")
    return table.reset_index(drop=True)


@shows_whole
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
