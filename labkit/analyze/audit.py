"""The effective-configuration audit: print what an arm really ran with and flag what a tuner should question.

Check the full launch configuration before tuning anything: a forgotten `enforce_eager`, graphs turned
off, a silent attention-backend fallback or a stray VLLM_* variable can cost more than any knob gains.
"""
from __future__ import annotations

import json

import pandas as pd

from labkit.errors import BadParameter
from labkit.shown import shows_whole


def _facts(results, arm: str) -> pd.Series:
    arms = results.arms.set_index("arm")
    if arm not in arms.index or arms.loc[arm, "status"] != "complete":
        raise BadParameter(f"arm {arm!r} has no complete results; complete arms: {results.complete_arms}")
    return arms.loc[arm]


def _platform_first_choice(results) -> str | None:
    """The backend vLLM ranks first here, as logged by any arm that let vLLM choose."""
    for raw in results.arms.get("attention_candidates", pd.Series(dtype=object)).dropna():
        names = json.loads(raw) if isinstance(raw, str) else raw
        if names:
            return names[0]
    return None


# a max_model_len this many times the workload's P99 request (prompt + output) is worth a question
MODEL_LEN_SLACK = 4


def _p99_request_tokens(results, arm: str) -> float | None:
    """The P99 of an arm's measured requests' prompt + output tokens (None without them)."""
    requests = results.requests
    if not {"arm", "prompt_tokens", "output_tokens"} <= set(requests.columns):
        return None
    mine = requests[requests.arm == arm]
    return float((mine.prompt_tokens + mine.output_tokens).quantile(0.99)) if len(mine) else None


ARM_KNOB = "this arm's environment knob"


def set_by_arm_knob(environment: dict, name: str) -> bool:
    """Whether an arm's recorded variable was set by its own `environment` knob (not by the shell or the lab)."""
    return name in environment.get("arm_variables", [])


@shows_whole
def effective_config(results, arm: str) -> pd.DataFrame:
    """Every resolved setting of one arm, with the engine arguments that were asked for."""
    facts = _facts(results, arm).dropna()
    spec = results.arm_spec(arm)
    lab = {"init_s", "seconds", "recorded_utc", "compiled", "cuda_graphs", "attention_backend_source"}
    rows = [{"setting": k, "value": v,
             "source": "knob" if k.startswith("knob.") else "measured by the lab" if k in lab else "resolved by vLLM"}
            for k, v in facts.items() if k not in ("status", "cause", "arm")]
    rows += [{"setting": f"asked: {k}", "value": json.dumps(v), "source": "engine argument"}
             for k, v in spec["engine_args"].items()]
    env = results.environment.get(arm, {})
    rows += [{"setting": k, "value": v, "source": ARM_KNOB if set_by_arm_knob(env, k) else "environment"}
             for k, v in env.get("tuning_variables", {}).items()]
    return pd.DataFrame(rows)


def flags(results, arm: str) -> list[str]:
    """What a tuner should question in this arm's effective configuration (empty: nothing)."""
    f = _facts(results, arm)
    env = results.environment.get(arm, {})
    on_gpu = env.get("platform") == "cuda"
    out = []
    if bool(f.get("enforce_eager")):
        out.append("enforce_eager is on: torch.compile and CUDA graphs are both off (a forgotten enforce_eager "
                   "is a classic cause of slow decode)")
    elif on_gpu and f.get("cudagraph_mode") in ("NONE", None):
        out.append("CUDA graphs are off (cudagraph_mode NONE): every decode step pays kernel-launch overhead")
    if not bool(f.get("compiled")) and not bool(f.get("enforce_eager")):
        out.append(f"torch.compile is off (compile mode {f.get('compile_mode')})")
    first = _platform_first_choice(results)
    used = f.get("attention_backend")
    requested = f.get("requested_attention_backend")
    if first and used and used != first:
        out.append(f"attention backend {used} is not the platform's first choice {first}")
    elif isinstance(requested, str) and requested:  # a forced backend: vLLM logs no ranking to compare with
        out.append(f"attention backend {requested} is set by hand: vLLM's own first choice here shows only in an "
                   "arm that lets it choose")
    limit, longest = f.get("max_model_len"), _p99_request_tokens(results, arm)
    if longest and pd.api.types.is_number(limit) and limit >= MODEL_LEN_SLACK * longest:
        out.append(f"max_model_len {limit:,.0f} is {limit / longest:.0f}x the workload's P99 request ({longest:,.0f} "
                   "tokens): vLLM must fit one request of that length in the KV pool to start, and counts its "
                   "concurrency in them; set it near your longest real request unless longer ones come")
    for name, value in sorted(env.get("tuning_variables", {}).items()):
        if name.endswith("_VERSION"):  # set by the image to describe itself, not a tuning choice
            continue
        who = f" by {ARM_KNOB}" if set_by_arm_knob(env, name) else ""
        out.append(f"environment variable {name}={value} is set{who}: it changes vLLM's behaviour outside the "
                   "engine arguments")
    return out


@shows_whole
def audit_table(results) -> pd.DataFrame:
    """One row per flag across every complete arm ('nothing to question' when an arm is clean)."""
    rows = []
    for arm in results.complete_arms:
        found = flags(results, arm)
        rows += [{"arm": arm, "flag": text} for text in found] or [{"arm": arm, "flag": "nothing to question"}]
    return pd.DataFrame(rows)
