"""From a `vllm serve` command to a measured, ranked path of fixes.

The path deep tuning starts with: (1) the launch's effective configuration, audited (a leftover
--enforce-eager, graphs off, a non-default attention backend, user-set VLLM_*/NCCL_* variables...);
(2) the current launch measured under the user's workload; (3) one-change arms chosen from what the audit
found and what the hardware allows, each measured against the current launch with intervals; (4) the
changes that helped, combined and measured again; (5) a ranked table, a waterfall, the recommended
`vllm serve` line and one journal entry per step. It stops early when the current launch already meets the
SLO or nothing is left to try, and counts its engine starts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os

import pandas as pd

from labkit.analyze import audit, diagnosis, profiling, roofline, stats
from labkit.analyze.numerics import agreement_phrase
from labkit.analyze.slo import check_slo_limits
from labkit.errors import BadParameter
from labkit.experiment import Experiment
from labkit.measure.environment import check_multicast_off
from labkit.measure.numerics import stored_numerics
from labkit.measure.peaks import detect_peaks
from labkit.measure.platform import Platform, current_platform
from labkit.measure.serve_parse import parse_serve
from labkit.redact import redact_text, redacted_repr, secret_name
from labkit.shown import Facts, number
from labkit.spec.capabilities import has_fp8_tensor_cores
from labkit.spec.knobs import serve_args
from labkit.spec.launch import launch_command
from labkit.spec.numbers import NON_NEGATIVE, check_numbers
from labkit.spec.protocol import Protocol
from labkit.spec.serve_command import Launch
from labkit.spec.workload import Concurrency, Fixed, FromLog, Poisson, Workload
from labkit.store import Results


def user_workload(requests: int, prompt_len: int, output_len: int, clients: int, *, prompt_log: str = "",
                  output_log: str = "", rate: float = 0.0) -> Workload:
    """The load a diagnosis measures, as a user describes theirs: fixed lengths or lengths resampled from a log
    (a file of one length per line, e.g. from the service's access log), and `clients` requests in flight or,
    with a `rate`, Poisson arrivals at that many requests a second."""
    check_numbers("user_workload (rate is requests per second; 0: a closed loop of `clients`)",
                  {"rate": (rate, NON_NEGATIVE)})
    return Workload(requests, FromLog.read(prompt_log) if prompt_log else Fixed(prompt_len),
                    FromLog.read(output_log) if output_log else Fixed(output_len),
                    Poisson(rate) if rate else Concurrency(clients))


def candidate_changes(knobs: dict, platform: Platform, workload: Workload, model: str | None = None
                      ) -> dict[str, tuple[dict, str]]:
    """One-change arms for a launch: name -> (the launch's knobs with that one change, why it is tried).
    Dropping a knob means vLLM's own default for it (the arms named default_*)."""
    def without(*names):
        return {k: v for k, v in knobs.items() if k not in names}

    found = {}
    if knobs.get("enforce_eager"):
        found["no_enforce_eager"] = (without("enforce_eager"), "enforce_eager turns off torch.compile and CUDA "
                                       "graphs together: often left over from debugging")
    if knobs.get("cuda_graphs") is False or "cudagraph_capture_sizes" in knobs:
        found["default_cuda_graphs"] = (without("cuda_graphs", "cudagraph_capture_sizes"),
                                       "graphs off or narrowed: every decode step outside them pays launch overhead")
    if "attention_backend" in knobs:
        found["default_attention_backend"] = (without("attention_backend"), f"{knobs['attention_backend']} is set "
                                             "by hand; vLLM's first choice for this platform may be faster")
    clients = getattr(workload.arrival, "n", None)  # a closed loop's requests in flight
    if "max_num_seqs" in knobs and clients and knobs["max_num_seqs"] < clients:
        found["default_max_num_seqs"] = (without("max_num_seqs"), f"max_num_seqs={knobs['max_num_seqs']} is below "
                                        f"the load's {clients} requests in flight: the rest queue")
    if knobs.get("max_num_batched_tokens", 1 << 30) < 2048:
        found["default_batch_budget"] = (without("max_num_batched_tokens"), "a batch budget under 2,048 tokens "
                                        "splits prefills into many steps")
    if knobs.get("enable_prefix_caching") is False:
        found["prefix_caching_on"] = (without("enable_prefix_caching"), "prefix caching is off: shared prompt "
                                      "prefixes are computed again for every request")
    for name, value in knobs.get("environment", {}).items():
        if secret_name(name):  # a credential (VLLM_API_KEY) is not a tuning choice: the launch needs it
            continue
        rest = {k: v for k, v in knobs["environment"].items() if k != name}
        found[f"without_{name}"] = ({**without("environment"), **({"environment": rest} if rest else {})},
                                    redact_text(f"{name}={value} is set on the command line: it changes vLLM "
                                                "outside its flags, and vLLM's default may be faster"))
    found.update(speculation_changes(knobs, clients))
    if has_fp8_tensor_cores(platform) and not str(knobs.get("kv_cache_dtype", "auto")).startswith("fp8"):
        found["fp8_kv_cache"] = ({**knobs, "kv_cache_dtype": "fp8"}, "this GPU has fp8 tensor cores: an fp8 KV "
                                 "cache halves the bytes attention reads and doubles the pool's tokens ("
                                 + fp8_quality(platform, "fp8_kv", model) + ")")
    return found


def fp8_quality(platform: Platform, launch: str, model: str | None = None) -> str:
    """What is known of an fp8 launch's quality on this hardware: the greedy agreement with bf16 that the
    precision notebook measured and stored (labkit.measure.numerics.record_numerics), else the advice to check."""
    entry = stored_numerics(platform, model)
    phrase = agreement_phrase(entry, launch) if entry else None
    return f"measured against bf16: {phrase}" if phrase else "check its quality before deploying"


def speculation_changes(knobs: dict, clients: int | None) -> dict[str, tuple[dict, str]]:
    """A launch that speculates: the same without speculation, and k one notch down and up (1, 2, 3, 5, 8), since
    the k that pays depends on the batch and the text (L3_kernel/speculative_decoding.ipynb measures the grid)."""
    config = knobs.get("speculative")
    if not config:
        return {}
    k, batch = config.get("num_speculative_tokens", 0), f"{clients} requests in flight" if clients else "this load"
    found = {"no_speculation": ({k2: v for k2, v in knobs.items() if k2 != "speculative"},
                                f"speculation with k={k} pays only while drafts are accepted and a step is not "
                                f"compute-bound: at {batch} it may cost more than it saves")}
    steps = sorted({1, 2, 3, 5, 8, k})
    at = steps.index(k)
    for other in ([steps[at - 1]] if at > 0 else []) + ([steps[at + 1]] if at + 1 < len(steps) else []):
        found[f"speculative_k{other}"] = ({**knobs, "speculative": {**config, "num_speculative_tokens": other}},
                                          f"k={other} instead of {k}: a {'shorter' if other < k else 'longer'} draft "
                                          f"wastes {'less' if other < k else 'more'} on a miss and wins "
                                          f"{'less' if other < k else 'more'} on a run of accepted tokens")
    return found


# the backends worth an engine start when attention dominates (FLEX_ATTENTION is a general fallback, left out)
PROFILED_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")


def profile_changes(knobs: dict, platform: Platform, bottleneck: str, backend_in_use: str | None,
                    model: str | None = None) -> dict[str, tuple[dict, str]]:
    """One-change arms the current launch's profile points to, on a GPU: attention-bound, the other attention
    backends; compute-bound at the GEMM limit with fp8 tensor cores, fp8 weights. A launch-bound profile
    points to the graphs, eager and batch changes the audit already found; a communication-bound one to the
    parallel layout, which one launch on this machine cannot change alone."""
    if platform.kind != "cuda":
        return {}
    found = {}
    if bottleneck.startswith("attention-bound"):
        for backend in PROFILED_BACKENDS:
            if backend != backend_in_use and backend != knobs.get("attention_backend"):
                found[f"attention_{backend}"] = ({**knobs, "attention_backend": backend}, f"the profile is "
                                                 f"attention-bound: {backend} in place of {backend_in_use}")
    if bottleneck.startswith("compute-bound") and has_fp8_tensor_cores(platform) and not knobs.get("quantization"):
        found["fp8_weights"] = ({**knobs, "quantization": "fp8"}, "the profile is at the GEMM limit on a GPU with "
                                "fp8 tensor cores: fp8 weights halve the bytes and double the rate (they change "
                                "the model's numerics: " + fp8_quality(platform, "fp8_weights", model) + ")")
    return found


def combine(current: dict, changed: list[dict]) -> dict:
    """The current knobs with every one-change arm's change applied: what each dropped, dropped; what each
    set, set."""
    def apply(base: dict, changes: list[dict]) -> dict:
        merged = dict(base)
        for knobs in changes:
            for key in set(base) - set(knobs):
                merged.pop(key, None)
            merged.update({k: v for k, v in knobs.items() if base.get(k) != v})
        return merged

    # the environment knob is a set of variables: each change drops or sets its own, not the whole set
    merged = apply({k: v for k, v in current.items() if k != "environment"},
                   [{k: v for k, v in knobs.items() if k != "environment"} for knobs in changed])
    variables = apply(current.get("environment", {}), [knobs.get("environment", {}) for knobs in changed])
    return {**merged, **({"environment": variables} if variables else {})}


@dataclasses.dataclass
class Diagnosis:
    """What a diagnosis found: the parsed launch, the audit of its effective configuration, the measured
    changes ranked, the waterfall of the path, the recommended launch and how many engines it started."""

    launch: Launch
    target: str
    results: Results
    flags: list[str]
    profile: dict  # the current launch's bottleneck class and rule, and its share of the roofline
    ranked: pd.DataFrame
    path: pd.DataFrame
    recommended: dict
    engine_starts: int
    outcome: str
    resumed: list[str] = dataclasses.field(default_factory=list)  # arms read back from the store, not measured again

    __repr__ = redacted_repr  # the launch and the recommended knobs hold the command's secrets

    def cost(self) -> str:
        """The outcome with what it cost: engines started by this run, and arms read back from the store."""
        return (f"{self.outcome} ({self.engine_starts} engine start(s) this run; read back from the store: "
                f"{', '.join(self.resumed) or 'none'})")

    def recommended_command(self) -> str:
        """The recommended launch as a `vllm serve` line: its knobs in vLLM's own flags (cuda_graphs=False is
        a compilation config, custom_all_reduce=False is --disable-custom-all-reduce), then what the lab kept
        but does not model, after the arm's own environment variables."""
        args, variables = serve_args(self.recommended)
        return launch_command("serve", self.launch.model, {**args, **self.launch.unmodelled}, variables)

    def journal_entries(self) -> list[dict]:
        """One entry per step (change -> metric -> conclusion), as the lab's journal keeps them."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        entries = [{"when_utc": now, "experiment": self.results.name, "load": "diagnosis", "change": "audit",
                    "metric": "effective configuration", "conclusion": "; ".join(self.flags) or "nothing to question",
                    "evidence": str(self.results.path)},
                   {"when_utc": now, "experiment": self.results.name, "load": "diagnosis", "change": "profile",
                    "metric": "bottleneck and roofline", "conclusion": "; ".join(f"{k}: {v}" for k, v in self.profile.items()),
                    "evidence": str(self.results.path)}]
        for row in self.ranked.to_dict("records"):
            value = row.get(self.target, float("nan"))
            also = [f"{side} {row[side]}" for side in ("also better on", "also worse on")
                    if isinstance(row.get(side), str) and row[side]]
            entries.append({"when_utc": now, "experiment": self.results.name, "load": "diagnosis",
                            "change": f"{row['arm']}: {row['why']}", "metric": f"{self.target}={number(value)}",
                            "conclusion": "; ".join([row["verdict"], *also]), "evidence": str(self.results.path)})
        entries.append({"when_utc": now, "experiment": self.results.name, "load": "diagnosis",
                        "change": "recommended launch", "metric": self.target, "conclusion": self.outcome,
                        "evidence": self.recommended_command()})
        return entries


def current_profile(results: Results) -> dict:
    """The current launch's profiler window read as a bottleneck class (and the rule that fired), and its
    decode and prefill as a share of this hardware's limit; what is missing says why."""
    found = Facts()
    try:
        verdict, rule = profiling.arm_bottleneck(results, "current")
        found.update(bottleneck=verdict, rule=rule)
    except (BadParameter, OSError, ValueError) as exc:
        found["bottleneck"] = f"not profiled: {exc}"
    table = roofline.roofline_table(results.select(results.loads[0]) if results.loads else results, detect_peaks())
    if not table.empty and "current" in set(table.arm):
        row = table.set_index("arm").loc["current"]
        found.update(tpot_pct_of_limit=round(float(row.tpot_pct_of_limit), 1),
                     ttft_pct_of_limit=round(float(row.ttft_pct_of_limit), 1), peaks=row.peaks)
    return found


def parse_slo(items: list[str]) -> dict[str, float]:
    """METRIC=LIMIT texts (tpot_p50_ms=40) as a dict; a malformed one or an unknown metric is a BadParameter."""
    slo = {}
    for item in items:
        name, _, limit = item.partition("=")
        try:
            slo[name.strip()] = float(limit)
        except ValueError:
            raise BadParameter(f"an SLO is METRIC=LIMIT such as tpot_p50_ms=40; got {item!r}") from None
        stats.metric(name.strip())
    check_slo_limits(slo)  # float() reads "nan" and "inf" too
    return slo


def _meets(results: Results, arm: str, slo: dict[str, float]) -> bool:
    for name, limit in slo.items():
        m = stats.metric(name)
        value = stats.point(stats.groups(results, arm, m), m)
        if (value > limit) if m.lower_is_better else (value < limit):
            return False
    return bool(slo)


@contextlib.contextmanager
def _variables(values: dict):
    """The launch's VLLM_*/NCCL_* variables in force while its arms run (workers inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def diagnose(command: str, workload: Workload, *, model: str | None = None, target: str = "tpot_p50_ms",
             slo: dict[str, float] | None = None, environ: dict | None = None, name: str = "diagnosis",
             protocol: Protocol | None = None, results_dir=None, overrides: dict | None = None,
             progress: bool = True) -> Diagnosis:
    """Run the path for a `vllm serve` command under `workload`. `model` is what the lab measures in the
    command's model's place (a synthetic shape such as "llama3-8b"; default: the command's model). `overrides`
    are knobs forced onto every arm (default: the settings' launch overrides, as for any experiment): they are
    not the command's, so no change proposes to undo them and the recommended command leaves them out. Every
    bad input fails before an engine starts."""
    stats.metric(target)  # an unknown metric fails here, not after the measurements
    for metric_name in slo or {}:
        stats.metric(metric_name)
    check_slo_limits(slo or {})
    environ = os.environ if environ is None else environ
    check_multicast_off(environ, "the environment of this launch")  # its arms run with it, before the parse
    launch = parse_serve(command, environ)
    platform = current_platform()
    changes = candidate_changes(launch.knobs, platform, workload, launch.model)
    arms = {"current": launch.knobs, **{arm: knobs for arm, (knobs, _) in changes.items()}}
    protocol = protocol or Protocol(trials=3, warmup_requests=4)
    if not protocol.profile_requests:  # the path reads the current launch's profile: every arm gets a window
        protocol = dataclasses.replace(protocol, profile_requests=4)

    def experiment(arms):
        return Experiment(name, arms, workload, model=model or launch.model, protocol=protocol,
                          results_dir=results_dir, **({} if overrides is None else {"overrides": overrides}))

    stored = experiment(arms).store
    resumed = {arm for arm in arms if stored.completed_spec(arm) is not None}  # read back, not started again

    def add_arm(arm, knobs):  # an arm found after the first measurements: the profile's, the combination
        arms[arm] = knobs
        if stored.completed_spec(arm) is not None:
            resumed.add(arm)
    with _variables(launch.variables):
        results = experiment(arms).run(progress=progress, only=["current"])
        if "current" not in results.complete_arms:
            raise BadParameter(f"the current launch did not run: {results.facts('cause').to_dict('records')}")
        flags = audit.flags(results, "current")
        profile = current_profile(results)
        used = results.facts("attention_backend").set_index("arm").attention_backend.get("current")
        for arm, (knobs, why) in profile_changes(launch.knobs, platform, profile["bottleneck"], used,
                                                      launch.model).items():
            if arm not in changes:
                changes[arm] = (knobs, why)
                add_arm(arm, knobs)
        if _meets(results, "current", slo or {}) or not changes:
            outcome = ("the current launch meets the SLO: keep what you have" if changes
                       else "nothing to try: keep what you have")
            return _finish(launch, target, results, flags, profile, outcome, arms=arms, resumed=resumed)
        results = experiment(arms).run(progress=progress)
        about = {arm: {"why": why} for arm, (_, why) in changes.items()}
        helped = [arm for arm in changes if arm in results.complete_arms
                  and diagnosis.helps(results, "current", arm, target)]
        combined = None
        if len(helped) > 1:
            # named by what it holds: another run whose noise lets other changes through measures its own
            combined = "+".join(helped)
            add_arm(combined, combine(launch.knobs, [arms[arm] for arm in helped]))
            about[combined] = {"why": "the changes that helped, together"}
            results = experiment(arms).run(progress=progress, only=[combined])
        best, trades = diagnosis.choose(results, [arm for arm in helped if arm in results.complete_arms],
                                        combined if combined in results.complete_arms else None, target)
        outcome = f"recommended: {best}" if best else "no change helped at this noise: keep what you have"
        return _finish(launch, target, results, flags, profile, outcome, arms=arms, resumed=resumed, about=about,
                       helped=helped, combined=combined, best=best, trades=trades)


def _finish(launch, target, results, flags, profile, outcome, *, arms, resumed, about=None, helped=(), combined=None,
            best=None, trades=()) -> Diagnosis:
    ranked = diagnosis.ranked_changes(results, "current", target, about) if about else pd.DataFrame()
    path = diagnosis.waterfall(results, "current", helped, combined, target, best)
    # arms of this diagnosis only: the store may hold others (a combination an earlier run's noise chose)
    starts = len((set(results.complete_arms) & set(arms)) - resumed)
    if len(path) > 1:
        outcome += f" ({target} {number(float(path.value.iloc[0]))} -> {number(float(path.value.iloc[-1]))})"
    outcome += "".join(f"; {trade}" for trade in trades)
    recommended = arms[best] if best else launch.knobs
    return Diagnosis(launch, target, results, flags, profile, ranked, path, dict(recommended), starts, outcome,
                     sorted(resumed))
