"""An experiment: named arms (knob settings) measured under one or more loads and one protocol.

Everything is checked before the first engine starts: knob values, workload, names, the model, that
the longest request fits max_model_len, and that stored arms of the same name were measured with the
same spec. Each arm then runs in its own worker process, which measures every load in turn on one
engine (an engine start is the expensive part); a failing arm is recorded with its cause and
the rest go on; arms already complete are skipped, so an interrupted experiment resumes where it stopped.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from labkit import settings
from labkit.errors import BadParameter, LabkitError
from labkit.files import write_json_atomic
from labkit.analyze import eta
from labkit.measure.environment import check_multicast_off, compile_cache, hardware_key
from labkit.measure.platform import Platform, current_platform
from labkit import at_once
from labkit.analyze.drift import repeat_arm
from labkit.analyze.placement import control_arm
from labkit.measure.placement import placement_record
from labkit.measure.resolve import implied_defaults
from labkit.measure.supervisor import ArmJob, ArmWorker, run_arm
from labkit.redact import redact, redacted_repr, secret_values
from labkit.spec.conversation import Conversation
from labkit.spec.load_search import LoadSearch
from labkit.spec.knobs import ArmPlan, check_knobs, knob_problems, normalized_knobs, plan_arm
from labkit.spec.lists import as_list
from labkit.spec.launch import DEFAULT_CONTEXT, IMPLIED, check_context, launch_command, sizes_text
from labkit.spec.models import SHAPES, ModelRef, check_model, resolve_model
from labkit.spec.numbers import POSITIVE, check_numbers, raise_problems
from labkit.spec.protocol import Protocol
from labkit.spec.texts import written_in_words
from labkit.spec.workload import Mix, Workload
from labkit.store import ExperimentStore, Results, check_name, load, spec_hash
from labkit.shown import shows_whole

CPU_DEFAULT_KV_BYTES = 1 << 30  # on CPU vLLM would otherwise reserve a share of the whole NUMA node


def _shared_knobs(knob_sets: list[dict]) -> dict:
    """The knobs every arm sets to the same value."""
    first, *rest = knob_sets
    return {k: v for k, v in first.items() if all(k in other and other[k] == v for other in rest)}


def layered_knobs(*layers: dict) -> dict:
    """Knob layers (base, arm, overrides), each later one winning, except that the `environment` knob's
    variables add up: an override's variable joins an arm's own instead of dropping them."""
    merged = {name: value for layer in layers for name, value in layer.items()}
    if variables := {name: text for layer in layers for name, text in layer.get("environment", {}).items()}:
        merged["environment"] = variables
    return merged


def launch_overrides() -> dict:
    """Knobs the settings force onto every arm (`labkit suite --override`, handed to each notebook kernel):
    one deliberate change, tried across every experiment."""
    knobs = settings.current().launch_overrides
    check_knobs(knobs, settings.VARIABLES["launch_overrides"])
    return dict(knobs)


def default_model(platform: Platform | None = None) -> str:
    """The model of `model="auto"`: llama3-8b on a GPU, tiny-llama on a CPU."""
    platform = platform or current_platform()
    return "llama3-8b" if platform.kind == "cuda" else "tiny-llama"


@dataclass
class Experiment:
    """An experiment's definition: its arms, loads, model, deployment context, shared and forced knobs and
    protocol, checked on creation, with the store its results go to."""

    name: str
    arms: dict[str, dict]  # arm name -> knobs that differ from `base`
    # one load, or several named loads measured on each engine; a LoadSearch searches its loads on each engine
    workload: Workload | Mix | Conversation | LoadSearch | dict
    model: str = "auto"  # a synthetic shape name, a local model folder or a hub id; "auto": per platform
    context: str = DEFAULT_CONTEXT  # the deployment measured: "serve" (vllm serve) or "offline" (vllm.LLM)
    base: dict = field(default_factory=dict)  # knobs every arm shares
    protocol: Protocol = field(default_factory=Protocol)
    engine_args: dict = field(default_factory=dict)  # extra vLLM engine arguments, in vLLM's own names
    overrides: dict = field(default_factory=launch_overrides)  # knobs that win over every arm's own
    arm_timeout_s: float = 1800.0
    results_dir: str | Path | None = None
    # a vLLM server already running (http://HOST:PORT): measured as it is, nothing started or stopped; one arm
    # without knobs, context "served", and `model` the one it serves (its tokenizer's vocabulary draws the prompts)
    server_url: str | None = None
    platform: Platform = field(default_factory=current_platform)
    # the first arm's worker, started by the plan: {"planned": (arm, launch, spec), "worker": ArmWorker or None}
    _early: dict | None = field(default=None, init=False, repr=False, compare=False)

    __repr__ = redacted_repr  # an arm's environment knob or engine_args may hold a secret

    def __post_init__(self):
        check_name(self.name, "experiment")
        if not isinstance(self.arms, dict) or not self.arms:
            raise BadParameter("arms must be a non-empty dict such as {'small': {'max_num_seqs': 4}}")
        # a list knob given as a range, array or generator is read once, so every later use sees the same list
        self.arms = {arm: normalized_knobs(knobs) for arm, knobs in self.arms.items()}
        self.base, self.overrides = normalized_knobs(self.base), normalized_knobs(self.overrides)
        for arm, knobs in self.arms.items():
            if not isinstance(knobs, dict):
                raise BadParameter(f"arm {arm!r}: its knobs must be a dict such as {{'enforce_eager': True}} "
                                   f"({{}} for vLLM's defaults), got {knobs!r}")
        if not isinstance(self.model, str):
            raise BadParameter(f"model must be a name, a model folder or a hub id (text), got {self.model!r}")
        if self.results_dir is not None and not isinstance(self.results_dir, (str, Path)):
            raise BadParameter(f"results_dir must be a folder path, got {self.results_dir!r}")
        check_numbers("Experiment", {"arm_timeout_s": (self.arm_timeout_s, POSITIVE)})
        self.loads = self.workload if isinstance(self.workload, dict) else {"default": self.workload}
        if not self.loads or not all(isinstance(w, (Workload, Mix, Conversation, LoadSearch))
                                     for w in self.loads.values()):
            raise BadParameter("workload must be a labkit Workload (or Mix, Conversation or LoadSearch), or a "
                               "non-empty dict of "
                               "named ones, got "
                               f"{self.workload!r}")
        for name, workload in self.loads.items():
            check_name(name, "load")
            for part in getattr(workload, "parts", {}):  # a Mix names its parts
                check_name(part, f"part of load {name!r}")
        if not isinstance(self.protocol, Protocol):
            raise BadParameter(f"protocol must be a labkit Protocol, got {type(self.protocol).__name__}")
        if self.protocol.decide_against is not None and self.protocol.decide_against not in self.arms:
            raise BadParameter(f"protocol.decide_against names arm {self.protocol.decide_against!r}, which this "
                               f"experiment does not have; name one of {list(self.arms)} (measured first) or None")
        for arm in self.arms:
            check_name(arm, "arm")
        raise_problems(f"Experiment {self.name!r}", self._knob_problems())
        if self.server_url is not None:  # after the knobs' check: base and arms are dicts of known knobs
            raise_problems("a running server as the target", self._target_problems())
        served_arms = self.context == "served" or any({**self.base, **k, **self.overrides}.get("api_server")
                                                      for k in self.arms.values())
        if served_arms and self.protocol.profile_requests:
            raise BadParameter("a served arm's engine runs inside `vllm serve`, where the lab cannot open a profiler "
                               "window: set profile_requests=0, or measure the profile with context='serve'")
        check_context(self.context, {arm: {**self.base, **knobs, **self.overrides} for arm, knobs in self.arms.items()},
                      self.loads)
        if self.model == "auto":
            self.model = default_model(self.platform)
        check_model(self.model)
        worded = [name for name, load in self.loads.items() if written_in_words(load.to_dict())]
        if worded and self.model in SHAPES:  # a synthetic shape's generated tokenizer has ids, not words
            raise BadParameter(f"loads {worded} are written in words (ChatText), which the synthetic {self.model!r} "
                               "cannot read: use a model with a tokenizer and chat template, such as smollm2-135m")
        self.store = ExperimentStore(self.name, self.results_dir)

    def _target_problems(self) -> list[str]:
        """What a running server as the target cannot have: knobs (it runs as it was started), another context."""
        problems = [] if isinstance(self.server_url, str) and re.fullmatch(r"http://[^/\s:]+:\d+/?", self.server_url) \
            else [f"server_url must be http://HOST:PORT, got {self.server_url!r}"]
        if self.context != "served":
            problems.append(f"context must be 'served' (the server is measured over HTTP), got {self.context!r}")
        knobbed = [arm for arm, knobs in self.arms.items() if knobs] + (["base"] if self.base else [])
        if len(self.arms) != 1 or knobbed or self.overrides:
            problems.append("the server runs as it was started: give one arm with no knobs, e.g. "
                            "arms={'current': {}}, and no base or overrides" + (f" (knobs in {knobbed})" if knobbed else ""))
        return problems

    def _knob_problems(self) -> list[str]:
        """Every bad knob of the base, the overrides and each arm, named once each: a fix for all in one go."""
        in_base = knob_problems(self.base)
        problems = [f"base: {p}" for p in in_base] + [f"overrides: {p}" for p in knob_problems(self.overrides)]
        for arm, knobs in self.arms.items():
            problems += [f"arm {arm!r}: {p}" for p in knob_problems({**self.base, **knobs}) if p not in in_base]
        return problems

    # ---- planning (no engine) ------------------------------------------------------------------
    def plans(self) -> dict[str, ArmPlan]:
        """Each arm's plan: base, own and override knobs translated to engine arguments, or why it cannot run here."""
        return {arm: self._plan(arm, layered_knobs(self.base, knobs)) for arm, knobs in self.arms.items()}

    def _plan(self, arm: str, knobs: dict) -> ArmPlan:
        """An override that contradicts an arm's own knobs (enforce_eager against narrowed capture sizes)
        makes that arm not applicable, with the reason, instead of failing the whole experiment."""
        merged = layered_knobs(knobs, self.overrides)
        try:
            return plan_arm(merged, self.platform, f"arm {arm!r}")
        except BadParameter as exc:  # the arm's own knobs passed in __post_init__: the override is at odds
            return ArmPlan(merged, {}, f"launch override {self.overrides} contradicts this arm: {exc}")

    def _engine_args(self, plan: ArmPlan, ref: ModelRef) -> dict:
        args = {"model": ref.model, "load_format": ref.load_format, "disable_log_stats": False, "seed": 0}
        if self.platform.kind == "cpu" and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(plan.knobs):
            args["kv_cache_memory_bytes"] = CPU_DEFAULT_KV_BYTES
        args.update(self.engine_args)
        args.update(plan.engine_args)
        return args

    def _check_lengths(self, plan: ArmPlan, ref: ModelRef, arm: str) -> None:
        limit = plan.knobs.get("max_model_len") or self.engine_args.get("max_model_len")
        if ref.shape is not None:
            positions = ref.shape.max_position_embeddings
            if limit is not None and limit > positions:  # vLLM refuses it only once the engine starts
                raise BadParameter(f"arm {arm!r}: max_model_len {limit} exceeds the {self.model} shape's "
                                   f"{positions} positions; lower max_model_len (and the request lengths)")
            limit = limit or positions
        longest = max(w.longest_request() for w in self.loads.values())
        if limit is not None and longest > limit:
            raise BadParameter(f"arm {arm!r}: the workload's longest request needs {longest} tokens but "
                               f"max_model_len is {limit}; shorten the lengths or raise max_model_len")

    def arm_spec(self, plan: ArmPlan, ref: ModelRef) -> dict:
        """What an arm is stored with and checked against on resume: model, shape, context, knobs, engine arguments
        (all but the model path), workloads and protocol."""
        args = {k: v for k, v in self._engine_args(plan, ref).items() if k != "model"}
        return {"model": self.model, "shape": ref.to_dict()["shape"], "context": self.context, "knobs": plan.knobs,
                "engine_args": args, **({"variables": plan.variables} if plan.variables else {}),
                "workloads": self._workload_dicts(), "protocol": self.protocol.to_dict()}

    def _workload_dicts(self) -> dict:
        return {name: w.to_dict() for name, w in self.loads.items()}

    @shows_whole
    def plan_table(self, defaults: bool = True, prepare: bool = True) -> pd.DataFrame:
        """What each arm will ask of vLLM here, or why it cannot run here: a dry run. Each arm's launch is
        written as its user would start it (`vllm serve ...` or `LLM(...)`), and with `defaults` vLLM's own
        resolution of the scheduler settings in this context on this machine is shown beside it (computed in
        a separate process, no engine started; a few seconds). With `prepare`, the first arm to run gets its
        worker now: it imports vLLM while the plan resolves and is read, and run() takes it over."""
        ref = resolve_model(self.model)
        plans = self.plans()
        if prepare:
            self._prepare_first_arm(plans, ref)
        runnable = {arm: self._engine_args(plan, ref) for arm, plan in plans.items()
                    if plan.not_applicable is None}
        resolved = self._implied(runnable) if defaults and runnable else {}
        shared = _shared_knobs([plan.knobs for plan in plans.values()]) if len(plans) > 1 else {}
        rows = []
        for arm, plan in plans.items():
            # what sets the arm apart comes first: a wide knobs cell is cut in the display, often at that very knob
            own = ", ".join(f"{k}={v}" for k, v in plan.knobs.items() if k not in shared)
            row = {"arm": arm, "differs_by": own or ("the shared knobs only" if plan.knobs else "vLLM's defaults"),
                   "context": self.context, "knobs": plan.knobs,
                   "launch": (launch_command(self.context, ref.model, runnable[arm], plan.variables)
                              if arm in runnable else None)}
            found = resolved.get(arm, {})
            for key in IMPLIED if defaults else ():
                value = found.get(key, found.get("error"))
                row[key] = sizes_text(value) if isinstance(value, list) else value
            # shown and stored with the notebook: the arm's secrets stay in the plan, not in its table
            rows.append(redact({**row, "runs_here": plan.not_applicable is None, "why_not": plan.not_applicable},
                               secret_values(plan.knobs) | secret_values(self.engine_args)))
        return pd.DataFrame(rows)

    def _implied(self, engine_args_by_arm: dict[str, dict]) -> dict[str, dict]:
        """vLLM's resolution of these arms in this context here: computed once per machine, vLLM version and
        arguments, then read back from the results folder (a rerun of the notebook, or its nbval check,
        starts no resolver)."""
        key = spec_hash([self.context, engine_args_by_arm, asdict(self.platform), os.cpu_count()])
        cached = self.store.path.parent / ".implied" / f"{key}.json"
        if cached.exists():
            try:
                return json.loads(cached.read_text())
            except (OSError, json.JSONDecodeError):
                pass  # a damaged cache entry is computed again
        # a busy machine took minutes to import vLLM here: the wait is said, not silent. The first arm's worker,
        # started with the plan, imports vLLM anyway: a fork of it answers, where a resolver of its own would
        # import vLLM a second time beside it (36.7 s of a plan on a fresh H100; 15-24 s a notebook in CI)
        early = (self._early or {}).get("worker")
        where = "the first arm's worker, once it has imported vLLM" if early else "a separate process (it imports vLLM)"
        print(f"resolving vLLM's defaults for {len(engine_args_by_arm)} arm(s) in {where}: seconds on an idle "
              "machine; remembered for the next plan; plan_table(defaults=False) skips it", flush=True)
        began = time.monotonic()
        resolved = early.resolve(self.context, engine_args_by_arm) if early else None
        if resolved is None:  # no early worker, or it ended before it answered
            resolved = implied_defaults(self.context, engine_args_by_arm)
        print(f"resolved in {eta.duration_text(time.monotonic() - began)}", flush=True)
        if not any("error" in found for found in resolved.values()):
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(cached, resolved)
            except OSError:
                pass  # an unwritable folder only costs the next plan its few seconds
        return resolved

    def _prepare_first_arm(self, plans: dict[str, ArmPlan], ref: ModelRef) -> None:
        """Start the worker of the first arm run() will measure (its imports take seconds of a core here, tens
        on a fresh GPU machine), only for this machine's own platform with vLLM installed. One never taken over
        exits by itself after EARLY_RELEASE_S, or when this experiment is collected or its process ends."""
        if self._early and self._early["worker"] and self._early["worker"].proc.is_alive():
            return
        if self.platform != current_platform() or self.platform.vllm_version is None:
            return
        first = None
        for arm, plan in plans.items():
            if plan.not_applicable:
                continue
            spec = self.arm_spec(plan, ref)
            try:
                if not self.store.check_resumable(arm, spec):
                    first = (arm, self._engine_args(plan, ref), spec)
                    break
            except LabkitError:  # a changed spec: run() refuses it, with its reason
                return
        if first is None:
            return
        self._early = {"planned": first,
                       "worker": self._worker(first, _vocab(ref), release_within_s=EARLY_RELEASE_S)}
        weakref.finalize(self, _discard_unused, self._early)

    def _take_early(self, todo: list) -> ArmWorker | None:
        """The plan's early worker when it is still waiting for the arm run() measures first, else None (and an
        early worker that does not fit is ended)."""
        early, self._early = self._early, None
        worker = early["worker"] if early else None
        if worker is None:
            return None
        early["worker"] = None  # run() has it now: collecting the experiment must not end it
        if todo and todo[0] == early["planned"] and worker.proc.is_alive():
            return worker
        worker.discard()
        return None

    # ---- running ---------------------------------------------------------------------------------
    def run(self, progress: bool = True, only: list[str] | None = None, parallel: int = 1,
            control: bool = False, cluster: str | None = None, accelerator_type: str | None = None,
            repeat: bool = False) -> Results:
        """Measure every arm (or the arms named in `only`) not already stored, and load the results.
        `parallel=N` runs up to N arms at once, each on a place of its own (labkit.measure.placement): on a GPU
        host the GPUs it needs (tp x pp x dp), on a CPU a share of the cores; every arm records where it ran, and
        a verdict between arms measured apart says so (labkit.analyze.placement). `control=True` (GPU arms at
        once) also measures the reference arm's launch on a second GPU, beside it, as arm `<reference>-control`:
        the GPU-to-GPU spread that a verdict between arms on different GPUs is judged against. `repeat=True`
        (arms one at a time) measures the reference arm's launch again after the others, as arm
        `<reference>-repeat`: how far the same launch moved over the run (the arms' order, caches the first arms
        wrote, the machine's drift), which a verdict between the run's arms is judged against (labkit.analyze.drift).
        `cluster` ("HOST:PORT" of a Ray cluster; default the setting `ray_address`) runs each arm as a Ray
        task on a node that has what it needs, up to `parallel` at once, `accelerator_type` ("H200") pinning
        GPU arms to that GPU model (labkit.measure.ray_arms); the results come back to this process's store."""
        from tqdm.auto import tqdm

        only = None if only is None else as_list("only", only, "['arm-name']")
        unknown = sorted(set(only or []) - set(self.arms))
        if unknown:
            raise BadParameter(f"no arm(s) {unknown} in this experiment; its arms are {list(self.arms)}")
        plans = {arm: plan for arm, plan in self.plans().items() if only is None or arm in only}
        if control:  # the reference's launch again, started right after it so that both take a GPU at once
            raise_problems("control=True", at_once.control_problems(self, parallel, plans))
            reference = at_once.control_reference(self)
            plans = {reference: plans[reference], control_arm(reference): plans[reference],
                     **{arm: plan for arm, plan in plans.items() if arm != reference}}
        if repeat:  # the reference's launch once more, after every other arm
            raise_problems("repeat=True", self._repeat_problems(
                parallel, control, cluster if cluster is not None else settings.current().ray_address, plans))
            reference = at_once.control_reference(self)
            plans = {**plans, repeat_arm(reference): plans[reference]}
        ref = resolve_model(self.model)
        vocab = _vocab(ref)
        for arm, plan in plans.items():  # every check before the first engine starts
            if not plan.not_applicable:
                self._check_lengths(plan, ref, arm)
        check_multicast_off(where="the shell's environment (the arm workers inherit it)")
        cluster = cluster if cluster is not None else settings.current().ray_address
        # where the arms run, refused here (every reason named) before any engine starts
        on_ray = at_once.ray_plan(self, cluster, parallel, plans, ref, accelerator_type) if cluster else None
        placer = None if cluster else at_once.placer_for(self, parallel, plans, ref)
        if self.server_url is not None:  # before any worker starts: is there a vLLM server to measure?
            from labkit.measure.served import check_server
            check_server(self.server_url)
        with self.store.lock():  # one writer per experiment, from the resume check to the last arm
            todo = []
            for arm, plan in plans.items():
                if plan.not_applicable:
                    continue
                spec = self.arm_spec(plan, ref)
                if not self.store.check_resumable(arm, spec):  # the full launch goes to the worker as planned
                    todo.append((arm, self._engine_args(plan, ref), spec))
            self.store.begin({"name": self.name, "model": self.model, "shape": ref.to_dict()["shape"],
                              "context": self.context, "arms": self.arms, "base": self.base,
                              "overrides": self.overrides, "workloads": self._workload_dicts(),
                              "protocol": self.protocol.to_dict()})
            early = self._take_early(todo if placer is None and on_ray is None else [])  # elsewhere: ended
            self.store.clean_work(keep=early.workdir if early else None)
            for arm, plan in plans.items():
                if plan.not_applicable:
                    self.store.record_skip(arm, {"arm": arm, "reason": plan.not_applicable,
                                                 "spec": {"knobs": plan.knobs}})
            bar = tqdm(todo, desc=f"{self.name}: arms", disable=not progress, unit="arm")
            estimates = self._estimates(todo)
            if todo:
                bar.write(eta.expected_total(list(estimates.values()), self.protocol.fewest_trials,
                                             self.protocol.most_trials))
            if on_ray is not None or placer is not None:
                if on_ray is not None:
                    at_once.run_on_ray(self, todo, vocab, on_ray, bar)
                else:
                    at_once.run_at_once(self, todo, vocab, placer, bar, estimates)
                bar.close()
                return load(self.name, self.store.path.parent)
            # the next arm's worker, importing while this arm's engine starts (the first arm's: the plan's)
            upcoming: list[ArmWorker] = [early] if early else []
            try:
                for index, (arm, _launch, spec) in enumerate(bar):
                    bar.set_postfix_str(arm)
                    current = upcoming.pop() if upcoming else self._worker(todo[index], vocab)
                    self._run_one(arm, spec, current, self._starter(todo[index + 1:], vocab, upcoming), progress, bar,
                                  self._estimates([todo[index]])[arm] if index else estimates[arm])
            finally:
                for worker in upcoming:  # interrupted or unwritable: the next arm's turn never comes
                    worker.discard()
            bar.close()
        return load(self.name, self.store.path.parent)

    def _repeat_problems(self, parallel: int, control: bool, cluster: str | None, plans: dict) -> list[str]:
        """Why the reference cannot be measured again at the end of this run (every reason at once)."""
        problems = []
        if parallel != 1 or control or cluster:
            problems.append("a repeat measures how one launch moved over a run of arms one after another: run "
                            "without parallel, control or a cluster (arms at once on GPUs: control=True measures "
                            "their spread)")
        reference = at_once.control_reference(self)
        if reference not in plans or plans[reference].not_applicable:
            problems.append(f"the reference arm {reference!r} is not among the arms to run here")
        return problems

    def _estimates(self, todo: list) -> dict[str, eta.Estimate]:
        """How long each arm to run will take here, from the records of earlier arms on this machine (this
        experiment's own among them, read again after each arm)."""
        records = eta.read_records([self.store.path.parent, settings.current().results_dir])
        hardware = hardware_key()
        return {arm: eta.estimate(records, hardware, bool(spec["engine_args"].get("enforce_eager")), spec["workloads"])
                for arm, _launch, spec in todo}

    def _starter(self, rest: list, vocab: int, upcoming: list):
        """What starts the next arm's worker (kept in `upcoming`), or None after the last arm."""
        if not rest:
            return None

        def start_next() -> ArmWorker:
            upcoming.append(self._worker(rest[0], vocab))
            return upcoming[-1]
        return start_next

    def _job(self, planned: tuple, vocab: int, placement: dict | None = None) -> ArmJob:
        """What the arm's worker is given: the full launch, the loads, the protocol and where it runs."""
        arm, launch, spec = planned
        context = "served" if spec["knobs"].get("api_server") else self.context  # the arm behind vllm serve
        return ArmJob(arm, launch, self._workload_dicts(), self.protocol.to_dict(), vocab, self.platform.kind,
                      context, arm_variables=spec.get("variables", {}),
                      compile_cache=str(compile_cache(settings.current().compile_cache_dir)),
                      server_url=self.server_url, placement=placement or placement_record(None, 1))

    def _worker(self, planned: tuple, vocab: int, release_within_s: float | None = None,
                placement: dict | None = None) -> ArmWorker:
        """The arm's worker, started now: it imports, then waits for its turn."""
        return ArmWorker(self._job(planned, vocab, placement), self.store.new_workdir(planned[0]), release_within_s)

    def _reference(self, arm: str) -> dict | None:
        """The protocol's reference arm's per-trial values, for an adaptive arm's "decided" stop: None for the
        reference itself, a fixed protocol, or a reference not yet (or not) complete in the store."""
        reference = self.protocol.decide_against
        if not self.protocol.adaptive or reference is None or arm == reference \
                or self.store.completed_spec(reference) is None:
            return None
        from labkit.analyze.stopping import reference_values

        return reference_values(load(self.name, self.store.path.parent), reference)

    def _run_one(self, arm: str, spec: dict, worker: ArmWorker, start_next, progress, bar,
                 estimate: eta.Estimate) -> None:
        from tqdm.auto import tqdm

        job, workdir = worker.job, worker.workdir
        job.reference = self._reference(arm)  # the reference arm may have completed since this worker started
        # "auto" may stop before its maximum: the bar's total is the most it can run
        trials = tqdm(total=self.protocol.most_trials * len(self.loads), desc=f"  {arm}: trials", leave=False,
                      disable=not progress)

        done = {name: 0 for name in self.loads}

        def on_progress(event):
            if event["stage"] == "trial":
                trials.update(1)
                done[event["load"]] += 1
            started = event["stage"] not in ("imported", "starting engine")
            left = _time_left(estimate, self.protocol, done, started)
            trials.set_postfix_str(event["stage"] + (f", {left}" if left else ""))
        try:
            outcome = run_arm(job, workdir, self.arm_timeout_s, on_progress, worker=worker,
                              start_next=start_next)
        except KeyboardInterrupt:  # the engine is down (run_arm's finally); what it logged is kept for the next run
            trials.close()
            self.store.keep_interrupted(arm, workdir)
            raise
        trials.close()
        self._store_outcome(arm, spec, outcome, workdir, bar)

    def _store_outcome(self, arm: str, spec: dict, outcome, workdir: Path, bar) -> None:
        """Commit a complete arm's folder to the store, or record its failure with the cause; one line says which."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if outcome.status == "complete":
            result = json.loads((workdir / "result.json").read_text())
            self.store.commit_arm(arm, workdir, {"arm": arm, "spec": spec, "facts": outcome.facts,
                                                 "environment": result.get("environment", {}),
                                                 "seconds": outcome.seconds, "recorded_utc": now})
            # one plain line per arm: a stored notebook says what happened where its progress bars cannot
            facts = outcome.facts or {}
            init = facts.get("init_s")
            bar.write(f"arm {arm!r}: complete in {outcome.seconds:.0f} s"
                      + (f" (engine start {init:.0f} s)" if init else "") + ", " + _trials_text(facts, self.protocol,
                                                                                           len(self.loads)))
        else:
            where = self.store.record_failure(arm, workdir, {"arm": arm, "spec": spec, "cause": outcome.cause,
                                                             "log_tail": outcome.log_tail,
                                                             "seconds": outcome.seconds, "recorded_utc": now})
            bar.write(f"arm {arm!r} failed: {outcome.cause} (log: {where / 'engine.log'})")


# how long the first arm's worker, started by the plan, waits for run() before it exits unused
EARLY_RELEASE_S = 900.0


def _vocab(ref: ModelRef) -> int:
    """The vocabulary the workload's token ids are drawn from."""
    return ref.shape.vocab_size if ref.shape else 32000


def _discard_unused(early: dict) -> None:
    """End the plan's early worker if run() never took it over."""
    if early.get("worker") is not None:
        early["worker"].discard()
        early["worker"] = None


def _time_left(estimate: eta.Estimate, protocol: Protocol, done: dict[str, int], started: bool) -> str:
    """The arm's time left, from this machine's records: the engine's start (until it has started), then the
    trials each load has left (for "auto", up to its maximum: it may stop sooner)."""
    per_trial = estimate.trial_s
    if any(per_trial.get(load) is None for load in done) or (not started and estimate.start_s is None):
        return ""
    seconds = sum(max(protocol.most_trials - n, 0) * per_trial[load] for load, n in done.items())
    seconds += 0 if started else estimate.start_s
    return ("at most " if protocol.adaptive else "") + f"~{eta.duration_text(seconds)} left"


def _trials_text(facts: dict, protocol: Protocol, loads: int) -> str:
    """How many trials an arm ran, and, when the protocol chose, why it stopped; a load search's probes counted."""
    searches = facts.get("load_search") or {}
    if searches:  # a search's loads are its probes: their number is the search's own
        probes = sum(s.get("probes_used", 0) for s in searches.values())
        return (f"{facts.get('trials_run', '?')} trial(s) over {loads - len(searches) + probes} load(s), {probes} "
                f"of them probed by {len(searches)} load search(es) on this engine")
    if not protocol.adaptive:
        return f"{protocol.trials} trial(s) x {loads} load(s)"
    ran = facts.get("trials_run", "?")
    by_load = facts.get("stopped_by_load")
    why = (", ".join(f"{load} {reason}" for load, reason in by_load.items()) if by_load
           else facts.get("stopped", "?"))
    return f"{ran} trial(s) over {loads} load(s) (stopped: {why})"
