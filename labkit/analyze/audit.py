"""The effective-configuration audit: print what an arm really ran with and flag what a tuner should question.

Check the full launch configuration before tuning anything: a forgotten `enforce_eager`, graphs turned
off, a silent attention-backend fallback or a stray VLLM_* variable can cost more than any knob gains.
"""
from __future__ import annotations

import json

import pandas as pd

from labkit.errors import BadParameter


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


ARM_KNOB = "this arm's environment knob"


def set_by_arm_knob(environment: dict, name: str) -> bool:
    """Whether an arm's recorded variable was set by its own `environment` knob (not by the shell or the lab)."""
    return name in environment.get("arm_variables", [])


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
    if first and used and used != first:
        out.append(f"attention backend {used} is not the platform's first choice {first}")
    for name, value in sorted(env.get("tuning_variables", {}).items()):
        if name.endswith("_VERSION"):  # set by the image to describe itself, not a tuning choice
            continue
        who = f" by {ARM_KNOB}" if set_by_arm_knob(env, name) else ""
        out.append(f"environment variable {name}={value} is set{who}: it changes vLLM's behaviour outside the "
                   "engine arguments")
    return out


def audit_table(results) -> pd.DataFrame:
    """One row per flag across every complete arm ('nothing to question' when an arm is clean)."""
    rows = []
    for arm in results.complete_arms:
        found = flags(results, arm)
        rows += [{"arm": arm, "flag": text} for text in found] or [{"arm": arm, "flag": "nothing to question"}]
    return pd.DataFrame(rows)
