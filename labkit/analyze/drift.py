"""The reference arm's launch measured again after the other arms (`Experiment.run(repeat=True)`, arm
`<reference>-repeat`), and what it means for a verdict between the arms of that run.

Arms measured one after another differ by their order as well as by their launches: a later arm finds caches
its predecessors wrote (vLLM's compile cache, FlashInfer's and Triton's kernels, the page cache), a GPU that
has warmed up, a host whose other work came or went. On one H100 the dummy-weights arm, run second from the
compile cache the real-weights arm had just written, decoded 24.7 % slower, and nothing in that run could tell
its weights from its order (data/baselines/h100/real-vs-dummy-2026-12-06). Run again with the repeat on another
H100 (real-vs-dummy-2026-12-07), the same launch moved up to 19 % between first and last, and dummy weights
showed no detectable difference. The repeat measures how far the same launch moved between the first and the
last arm:

- a verdict between arms of that run says how far the repeat moved;
- it is *too noisy to judge here* when the repeat moved as far as the change (the far end of its 95 % interval
  reaches it): order and drift alone could have made the change.

The comparison of the reference with its own repeat keeps its verdict: it is the measurement of the drift.
"""
from __future__ import annotations

REPEAT_SUFFIX = "-repeat"
MARK = "(repeat)"  # ends the caution: what the conclusions look for to give this advice
ADVICE = "rerun with the arms in another order, or on a quieter machine"
DRIFT_ADVICE = "none: it is the run's drift"  # the repeat is no launch to choose


def repeat_arm(reference: str) -> str:
    return reference + REPEAT_SUFFIX


def repeated_reference(results) -> str | None:
    """The arm whose launch was measured again at the end of the run (complete, with its repeat); None without."""
    complete = set(results.complete_arms)
    return next((arm for arm in results.complete_arms if repeat_arm(arm) in complete), None)


def drift(results, m) -> tuple[float, float] | None:
    """How far the repeat moved from its reference on metric `m`: (change, far end of its 95 % interval in
    absolute value); None without a complete repeat."""
    from labkit.analyze.stats import same_launch_move

    reference = repeated_reference(results)
    return None if reference is None else same_launch_move(results, reference, repeat_arm(reference), m)


def _applies(results, baseline_arm: str, arm: str) -> str | None:
    """The reference repeated in this run, where it bears on a verdict between these two arms; None where it
    does not (no repeat, or the comparison of the reference with its own repeat, which measures the drift)."""
    reference = repeated_reference(results)
    if reference is None or {baseline_arm, arm} == {reference, repeat_arm(reference)}:
        return None
    return reference


def caution(results, baseline_arm: str, arm: str, m) -> str | None:
    """How far the reference's launch moved when measured again at the end of the run; None without a repeat."""
    reference = _applies(results, baseline_arm, arm)
    found = drift(results, m) if reference else None
    if found is None:
        return None
    return f"{reference}'s launch measured again after the other arms moved {m.name} {found[0]:+.1%} {MARK}"


def explains(results, baseline_arm: str, arm: str, m, rel_change: float) -> str | None:
    """Why the run's drift explains the change (in words), or None: the repeat moved as far as the change."""
    reference = _applies(results, baseline_arm, arm)
    found = drift(results, m) if reference and rel_change == rel_change else None
    if found is None or abs(rel_change) > found[1]:
        return None
    return (f"{reference}'s launch, measured again after the other arms, moved up to {found[1]:.1%}, as far as the "
            f"change ({rel_change:+.1%}): the arms' order or the machine's drift alone could have made it; {ADVICE}")
