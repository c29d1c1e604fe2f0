"""Where the engine's time goes, read from a torch-profiler trace, and which bottleneck that points to.

vLLM writes a chrome trace per worker (`<prefix_>rank0.<ns>.pt.trace.json.gz` on 0.32, `...-rank-0...` from
the CPU worker on 0.26) plus a frontend trace (`<host>_<pid>.async_llm.<ns>...`) that holds no operators.
On a GPU the worker trace has the kernels that ran on the device; on a CPU it has only host operators, so
the analysis falls back to the outermost CPU operators, and says so, rather than comparing unlike things.

The trace is parsed by hand: its complete events ("ph": "X") are all that is needed. HolisticTraceAnalysis
(PyPI `HolisticTraceAnalysis`) does more, but pulls in jupyterlab, plotly, networkx and pydot, expects GPU
streams (a CPU trace has none), and is not a dependency of the lab.

Time is measured on the busiest device (trace pid) with all its streams merged as a union of intervals:
the device is busy when any stream runs, idle otherwise, and a moment covered by two events counts once
(for the one that started first). Categories plus idle gaps then add up to the window, first start to last end.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.errors import BadParameter

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
IDLE = "idle gaps"

# First match wins, so the specific families come before the broad elementwise words ("add" would
# otherwise take "addmm", "reduce" take "all_reduce", "mul" take "multinomial").
CATEGORY_RULES: list[tuple[str, str]] = [
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device|custom_ar|"
                      r"c10d::|send|recv"),
    ("memory copy", r"memcpy|memset|copy_|^aten::_?to(_copy)?$|contiguous|clone"),
    ("sampling", r"sampler|sampling|top_?k|top_?p|argmax|multinomial|gumbel|exponential_"),
    ("attention", r"flash|fmha|attention|attn|paged|sdpa|scaled_dot_product|reshape_and_cache|kv_cache|"
                  r"mla_|merge_attn"),
    ("gemm", r"gemm|matmul|(^|[^a-z])b?mm([^a-z]|$)|addmm|cutlass|cublas|xmma|nvjet|linear|wgmma|"
             r"splitk|scaled_mm|marlin|machete"),
    ("norm/activation/elementwise", r"norm|rms|silu|gelu|swiglu|act_and_mul|elementwise|vectorized|unrolled|"
                                    r"add|mul|sub|div|rotary|rope|softmax|reduce|mean|pow|rsqrt|exp|"
                                    r"fill|where|embedding|index|triton_"),
]
_COMPILED = [(label, re.compile(pattern, re.IGNORECASE)) for label, pattern in CATEGORY_RULES]

# The bottleneck rules: GEMM, communication and attention shares are of busy time, idle is of the window.
GEMM_BOUND_PCT = 80.0
GEMM_BOUND_MAX_IDLE_PCT = 10.0
COMMUNICATION_BOUND_PCT = 20.0
IDLE_BOUND_PCT = 30.0
ATTENTION_BOUND_PCT = 40.0


def load_trace(path: str | Path) -> pd.DataFrame:
    """Complete events of a chrome trace; gzip is detected from the bytes, since names do not always say."""
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadParameter(f"cannot read the profiler trace {path}: {type(exc).__name__}: {exc}") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    rows = [(e.get("name", ""), e.get("cat", ""), e.get("ts", 0.0), e.get("dur", 0.0), e.get("pid", ""),
             e.get("tid", "")) for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    df = pd.DataFrame(rows, columns=["name", "cat", "ts_us", "dur_us", "pid", "tid"])
    # pids mix numbers and labels ("Spans"); as text they group and sort without type errors.
    df = df.astype({"name": str, "cat": str, "ts_us": float, "dur_us": float, "pid": str, "tid": str})
    return df


def _top_level(ops: pd.DataFrame) -> pd.DataFrame:
    """Drop operators that start inside an earlier one of the same thread: their time is their parent's."""
    ops = ops.sort_values(["pid", "tid", "ts_us", "dur_us"], ascending=[True, True, True, False])
    end = ops["ts_us"] + ops["dur_us"]
    covered_until = end.groupby([ops["pid"], ops["tid"]]).transform(lambda s: s.cummax().shift())
    return ops[~(ops["ts_us"] < covered_until)]


def device_events(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The events that did the work: GPU kernels and copies, or (a CPU trace) the outermost CPU operators."""
    gpu = df[df["cat"].str.lower().isin(DEVICE_CATS)]
    if len(gpu):
        return gpu.sort_values("ts_us").reset_index(drop=True), "gpu kernels"
    cpu = df[df["cat"] == "cpu_op"]
    if cpu.empty:
        raise BadParameter("the trace has no GPU kernels and no CPU operators: pass a worker trace "
                           "(rank*.pt.trace.json.gz), not the frontend's *.async_llm.* one")
    return _top_level(cpu).sort_values("ts_us").reset_index(drop=True), "cpu operators"


def categorize(name: str, cat: str | None = None) -> str:
    """The category of a kernel or operator name by the first rule it matches ("memory copy" for GPU
    memcpy/memset events), else "other"."""
    if cat is not None and cat.lower() in ("gpu_memcpy", "gpu_memset"):
        return "memory copy"
    for label, pattern in _COMPILED:
        if pattern.search(name):
            return label
    return "other"


NAME_WIDTH = 160


def kernel_summary(events: pd.DataFrame, top: int = 15) -> pd.DataFrame:
    """Heaviest kernels (or operators) by total time; share is of the summed time of all given events."""
    grouped = events.groupby("name", sort=False).agg(count=("dur_us", "size"), total_us=("dur_us", "sum"),
                                                       cat=("cat", "first"))
    total = grouped["total_us"].sum()
    out = grouped.sort_values("total_us", ascending=False).head(top).reset_index()
    out["total_ms"] = out["total_us"] / 1000.0
    out["mean_us"] = out["total_us"] / out["count"]
    out["share_pct"] = 100.0 * out["total_us"] / total if total > 0 else 0.0
    out["category"] = [categorize(n, c) for n, c in zip(out["name"], out["cat"])]
    # templated GPU kernel names run to a thousand characters; the head names the kernel
    out["name"] = [n if len(n) <= NAME_WIDTH else n[:NAME_WIDTH - 1] + "…" for n in out["name"]]
    return out[["name", "category", "count", "total_ms", "mean_us", "share_pct"]]


def _timeline(events: pd.DataFrame) -> pd.DataFrame:
    """The busiest device's events, each with the part of its time that no earlier event already covered."""
    if events.empty:
        raise BadParameter("no device events to analyse")
    busiest = events.groupby("pid")["dur_us"].sum().idxmax()
    ev = events[events["pid"] == busiest].sort_values(["ts_us", "dur_us"], ascending=[True, False])
    start = ev["ts_us"].to_numpy()
    end = start + ev["dur_us"].to_numpy()
    covered = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])  # furthest end before each event
    own = np.clip(end - np.maximum(start, covered), 0.0, None)
    gap = np.clip(start - covered, 0.0, None)
    gap[0] = 0.0
    return pd.DataFrame({"name": ev["name"].to_numpy(), "cat": ev["cat"].to_numpy(), "start": start, "end": end,
                         "own_us": own, "gap_before_us": gap})


def time_shares(events: pd.DataFrame) -> pd.DataFrame:
    """Categories and idle gaps as shares of the window, so they add up to 100 %; busy_pct is of busy time."""
    tl = _timeline(events)
    window = tl["end"].max() - tl["start"].min()
    tl["category"] = [categorize(n, c) for n, c in zip(tl["name"], tl["cat"])]
    busy = tl.groupby("category")["own_us"].sum().sort_values(ascending=False)
    busy_total = busy.sum()
    idle = tl["gap_before_us"].sum()
    out = pd.DataFrame({"category": list(busy.index) + [IDLE], "ms": list(busy.to_numpy() / 1000.0) + [idle / 1000.0]})
    out["share_pct"] = 100.0 * out["ms"] * 1000.0 / window if window > 0 else 0.0
    out["busy_pct"] = [100.0 * v / busy_total if busy_total > 0 else 0.0 for v in busy.to_numpy()] + [np.nan]
    return out


def gap_stats(events: pd.DataFrame) -> dict:
    """How often, and for how long, the device waited between one event and the next."""
    tl = _timeline(events)
    window = tl["end"].max() - tl["start"].min()
    gaps = tl["gap_before_us"][tl["gap_before_us"] > 0]
    return {"n_gaps": int(len(gaps)),
            "median_gap_us": float(gaps.median()) if len(gaps) else 0.0,
            "total_gap_ms": float(gaps.sum() / 1000.0),
            "idle_share_pct": float(100.0 * gaps.sum() / window) if window > 0 else 0.0,
            "window_ms": float(window / 1000.0)}


def bottleneck(shares_df: pd.DataFrame) -> tuple[str, str]:
    """The first rule that fires, in the spec's order, with the numbers that made it fire."""
    ms = shares_df.set_index("category")["ms"]
    idle_ms = float(ms.get(IDLE, 0.0))
    busy_ms = float(ms.drop(IDLE, errors="ignore").sum())
    window_ms = busy_ms + idle_ms

    def busy_pct(category: str) -> float:
        return 100.0 * float(ms.get(category, 0.0)) / busy_ms if busy_ms > 0 else 0.0

    idle = 100.0 * idle_ms / window_ms if window_ms > 0 else 0.0
    gemm, comm, attn = busy_pct("gemm"), busy_pct("communication"), busy_pct("attention")
    if gemm > GEMM_BOUND_PCT and idle < GEMM_BOUND_MAX_IDLE_PCT:
        return ("compute-bound: at the GEMM limit (quantize, or a bigger GPU)",
                f"GEMM {gemm:.1f} % of busy time > {GEMM_BOUND_PCT:g} % and idle {idle:.1f} % "
                f"< {GEMM_BOUND_MAX_IDLE_PCT:g} %")
    if comm > COMMUNICATION_BOUND_PCT:
        return ("communication-bound: tensor parallelism over-sharded or poor topology",
                f"communication {comm:.1f} % of busy time > {COMMUNICATION_BOUND_PCT:g} %")
    if idle > IDLE_BOUND_PCT:
        return ("launch/scheduling-bound: many gaps between kernels (CUDA graphs, larger batches)",
                f"idle {idle:.1f} % of the window > {IDLE_BOUND_PCT:g} %")
    if attn > ATTENTION_BOUND_PCT:
        return ("attention-bound: long contexts (attention backend, KV dtype)",
                f"attention {attn:.1f} % of busy time > {ATTENTION_BOUND_PCT:g} %")
    return ("mixed: no single bottleneck",
            f"no rule fired (GEMM {gemm:.1f} %, communication {comm:.1f} %, attention {attn:.1f} % of busy "
            f"time; idle {idle:.1f} % of the window)")


def analyse(path: str | Path, top: int = 15) -> dict:
    """One trace analysed: its source (GPU kernels or CPU operators), window_ms, the heaviest kernels, the time
    shares, the gap statistics and the bottleneck (verdict, rule that fired)."""
    events, source = device_events(load_trace(path))
    shares = time_shares(events)
    gaps = gap_stats(events)
    return {"source": source, "window_ms": gaps["window_ms"], "kernels": kernel_summary(events, top),
            "shares": shares, "gaps": gaps, "bottleneck": bottleneck(shares)}


def summary(path: str | Path) -> dict:
    """What the analysis of a trace keeps when the trace itself is not kept: the bottleneck and its rule, the
    source, the time shares and the gaps, in a few hundred bytes. A GPU worker's trace runs to tens of MB,
    too large to travel with the evidence; the summary is recorded with the arm's facts."""
    found = analyse(path, top=0)
    verdict, rule = found["bottleneck"]
    return {"bottleneck": verdict, "rule": rule, "source": found["source"], "gaps": found["gaps"],
            "shares_pct": {r.category: round(float(r.share_pct), 2) for r in found["shares"].itertuples()}}


def find_traces(directory: str | Path) -> list[Path]:
    """Worker traces under a torch_profiler_dir, rank 0's first (the ranks of a split model run the same
    kernels), each rank's newest first; the frontend's async_llm traces are left out."""
    found = [p for p in Path(directory).rglob("*.pt.trace.json*") if ".async_llm." not in p.name]
    return sorted(found, key=lambda p: (_rank(p), -p.stat().st_mtime))


def _rank(trace: Path) -> int:
    match = re.match(r"(?:dp\d+[_-])?rank(\d+)\.", trace.name)
    return int(match.group(1)) if match else 0


def arm_trace(results, arm: str) -> Path:
    """The stored worker trace of an arm measured with `Protocol(profile_requests=...)`."""
    row = results.arms.set_index("arm").loc[arm] if arm in set(results.arms.arm) else None
    trace = None if row is None else row.get("profile_trace")
    if not isinstance(trace, str):
        raise BadParameter(f"arm {arm!r} has no profiler trace: measure it with lk.Protocol(profile_requests=N)")
    return results.arm_file(arm, trace)


def arm_bottleneck(results, arm: str) -> tuple[str, str]:
    """An arm's bottleneck and the rule that fired: from its stored trace, or, where the trace was not kept,
    from the summary recorded when it was measured."""
    row = results.arms.set_index("arm").loc[arm] if arm in set(results.arms.arm) else {}
    try:
        return analyse(arm_trace(results, arm))["bottleneck"]
    except (BadParameter, OSError) as missing:
        recorded = row.get("profile_summary")  # the store keeps a fact that is a dict as its JSON text
        recorded = json.loads(recorded) if isinstance(recorded, str) else {}
        if "bottleneck" in recorded:
            return recorded["bottleneck"], recorded["rule"] + " (from the summary recorded with the arm)"
        raise BadParameter(f"{missing}; and no summary was recorded with it (arms measured before summaries were "
                           "recorded have none): measure the arm again under a new experiment name to profile it"
                           ) from None


def profile_arms(results, top: int = 10) -> dict[str, dict]:
    """`analyse` for every complete arm that holds a trace."""
    return {arm: analyse(arm_trace(results, arm), top) for arm in results.complete_arms}


def side_by_side(analyses: dict[str, dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time shares per category with one column per arm, and one row per arm with its gaps and verdict."""
    shares = pd.concat({arm: a["shares"].set_index("category")["share_pct"] for arm, a in analyses.items()},
                       axis=1).fillna(0.0)
    verdicts = pd.DataFrame([{"arm": arm, "source": a["source"], "window_ms": a["window_ms"],
                              "gaps": a["gaps"]["n_gaps"], "median_gap_us": a["gaps"]["median_gap_us"],
                              "idle_pct": a["gaps"]["idle_share_pct"],
                              "bottleneck": a["bottleneck"][0], "rule": a["bottleneck"][1]}
                             for arm, a in analyses.items()])
    return shares, verdicts
