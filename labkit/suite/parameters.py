"""Notebook parameters: the named profiles a suite run uses, each notebook's smoke values (one list, read by
the notebook's own `smoke` switch too), and the check that refuses a parameter the notebook does not have,
or a value of the wrong type, before a kernel starts."""
from __future__ import annotations

import functools
import re
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter, close_match
from labkit.spec.numbers import number_problem, wanted

NOTEBOOKS = settings.NOTEBOOKS

# The small runs CI does, per notebook (relative to notebooks/): `smoke=True` in a notebook applies them.
SMOKE: dict[str, dict] = {
    "00_quickstart.ipynb": dict(model="tiny-llama", num_requests=24, prompt_len=64, output_len=16, trials=2,
                                experiment="quickstart-smoke"),
    # one change to find (max_num_seqs 1 under 4 clients queues requests: TTFT): two engine starts, eager and
    # in-process through the notebook's overrides (set in the command, they would be changes to undo)
    "01_diagnose.ipynb": dict(command="vllm serve tiny-llama --max-num-seqs 1", model="tiny-llama", prompt_len=32,
                              output_len=16, clients=4, requests=8, target="ttft_p99_ms", trials=2,
                              experiment="diagnosis-smoke"),
    "explore.ipynb": dict(experiment="quickstart-smoke"),
    # a 2 MiB pool holds 2,048 tokens of the tiny model: 7 documents of 256 + 32, so 16 overflow it
    "L1_business/prefix_cache.ipynb": dict(model="tiny-llama", system_tokens=256, question_tokens=32, output_len=8,
                                           requests=16, clients=4, doc_tokens=256, working_sets="2,16", reuse=3,
                                           sessions=4, turns=3, message_tokens=32, answer_tokens=16,
                                           sessions_in_flight=2, kv_cache_mib=2, trials=1,
                                           experiment="prefix-cache-smoke"),
    # prompts 32x apart: on two shared cores a tiny-llama load's first tokens come tens to hundreds of ms late at
    # random (556 ms seen), and 64 against 512 tokens (fastest first tokens 13.7 and 26.5 ms beside a busy loop)
    # came in the wrong order once even for the fastest request
    "L1_business/request_shape.ipynb": dict(model="tiny-llama", prompt_lengths="64,2048", output_len=8,
                                            max_tokens="8,64", fixed_prompt=64, current_prompt=512, cuts="128,256",
                                            clients=4, requests=12, trials=1, experiment="request-shape-smoke"),
    # 96 + 48 tokens are 2 KV blocks of 1 MiB's 16-token blocks each: preemption from 5 sequences, so
    # the grid has one setting below the onset and one above it
    "L2_engine/api_server.ipynb": dict(model="tiny-llama", prompt_len=32, output_len=16, decode_requests=2, clients=4,
                                       closed_requests=8, burst_requests=8, trials=1, experiment="api-server-smoke"),
    # a closed-loop and a rate search on one eager engine (TPOT P99 ~10 ms at 8 clients here: the closed loop
    # brackets and bisects); the template arm is not applicable on this CPU. A rate probe holds 3 s of its
    # schedule, not 10: its four probes took 12 s each, half the notebook's smoke run
    "L2_engine/capacity.ipynb": dict(model="tiny-llama", prompt_len=32, output_len=16, slo_ttft_p99_ms=500.0,
                                     slo_tpot_p99_ms=8.0, clients="1,8", rates="2,16", probe_requests=8,
                                     probe_seconds=3.0, trials=1, experiment="capacity-smoke"),
    "L2_engine/batch_triangle.ipynb": dict(model="tiny-llama", grid="2,8", clients=8, num_requests=16,
                                           prompt_len=96, output_len=48, kv_cache_mib=1, slo_ms=8.0, trials=2,
                                           experiment="batch-triangle-smoke"),
    "L2_engine/chunked_prefill.ipynb": dict(model="tiny-llama", stream_clients=4, stream_prompt_len=32,
                                            stream_output_len=160, long_prompt_len=2048, long_count=2,
                                            first_injection_s=0.1, injection_interval_s=0.15, budgets="256",
                                            trials=1, experiment="chunked-prefill-smoke"),
    "L2_engine/memory_pools.ipynb": dict(model="tiny-llama", cpu_kv_mib="64", prompt_median=128,
                                         output_median=32, requests=8, experiment="memory-pools-smoke"),
    "L2_engine/parallelism.ipynb": dict(model="tiny-llama", prompt_len=32, output_len=16, single_requests=3,
                                        clients=4, load_requests=8, trials=2, profile_requests=2,
                                        experiment="parallelism-smoke"),
    "L3_kernel/attention_backends.ipynb": dict(model="tiny-llama", clients=4, requests=8, trials=2,
                                               decode_prompt_len=32, decode_output_len=32, prefill_prompt_len=512,
                                               prefill_output_len=4, experiment="attention-backends-smoke"),
    "L3_kernel/cuda_graphs.ipynb": dict(model="tiny-llama", prompt_len=32, output_len=16, decode_requests=2,
                                        stream_clients=8, stream_requests=16, trials=2, experiment="cuda-graphs-smoke"),
    # the real 135M model (smollm2-135m): in bfloat16 a CPU without AVX-512 prefilled 512-token prompts at ~40
    # tokens/s on one core here (an 18 s TTFT); float32 is its native arithmetic. Even so a step of it at batch 4
    # took ~0.2 s beside another notebook: one trial a load, and loads of a few steps
    "L3_kernel/real_vs_dummy_weights.ipynb": dict(decode_prompt_len=32, decode_output_len=16, decode_clients=2,
                                                  prefill_prompt_len=64, prefill_output_len=4, prefill_clients=2,
                                                  requests_per_client=2, dtype="float32", trials=1,
                                                  experiment="real-vs-dummy-smoke"),
    # one batch: its verification batches (2 and 2 x (k + 1)) are the estimate's two loads
    "L3_kernel/speculative_decoding.ipynb": dict(ks="3", tasks="copy", clients="2", requests_per_client=1,
                                                 output_len=16, dtype="float32", trials=1,
                                                 estimate_shape="tiny-llama", estimate_prompt_len=64,
                                                 experiment="speculative-decoding-smoke"),
    "L3_kernel/profile_hotspots.ipynb": dict(model="tiny-llama", clients=4, prompt_len=32, output_len=16, requests=8,
                                             profile_requests=4, trials=2, experiment="profile-hotspots-smoke"),
    "L4_hardware/hardware_profile.ipynb": dict(copy_mib=64, gemm_n=512, repeats=2, record=False),
    "L4_hardware/precision.ipynb": dict(model="tiny-llama", decode_prompt_len=32, decode_output_len=32,
                                        decode_clients=4, decode_requests=8, long_prompt_len=1024, long_output_len=8,
                                        long_clients=2, long_requests=4, trials=2, numerics_tokens=8,
                                        experiment="precision-smoke"),
    "L4_hardware/templates.ipynb": dict(model="tiny-llama", prompt_len=64, output_len=16, clients=4, requests=8,
                                        trials=2, experiment="templates-smoke"),
}

# A smoke run checks a notebook's wiring: its engines start eager (torch.compile off: 10-25 s less per engine
# start on a CPU), except in the notebooks whose subject is compilation (they ask for eager=False). Every smoke
# engine on one device keeps its worker inside the engine-core process: vLLM's CPU platform otherwise starts a
# worker process of its own even for one device, and that process imports vLLM a third time (8-10 s of each
# CPU engine start here). On a GPU a one-device engine is laid out so already; engines over several devices
# keep their worker processes either way.
SMOKE_LAYOUT = {"environment": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
SMOKE_OVERRIDES = {"enforce_eager": True, **SMOKE_LAYOUT}


def smoke_overrides(smoke: bool, eager: bool = True) -> dict:
    """The knobs forced onto a notebook's arms: in a smoke run an eager engine (unless eager=False) without a
    worker process beside its engine core, then the settings' launch overrides (`labkit suite --override`),
    which win. Shown in each arm's knobs and launch line."""
    from labkit.experiment import launch_overrides  # the experiment module imports this one's package

    smoke_knobs = (SMOKE_OVERRIDES if eager else SMOKE_LAYOUT) if smoke else {}
    return {**smoke_knobs, **launch_overrides()}


# Named parameter sets: "*" applies to every notebook, a notebook path (relative to notebooks/) overrides.
PROFILES: dict[str, dict[str, dict]] = {
    "cpu-smoke": {"*": {"smoke": True}},  # minutes on a laptop or CI machine: each notebook's SMOKE values
    "cpu": {"*": {}},  # the notebooks' own defaults (tiny model on a CPU)
    "gpu": {"*": {}},  # the notebooks' own defaults (Llama-3-8B shape on a GPU)
    # the grid starts at 8 there: at batch 8 the H200 measured TBT P99 21 ms (SLO 50 ms) and 11.8 s a trial
    # (data/baselines/h200/results/batch-triangle); each halving of the batch about doubles a trial
    # the diagnosis's eager batch-4 launch decodes ~15 ms a token there: 800-token answers made a trial minutes
    "h200": {"*": {}, "L2_engine/batch_triangle.ipynb": {"grid": "8,16,32,64,128"},
             # a rate search from 0.5 requests/s spends minutes a trial on its first rungs (64 requests at 0.5/s),
             # where an 8B engine on this GPU holds far more
             "L2_engine/capacity.ipynb": {"clients": "4,256", "rates": "4,64"},
             # sized by time: every load is a few rounds of 128 decode steps, and without graphs a step is launch-
             # bound (28 ms on an H100 at any batch: 12-15 s a trial of four rounds, the minimum of two trials per
             # load 142 s, data/baselines/h100/time-to-verdict-2026-12-05); two rounds a trial halve that, and the
             # synchronous rounds of a closed loop measure the same token rates. Its own results folder: the
             # committed H200 store (four rounds a trial) would refuse the changed workload
             "L3_kernel/cuda_graphs.ipynb": {"decode_requests": 2, "requests_per_client": 2, "stream_requests": 128,
                                             "experiment": "cuda-graphs-time-sized"},
             # mistuned three ways (eager, Triton's attention instead of the platform's first choice, a batch
             # of 4 under 16 clients): three one-change arms for those, and fp8 KV cache on an fp8 GPU
             "01_diagnose.ipynb": {"command": "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --enforce-eager "
                                              "--max-num-seqs 4 --attention-backend TRITON_ATTN",
                                   "output_len": 256, "requests": 32, "trials": 2}},
}


def relative(notebook: str | Path) -> str | None:
    """The notebook's path under notebooks/ (None for a notebook elsewhere)."""
    path = Path(notebook).resolve()
    return str(path.relative_to(NOTEBOOKS)) if path.is_relative_to(NOTEBOOKS) else None


def smoke_parameters(notebook: str) -> dict:
    """The smoke values of a notebook (its path under notebooks/), for its `if smoke:` cell."""
    if notebook not in SMOKE:
        raise BadParameter(f"no smoke values for {notebook!r}; notebooks with smoke values are {sorted(SMOKE)}")
    return dict(SMOKE[notebook])


def parameters_for(profile: str, notebook: Path) -> dict:
    """The parameters a profile gives one notebook."""
    if profile not in PROFILES:
        raise BadParameter(f"unknown parameter profile {profile!r}; profiles are {sorted(PROFILES)}")
    return {**PROFILES[profile].get("*", {}), **PROFILES[profile].get(relative(notebook), {})}


@functools.lru_cache(maxsize=64)
def _declared(path: str, mtime: float) -> dict[str, dict]:
    import papermill

    return papermill.inspect_notebook(path)


def declared(notebook: str | Path) -> dict[str, dict]:
    """The notebook's own parameters cell: name -> {inferred_type_name, default, help} (papermill's reading)."""
    path = Path(notebook).resolve()
    return _declared(str(path), path.stat().st_mtime)


NUMBER_OR_AUTO = {"trials"}  # declared as text ("auto"), and a whole number works too: trials="auto" or trials=3


def _coerce(value, kind: str, name: str = "", default: str = ""):
    """The value as the parameter's type, or raise ValueError. Booleans take true/false only (True, "true",
    "false"; not "no" or 1, which papermill would pass on as truthy text or numbers)."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("true or false")
    if kind in ("int", "float"):
        # every numeric parameter of the lab's notebooks is a count, a length, a time or a limit: none is
        # negative, and none is NaN or infinite (JSON's NaN and Infinity arrive as floats)
        rules = dict(integer=kind == "int", minimum=0)
        if number_problem(value, **rules):
            raise ValueError(wanted(**rules))
        return float(value) if kind == "float" else value
    if name in NUMBER_OR_AUTO and value != "auto":
        number = int(value) if isinstance(value, str) and value.isdigit() else value
        if number_problem(number, integer=True, minimum=1):
            raise ValueError('"auto" or ' + wanted(integer=True, minimum=1))
        return number
    if kind == "str":
        if (isinstance(value, int) and not isinstance(value, bool) and value >= 0
                and re.fullmatch(r"""["'][\d,\s]+["']""", default or "")):
            return str(value)  # a list of counts such as "8,16" given one count: `-p cliff_clients 8` arrives as 8
        if not isinstance(value, str):
            raise ValueError("text")
        return value
    return value  # a parameter papermill could not type (None default, an expression): taken as given


def check_parameters(notebook: str | Path, given: dict) -> dict:
    """`given` checked against the notebook's parameters cell and coerced to its types; an unknown name or a
    value of the wrong type is a BadParameter listing every parameter with its type."""
    params = declared(notebook)
    problems, checked = [], {}
    for name, value in given.items():
        if name not in params:
            problems.append(f"{name!r} is not a parameter of this notebook{close_match(name, params)}")
            continue
        kind = params[name]["inferred_type_name"]
        try:
            checked[name] = _coerce(value, kind, name, params[name]["default"])
        except ValueError as exc:
            problems.append(f"{name} must be {exc}, got {value!r}")
    if problems:
        listing = ", ".join(f"{n}: {p['inferred_type_name']} = {p['default']}" for n, p in params.items())
        raise BadParameter(f"{Path(notebook).name}: {'; '.join(problems)}. Its parameters are: {listing}")
    return checked
