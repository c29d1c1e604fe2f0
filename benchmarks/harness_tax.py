"""Harness tax: what the lab's measurement costs against plain vLLM started the same way, per arm and load.

    python benchmarks/harness_tax.py [--model auto] [--arms default,eager,graphs_off] [--loads burst,closed]
                                     [--requests N] [--prompt-len N] [--output-len N] [--clients 64]
                                     [--trials 5] [--temperature T] [--workdir DIR] [--out result.json]

Each pair runs both sides in fresh processes with the same engine arguments, usage context, sampling,
warm-up and per-trial prompts:
- `burst` (an offline batch): the lab with context="offline" (a streaming AsyncLLM, every token stamped)
  against `vllm.LLM(...).generate` on the whole batch, which is what an offline user runs;
- `closed` (a server under N closed-loop clients): the lab with context="serve" against a plain AsyncLLM
  client built with the API server's usage context that asks for final outputs only (or, with
  --plain-streaming, every token as it comes, unstamped: what a streaming API server's frontend handles).
The only argument that differs is printed with each pair: the offline LLM class keeps vLLM's stats logging
off unless asked, and the lab needs it on to read the engine's counters, so that cost is in the tax.
The ratio is the lab's output tok/s over the plain side's, with a 95 % bootstrap interval over the trials.
Targets: >= 0.99 on a GPU, >= 0.97 on a 2-core CPU. With --workdir, every finished side is kept there and a
rerun with the same arguments measures only what is missing (a run cut off by a time limit resumes).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# graphs_off: torch.compile kept, no CUDA graphs (the cuda_graphs notebook's arm), to find where its batch-1 time goes
ARMS = {"default": {}, "eager": {"enforce_eager": True}, "graphs_off": {"cuda_graphs": False}}
LOADS = {"burst": "offline", "closed": "serve"}  # load -> the deployment context it stands for
TARGETS = {"cuda": 0.99, "cpu": 0.97}
SIZES = {"cuda": {"requests": 512, "prompt_len": 512, "output_len": 128},  # the shape the gap was found on
         "cpu": {"requests": 128, "prompt_len": 128, "output_len": 64}}  # trials of seconds, not tenths


def workload(load: str, a):
    import labkit as lk
    arrival = lk.Burst() if load == "burst" else lk.Concurrency(a.clients)
    return lk.Workload(a.requests, lk.Fixed(a.prompt_len), lk.Fixed(a.output_len), arrival)


def plan_pairs(a, results_dir: str | Path) -> list[dict]:
    """Every (arm, load) pair: the lab's experiment and the plain side's job, built from the same spec."""
    import labkit as lk

    pairs = []
    for load in a.loads:
        exp = lk.Experiment(f"harness-tax-{load}", {arm: ARMS[arm] for arm in a.arms}, workload(load, a),
                            model=a.model, context=LOADS[load], results_dir=results_dir,
                            protocol=lk.Protocol(trials=a.trials, warmup_requests=8, temperature=a.temperature))
        ref = lk.resolve_model(exp.model)
        for arm, plan in exp.plans().items():
            spec = exp.arm_spec(plan, ref)
            engine_args = {"model": ref.model, **spec["engine_args"]}
            differs = {}
            if LOADS[load] == "offline":  # LLM's own default, as an offline user runs it
                engine_args["disable_log_stats"] = True
                differs["disable_log_stats"] = {"lab": False, "plain": True}
            pairs.append({"arm": arm, "load": load, "context": exp.context, "experiment": exp, "differs": differs,
                          "plain": {"engine_args": engine_args, "context": exp.context,
                                    "workload": spec["workloads"]["default"], "vocab": ref.shape.vocab_size,
                                    "trials": a.trials, "warmup_requests": exp.protocol.warmup_requests,
                                    "temperature": exp.protocol.temperature, "streaming": a.plain_streaming}})
    return pairs


def _requests(job: dict, trial: int):
    from labkit.measure.driver import content_seed
    from labkit.spec.workload import Workload
    return Workload.from_dict(job["workload"]).build(job["vocab"], content_seed(0, trial))  # as the lab's load 0


def plain_offline(job: dict) -> list[float]:
    """LLM.generate on the whole batch, as an offline user runs it."""
    from vllm import LLM, SamplingParams

    from labkit.measure.driver import sampling_for

    llm = LLM(**job["engine_args"])
    sampling = sampling_for(llm.llm_engine.model_config, job["temperature"])

    def generate(requests) -> int:
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, **sampling) for r in requests]
        return sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False))

    generate(_requests(job, -1)[:job["warmup_requests"]])  # the lab's warm-up
    rates = []
    for trial in range(job["trials"]):
        requests = _requests(job, trial)
        started = time.perf_counter()
        tokens = generate(requests)
        rates.append(tokens / (time.perf_counter() - started))
    return rates


async def plain_serve(job: dict) -> list[float]:
    """A plain AsyncLLM with the API server's usage context: clients that each await a final output and send
    the next request, no per-token stamps, no counters."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from labkit.measure.driver import sampling_for
    from labkit.spec.workload import Workload

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**job["engine_args"]),
                                       usage_context=UsageContext.OPENAI_API_SERVER)
    sampling = sampling_for(engine.vllm_config.model_config, job["temperature"])
    clients = Workload.from_dict(job["workload"]).arrival.n
    kind = RequestOutputKind.DELTA if job.get("streaming") else RequestOutputKind.FINAL_ONLY
    counter = iter(range(10**9))

    async def one(request) -> int:
        params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True,
                                output_kind=kind, **sampling)
        tokens = 0  # the final output holds every token; a streamed one, each delta its own
        async for out in engine.generate({"prompt_token_ids": request.prompt_token_ids}, params,
                                         request_id=f"plain-{next(counter)}"):
            tokens = len(out.outputs[0].token_ids) + (tokens if kind == RequestOutputKind.DELTA else 0)
        return tokens

    async def closed_loop(requests, n) -> int:
        queue, done = list(reversed(requests)), []

        async def client():
            while queue:
                done.append(await one(queue.pop()))
        await asyncio.gather(*(client() for _ in range(min(n, len(requests)))))
        return sum(done)

    try:
        await asyncio.gather(*(one(r) for r in _requests(job, -1)[:job["warmup_requests"]]))  # the lab's warm-up
        rates = []
        for trial in range(job["trials"]):
            requests = _requests(job, trial)
            started = time.perf_counter()
            tokens = await closed_loop(requests, clients)
            rates.append(tokens / (time.perf_counter() - started))
        return rates
    finally:
        engine.shutdown()


def ratio_interval(lab: list[float], plain: list[float]) -> tuple[float, float, float]:
    """lab mean / plain mean, with the 95 % interval of the ratio of bootstrap means over the trials."""
    import numpy as np

    from labkit.analyze.stats import metric, replicates

    m = metric("output_tok_s")
    ratios = replicates([np.asarray(lab, float)], m, seed=0) / replicates([np.asarray(plain, float)], m, seed=1)
    return float(np.mean(lab) / np.mean(plain)), float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def _run_plain(job: dict, folder: Path, name: str) -> list[float]:
    """The plain side in a fresh process; a finished side of the same job is read back, not remeasured."""
    done = folder / f"plain-{name}.json"
    if done.exists() and {k: v for k, v in json.loads(done.read_text()).items() if k != "rates"} == job:
        return json.loads(done.read_text())["rates"]
    path = folder / f"plain-{name}.job.json"
    path.write_text(json.dumps(job))
    # a session of its own, ended as a whole afterwards: vLLM's engine-core and worker processes must not
    # outlive the side that started them (they would hold memory and cores during the next measurement)
    side = subprocess.Popen([sys.executable, __file__, "--plain-job", str(path)], start_new_session=True)
    try:
        code = side.wait()
    finally:
        try:
            os.killpg(side.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if code != 0:
        raise RuntimeError(f"the plain side {name} failed (exit {code}); its output is above")
    path.rename(done)
    return json.loads(done.read_text())["rates"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="auto")
    parser.add_argument("--arms", default="default,eager", help=f"comma-separated, of {list(ARMS)} (graphs_off: GPU only)")
    parser.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {list(LOADS)}")
    parser.add_argument("--requests", type=int, help="per trial (default: 512 on a GPU, 128 on a CPU)")
    parser.add_argument("--prompt-len", type=int, help="(default: 512 on a GPU, 128 on a CPU)")
    parser.add_argument("--output-len", type=int, help="(default: 128 on a GPU, 64 on a CPU)")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients of the closed load")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=None,
                        help="default: the server's default for a request that names none, as vllm bench serve")
    parser.add_argument("--plain-streaming", action="store_true",
                        help="the closed load's plain client streams every token (DELTA) without stamping it, as "
                             "a streaming API server does: splits the tax into streaming and the lab's own work")
    parser.add_argument("--workdir", help="keep each finished side here and resume from it (default: a temporary folder)")
    parser.add_argument("--out")
    parser.add_argument("--plain-job", help=argparse.SUPPRESS)  # internal: run one plain side only
    a = parser.parse_args()
    if a.plain_job:
        job = json.loads(Path(a.plain_job).read_text())
        rates = plain_offline(job) if job["context"] == "offline" else asyncio.run(plain_serve(job))
        Path(a.plain_job).write_text(json.dumps({**job, "rates": rates}))
        sys.stdout.flush()
        os._exit(0)  # as the lab's worker: engine teardown at interpreter exit only adds noise

    import labkit as lk
    platform = lk.current_platform()
    a.arms, a.loads = a.arms.split(","), a.loads.split(",")
    for what, chosen, known in (("arm", a.arms, ARMS), ("load", a.loads, LOADS)):
        if set(chosen) - set(known):
            parser.error(f"unknown {what}(s) {sorted(set(chosen) - set(known))}; choose from {list(known)}")
    for key, value in SIZES["cuda" if platform.kind == "cuda" else "cpu"].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    target = TARGETS.get(platform.kind, TARGETS["cpu"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(a.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        pairs = plan_pairs(a, workdir)
        for pair in pairs:
            pair["plain_tok_s"] = _run_plain(pair["plain"], workdir, f"{pair['load']}-{pair['arm']}")
        for exp in {id(p["experiment"]): p["experiment"] for p in pairs}.values():
            trials = exp.run(progress=False).trials
            for pair in (p for p in pairs if p["experiment"] is exp):
                pair["lab_tok_s"] = trials[trials.arm == pair["arm"]].output_tok_s.tolist()
        for pair in pairs:
            ratio, low, high = ratio_interval(pair["lab_tok_s"], pair["plain_tok_s"])
            rows.append({"arm": pair["arm"], "load": pair["load"], "context": pair["context"],
                         "plain_tok_s": pair["plain_tok_s"], "lab_tok_s": pair["lab_tok_s"], "ratio": ratio,
                         "ci_low": low, "ci_high": high, "meets_target": ratio >= target,
                         "differs": pair["differs"],
                         "engine_args": {**pair["plain"]["engine_args"], "model": pair["experiment"].model}})
    report = {"model": pairs[0]["experiment"].model, "platform": platform.kind, "vllm": platform.vllm_version_str,
              "gpus": list(platform.gpu_names),
              "requests": a.requests, "prompt_len": a.prompt_len, "output_len": a.output_len, "clients": a.clients,
              "trials": a.trials, "temperature": a.temperature, "target": target, "pairs": rows}
    for row in rows:
        print(f"{row['arm']:>8} {row['load']:>6} ({row['context']}): lab {sum(row['lab_tok_s']) / len(row['lab_tok_s']):,.0f}"
              f" / plain {sum(row['plain_tok_s']) / len(row['plain_tok_s']):,.0f} tok/s = {row['ratio']:.3f} "
              f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]  target {target}")
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
