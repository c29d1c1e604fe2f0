"""Speculative decoding on a larger shape, estimated from three measurements — labelled as an estimate.

Whether drafts pay depends on two things no single measurement here has together: what the model writes (how
many drafted tokens it accepts: needs real weights, which the lab has only for a small model) and what a step
of k + 1 tokens per sequence costs (a property of the shape: measurable with dummy weights on any size). This
combines them:

- from the small real model speculating, per task, batch B and k: the tokens a step produced (tau: its time
  per step, the gap between streamed chunks, over its time per token; every step counts, those where the
  lookup found no draft too) and its time per step;
- from the same small model in plain decode at batch B x (k + 1): the forward of as many tokens as its
  verification step checks. The speculating step's time beyond it is speculation's own work (the lookup, the
  rejection sampling, the bookkeeping), which does not depend on the shape: it is carried over as measured
  (never below 0: a plain step at B x (k + 1) reads more KV cache than a verification step, see below);
- from the larger shape with dummy weights, plain decode: its time per step at batch B, and at B x (k + 1),
  which stands in for its verification step: the same weight reads and GEMM tokens, k + 1 times the KV-cache
  reads of the real step (each token a sequence of its own), so it errs on the slow side.

Estimated change in output tok/s = tau x step(B) / (step(B x (k + 1)) + extra time) - 1, with a band from the
ends of every input's 95 % interval. It assumes the larger model accepts drafts as often as the small one (a
larger model that copies more faithfully accepts more). Means throughout: a mean time per step times the steps
is the time taken.
"""
from __future__ import annotations

import math

import pandas as pd

from labkit.analyze.speculation import arm_ks_and_load_shapes
from labkit.analyze.stats import summarize
from labkit.shown import change as relative

PER_TOKEN, PER_STEP = "tpot_mean_ms", "itl_mean_ms"  # a step streams one chunk: its gap is the step's time
PAYS, COSTS, UNCLEAR = "likely pays", "likely costs", "could go either way"

Interval = tuple[float, float, float]  # value, 95 % low, high


def verification_batches(clients: list[int], ks: list[int]) -> list[int]:
    """The batches the larger shape's plain decode is measured at: each batch B and each B x (k + 1)."""
    return sorted({b for c in clients for b in (c, *(c * (k + 1) for k in ks))})


def _values(results, metrics: list[str]) -> dict[tuple[str, str, str], Interval]:
    """(load, arm, metric) -> (value, 95 % low, high) of every measured arm at every load."""
    out = {}
    for load, part in results.per_load():
        for r in summarize(part, metrics).itertuples():
            out[(load, r.arm, r.metric)] = (r.value, r.ci_low, r.ci_high)
    return out


def step_times(results) -> dict[int, Interval]:
    """Plain decode, its mean time per step by batch (ms): {clients: (value, low, high)} of its loads
    (closed-loop concurrencies; a plain step makes one token per sequence, so its time per token)."""
    _ks, shapes = arm_ks_and_load_shapes(results)
    return {shapes[load][1]: v for (load, _arm, _m), v in _values(results, [PER_TOKEN]).items()
            if shapes.get(load, ("", None))[1]}


def speculating_steps(results, plain_steps: dict[int, Interval]) -> list[dict]:
    """Per load and speculating arm of the small model's results: task, clients, k, the tokens a step produced
    (tau) and speculation's extra time per step beyond the same model's plain step at B x (k + 1)
    (`plain_steps`, from `step_times`), each an Interval (the ends of the inputs' intervals, so a band, not a
    confidence interval). A batch whose B x (k + 1) was not measured is left out."""
    ks, shapes = arm_ks_and_load_shapes(results)
    values = _values(results, [PER_TOKEN, PER_STEP])
    rows = []
    for (load, arm, metric), step in values.items():
        task, clients = shapes.get(load, ("ids", None))
        if metric != PER_STEP or not ks.get(arm) or not clients or clients * (ks[arm] + 1) not in plain_steps:
            continue
        tau, extra = step_yield_and_extra(step, values[(load, arm, PER_TOKEN)], plain_steps[clients * (ks[arm] + 1)])
        rows.append({"task": task, "clients": clients, "k": ks[arm], "tau": tau, "extra": extra})
    return rows


def step_yield_and_extra(step: Interval, per_token: Interval, verify_step: Interval) -> tuple[Interval, Interval]:
    """A speculating arm's tokens per step (its time per step over its time per token) and its extra time per
    step beyond a plain step of the tokens it verifies (never below 0), each with the band the inputs'
    interval ends give."""
    tau = (step[0] / per_token[0], step[1] / per_token[2], step[2] / per_token[1])
    extra = tuple(max(0.0, e) for e in (step[0] - verify_step[0], step[1] - verify_step[2], step[2] - verify_step[1]))
    return tau, extra


def larger_shape_estimate(small, small_plain, large) -> pd.DataFrame:
    """`estimate` from stored results: the small real model's speculative experiment, its plain decode and the
    larger shape's plain decode, both at the batches `verification_batches` names."""
    return estimate(speculating_steps(small, step_times(small_plain)), step_times(large))


def estimate(speculating: list[dict], steps: dict[int, Interval]) -> pd.DataFrame:
    """Per task, batch and k: the small real model's tokens per step and extra time per step, the larger
    shape's plain step at B and at B x (k + 1), and the estimated change of its output tok/s with the band of
    the inputs' intervals and a word for it (a band wholly above 0 % likely pays, wholly below likely costs).
    A batch the larger shape was not measured at is left out (its rows would be guesses on guesses)."""
    rows = []
    for r in sorted(speculating, key=lambda r: (r["task"], r["clients"] or 0, r["k"])):
        b, k = r["clients"], r["k"]
        if b not in steps or b * (k + 1) not in steps:
            continue
        plain, verify, tau, extra = steps[b], steps[b * (k + 1)], r["tau"], r["extra"]
        value = tau[0] * plain[0] / (verify[0] + extra[0]) - 1
        low = tau[1] * plain[1] / (verify[2] + extra[2]) - 1
        high = tau[2] * plain[2] / (verify[1] + extra[1]) - 1
        word = PAYS if low > 0 else COSTS if high < 0 else UNCLEAR
        rows.append({"task": r["task"], "clients": b, "k": k, "tokens per step (small model)": round(tau[0], 2),
                     "extra ms per step (speculation's own)": round(extra[0], 3),
                     "ms per step at B (larger shape)": round(plain[0], 3),
                     "ms per step at B x (k+1) (larger shape)": round(verify[0], 3),
                     "estimated output tok/s change [band]": relative(value, low, high) if math.isfinite(value) else "n/a",
                     "estimate": word})
    return pd.DataFrame(rows)
