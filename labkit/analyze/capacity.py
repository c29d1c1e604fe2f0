"""Capacity under an SLO, and the replicas a demand needs: "how much load does this launch hold at my SLO,
and how many GPUs do I need".

A `Capacity` is one arm's measured answer to the first question, per engine (one launch of the arm, on its
tp x pp x dp GPUs). A load search measuring it on an engine produces one; `capacity_from_points` derives one
from an experiment already stored, whose loads are the same requests at several closed-loop concurrencies
(or Poisson rates), with the rule of the SLO search (labkit.analyze.slo.from_points). `replicas_needed`
answers the second question from capacities: an estimate, and said to be one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from labkit.analyze import slo, stats
from labkit.analyze.parallel import gpus_per_arm
from labkit.errors import BadParameter
from labkit.shown import with_detail
from labkit.spec.numbers import COUNT, POSITIVE, check_number, raise_problems

CLIENTS = "clients"  # closed loop: concurrent clients, each sending its next request when one finishes
REQUESTS_PER_S = "requests/s"  # open loop: Poisson arrivals at this mean rate
UNITS = {"Concurrency": CLIENTS, "Poisson": REQUESTS_PER_S}  # the arrival kind a load's capacity is read in
NO_CAPACITY = "no load met the SLO"


@dataclass(frozen=True)
class Capacity:
    """One arm's capacity under an SLO set, per engine.

    value: the load one engine holds while meeting every SLO, to plan with: concurrent clients (`unit`
        "clients") or requests/s (`unit` "requests/s"). From stored points it is the SLO search's answer: the
        largest measured load that meets every SLO (each metric's 95 % interval's upper end within its limit)
        with every smaller one, backed off one notch for headroom.
    low, high: the band the measurement supports, low <= value <= high: the engine holds at least `low`, and
        no measured load above `high` met the SLOs. From stored points: the backed-off answer and the largest
        meeting load. A load search that brackets the edge more finely gives a narrower band.
    value, low and high are all None when no measured load met the SLOs (`note` says which failed first).
    gpus_per_engine: the GPUs one engine takes (tensor x pipeline x data parallel sizes).
    slos: the limits it was measured against; note: how it was found (the binding constraint, "extend the
        grid" when even the largest load met) or why there is none.
    """

    arm: str
    unit: str
    value: float | None
    low: float | None
    high: float | None
    gpus_per_engine: int = 1
    slos: dict = field(default_factory=dict)
    note: str = ""

    def __post_init__(self):
        """Refuse a Capacity that cannot be read, naming every problem at once."""
        problems = [None if self.unit in (CLIENTS, REQUESTS_PER_S) else
                    f"unit must be {CLIENTS!r} or {REQUESTS_PER_S!r}, got {self.unit!r}",
                    check_number("gpus_per_engine", self.gpus_per_engine, **COUNT)]
        bounds = (self.low, self.value, self.high)
        if any(b is None for b in bounds):
            if any(b is not None for b in bounds):
                problems.append(f"value, low and high are None together (no load met the SLO) or numbers together; "
                                f"got value={self.value!r}, low={self.low!r}, high={self.high!r}")
        else:
            found = [check_number(name, b, **POSITIVE) for name, b in zip(("low", "value", "high"), bounds)]
            problems += found
            if not any(found) and not self.low <= self.value <= self.high:
                problems.append(f"the band must hold the value: low <= value <= high, got {self.low!r} <= "
                                f"{self.value!r} <= {self.high!r}")
        raise_problems(f"Capacity of {self.arm!r}", problems)

    @property
    def met(self) -> bool:
        """Whether any measured load met the SLOs."""
        return self.value is not None

    def sentence(self) -> str:
        """One line: what one engine of the arm holds, or that no load met the SLO."""
        if not self.met:
            return f"{self.arm}: {self.note or NO_CAPACITY}"
        band = "" if self.low == self.high else f" (the measurement supports {self.low:g} to {self.high:g})"
        return (f"{self.arm}: one engine ({self.gpus_per_engine} GPU{'s' if self.gpus_per_engine > 1 else ''}) holds "
                f"{amount(self.value, self.unit)} within the SLOs{band}" + (f"; {self.note}" if self.note else ""))


def amount(value: float, unit: str) -> str:
    """A load in words: '1 client', '16 clients', '2.5 requests/s'."""
    return f"{value:g} {'client' if unit == CLIENTS and value == 1 else unit}"


def load_points(results, loads: list[str] | None = None) -> dict[str, float]:
    """The loads that are capacity points, with their load in one unit: the clients of a closed loop or the
    rate of Poisson arrivals, in the stored spec's order. Loads given by name must all be such points, of
    one unit, at distinct values, and differ from each other in nothing but how they arrive and how many
    requests were sent; every problem is named at once."""
    workloads = results.spec.get("workloads") or {}
    asked = list(loads) if loads is not None else [name for name in results.loads
                                                  if _unit(workloads.get(name)) is not None]
    problems = [f"no load {name!r}; the loads are {results.loads}" for name in asked if name not in workloads]
    known = [name for name in asked if name in workloads]
    problems += [f"load {name!r} arrives as {_kind(workloads[name])}: a capacity point is a closed loop "
                 f"(Concurrency(n)) or Poisson arrivals (Poisson(rate))" for name in known if _unit(workloads[name]) is None]
    points = {name: _arrival_value(workloads[name]) for name in known if _unit(workloads[name])}
    units = {_unit(workloads[name]) for name in points}
    if len(units) > 1:
        problems.append(f"the loads mix units {sorted(units)}: pick loads of one kind with loads=[...]")
    seen: dict[float, str] = {}
    for name, value in points.items():
        if value in seen:
            problems.append(f"loads {seen[value]!r} and {name!r} both run at {value:g}: pick one with loads=[...]")
        seen.setdefault(value, name)
    shapes = {name: _shape(workloads[name]) for name in points}
    first = next(iter(points), None)
    problems += [f"load {name!r} sends other requests than {first!r} (lengths, prefixes or seed): a capacity "
                 f"compares one request shape at several loads; pick those with loads=[...]"
                 for name in points if shapes[name] != shapes[first]]
    if not asked:
        problems.append(f"no load of {results.name!r} is a closed loop or Poisson arrivals; its loads: {results.loads}")
    raise_problems(f"capacity points of {results.name!r}", problems)
    return points


def _kind(workload: dict | None) -> str:
    if not workload:
        return "nothing stored"
    return workload.get("kind") or workload.get("arrival", {}).get("kind", "unknown")


def _unit(workload: dict | None) -> str | None:
    return UNITS.get(_kind(workload)) if workload and "kind" not in workload else None


def _arrival_value(workload: dict) -> float:
    """A closed loop's clients (a whole number), or a Poisson load's rate."""
    arrival = workload["arrival"]
    return int(arrival["n"]) if arrival["kind"] == "Concurrency" else float(arrival["rate"])


def _shape(workload: dict) -> dict:
    """What a request of the load is, without how the requests arrive or how many there were."""
    return {k: v for k, v in workload.items() if k not in ("arrival", "num_requests")}


def capacity_from_points(results, arm: str, slos: dict[str, float], loads: list[str] | None = None) -> Capacity:
    """One arm's Capacity from its stored loads at several concurrencies (or rates), with the SLO search's rule
    (slo.from_points): each load's SLO metrics are summarised with their 95 % intervals, a load meets when every
    interval's upper end is within its limit, and the answer is the largest meeting load with every smaller one
    meeting, backed off one notch; the band runs from that answer to the largest meeting load. No load meeting
    gives a Capacity without a value, its note naming the SLO the smallest load broke."""
    if arm not in results.complete_arms:
        raise BadParameter(f"no complete arm {arm!r} in {results.name!r}; complete arms: {results.complete_arms}")
    return capacities_from_points(results, slos, loads, arms=[arm])[0]


def capacities_from_points(results, slos: dict[str, float], loads: list[str] | None = None,
                           arms: list[str] | None = None) -> list[Capacity]:
    """`capacity_from_points` for each of `arms` (every complete arm by default), in the experiment's order;
    each load is summarised once for all of them."""
    slo.check_slos(slos)
    points = load_points(results, loads)
    unit = UNITS[_kind(results.spec["workloads"][next(iter(points))])]
    arms = [a for a in results.complete_arms if arms is None or a in arms]
    summaries = {at: stats.summarize(results.select(load), list(slos)).set_index(["arm", "metric"])
                 for load, at in points.items()}
    gpus = gpus_per_arm(results).set_index("arm").gpus
    found = []
    for arm in arms:
        measured = {at: {name: tuple(s.loc[(arm, name), ["value", "ci_low", "ci_high"]]) for name in slos}
                    for at, s in summaries.items() if arm in s.index.get_level_values("arm")}
        found.append(_capacity(arm, unit, int(gpus[arm]), slos, measured))
    return found


def _capacity(arm: str, unit: str, gpus: int, slos: dict[str, float], measured: dict) -> Capacity:
    """The rule of the SLO search on one arm's measured loads, as a Capacity."""
    found = slo.from_points(measured, slos)
    if found.answer is None:
        smallest = min(measured) if measured else None
        why = (f"at the smallest measured load, {amount(smallest, unit)}, {found.binding_constraint} is already over "
               f"its limit" if measured else "no load of this arm was measured")
        return Capacity(arm, unit, None, None, None, gpus, dict(slos), f"{NO_CAPACITY}: {why}")
    binding = (f"above {amount(found.largest_meeting, unit)} {found.binding_constraint} goes over its limit first"
               if found.binding_constraint else "")
    note = "; ".join(n for n in (binding, found.note) if n)
    return Capacity(arm, unit, found.answer, found.answer, found.largest_meeting, gpus, dict(slos), note)


def capacities_from_searches(results, search: str = "default", arms: list[str] | None = None) -> list[Capacity]:
    """Each complete arm's Capacity from its stored load search `search` (labkit.spec.load_search.LoadSearch,
    measured on one engine): the value is the search's answer (backed off one notch), the band runs from it to
    the largest load that met every SLO, as `capacity_from_points` reads it. An arm without that search is left
    out; a search that met nothing gives a Capacity without a value, its note saying why (e.g. already broken at
    the smallest load, or saturated)."""
    from labkit.analyze.load_search import stored_searches

    gpus = gpus_per_arm(results).set_index("arm").gpus
    found = []
    for (arm, name), result in stored_searches(results).items():
        if name != search or (arms is not None and arm not in arms):
            continue
        unit = CLIENTS if result.kind == "clients" else REQUESTS_PER_S
        if result.answer is None:
            # never broken at the top: every load met, and the capacity lies above the range, so no number
            why = NO_CAPACITY if result.largest_meeting is None else "no capacity within the searched range"
            found.append(Capacity(arm, unit, None, None, None, int(gpus[arm]), dict(result.slos),
                                  f"{why}: {result.note}"))
            continue
        binding = (f"above {amount(result.largest_meeting, unit)} {result.binding_constraint} goes over its limit "
                   f"first" if result.binding_constraint else "")
        note = "; ".join(n for n in (binding, result.note, f"{result.probes_used} probes on one engine") if n)
        found.append(Capacity(arm, unit, float(result.answer), float(result.answer), float(result.largest_meeting),
                              int(gpus[arm]), dict(result.slos), note))
    return found


def _replicas(demand: float, per_engine: float) -> int:
    # rounded to 9 places first: 2.1 / 0.3 is 7.000000000000001 in floats, and must not need 8 replicas
    return max(1, math.ceil(round(demand / per_engine, 9)))


def replicas_needed(capacities, users: float | None = None, rate: float | None = None):
    """Per arm, the engines (replicas) and GPUs that serve `users` concurrent clients (capacities in clients)
    or `rate` requests/s (capacities in requests/s) within the SLOs the capacities were measured at:
    replicas = ceil(demand / capacity), GPUs = replicas x GPUs per engine, and the band
    ceil(demand / high) .. ceil(demand / low) from the capacity's band. An arm where no load met the SLO gets no
    number: its row says so. It is an estimate, and the table says so above it: it assumes replicas are
    independent and scale linearly (no shared router, network or storage that slows them together)."""
    capacities = [capacities] if isinstance(capacities, Capacity) else list(capacities or [])
    given = {"users": users, "rate": rate}
    named = [name for name, v in given.items() if v is not None]
    problems = [] if len(named) == 1 else [f"give users=N (concurrent clients) or rate=R (requests/s), exactly one; "
                                           f"got {', '.join(named) or 'neither'}"]
    problems += [check_number(name, given[name], **POSITIVE) for name in named]
    if not capacities:
        problems.append("give at least one Capacity (e.g. capacities_from_points(results, slos))")
    problems += [f"item {i} is no Capacity: {c!r}" for i, c in enumerate(capacities) if not isinstance(c, Capacity)]
    unit = CLIENTS if named == ["users"] else REQUESTS_PER_S if named == ["rate"] else None
    if unit:
        problems += [f"{c.arm!r} was measured in {c.unit}, not {unit}: give "
                     f"{'users' if c.unit == CLIENTS else 'rate'}= for it" for c in capacities
                     if isinstance(c, Capacity) and c.unit != unit]
    raise_problems("replicas_needed", problems)
    demand = users if users is not None else rate
    rows = []
    for c in capacities:
        row = {"arm": c.arm, f"per engine ({c.unit})": c.value, "gpus per engine": c.gpus_per_engine}
        if c.met:
            replicas, fewest, most = (_replicas(demand, c.value), _replicas(demand, c.high), _replicas(demand, c.low))
            row.update(replicas=replicas, replicas_low=fewest, replicas_high=most, gpus=replicas * c.gpus_per_engine,
                       gpus_low=fewest * c.gpus_per_engine, gpus_high=most * c.gpus_per_engine, note=c.note)
        else:
            row.update(replicas=pd.NA, replicas_low=pd.NA, replicas_high=pd.NA, gpus=pd.NA, gpus_low=pd.NA,
                       gpus_high=pd.NA, note=c.note or NO_CAPACITY)
        rows.append(row)
    table = pd.DataFrame(rows)
    table[table.columns[1]] = table[table.columns[1]].astype("Float64")  # no capacity: <NA>, like its replicas
    for column in ("replicas", "replicas_low", "replicas_high", "gpus", "gpus_low", "gpus_high"):
        table[column] = table[column].astype("Int64")
    asked = f"{demand:g} concurrent clients" if unit == CLIENTS else f"{demand:g} requests/s"
    caption = (f"An estimate for {asked}: replicas = demand / what one engine held within the SLOs, rounded up "
               f"(the band from the capacity's band). It assumes independent replicas that scale linearly: a "
               f"router, network or storage they share is not measured here; load the replicas together to confirm.")
    return with_detail(table, None, "", caption)
