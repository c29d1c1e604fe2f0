"""The largest load that meets every SLO on one engine: a bracketing search over a ladder of loads (closed-loop
clients or a Poisson rate, labkit.spec.load_search.LoadSearch), pure, so the arm's worker can run it between
trials on the engine it has and a unit test can run it on a fake.

The search grows the load (doubling it, from the smallest rung) until a probe breaks an SLO, then bisects between
the last rung that met every SLO and the first that did not. A probe meets the SLOs under the lab's one rule
(labkit.analyze.slo.violations: each metric's 95 % interval lies within its limit); a rate probe whose queue
kept growing (the engine cannot keep up: `saturated`) is ended early and counts as a violation of every SLO. The
answer backs off one notch from the largest meeting rung (labkit.analyze.slo.backed_off). A range that cannot
bracket the edge says so, with no answer: broken already at its smallest load, or never broken at its largest.

Every rung probed is kept in evaluation order with its measurement, so the search can be shown as a table and
stored as an arm's fact (`load_search`), and read back (`search_table`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from labkit.analyze import stats
from labkit.analyze.slo import Measurement, backed_off, violations
from labkit.errors import BadParameter
from labkit.shown import cell, number, shows_whole

SATURATED = "saturated"  # the pseudo-constraint a saturated probe violates: the queue never drained


@dataclass
class Probe:
    """One load tried: its rung on the ladder, the load, each SLO metric's (value, ci_low, ci_high), whether the
    engine could not keep up (the probe was ended early), and what it cost."""

    index: int  # the rung on the ladder
    level: float
    measurement: Measurement
    saturated: bool = False
    trials: int = 0
    requests: int = 0
    load: str = ""  # the stored load its rows are under

    def violations(self, slos: dict[str, float]) -> list[str]:
        """The SLOs this probe does not clearly meet; a saturated probe violates them all, as `saturated`."""
        return [SATURATED] if self.saturated else violations(self.measurement, slos)


@dataclass
class LoadSearchResult:
    """The outcome of a load search: the recommended load (one notch below the largest meeting one), the largest
    meeting load, the constraint that breaks above it, every probe in the order taken, and a note where the range
    could not bracket the edge."""

    kind: str  # "clients" or "rate"
    slos: dict[str, float]
    answer: float | None
    largest_meeting: float | None
    binding_constraint: str | None
    probes: list[Probe] = field(default_factory=list)
    note: str = ""
    bracketed: bool = True

    @property
    def probes_used(self) -> int:
        """How many loads were measured."""
        return len(self.probes)

    def sentence(self) -> str:
        """One line: the recommended load (or why there is none), the binding constraint and the probes."""
        unit = "clients" if self.kind == "clients" else "requests/s"
        probes = f"{self.probes_used} probe{'s' * (self.probes_used != 1)} on one engine"
        if self.answer is None:
            return f"no {self.kind} answer: {self.note}; {probes}"
        return (f"{self.kind}={_level_text(self.answer)} {unit} (largest meeting every SLO: "
                f"{_level_text(self.largest_meeting)}, backed off one notch); binding constraint: "
                f"{self.binding_constraint}; {probes}")

    def table(self) -> pd.DataFrame:
        """One row per probe in the order taken: the load, each SLO metric's value [95 % interval], whether it
        met them (and which it broke), whether it saturated, and the trials and requests it took."""
        rows = []
        for number, probe in enumerate(self.probes, 1):
            row = {"probe": number, self.kind: probe.level}
            for name, limit in self.slos.items():
                value, low, high = probe.measurement.get(name, (math.nan,) * 3)
                row[f"{name} (limit {_level_text(limit)})"] = cell(value, low, high)
            broken = probe.violations(self.slos)
            row.update(meets="yes" if not broken else "no", violations=", ".join(broken),
                       saturated="yes" if probe.saturated else "no", trials=probe.trials, requests=probe.requests,
                       load=probe.load,
                       recommended="yes" if self.answer is not None and probe.level == self.answer else "")
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """The result as plain data (what the arm's `load_search` fact stores); `from_dict` reads it."""
        out = asdict(self)
        out["probes_used"] = self.probes_used
        for probe in out["probes"]:
            probe["measurement"] = {k: [_plain(x) for x in v] for k, v in probe["measurement"].items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "LoadSearchResult":
        """The result a `to_dict` describes."""
        data = {k: v for k, v in data.items() if k != "probes_used"}
        probes = [Probe(**{**p, "measurement": {k: tuple(math.nan if x is None else x for x in v)
                                                for k, v in p["measurement"].items()}}) for p in data.pop("probes")]
        return cls(probes=probes, **data)


def _plain(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _level_text(level) -> str:
    return number(float(level)) if isinstance(level, float) else str(level)


# ---- the search -----------------------------------------------------------------------------------------
def growth(levels: list, index: int) -> int:
    """The rung the search tries after rung `index` met every SLO: the first at twice its load or more, else the
    last rung."""
    return next((j for j in range(index + 1, len(levels)) if levels[j] >= 2 * levels[index]), len(levels) - 1)


def next_probe(levels: list, meets: dict[int, bool]) -> int | None:
    """The rung to measure next, given the rungs measured so far (rung -> met every SLO), or None when the search
    is done. Grow from the smallest rung, doubling the load, until a rung breaks; then bisect between the largest
    meeting rung and the smallest breaking one until they are neighbours. Every meeting rung it takes lies below
    every breaking one, so the state is the two of them alone."""
    if 0 not in meets:
        return 0
    good = max((i for i, ok in meets.items() if ok), default=-1)
    bad = min((i for i, ok in meets.items() if not ok), default=None)
    if good < 0:
        return None  # broken at the smallest load
    if bad is None:
        return None if good == len(levels) - 1 else growth(levels, good)
    return (good + bad) // 2 if bad - good > 1 else None


def conclude(kind: str, levels: list, probes: list[Probe], slos: dict[str, float]) -> LoadSearchResult:
    """The answer from the probes taken (as `next_probe` chose them): the largest meeting rung backed off one
    notch, the binding constraint at the first breaking rung, or why the range did not bracket the edge."""
    by_rung = {p.index: p for p in probes}
    good = max((i for i, p in by_rung.items() if not p.violations(slos)), default=-1)
    bad = min((i for i, p in by_rung.items() if p.violations(slos)), default=None)
    unit = "clients" if kind == "clients" else "requests/s"
    if good < 0:
        broken = ", ".join(by_rung[0].violations(slos)) if 0 in by_rung else "nothing measured"
        return LoadSearchResult(kind, dict(slos), None, None, broken, list(probes),
                                f"already broken at the smallest load ({_level_text(levels[0])} {unit}: {broken}); "
                                "lower the range's low end or loosen the SLOs", bracketed=False)
    if bad is None:
        return LoadSearchResult(kind, dict(slos), None, levels[good], None, list(probes),
                                f"never broken at the largest load ({_level_text(levels[-1])} {unit} met every SLO): "
                                "the capacity lies above the range; extend its high end", bracketed=False)
    return LoadSearchResult(kind, dict(slos), backed_off(levels, good), levels[good],
                            ", ".join(by_rung[bad].violations(slos)), list(probes))


def most_probes(levels: list) -> int:
    """The most probes a search over this ladder can take (growth to the top, then a bisection of the widest
    gap between growth rungs): what a probe's share of a time budget is reckoned from."""
    rungs, index = [0], 0
    while index < len(levels) - 1:
        index = growth(levels, index)
        rungs.append(index)
    widest = max((b - a for a, b in zip(rungs, rungs[1:])), default=1)
    return len(rungs) + max(0, math.ceil(math.log2(max(widest, 1))))


def bracket_search(evaluate: Callable[[int, float], Probe], kind: str, levels: list,
                   slos: dict[str, float]) -> LoadSearchResult:
    """The search with a synchronous `evaluate(rung, level) -> Probe` (a test's fake; the worker runs the same
    steps, `next_probe` and `conclude`, with its engine between them)."""
    from labkit.spec.load_search import slo_problems
    from labkit.spec.numbers import raise_problems

    raise_problems("load search", slo_problems(slos))
    if len(levels) < 2 or sorted(set(levels)) != list(levels):
        raise BadParameter(f"a load search needs an ascending ladder of two loads or more, got {levels!r}")
    probes: list[Probe] = []
    while (rung := next_probe(levels, {p.index: not p.violations(slos) for p in probes})) is not None:
        probes.append(evaluate(rung, levels[rung]))
    return conclude(kind, levels, probes, slos)


# ---- one probe's measurement ------------------------------------------------------------------------------
def trial_groups(trial_rows: list[list[dict]], m: stats.Metric) -> list[np.ndarray]:
    """A latency's values per trial from request rows (dicts, as the worker holds them), as `stats.groups`
    reads them from a stored table."""
    out = []
    for rows in trial_rows:
        if m.level == "token":
            pooled = [g for row in rows for g in stats.request_gaps(row, m)]
        else:
            pooled = [math.nan if row.get(m.column) is None else row[m.column] for row in rows]
        values = np.asarray(pooled, float)
        values = values[~np.isnan(values)]
        if len(values):
            out.append(values)
    return out


def measure(trial_rows: list[list[dict]], names, confidence: float = 0.95) -> Measurement:
    """Each latency's value and bootstrap interval over a probe's trials, as `stats.summarize` computes them
    (NaN where no request gave a value: such a metric meets no SLO)."""
    alpha, out = (1 - confidence) / 2, {}
    for name in names:
        m = stats.metric(name)
        data = trial_groups(trial_rows, m)
        if not data:
            out[name] = (math.nan, math.nan, math.nan)
            continue
        reps = stats.replicates(data, m)
        out[name] = (stats.point(data, m), float(np.nanquantile(reps, alpha)), float(np.nanquantile(reps, 1 - alpha)))
    return out


# ---- saturation of a rate probe ---------------------------------------------------------------------------
SATURATION_SHARE = 1 / 3  # the queue grew by this share of the requests sent: fewer than 2/3 of them came back
SATURATION_LEAST_SENT = 24  # requests sent in a judged window (fewer: the counts' noise would decide)
SETTLED_AFTER = 4  # windows are judged from this many times the first request's latency on (the queue's ramp)


def saturated(sent_s, done_s, now_s: float, share: float = SATURATION_SHARE,
              least: int = SATURATION_LEAST_SENT) -> bool:
    """Whether an open-loop probe's engine cannot keep up, from each sent request's send time and completion time
    (NaN while in flight), seconds from the trial's start, judged at `now_s`.

    A queue that never drains grows without end: in both of the last two windows (now/4 to now/2, now/2 to now)
    the requests in flight grew by at least `share` of the requests sent in it (each window holding `least` sent
    requests). A queue that fills while the first requests are served (as the batch grows, latency with it) grows
    too, for about one latency: the windows are judged only once now/4 is `SETTLED_AFTER` times the first
    completion's time. Simulated on Poisson arrivals with log-normal latencies (median 0.2-5 s, sigma up to 1) it
    flagged 3 % of engines that held their rate (the heaviest tails), none with sigma up to 0.5, and caught a
    first-come-first-served engine 2x to 8x over its rate within 20 s (tests/unit/test_load_search.py); an
    engine that shares itself among every request in flight returns its first request late when far over its
    rate, and is caught later (the worker ends such a probe at its deadline)."""
    sent, done = np.asarray(sent_s, float), np.asarray(done_s, float)
    sent, done = sent[sent < now_s], done[sent < now_s]
    back = done[~np.isnan(done)]
    if not len(back) or now_s / 4 < SETTLED_AFTER * back.min():
        return False

    def in_flight(t):
        return int(((sent < t) & ~(done < t)).sum())  # NaN (not back) compares False: still in flight
    for low, high in ((now_s / 4, now_s / 2), (now_s / 2, now_s)):
        count = int(((sent >= low) & (sent < high)).sum())
        if count < least or in_flight(high) - in_flight(low) < share * count:
            return False
    return True


# ---- reading a stored search back -------------------------------------------------------------------------
def stored_searches(results, arm: str | None = None) -> dict[tuple[str, str], LoadSearchResult]:
    """(arm, search) -> its result, from the complete arms' `load_search` facts (one arm, or every arm)."""
    if "load_search" not in results.arms:
        return {}
    found = {}
    for row in results.arms.itertuples():
        if row.status != "complete" or (arm is not None and row.arm != arm):
            continue
        fact = row.load_search
        if isinstance(fact, str):
            fact = json.loads(fact)
        if not isinstance(fact, dict):
            continue
        for search, data in fact.items():
            found[(row.arm, search)] = LoadSearchResult.from_dict(data)
    return found


def probe_levels(results, search: str = "default") -> dict[str, tuple[str, float]]:
    """Each stored probe load of `search` (over every arm): its kind ("clients" or "rate") and level, so a
    table per load (goodput, throughput) can be read against the load it was measured at."""
    return {probe.load: (result.kind, float(probe.level))
            for (_, name), result in stored_searches(results).items() if name == search for probe in result.probes}


def search_result(results, arm: str | None = None, search: str = "default") -> LoadSearchResult:
    """One arm's stored load search (the only arm, when `arm` is left out)."""
    found = stored_searches(results, arm)
    arms = sorted({a for a, _ in found})
    if arm is None and len(arms) > 1:
        raise BadParameter(f"several arms searched {arms}: name one, e.g. search_result(results, {arms[0]!r})")
    matching = [r for (a, s), r in found.items() if s == search]
    if not matching:
        raise BadParameter(f"no stored load search {search!r}" + (f" for arm {arm!r}" if arm else "")
                           + f"; stored: {sorted(found) or 'none'}")
    return matching[0]


@shows_whole
def search_table(results, arm: str | None = None, search: str | None = None) -> pd.DataFrame:
    """Every stored load search as a table: per arm, search and probe (in the order taken) the load, each SLO
    metric's value [95 % interval], whether it met them, whether it saturated; each search's answer in its
    `recommended` column and its sentence in the table's attrs."""
    found = stored_searches(results, arm)
    frames, sentences = [], {}
    for (arm_name, name), result in found.items():
        if search is not None and name != search:
            continue
        frames.append(result.table().assign(arm=arm_name, search=name))
        sentences[f"{arm_name}/{name}"] = result.sentence()
    if not frames:
        raise BadParameter(f"no stored load search in {results.name}" + (f" for arm {arm!r}" if arm else ""))
    table = pd.concat(frames, ignore_index=True)
    first = ["arm", "search", "probe", *[c for c in ("clients", "rate") if c in table]]
    table = table[[*first, *[c for c in table.columns if c not in first]]]
    table.attrs["answers"] = sentences
    return table


def stored_slos(results) -> dict[str, float]:
    """The SLOs an experiment's load searches were run against (from its stored workloads): what its goodput is
    read at. {} when it has no load search, or when its searches hold different SLOs (then goodput is read per
    search, with that search's SLOs, not for the experiment as a whole)."""
    found = [w["slos"] for w in (results.spec.get("workloads") or {}).values()
             if isinstance(w, dict) and w.get("kind") == "LoadSearch"]
    return dict(found[0]) if found and all(slos == found[0] for slos in found) else {}
