"""Greedy answers of a real model under several launches (bf16, fp8 weights, an fp8 KV cache, both) over one
fixed chat prompt set, each launch in a fresh engine process of its own; and the comparison kept per hardware
for the diagnosis to cite (labkit.analyze.numerics compares, pure)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import time

from labkit import settings
from labkit.analyze.numerics import numerics_table, pick_entry, read_numerics_file
from labkit.files import write_json_atomic
from labkit.measure.environment import hardware_key
from labkit.measure.greedy import CHAT_QUESTIONS, EngineRunFailed, chat_prompt_ids, vllm_greedy_answers
from labkit.measure.platform import Platform, current_platform
from labkit.spec.capabilities import has_fp8_tensor_cores
from labkit.spec.knobs import knob_problems, plan_arm
from labkit.spec.models import SHAPES, resolve_model
from labkit.spec.numbers import raise_problems
from labkit.spec.packaged_models import packaged_name

# the launches the precision notebook compares: the model's own precision first, the reference
FP8_LAUNCHES = {"bf16": {}, "fp8_weights": {"quantization": "fp8"}, "fp8_kv": {"kv_cache_dtype": "fp8"},
                "fp8_both": {"quantization": "fp8", "kv_cache_dtype": "fp8"}}


def launch_problems(model: str, launches, max_tokens, questions, common: dict) -> list[str]:
    """Everything wrong with a numerics request, at once, before any engine starts."""
    problems = []
    if not isinstance(model, str) or not model:
        problems.append(f"model must be a model name or folder with real weights, got {model!r}")
    elif model in SHAPES or (packaged_name(model) or (None, False))[1]:
        problems.append(f"model {model!r} has dummy weights: numerics need a model's real weights")
    if not isinstance(launches, dict) or not launches:
        problems.append(f"launches must be a non-empty dict of name -> knobs, got {launches!r}")
    else:
        for name, knobs in launches.items():
            problems += [f"launch {name!r}: {p}" for p in knob_problems(knobs)]
    problems += [f"common knobs: {p}" for p in knob_problems(common)]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        problems.append(f"max_tokens must be a whole number of tokens above 0, got {max_tokens!r}")
    if isinstance(questions, str) or not questions or not all(isinstance(q, str) and q.strip() for q in questions):
        problems.append(f"questions must be a non-empty list of non-empty texts, got {questions!r}")
    return problems


def run_launches(model: str, launches: dict[str, dict], *, questions=CHAT_QUESTIONS, max_tokens: int = 32,
                 dtype: str = "bfloat16", common: dict | None = None, platform: Platform | None = None,
                 timeout_s: float = 600, progress=print) -> dict[str, dict]:
    """Each launch's greedy answers (token ids and the chosen tokens' log-probabilities) to the same chat
    prompts: launch name -> {"knobs", "answers", "seconds"}, or {"knobs", "cause"} for a launch that did not
    run (not applicable here, or its engine failed: vLLM's last meaningful error line), the rest going on.
    `launches` are knob dicts (labkit.spec.knobs, with `common` added to each); `dtype` is the weights' and
    activations' type unless a launch sets its own. Bad input is refused before any engine starts."""
    common = dict(common or {})
    raise_problems("numerics launches", launch_problems(model, launches, max_tokens, questions, common))
    platform = platform or current_platform()
    ref = resolve_model(model)
    prompts = chat_prompt_ids(ref.model, tuple(questions))
    runs = {}
    for name, knobs in launches.items():
        knobs = {**common, **knobs}
        plan = plan_arm(knobs, platform, f"launch {name!r}")
        if plan.not_applicable:
            runs[name] = {"knobs": knobs, "cause": f"not applicable: {plan.not_applicable}"}
            progress(f"{name}: not applicable ({plan.not_applicable})")
            continue
        engine_args = {**plan.engine_args}
        launch_dtype = engine_args.pop("dtype", dtype)
        engine_args.setdefault("load_format", ref.load_format)
        started = time.monotonic()
        try:
            answers = vllm_greedy_answers(ref.model, prompts, max_tokens, launch_dtype, engine_args, timeout_s,
                                          variables=plan.variables)
        except EngineRunFailed as failed:
            runs[name] = {"knobs": knobs, "cause": failed.cause}
            progress(f"{name}: failed ({failed.cause})")
            continue
        runs[name] = {"knobs": knobs, "answers": answers, "seconds": round(time.monotonic() - started, 1)}
        progress(f"{name}: {len(answers)} answers in {runs[name]['seconds']} s")
    return runs


def _plain(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def record_numerics(table, model: str, platform: Platform | None = None, *, reference: str = "bf16",
                    questions=CHAT_QUESTIONS, max_tokens: int | None = None) -> str:
    """Keep a numerics table as this hardware's measurement for `model` (data/numerics/<hardware key>.json, one
    entry per model, replaced atomically): the diagnosis cites it beside its fp8 suggestions. Returns the path."""
    platform = platform or current_platform()
    key = hardware_key(platform.gpu_names or None)
    path = settings.current().numerics_dir / f"{key}.json"
    kept = read_numerics_file(path)
    kept[model] = {"model": model, "hardware": key, "device": (platform.gpu_names or ("cpu",))[0],
                   "compute_capability": platform.compute_capability, "reference": reference,
                   "questions": list(questions), "max_tokens": max_tokens,
                   "measured_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "rows": [{k: _plain(v) for k, v in row.items()} for row in table.to_dict("records")]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, kept)
    return str(path)


def stored_numerics(platform: Platform, model: str | None = None) -> dict | None:
    """This hardware's stored numerics entry for `model`, else its newest for any model, else None."""
    if platform.kind != "cuda":
        return None
    path = settings.current().numerics_dir / f"{hardware_key(platform.gpu_names)}.json"
    return pick_entry(read_numerics_file(path), model)


@dataclasses.dataclass
class Numerics:
    """The precision notebook's numerics section: the table (None where nothing ran), each launch's run, the
    file it was kept in, and why it did not run here."""

    table: object = None  # a pandas DataFrame (labkit.analyze.numerics.numerics_table)
    runs: dict = dataclasses.field(default_factory=dict)
    path: str | None = None
    not_applicable: str | None = None

    def __repr__(self) -> str:
        if self.not_applicable:
            return f"Numerics: not applicable here: {self.not_applicable}"
        return f"Numerics of {sorted(self.runs)}, kept in {self.path}"


def fp8_numerics(model: str, max_tokens: int, platform: Platform | None = None, *, common: dict | None = None,
                 questions=CHAT_QUESTIONS, progress=print) -> Numerics:
    """fp8 weights, an fp8 KV cache and both against bf16 on `model`'s real weights (FP8_LAUNCHES), kept for
    the diagnosis; only on a GPU with fp8 tensor cores, elsewhere (or with no model) not applicable, the
    reason given and no engine started."""
    platform = platform or current_platform()
    if not model:
        return Numerics(not_applicable="no model given (numerics_model is empty): skipped")
    if not has_fp8_tensor_cores(platform):
        where = (f"a GPU of compute capability {platform.compute_capability}" if platform.kind == "cuda"
                 else f"a {platform.kind.upper()}")
        return Numerics(not_applicable=f"fp8 weights and an fp8 KV cache need fp8 tensor cores (an NVIDIA GPU of "
                                       f"compute capability 8.9 or newer); this machine has {where}")
    runs = run_launches(model, FP8_LAUNCHES, questions=questions, max_tokens=max_tokens, common=common,
                        platform=platform, progress=progress)
    table = numerics_table(runs, "bf16")
    path = record_numerics(table, model, platform, questions=questions, max_tokens=max_tokens)
    return Numerics(table, runs, path)
