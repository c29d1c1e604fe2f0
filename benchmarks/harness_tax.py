"""Harness tax: labkit's streaming measurement vs a plain `LLM.generate` loop, same prompts and engine.

    python benchmarks/harness_tax.py [--model auto] [--requests 256] [--prompt-len 128]
                                     [--output-len 128] [--trials 3] [--out result.json]

Both sides run in fresh processes with the same engine arguments, warm-up and per-trial prompts (an
offline burst). The ratio is labkit's output tok/s over the plain loop's; the goal is >= 0.99.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def plain_generate(engine_args: dict, workload: dict, vocab: int, trials: int) -> list[float]:
    from vllm import LLM, SamplingParams

    from labkit.runner import content_seed
    from labkit.workload import Workload

    wl = Workload.from_dict(workload)
    llm = LLM(**engine_args)

    def batch(content_seed):
        reqs = wl.build(vocab, content_seed)
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=1.0) for r in reqs]
        return prompts, params

    prompts, params = batch(content_seed(0, -1))  # the same warm-up as labkit's
    llm.generate(prompts[:8], params[:8], use_tqdm=False)
    rates = []
    for trial in range(trials):
        prompts, params = batch(content_seed(0, trial))
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    return rates


def main() -> None:
    import labkit as lk
    from labkit.experiment import Experiment

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="auto")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--out")
    parser.add_argument("--plain-job", help=argparse.SUPPRESS)  # internal: run the plain side only
    a = parser.parse_args()
    if a.plain_job:
        job = json.loads(Path(a.plain_job).read_text())
        rates = plain_generate(job["engine_args"], job["workload"], job["vocab"], job["trials"])
        Path(a.plain_job).write_text(json.dumps({**job, "rates": rates}))
        return

    workload = lk.Workload(a.requests, lk.Fixed(a.prompt_len), lk.Fixed(a.output_len), lk.Burst())
    with tempfile.TemporaryDirectory() as tmp:
        exp = Experiment("harness-tax", {"labkit": {"max_num_seqs": a.max_num_seqs}}, workload, model=a.model,
                         protocol=lk.Protocol(trials=a.trials, warmup_requests=8), results_dir=tmp)
        ref = lk.resolve_model(exp.model)
        engine_args = {"model": ref.model, **exp.arm_spec(exp.plans()["labkit"], ref)["engine_args"]}
        engine_args["disable_log_stats"] = True  # LLM's own default; labkit needs the stats on
        job = Path(tmp) / "plain.json"
        job.write_text(json.dumps({"engine_args": engine_args, "workload": workload.to_dict(),
                                   "vocab": ref.shape.vocab_size, "trials": a.trials}))
        subprocess.run([sys.executable, __file__, "--plain-job", str(job)], check=True)  # a fresh process
        plain = json.loads(job.read_text())["rates"]
        lab = exp.run(progress=False).trials.output_tok_s.tolist()
    mean = lambda xs: sum(xs) / len(xs)
    report = {"model": exp.model, "platform": exp.platform.kind, "vllm": exp.platform.vllm_version_str,
              "requests": a.requests, "prompt_len": a.prompt_len, "output_len": a.output_len,
              "plain_generate_tok_s": plain, "labkit_tok_s": lab, "ratio": mean(lab) / mean(plain), "goal": 0.99}
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
