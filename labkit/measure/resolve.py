"""What vLLM resolves for a launch on this machine, and the engine arguments an arm's engine is built from.

The deployment context (labkit.spec.launch) says which launch an arm stands for; here vLLM itself is asked what
that launch gets (max_num_seqs, max_num_batched_tokens, CUDA-graph capture sizes), in a separate process
(`python -m labkit.measure.resolve`) or in an arm's worker, which has vLLM imported already.
"""
from __future__ import annotations

import json
import subprocess
import sys

from labkit.spec.launch import CONTEXTS, SERVER_ONLY, filter_engine_args
from labkit.spec.numbers import POSITIVE, check_numbers


def implied_defaults(context: str, engine_args_by_arm: dict[str, dict], timeout_s: float = 300.0) -> dict[str, dict]:
    """What vLLM resolves for each arm in this context on this machine (max_num_seqs, max_num_batched_tokens,
    CUDA-graph capture sizes), from vLLM's own engine configuration, built in a separate process so that
    neither vLLM's import nor its environment variables reach the caller. No engine starts. An arm vLLM
    cannot configure here gets {"error": ...}; so does every arm when vLLM is not installed."""
    check_numbers("implied_defaults", {"timeout_s": (timeout_s, POSITIVE)})
    job = json.dumps({"context": context, "arms": engine_args_by_arm}, default=str)
    try:
        done = subprocess.run([sys.executable, "-m", "labkit.measure.resolve"], input=job, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {arm: {"error": f"vLLM took over {timeout_s:.0f} s to resolve the configuration"}
                for arm in engine_args_by_arm}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {arm: {"error": last} for arm in engine_args_by_arm}
    return json.loads(lines[-1])


def engine_launch(engine_args: dict, context: str):
    """The AsyncEngineArgs and vLLM UsageContext an arm's engine is built from: the deployment's own, so that
    vLLM resolves the defaults that deployment gets (max_num_seqs, max_num_batched_tokens, capture sizes)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    supported = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    engine_args = {k: v for k, v in engine_args.items() if k not in SERVER_ONLY}  # the server's, not the engine's
    return (AsyncEngineArgs(**filter_engine_args(engine_args, supported)),
            getattr(UsageContext, CONTEXTS[context][0]))


def _resolve(context: str, engine_args: dict) -> dict:
    args, usage_context = engine_launch(engine_args, context)  # exactly as the arm's worker builds its engine
    config = args.create_engine_config(usage_context)
    sched, compilation = config.scheduler_config, config.compilation_config
    return {"max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
            "cudagraph_capture_sizes": list(compilation.cudagraph_capture_sizes or [])}


def resolve_arms(context: str, engine_args_by_arm: dict[str, dict]) -> dict[str, dict]:
    """_resolve for each arm, in a process that has vLLM imported; an arm vLLM refuses gets {"error": ...}."""
    found = {}
    for arm, engine_args in engine_args_by_arm.items():
        try:
            found[arm] = _resolve(context, engine_args)
        except Exception as exc:  # one arm vLLM refuses does not hide the others
            found[arm] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def _main() -> None:
    job = json.loads(sys.stdin.read())
    print(json.dumps(resolve_arms(job["context"], job["arms"]), default=str), flush=True)


if __name__ == "__main__":
    _main()
