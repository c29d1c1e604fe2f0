"""Tensor parallelism against replicas: the 15 % rule, throughput per GPU, the communication share and
the NCCL settings a parallel run was measured with.

The rule: if TP=2 single-request latency is more than 15 % worse than TP=1, communication eats the split:
go back to TP=1 or scale with replicas. It is applied with the CI of the relative change (stats.compare
with a threshold), so a difference inside the noise is called noise, not a verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from labkit.analyze import audit, stats

TP_RULE_THRESHOLD = 0.15
LATENCY_METRICS = ("tpot_p50_ms", "ttft_p50_ms")
FIRES = "communication eats the split"
PASSES = "the split is within the 15 % budget"
UNDECIDED = "cannot tell at this noise"
NOT_MEASURABLE = "not measurable here"


def scope_note(plan: pd.DataFrame, split: str = "tp2", replicas: str = "dp2") -> str:
    """In plain words, from `Experiment.plan_table()`: which arms run here and, for those that cannot, why
    and which comparison is lost with them."""
    skipped = plan[~plan.runs_here]
    if skipped.empty:
        return f"every arm runs here ({', '.join(plan.arm)}): the comparison is measured on this machine"
    reasons = "\n".join(f"  {row.arm}: {row.why_not}" for row in skipped.itertuples())
    running = ", ".join(plan.arm[plan.runs_here]) or "none"
    lost = []
    if split in set(skipped.arm):
        lost.append("the 15 % rule (TP=1 against TP=2)")
    if {split, replicas} & set(skipped.arm):
        lost.append("replicas against the split model (output per GPU)")
    if ({split} | set(COMMUNICATION_ARMS)) & set(skipped.arm) and set(COMMUNICATION_ARMS) & set(plan.arm):
        lost.append("the communication settings (NCCL's P2P path, vLLM's custom all-reduce)")
    return (f"runs here: {running}. Not applicable here:\n{reasons}\nReported as not measurable on this machine: "
            f"{'; '.join(lost) or 'nothing'}. Two GPUs, one per rank or replica, measure all of it.")


def _status(results, arm: str) -> tuple[str, str | None]:
    arms = results.arms.set_index("arm") if len(results.arms) else pd.DataFrame()
    if arm not in arms.index:
        return "not measured", None
    row = arms.loc[arm]
    return str(row["status"]), row.get("cause") if isinstance(row.get("cause"), str) else None


@dataclass(frozen=True)
class TPVerdict:
    """The 15 % rule's outcome: its status, the advice in words, the comparisons it rests on and the threshold."""

    status: str  # FIRES, PASSES, UNDECIDED or NOT_MEASURABLE
    advice: str
    comparisons: tuple[stats.Comparison, ...] = ()
    threshold: float = TP_RULE_THRESHOLD

    def sentence(self) -> str:
        """The status and advice on one line, then the CI rule and one line per comparison (when there are any)."""
        lines = [f"TP=2 vs TP=1, single request: {self.status}: {self.advice}"]
        if self.comparisons:
            lines.append(f"  (a verdict below needs the whole 95 % CI beyond +/-{self.threshold:.0%})")
        lines += [f"  {c.sentence()}" for c in self.comparisons]
        return "\n".join(lines)

    def table(self) -> pd.DataFrame:
        """The comparisons as a DataFrame, with `beyond_rule`: whether the whole CI lies above the threshold."""
        return pd.DataFrame([{**c.__dict__, "beyond_rule": c.ci_low > self.threshold} for c in self.comparisons])


def tp_rule(results, baseline: str = "tp1", candidate: str = "tp2", metrics=LATENCY_METRICS,
            threshold: float = TP_RULE_THRESHOLD) -> TPVerdict:
    """The 15 % rule on one single-request load (pass `results.select(load)`).

    Fires when, for any latency metric, the whole CI of TP=2's relative change lies above the threshold;
    passes when every CI's upper end lies below it; otherwise the noise is too large to say."""
    for arm in (baseline, candidate):
        status, cause = _status(results, arm)
        if status != "complete":
            why = f": {cause}" if cause else ""
            return TPVerdict(NOT_MEASURABLE, f"arm {arm!r} is {status}{why}. Without both TP=1 and TP=2 measured "
                                             "on this machine there is nothing to compare", (), threshold)
    comparisons = tuple(stats.compare(results, baseline, candidate, m, threshold) for m in metrics)
    fired = [c.metric for c in comparisons if c.ci_low > threshold]
    if fired:
        return TPVerdict(FIRES, f"{', '.join(fired)} more than {threshold:.0%} worse with TP=2 (whole CI above): "
                                "go back to TP=1, or scale with replicas", comparisons, threshold)
    if all(c.ci_high < threshold for c in comparisons):
        faster = [c.metric for c in comparisons if c.ci_high < 0]
        gain = f"; TP=2 is faster on {', '.join(faster)}" if faster else ""
        return TPVerdict(PASSES, f"keep TP=2 where its memory or its latency is needed{gain}", comparisons,
                         threshold)
    return TPVerdict(UNDECIDED, f"a CI straddles +{threshold:.0%}: measure more trials or requests before "
                                "deciding", comparisons, threshold)


def gpus_per_arm(results) -> pd.DataFrame:
    """tp, pp, dp and the GPUs one launch of each arm takes: every data-parallel replica holds its own tensor x
    pipeline group, so tp x pp x dp (as labkit.spec.knobs.gpus_needed counts them before a launch; that module
    reads the machine, which an analysis never imports). vLLM's resolved sizes where recorded, else the knobs
    asked for, else 1."""
    arms = results.arms
    rows = []
    for _, row in arms.iterrows():
        sizes = {}
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = row.get(name)
            if value is None or pd.isna(value):
                value = row.get(f"knob.{name}")
            sizes[name] = int(value) if value is not None and not pd.isna(value) else 1
        rows.append({"arm": row["arm"], "tp": sizes["tensor_parallel_size"], "pp": sizes["pipeline_parallel_size"],
                     "dp": sizes["data_parallel_size"], "gpus": math.prod(sizes.values())})
    return pd.DataFrame(rows, columns=["arm", "tp", "pp", "dp", "gpus"])


def throughput_per_gpu(results) -> pd.DataFrame:
    """Output tokens per second per GPU (output_tok_s / (tp x pp x dp)) with its CI, for one load; arms that did
    not run here are listed with their status and reason."""
    sizes = gpus_per_arm(results).set_index("arm")
    summary = stats.summarize(results, ["output_tok_s"]).set_index("arm")
    rows = []
    for arm in results.arms.arm:
        status, cause = _status(results, arm)
        entry = {"arm": arm, "status": status, **sizes.loc[arm].to_dict(), "why_not": cause}
        if arm in summary.index:
            s, g = summary.loc[arm], sizes.loc[arm, "gpus"]
            entry.update(output_tok_s=s.value, output_tok_s_per_gpu=s.value / g,
                         per_gpu_ci_low=s.ci_low / g, per_gpu_ci_high=s.ci_high / g)
        rows.append(entry)
    columns = ["arm", "status", "tp", "dp", "gpus", "output_tok_s", "output_tok_s_per_gpu", "per_gpu_ci_low",
               "per_gpu_ci_high", "why_not"]
    return pd.DataFrame(rows).reindex(columns=columns)


def compare_per_gpu(results, baseline: str, candidate: str) -> stats.Comparison | None:
    """Throughput per GPU of candidate against baseline, with the CI of the change; None when either did not
    run here. Each trial's throughput is divided by its arm's GPU count before the bootstrap."""
    if any(_status(results, arm)[0] != "complete" for arm in (baseline, candidate)):
        return None
    sizes = gpus_per_arm(results).set_index("arm")["gpus"]
    m = stats.metric("output_tok_s")
    base = [g / sizes[baseline] for g in stats.groups(results, baseline, m)]
    cand = [g / sizes[candidate] for g in stats.groups(results, candidate, m)]
    return replace(stats.machine_aware(results, baseline, candidate, m, stats.compare_groups(base, cand, m)),
                   metric="output_tok_s_per_gpu")


def replicas_or_split(results, split: str = "tp2", replicas: str = "dp2") -> str:
    """One line: on the same GPUs, do replicas or a split model give more output per GPU (one load)?"""
    c = compare_per_gpu(results, split, replicas)
    if c is None:
        missing = [f"{arm!r} is {s}" + (f" ({why})" if why else "") for arm in (split, replicas)
                   for s, why in [_status(results, arm)] if s != "complete"]
        return f"{NOT_MEASURABLE}: {'; '.join(missing)}"
    if c.verdict == stats.BETTER:
        return f"replicas ({replicas}) give more output per GPU than the split ({split}): {c.sentence()}"
    if c.verdict == stats.WORSE:
        return f"the split ({split}) gives more output per GPU than replicas ({replicas}): {c.sentence()}"
    return f"no detectable difference per GPU between {replicas} and {split}: {c.sentence()}"


def communication_share(analyses: dict[str, dict]) -> pd.DataFrame:
    """Per profiled arm: communication (NCCL, custom all-reduce) as % of busy device time and of the window."""
    rows = []
    for arm, a in analyses.items():
        shares = a["shares"].set_index("category")
        has = "communication" in shares.index
        rows.append({"arm": arm, "source": a["source"],
                     "communication_pct_of_busy": float(shares.loc["communication", "busy_pct"]) if has else 0.0,
                     "communication_pct_of_window": float(shares.loc["communication", "share_pct"]) if has else 0.0,
                     "window_ms": a["window_ms"], "bottleneck": a["bottleneck"][0]})
    return pd.DataFrame(rows)


def communication_variables(results) -> pd.DataFrame:
    """The NCCL_* variables each measured arm ran with, and who set them."""
    rows = []
    for arm, env in results.environment.items():
        for source, who in (("tuning_variables", "user or the lab, before vLLM"), ("set_by_vllm", "vLLM")):
            for name, value in sorted(env.get(source, {}).items()):
                if name.startswith("NCCL_"):
                    rows.append({"arm": arm, "variable": name, "value": value,
                                 "set_by": audit.ARM_KNOB if audit.set_by_arm_knob(env, name) else who})
    return pd.DataFrame(rows, columns=["arm", "variable", "value", "set_by"])


# the communication settings of a TP=2 engine, each one change from the split arm: name -> (knobs, what changes)
COMMUNICATION_ARMS = {
    "tp2_p2p_off": ({"tensor_parallel_size": 2, "environment": {"NCCL_P2P_DISABLE": "1"}},
                    "NCCL's peer-to-peer path off (NCCL_P2P_DISABLE=1): all-reduce traffic leaves NVLink, as on a "
                    "PCIe-only pair"),
    "tp2_custom_all_reduce_off": ({"tensor_parallel_size": 2, "custom_all_reduce": False},
                                  "vLLM's custom all-reduce off: NCCL's all-reduce at every step"),
}


def communication_arms() -> dict[str, dict]:
    """The communication arms' knobs, to add to a parallelism experiment beside its split arm."""
    return {arm: dict(knobs) for arm, (knobs, _) in COMMUNICATION_ARMS.items()}


def communication_settings(results, split: str = "tp2", metric: str = "tpot_p50_ms") -> pd.DataFrame:
    """One row per communication arm on one single-request load (pass `results.select(load)`): what it
    changes against the split arm, the change of `metric` with its 95 % CI and the verdict, or why it is not
    measurable here."""
    rows = []
    for arm, (_, change) in COMMUNICATION_ARMS.items():
        row = {"arm": arm, "change": change}
        missing = [(a, *status) for a in (split, arm) if (status := _status(results, a))[0] != "complete"]
        if missing:
            a, status, cause = missing[0]
            row.update(verdict=NOT_MEASURABLE, why=f"arm {a!r} is {status}" + (f": {cause}" if cause else ""))
        else:
            c = stats.compare(results, split, arm, metric)
            row.update(verdict=c.verdict, why=c.sentence())
        rows.append(row)
    return pd.DataFrame(rows)
