"""The one check of every number the lab is given: lengths, counts, rates, times, limits, thresholds.

Python lets impossible numbers through quietly: NaN compares False with everything (so `nan <= 0` passes a
"positive" check), infinity passes every lower bound, and True is an int equal to 1. Every public
constructor, function and command-line option checks its numbers here, so each refuses the same things with
the same words, and a constructor can name every problem at once.
"""
from __future__ import annotations

import math
import numbers

from labkit.errors import BadParameter


def wanted(*, integer: bool = False, minimum=None, maximum=None, exclusive_minimum: bool = False,
           exclusive_maximum: bool = False, allow_none: bool = False) -> str:
    """Such a number in words: "a whole number >= 1", "a finite number > 0 (or None)"."""
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if exclusive_minimum else '>='} {minimum}")
    if maximum is not None:
        bounds.append(f"{'<' if exclusive_maximum else '<='} {maximum}")
    words = ("a whole number" if integer else "a finite number") + (" " + " and ".join(bounds) if bounds else "")
    return words + (" (or None)" if allow_none else "")


def number_problem(value, **rules) -> str | None:
    """What is wrong with `value` as such a number ("must be ..., got ..."), or None; the rules are `wanted`'s
    keywords. Booleans, text, NaN and infinities are never numbers; `integer` refuses 2.5 and 2.0 alike (a
    count is given as a whole number)."""
    integer, minimum, maximum = rules.get("integer", False), rules.get("minimum"), rules.get("maximum")
    if value is None and rules.get("allow_none"):
        return None
    problem = f"must be {wanted(**rules)}, got {value!r}"
    kind = numbers.Integral if integer else numbers.Real
    # numpy's bool is no numbers.Integral, but Python's bool is: refuse both by name
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, kind):
        return problem
    if not math.isfinite(value):
        return problem
    if minimum is not None and (value <= minimum if rules.get("exclusive_minimum") else value < minimum):
        return problem
    if maximum is not None and (value >= maximum if rules.get("exclusive_maximum") else value > maximum):
        return problem
    return None


def check_number(name: str, value, **rules) -> str | None:
    """`number_problem` with the parameter's name in front ("clients must be ...", or None); the rules are
    `wanted`'s keywords."""
    problem = number_problem(value, **rules)
    return None if problem is None else f"{name} {problem}"


def raise_problems(where: str, problems, most: int | None = None) -> None:
    """Raise one BadParameter naming every problem found (None entries are no problem), or the first `most`
    and how many more (a long list's every bad entry would drown the message); nothing if none."""
    found = [p for p in problems if p]
    if len(found) == 1:
        raise BadParameter(f"{where}: {found[0]}")
    if found:  # one per line: a list of fixes is read down, not across
        shown = found if most is None or len(found) <= most else found[:most] + [f"and {len(found) - most} more"]
        raise BadParameter(f"{where}: {len(found)} problems, nothing started:\n" + "\n".join(f"  - {p}" for p in shown))


def check_numbers(where: str, checks: dict[str, tuple]) -> None:
    """Check several parameters at once and raise one BadParameter naming each bad one: name -> (value, rules)."""
    raise_problems(where, [check_number(name, value, **rules) for name, (value, rules) in checks.items()])


# The rules the lab's parameters share, named once.
COUNT = dict(integer=True, minimum=1)  # requests, clients, tokens of a length, trials
COUNT_OR_ZERO = dict(integer=True, minimum=0)  # warm-up requests, a shared prefix's tokens
SEED = dict(integer=True, minimum=0)  # numpy's generators take seeds >= 0
POSITIVE = dict(minimum=0, exclusive_minimum=True)  # rates, intervals, time limits, SLO limits
NON_NEGATIVE = dict(minimum=0)  # think times, offsets, thresholds, temperature
FRACTION = dict(minimum=0, maximum=1, exclusive_minimum=True)  # shares in (0, 1]
PROBABILITY = dict(minimum=0, maximum=1, exclusive_minimum=True, exclusive_maximum=True)  # confidence levels
