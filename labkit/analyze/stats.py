"""Summaries with bootstrap confidence intervals, and A/B comparisons with a plain verdict.

Requests within a trial share that trial's conditions, so request- and token-level statistics use a
two-level (cluster) bootstrap: resample trials, then values within each chosen trial. With one trial
it falls back to resampling values. Trial-level metrics (throughput) resample trials.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from labkit.errors import BadParameter
from labkit.spec.numbers import NON_NEGATIVE, PROBABILITY, check_numbers
from labkit.analyze import drift, gpu_state, noise, placement
from labkit.analyze.quantile_bootstrap import windowed_replicates
from labkit.spec.lists import as_list
from labkit.shown import number, shows_whole

N_BOOT = 1000
# The verdicts a comparison can reach, named once: every table, colour and mapping reads them from here.
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no detectable difference"
TOO_FEW = "too few trials"
TOO_NOISY = "too noisy to judge here"  # the host's outside load can explain the change (labkit.analyze.noise)
VERDICTS = (BETTER, WORSE, NO_DIFFERENCE, TOO_FEW, TOO_NOISY)


@dataclass(frozen=True)
class Metric:
    """What a metric is: the level it is measured at, the column it reads, its percentile (None: the mean),
    which direction is better, and its meaning in words."""

    name: str
    level: str  # "trial", "request" or "token"
    column: str
    percentile: float | None  # None: the mean
    lower_is_better: bool
    meaning: str


CHUNK_GAPS = "chunk_itl_ms"  # derived from each request's token stamps (labkit.analyze.stats.chunk_gaps)


def chunk_gaps(token_s) -> np.ndarray:
    """A request's gaps between streamed chunks, in ms, from its token stamps: tokens that arrived together
    (one chunk, one stamp) make one arrival. vllm bench serve's ITL is exactly these gaps (its client stamps
    each chunk; the first chunk is the TTFT, not a gap)."""
    stamps = np.asarray(token_s, float)
    if len(stamps) < 2:
        return np.array([])
    arrivals = stamps[np.r_[True, np.diff(stamps) > 0]]
    return np.diff(arrivals) * 1e3


def _gaps_source(m: "Metric") -> tuple[str, callable]:
    """Where a token-level metric's gaps of one request come from: the column read, and how it becomes gaps."""
    if m.column == CHUNK_GAPS:
        return "token_s", chunk_gaps
    return m.column, lambda values: np.asarray(values, float)


def request_gaps(request, m: "Metric") -> np.ndarray:
    """One request's gaps (a dict or a row of the requests table) for a token-level metric: its token gaps
    (TBT), or its chunk gaps (ITL) from its token stamps."""
    column, to_gaps = _gaps_source(m)
    return to_gaps(request[column] if request[column] is not None else [])


def _metrics() -> dict[str, Metric]:
    out = {}
    for name, column, meaning in (("output_tok_s", "output_tok_s", "output tokens per second"),
                                  ("total_tok_s", "total_tok_s", "prompt + output tokens per second"),
                                  ("request_s", "request_s", "completed requests per second")):
        out[name] = Metric(name, "trial", column, None, False, meaning)
    out["preemptions"] = Metric("preemptions", "trial", "preemptions", None, True, "preemptions per trial")
    out["prefix_hit_pct"] = Metric("prefix_hit_pct", "trial", "prefix_hit_pct", None, False,
                                   "prompt tokens served from the prefix cache, % of those queried")
    out["prefill_tokens_computed"] = Metric("prefill_tokens_computed", "trial", "prefill_tokens_computed", None, True,
                                            "prompt tokens prefilled (not served from the cache) per trial")
    out["spec_acceptance_pct"] = Metric("spec_acceptance_pct", "trial", "spec_acceptance_pct", None, False,
                                        "drafted tokens the target model accepted, % (speculative decoding)")
    out["spec_accepted_length"] = Metric("spec_accepted_length", "trial", "spec_accepted_length", None, False,
                                         "tokens a verifying step yields: 1 + accepted per draft")
    out["kv_usage_peak_pct"] = Metric("kv_usage_peak_pct", "trial", "kv_usage_peak_pct", None, True,
                                      "peak KV-cache usage, % of the pool")
    for prefix, level, column, meaning in (("ttft", "request", "ttft_ms", "time to first token"),
                                           ("tpot", "request", "tpot_ms", "time per output token after the first"),
                                           ("e2e", "request", "e2e_ms", "request latency, end to end"),
                                           ("tbt", "token", "itl_ms", "gap between consecutive tokens"),
                                           # vllm bench serve's ITL: one gap per streamed chunk, so the tokens
                                           # a chunk carries together are one gap, where TBT counts each token
                                           ("itl", "token", CHUNK_GAPS, "gap between consecutive streamed "
                                            "chunks (vllm bench serve's ITL)")):
        out[f"{prefix}_mean_ms"] = Metric(f"{prefix}_mean_ms", level, column, None, True, f"mean {meaning}")
        for q in (50, 90, 99):
            out[f"{prefix}_p{q}_ms"] = Metric(f"{prefix}_p{q}_ms", level, column, q, True, f"P{q} {meaning}")
    return out


METRICS = _metrics()
# The default views, named once: a summary shows throughput and the latencies users feel; a verdict (an A/B,
# a baseline comparison, a report) judges throughput, the tail of TTFT and TBT, and the typical TPOT.
SUMMARY_METRICS = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tbt_p99_ms"]
VERDICT_METRICS = ["output_tok_s", "ttft_p99_ms", "tpot_p50_ms", "tbt_p99_ms"]


def metric_names(metrics, default) -> list[str]:
    """The metrics asked for as a plain list (a tuple, array, Series or generator too); None or empty: `default`.
    A bare name is refused: it would otherwise be read letter by letter."""
    names = [] if metrics is None else as_list("metrics", metrics, "['ttft_p99_ms', 'tpot_p50_ms']")
    return names or list(default)


def metric(name: str) -> Metric:
    """The Metric of that name; an unknown name raises BadParameter listing the known ones."""
    if name not in METRICS:
        raise BadParameter(f"unknown metric {name!r}; known: {sorted(METRICS)}")
    return METRICS[name]


def groups(results, arm: str, m: Metric) -> list[np.ndarray]:
    """The metric's raw values for one arm, one array per trial."""
    if len(getattr(results, "loads", [])) > 1:
        raise BadParameter(f"these results hold several loads {results.loads}: pick one with "
                           "results.select(load) so that like is compared with like")
    if m.level == "trial":
        frame = results.trials[results.trials.arm == arm]
        return [frame[m.column].to_numpy(float)] if len(frame) else []
    frame = results.requests[results.requests.arm == arm]
    out = []
    for _, trial in frame.groupby("trial"):
        if m.level != "token":
            values = trial[m.column].to_numpy(float)
        else:  # each request's gaps, pooled (a column of lists: read as such, not row by row)
            column, to_gaps = _gaps_source(m)
            gaps = [to_gaps(v) for v in trial[column]]
            values = np.concatenate(gaps) if gaps else np.array([])
        values = values[~np.isnan(values)]
        if len(values):
            out.append(values)
    return out


def _stat(values: np.ndarray, m: Metric) -> float:
    if not len(values):
        return float("nan")
    return float(np.mean(values) if m.percentile is None else np.percentile(values, m.percentile))


# Small samples (a smoke run's few requests) are resampled in blocks, one vectorised call per block: one
# percentile call per replicate made a suite's comparison take minutes, nearly all of it numpy's per-call cost.
# Large samples keep one partition per replicate, which is faster there than sorting whole blocks.
VECTORISED_UP_TO = 1024  # values in one replicate (measured: 4x faster at 400, 3x slower at 4,000)
BLOCK_VALUES = 2_000_000  # values drawn per block (tens of MB)


def replicates(data: list[np.ndarray], m: Metric, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates of the statistic (two-level for request/token metrics: trials drawn with
    replacement, then each drawn trial's values with replacement)."""
    rng = np.random.default_rng(seed)
    if not data:
        return np.full(n_boot, np.nan)
    if m.level == "trial":
        values = data[0]
        idx = rng.integers(0, len(values), size=(n_boot, len(values)))
        return values[idx].mean(axis=1)
    if max(len(g) for g in data) * len(data) <= VECTORISED_UP_TO:
        return _replicates_in_blocks(data, m, n_boot, rng)
    if m.percentile is not None:  # many values: draw only those near the percentile, where the window is narrow
        windowed = windowed_replicates(data, m.percentile, n_boot, rng)
        if windowed is not None:
            return windowed
    out = np.empty(n_boot)
    for b in range(n_boot):
        chosen = [data[i] for i in rng.integers(0, len(data), len(data))] if len(data) > 1 else data
        sample = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in chosen])
        out[b] = _stat(sample, m)
    return out


def _replicates_in_blocks(data: list[np.ndarray], m: Metric, n_boot: int, rng) -> np.ndarray:
    flat = np.concatenate(data)
    lengths = np.array([len(g) for g in data])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    block = max(1, BLOCK_VALUES // (int(lengths.max()) * len(data)))
    out = np.empty(n_boot)
    for start in range(0, n_boot, block):
        count = min(block, n_boot - start)
        # one trial alone is not resampled at the trial level: there is nothing to draw between
        trials = (rng.integers(0, len(data), size=(count, len(data))) if len(data) > 1
                  else np.zeros((count, 1), dtype=int))
        group = np.repeat(trials.ravel(), lengths[trials.ravel()])  # the trial each drawn value comes from
        drawn = flat[offsets[group] + (rng.random(len(group)) * lengths[group]).astype(int)]
        out[start:start + count] = _row_stats(drawn, lengths[trials].sum(axis=1), m)
    return out


def _row_stats(values: np.ndarray, sizes: np.ndarray, m: Metric) -> np.ndarray:
    """The statistic of each consecutive run of `sizes` values: the mean, or the percentile as numpy's
    default (linear) method computes it."""
    rows = np.repeat(np.arange(len(sizes)), sizes)
    if m.percentile is None:
        return np.bincount(rows, weights=values, minlength=len(sizes)) / sizes
    span = float(values.max() - values.min()) or 1.0
    ordered = values[np.argsort(rows + 0.5 * (values - values.min()) / span)]  # by row, then by value
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    position = (sizes - 1) * (m.percentile / 100.0)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, sizes - 1)
    below, above = ordered[starts + low], ordered[starts + high]
    return below + (position - low) * (above - below)


def point(data: list[np.ndarray], m: Metric) -> float:
    """The metric's statistic over every trial's values pooled; NaN when there are none."""
    return _stat(np.concatenate(data), m) if data else float("nan")


def interval(replicate_values, alpha: float) -> tuple[float, float]:
    """The (alpha, 1 - alpha) quantiles of bootstrap replicates; NaN for a metric an arm has no value of (the
    acceptance of an arm that drafts nothing), without numpy's warning about an empty slice."""
    values = np.asarray(replicate_values, float)
    if not np.isfinite(values).any():
        return float("nan"), float("nan")
    return float(np.nanquantile(values, alpha)), float(np.nanquantile(values, 1 - alpha))


@shows_whole
def summarize(results, metrics: list[str] | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """One row per arm and metric: the value and its confidence interval (the arms that ran these results' loads:
    under a load search, each arm only at its own probe levels)."""
    check_numbers("summarize", {"confidence": (confidence, PROBABILITY)})
    names = metric_names(metrics, SUMMARY_METRICS)
    alpha = (1 - confidence) / 2
    rows = []
    for arm in results.measured_arms:
        for name in names:
            m = metric(name)
            data = groups(results, arm, m)
            reps = replicates(data, m)
            low, high = interval(reps, alpha)
            rows.append({"arm": arm, "metric": name, "value": point(data, m), "ci_low": low, "ci_high": high,
                         "trials": int(sum(len(g) for g in data)) if m.level == "trial" else len(data),
                         "n": int(sum(len(g) for g in data))})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Comparison:
    """A candidate against a baseline on one metric: both values, the relative change, its CI and the verdict."""

    metric: str
    baseline: float
    candidate: float
    rel_change: float  # candidate / baseline - 1
    ci_low: float
    ci_high: float
    verdict: str  # one of VERDICTS
    threshold: float = 0.0  # the smallest change that counted
    caution: str | None = None  # how the machine moved between the arms' trials (GPU clocks, host load)
    too_noisy: str | None = None  # with TOO_NOISY: why the load explains the change, and what to do

    def sentence(self) -> str:
        """One line: both values, the relative change with its 95 % CI, the verdict, and any caution."""
        verdict = self.verdict
        if verdict == NO_DIFFERENCE and self.threshold and (self.ci_low > 0 or self.ci_high < 0):
            # the CI excludes no change, but not the band within the threshold: say so, not "no difference"
            verdict += f" beyond +/-{self.threshold:.0%}"
        if self.too_noisy:
            verdict += f" ({self.too_noisy})"
        line = (f"{self.metric}: {number(float(self.baseline))} -> {number(float(self.candidate))} ({self.rel_change:+.1%}, "
                f"95% CI {self.ci_low:+.1%} to {self.ci_high:+.1%}): {verdict}")
        return line + (f" [caution: {self.caution}]" if self.caution else "")


def compare_groups(base: list[np.ndarray], cand: list[np.ndarray], m: Metric, threshold: float = 0.0,
                   confidence: float = 0.95) -> Comparison:
    """Relative change of candidate vs baseline, its CI, and a verdict.

    A change counts only when the whole CI lies beyond `threshold` (a practical minimum, e.g. 0.05 for
    "more than 5 %"); otherwise the difference is not detectable at this noise.
    """
    check_numbers("a comparison", {"threshold": (threshold, NON_NEGATIVE), "confidence": (confidence, PROBABILITY)})
    a, b = point(base, m), point(cand, m)
    if m.level == "trial" and min(sum(len(g) for g in base), sum(len(g) for g in cand)) < 2:
        # one trial-level value has no spread to compare against: its "interval" would have zero width
        return Comparison(m.name, a, b, b / a - 1 if a else float("nan"), float("nan"), float("nan"),
                          TOO_FEW)
    rel = replicates(cand, m, seed=2) / replicates(base, m, seed=1) - 1
    alpha = (1 - confidence) / 2
    low, high = interval(rel, alpha)
    return Comparison(m.name, a, b, b / a - 1 if a else float("nan"), low, high, verdict(low, high, m, threshold),
                      threshold)


def verdict(low: float, high: float, m: Metric, threshold: float = 0.0) -> str:
    """The verdict of a relative change's interval: it counts only when all of it lies beyond `threshold`."""
    if low > threshold:
        direction = "higher"
    elif high < -threshold:
        direction = "lower"
    else:
        return NO_DIFFERENCE
    return WORSE if (direction == "higher") == m.lower_is_better else BETTER


# two-sided 95 % quantiles of Student's t for 1..10 degrees of freedom; beyond, the Cornish-Fisher expansion
# around the normal quantile is within 0.001 of them
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def t_quantile(df: int) -> float:
    """Student's t 97.5 % quantile: the half-width factor of a 95 % interval from `df` degrees of freedom."""
    if df < 1:
        raise ValueError("a t interval needs at least one degree of freedom (two values)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def same_launch_move(results, arm: str, again: str, m: Metric) -> tuple[float, float] | None:
    """How far one launch moved between two arms that ran it (a control on another GPU, a repeat later in the
    run): (change, far end of its 95 % interval in absolute value); None where nothing can be said."""
    c = compare_groups(groups(results, arm, m), groups(results, again, m), m)
    ends = [abs(x) for x in (c.ci_low, c.ci_high, c.rel_change) if pd.notna(x)]
    return (c.rel_change, max(ends)) if ends else None


def compare(results, baseline_arm: str, candidate_arm: str, metric_name: str, threshold: float = 0.0) -> Comparison:
    """`compare_groups` on one metric between two complete arms of the results, aware of the machine: the
    comparison carries a caution where the arms' GPU clocks or slowdowns (labkit.analyze.gpu_state) or the
    host's outside load (labkit.analyze.noise) differed, and a better/worse that the load alone explains
    becomes TOO_NOISY."""
    for arm in (baseline_arm, candidate_arm):
        if arm not in results.complete_arms:
            raise BadParameter(f"arm {arm!r} has no complete results; complete arms: {results.complete_arms}")
    m = metric(metric_name)
    c = compare_groups(groups(results, baseline_arm, m), groups(results, candidate_arm, m), m, threshold)
    return machine_aware(results, baseline_arm, candidate_arm, m, c)


def machine_aware(results, baseline_arm: str, candidate_arm: str, m: Metric, c: Comparison) -> Comparison:
    """The comparison of two arms' values with how the machine moved between their trials: the GPU's and the
    host's cautions joined, where the arms ran, how far the reference's repeat moved (labkit.analyze.drift), and
    TOO_NOISY (with the reason) for a better/worse the outside load, the GPUs' spread or the run's drift explains."""
    notes = [n for n in (gpu_state.caution(results.trials, baseline_arm, candidate_arm),
                         noise.caution(results, baseline_arm, candidate_arm),
                         placement.caution(results, baseline_arm, candidate_arm, m),
                         drift.caution(results, baseline_arm, candidate_arm, m)) if n]
    why = None
    if c.verdict in (BETTER, WORSE):
        why = (noise.explains(results, baseline_arm, candidate_arm, m, c.rel_change)
               or placement.explains(results, baseline_arm, candidate_arm, m, c.rel_change)
               or drift.explains(results, baseline_arm, candidate_arm, m, c.rel_change))
    return replace(c, caution="; ".join(notes) or None, **({"verdict": TOO_NOISY, "too_noisy": why} if why else {}))


@shows_whole
def by_load(results, arm: str, x_by_load: dict[str, float], metrics: list[str], x: str = "x") -> pd.DataFrame:
    """One arm's metrics across loads that differ in one quantity (prompt length, distinct prefixes...): one
    row per load with that quantity as column `x`, and each metric's value with `_low` and `_high` (95 %)."""
    rows = []
    for load, value in x_by_load.items():
        summary = summarize(results.select(load), metrics).set_index(["arm", "metric"])
        if arm not in summary.index.get_level_values("arm"):
            continue
        row = {"load": load, x: value}
        for name in metrics:
            low, point_, high = summary.loc[(arm, name), ["ci_low", "value", "ci_high"]]
            row.update({name: point_, f"{name}_low": low, f"{name}_high": high})
        rows.append(row)
    return pd.DataFrame(rows)


class ArmComparisons(list):
    """(arm, baseline arm, Comparison) for every other arm and metric: prints as one sentence per line,
    `.table()` gives the numbers as a DataFrame."""

    def table(self) -> pd.DataFrame:
        """The comparisons as a DataFrame: one row per arm and metric, with the arm it was compared against."""
        return pd.DataFrame([{"arm": arm, "vs": vs, **c.__dict__} for arm, vs, c in self])

    def __str__(self) -> str:
        return "\n".join(f"{arm} vs {vs}: {c.sentence()}" for arm, vs, c in self)


def compare_arms(results, baseline_arm: str, metrics: list[str] | None = None,
                 threshold: float = 0.0) -> ArmComparisons:
    """Every other complete arm against the baseline arm, per metric, as printable comparisons."""
    names = metric_names(metrics, VERDICT_METRICS)
    return ArmComparisons((arm, baseline_arm, compare(results, baseline_arm, arm, name, threshold))
                          for arm in results.complete_arms if arm != baseline_arm for name in names)


@shows_whole
def ab_record(results, baseline_arm: str, metrics: list[str], threshold: float = 0.0) -> pd.DataFrame:
    """The record a team files: per load, arm and metric the value with its CI, and the change against
    the baseline arm with its CI and verdict; `caution` names GPU clocks that differed between the two arms
    or trials the driver slowed (labkit.analyze.gpu_state), where they were sampled, and outside load on the
    host that differed or was heavy (labkit.analyze.noise); a verdict the load explains is TOO_NOISY."""
    if baseline_arm not in results.complete_arms:
        raise BadParameter(f"no complete arm {baseline_arm!r} to compare with; complete arms: {results.complete_arms}")
    rows = []
    for load, part in results.per_load():
        summary = summarize(part, metrics)
        for row in summary.itertuples():
            entry = {"load": load, "arm": row.arm, "metric": row.metric, "value": row.value,
                     "ci_low": row.ci_low, "ci_high": row.ci_high}
            if row.arm != baseline_arm and baseline_arm in part.measured_arms:
                c = compare(part, baseline_arm, row.arm, row.metric, threshold)
                entry.update(change=c.rel_change, change_ci_low=c.ci_low, change_ci_high=c.ci_high, verdict=c.verdict,
                             caution=c.caution)
            rows.append(entry)
    record = pd.DataFrame(rows)
    record.attrs["reference"] = baseline_arm  # the arm the changes are against (labkit.present.tables)
    return record


def joined_cautions(cautions: pd.Series) -> str:
    """The cautions of several rows (an arm's metrics) as one text, each note once: the host's load is the same
    for every metric of an arm, and is said once."""
    notes = [note for caution in cautions.dropna() for note in caution.split("; ")]
    return "; ".join(dict.fromkeys(notes))


def arm_outcomes(record: pd.DataFrame, baseline_arm: str) -> pd.DataFrame:
    """One row per load (where the record has loads) and compared arm: the metrics it wins and loses on,
    those too noisy to judge, the advice that follows, any caution about the machine, and the same as one
    sentence. A metric too noisy to judge is no verdict: it may hide a loss or a gain, so the advice is to
    measure again on a quiet machine, whatever the other metrics say."""
    others = record.dropna(subset=["verdict"]) if "verdict" in record else record.iloc[0:0]
    keys = ["load", "arm"] if "load" in others else ["arm"]
    rows = []
    for key, part in others.groupby(keys, sort=False):
        arm = key[-1] if isinstance(key, tuple) else key
        better = sorted(set(part.loc[part.verdict == BETTER, "metric"]))
        worse = sorted(set(part.loc[part.verdict == WORSE, "metric"]))
        noisy = sorted(set(part.loc[part.verdict == TOO_NOISY, "metric"]))
        if arm == drift.repeat_arm(baseline_arm):  # the same launch again: what it shows is the run's drift
            moved = ", ".join([f"better on {m}" for m in better] + [f"worse on {m}" for m in worse]) \
                or "no detectable move"
            advice = drift.DRIFT_ADVICE
            sentence = f"{arm}: {baseline_arm}'s launch measured again after the other arms, {moved}"
        elif noisy:
            judged = ([f"better on {', '.join(better)}"] if better else []) + (
                [f"worse on {', '.join(worse)}"] if worse else [])
            drifted = "caution" in part and part.caution.fillna("").str.contains(drift.MARK, regex=False).any()
            advice = drift.ADVICE if drifted else noise.ADVICE
            why = "the machine or the arms' order" if drifted else "the host's outside load"
            sentence = (f"{arm}: {TOO_NOISY} on {', '.join(noisy)}, {why} can explain the change"
                        + (f" ({'; '.join(judged)})" if judged else ""))
        elif better and not worse:
            advice, sentence = "consider it", f"{arm} beats {baseline_arm} on {', '.join(better)} and loses on nothing"
        elif worse and not better:
            advice, sentence = f"keep {baseline_arm}", f"{arm} is worse on {', '.join(worse)}"
        elif better:
            advice, sentence = "choose by your SLO", f"{arm} trades {', '.join(worse)} for {', '.join(better)}"
        else:
            advice, sentence = f"keep {baseline_arm}", f"{arm}: no detectable difference from {baseline_arm} at this noise"
        notes = joined_cautions(part.caution) if "caution" in part else ""
        sentence += f": {advice}" + (f" (caution, the machine moved too: {notes})" if notes else "")
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "better on": ", ".join(better),
                     "worse on": ", ".join(worse), "too noisy on": ", ".join(noisy), "advice": advice,
                     "caution": notes, "sentence": sentence})
    return pd.DataFrame(rows, columns=keys + ["better on", "worse on", "too noisy on", "advice", "caution", "sentence"])


def conclusion(record: pd.DataFrame, baseline_arm: str) -> str:
    """One line: which arm, if any, beats the baseline without losing on any metric."""
    outcomes = arm_outcomes(record, baseline_arm)
    if outcomes.empty:
        return f"only {baseline_arm!r} was measured: nothing to compare"
    return "; ".join(outcomes.sentence)


@shows_whole
def differences(results, baseline_arm: str, candidate_arm: str, metrics: list[str],
                confidence: float = 0.95) -> pd.DataFrame:
    """Per load and metric: what the candidate adds to the baseline in the metric's own unit (ms, tokens/s),
    with the bootstrap interval of the difference: e.g. the milliseconds an API server adds to TTFT."""
    check_numbers("differences", {"confidence": (confidence, PROBABILITY)})
    alpha = (1 - confidence) / 2
    rows = []
    for load, part in results.per_load():
        if not {baseline_arm, candidate_arm} <= set(part.measured_arms):
            continue
        for name in metric_names(metrics, VERDICT_METRICS):
            m = metric(name)
            base, cand = groups(part, baseline_arm, m), groups(part, candidate_arm, m)
            added = replicates(cand, m, seed=2) - replicates(base, m, seed=1)
            rows.append({"load": load, "metric": name, baseline_arm: point(base, m), candidate_arm: point(cand, m),
                         "added": point(cand, m) - point(base, m), "added_low": float(np.nanquantile(added, alpha)),
                         "added_high": float(np.nanquantile(added, 1 - alpha))})
    return pd.DataFrame(rows)


@shows_whole
def stepwise_contributions(results, metric_name: str, path: list[str]) -> pd.DataFrame:
    """How much of the change from path[0] to path[-1] each step explains (e.g. eager -> compile only ->
    compile + graphs: the share of the gap due to torch.compile and to CUDA graphs)."""
    m = metric(metric_name)
    values = [point(groups(results, arm, m), m) for arm in path]
    total = values[-1] - values[0]
    return pd.DataFrame([{"step": f"{a} -> {b}", metric_name: vb - va,
                          "share_of_total_pct": 100 * (vb - va) / total if total else float("nan")}
                         for a, b, va, vb in zip(path, path[1:], values, values[1:])])


@shows_whole
def ranking(results, metric_name: str) -> pd.DataFrame:
    """Arms ordered best first; each compared with the best, so that ties within noise are called so."""
    m = metric(metric_name)
    summary = summarize(results, [metric_name]).sort_values("value", ascending=m.lower_is_better)
    if summary.empty:
        return summary
    best = summary.arm.iloc[0]
    verdicts = []
    for arm in summary.arm:
        if arm == best:
            verdicts.append("best")
            continue
        c = compare(results, best, arm, metric_name)
        verdicts.append("within noise of the best" if c.verdict == NO_DIFFERENCE
                        else f"{c.rel_change:+.1%} vs the best ({c.verdict})")
    return summary.assign(rank=range(1, len(summary) + 1), verdict=verdicts).reset_index(drop=True)
