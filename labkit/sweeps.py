"""Experiments that choose what to measure next from what they have measured: the SLO search over
max_num_seqs starts one engine per point it needs (labkit.analyze.slo holds the search itself, pure)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from labkit.analyze import stats
from labkit.analyze.slo import Measurement, SloResult, check_slos, search
from labkit.errors import BadParameter
from labkit.spec.lists import as_list


def search_max_num_seqs(experiment, grid: list[int], slos: dict[str, float], arm_name=lambda v: f"max_num_seqs={v}",
                        progress: bool = True) -> SloResult:
    """Run the search on a labkit Experiment whose arms include `arm_name(v)` for each grid value; each
    evaluation measures one arm (one engine start) unless the store already holds it."""
    check_slos(slos)
    grid = as_list("grid", grid, "[1, 2, 4, 8]")
    missing = [arm_name(v) for v in grid if arm_name(v) not in experiment.arms]
    if missing:
        raise BadParameter(f"the experiment has no arms {missing} for the grid")

    stored = set()

    def evaluate(value: int) -> Measurement:
        arm = arm_name(value)
        if experiment.store.completed_spec(arm) is not None:
            stored.add(value)
        results = experiment.run(progress=progress, only=[arm])
        if arm not in results.complete_arms:  # a failed engine meets no SLO
            return {name: (np.nan, np.nan, np.nan) for name in slos}
        table = stats.summarize(results, list(slos)).set_index(["arm", "metric"])
        return {name: tuple(table.loc[(arm, name), ["value", "ci_low", "ci_high"]]) for name in slos}
    result = search(evaluate, grid, slos)
    return replace(result, engine_starts=result.engine_starts - len(stored), from_store=len(stored))
