"""The deployment context: which vLLM launch an arm stands for, and the defaults vLLM gives it there.

vLLM picks its scheduler defaults (max_num_seqs, max_num_batched_tokens, and through them the CUDA-graph
capture sizes) by *usage context* and device: `vllm serve` (OPENAI_API_SERVER) and the offline `LLM` class
(LLM_CLASS) get their own, while an engine built without one (ENGINE_CONTEXT) falls back to values no
deployment runs (128 / 2048 on an H200, where `vllm serve` applies 1024 / 8192). So every engine the lab
starts carries the context of the deployment being tuned: an arm with no knobs *is* `vllm serve MODEL`.
What vLLM resolves for a launch here is asked of vLLM itself, in labkit.measure.resolve.
"""
from __future__ import annotations

import json
import shlex

from labkit.errors import BadParameter
from labkit.redact import redact_text, secret_name
from labkit.spec.workload import Burst, Mix

CONTEXTS = {  # the lab's name -> vLLM's UsageContext member, and the launch it stands for
    "serve": ("OPENAI_API_SERVER", "vllm serve MODEL (the OpenAI-compatible server)"),
    # the same launch, measured through the server itself: `vllm serve` started for the arm, driven over HTTP
    "served": ("OPENAI_API_SERVER", "vllm serve MODEL started for the arm and measured over HTTP"),
    "offline": ("LLM_CLASS", "vllm.LLM(MODEL).generate(...) (offline batch inference)"),
}
DEFAULT_CONTEXT = "serve"
IMPLIED = ("max_num_seqs", "max_num_batched_tokens", "cudagraph_capture_sizes")
SERVER_ONLY = ("api_server_count",)  # options of `vllm serve` itself, not of the engine it starts


def check_context(context: str, knobs_by_arm: dict[str, dict], loads: dict) -> None:
    """An unknown context, or arms and loads no deployment of that context runs, fail before any engine."""
    if context not in CONTEXTS:
        choices = "; ".join(f"{name!r}: {what}" for name, (_, what) in CONTEXTS.items())
        raise BadParameter(f"unknown deployment context {context!r}; choose {choices}")
    for arm, knobs in knobs_by_arm.items():
        if context != "served" and not knobs.get("api_server") and set(SERVER_ONLY) & set(knobs):
            raise BadParameter(f"arm {arm!r}: {', '.join(sorted(set(SERVER_ONLY) & set(knobs)))} is an option of "
                               "`vllm serve`, which an in-process engine does not run: add api_server=True to "
                               "the arm, or use context='served'")
    if context != "offline":
        return
    for arm, knobs in knobs_by_arm.items():
        if knobs.get("api_server"):
            raise BadParameter(f"arm {arm!r}: api_server=True measures `vllm serve`, which the offline LLM class "
                               "is not: use context='serve' (the default) for an in-process against served A/B")
        if knobs.get("data_parallel_size", 1) > 1:
            raise BadParameter(f"arm {arm!r}: the offline LLM class runs no data-parallel replicas (vLLM refuses "
                               f"LLM(data_parallel_size={knobs['data_parallel_size']})); measure replicas with "
                               "context='serve', or drop data_parallel_size")
    for name, load in loads.items():
        parts = load.parts.values() if isinstance(load, Mix) else [load]
        if not all(isinstance(getattr(part, "arrival", None), Burst) for part in parts):  # a LoadSearch has none
            raise BadParameter(f"load {name!r}: the offline LLM class takes its whole batch at once (a Burst); "
                               "an arrival process (closed loop, rate) is a server's: use context='serve' or "
                               "arrival=lk.Burst()")


def _secret(name: str, value) -> bool:
    """A setting whose value a shown launch leaves out: a secret name's (not a flag's True), or a token's."""
    if isinstance(value, str) and redact_text(value) != value:
        return True
    return secret_name(name) and value is not None and not isinstance(value, bool)


def _where_secrets_go(variables: list[str], args: list[str], context: str) -> str:
    """What a shown launch says in place of the secrets it leaves out: where to set the real values."""
    if not variables and not args:
        return ""
    where = [f"set {', '.join(variables)} in your shell"] if variables else []
    # the flag comes last: "--hf-token VALUE" is what redaction looks for, so nothing may follow it but a ";"
    where += [f"add its value after {'--' + name.replace('_', '-') if context == 'serve' else name + '='}"
              for name in args]
    return f"{'; ' if context == 'offline' else '  # '}secrets are not shown: {'; '.join(where)}"


def launch_command(context: str, model: str, engine_args: dict, variables: dict | None = None) -> str:
    """The arm as its user would launch it: a `vllm serve` command line (after the arm's own environment
    variables, as a shell sets them for one command), or the offline `LLM(...)` call. A secret (VLLM_API_KEY,
    hf_token, a token-shaped value) is left out and the line says where to set it: a shown launch is copied
    and stored, and a `<redacted>` pasted into a shell would set the secret to that text."""
    args = {k: v for k, v in engine_args.items() if k != "model"}
    hidden_args = [k for k, v in args.items() if _secret(k, v)]
    hidden_variables = [k for k, v in (variables or {}).items() if _secret(k, v)]
    args = {k: v for k, v in args.items() if k not in hidden_args}
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (variables or {}).items()
                   if name not in hidden_variables]
    note = _where_secrets_go(hidden_variables, hidden_args, context)
    if context == "offline":
        listed = "".join(f", {k}={v!r}" for k, v in args.items())
        comment = f"with {' '.join(assignments)}" if assignments else ""
        if note:
            comment = f"{comment}{note}" if comment else note[2:]
        return redact_text(f"LLM(model={model!r}{listed})" + (f"  # {comment}" if comment else ""))
    return redact_text(" ".join([*assignments, shlex.join(["vllm", *serve_argv(model, args)])])) + note


def serve_argv(model: str, engine_args: dict) -> list[str]:
    """`serve MODEL --flag value ...`: the arguments of `vllm serve` for these engine arguments (the model among
    them is ignored: `model` is the positional one)."""
    words = ["serve", model]
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if key == "model" or (key == "disable_log_stats" and value is False):
            continue  # a store-true flag: vllm serve logs its stats unless told otherwise
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            words += [flag, json.dumps(value)]
        else:
            words += [flag, str(value)]
    return words


def sizes_text(sizes: list[int]) -> str:
    """A capture-size list short enough for a table cell: its ends, its count."""
    if not sizes:
        return "none"
    if len(sizes) <= 6:
        return ", ".join(map(str, sizes))
    return f"{', '.join(map(str, sizes[:4]))}, ... {sizes[-1]} ({len(sizes)} sizes)"


def filter_engine_args(engine_args: dict, supported: set[str]) -> dict:
    """The engine arguments unchanged when this vLLM has every one of them; otherwise a TypeError names
    those it lacks."""
    unknown = sorted(set(engine_args) - supported)
    if unknown:
        raise TypeError(f"unexpected keyword: this vLLM has no engine argument(s) {unknown}")
    return engine_args
