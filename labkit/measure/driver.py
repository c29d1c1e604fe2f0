"""The measurement protocol inside an arm's worker: warm-up, then timed trials over a streaming AsyncLLM.

Every token's arrival is stamped in the client loop (`RequestOutputKind.DELTA`), on the frontend's clock:
when the token reaches the process that holds the engine client, as a streaming API server would hand it
on (network and HTTP framing excluded). That gives TTFT, each inter-token gap (TBT), TPOT and E2E per
request. Engine counters (preemptions, prefix-cache hits) are read as deltas of vLLM's own metrics around
each trial. Sampling is part of the protocol (labkit.spec.protocol) and the same for every arm.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from labkit.measure.gpu_state import GpuStateSampler
from labkit.measure.hostload import OtherLoad
from labkit.spec.conversation import Conversation
from labkit.spec.protocol import SAMPLING_KEYS, Protocol, choose_sampling
from labkit.spec.workload import Burst, Concurrency, Mix, Request, Workload
from labkit.store import token_gaps

COUNTERS = {  # vLLM metric name -> column in the trial table
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:prompt_tokens": "engine_prompt_tokens",
    "vllm:generation_tokens": "engine_generation_tokens",
    # speculative decoding (acceptance derived in labkit.store): 0 for an arm that drafts nothing
    "vllm:spec_decode_num_drafts": "spec_drafts",
    "vllm:spec_decode_num_draft_tokens": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "spec_accepted_tokens",
}
KV_USAGE_GAUGE = "vllm:kv_cache_usage_perc"
_ids = itertools.count()


def sampling_for(model_config, temperature: float | None) -> dict:
    """The sampling every request of an arm gets: what vLLM applies to a request that sets nothing (the
    model's generation config, else SamplingParams' own defaults), with the protocol's temperature where
    it names one. Tokens are always exactly max_tokens (EOS ignored), so lengths stay the workload's."""
    from vllm import SamplingParams

    neutral = SamplingParams()
    return choose_sampling(model_config.get_diff_sampling_param(), {k: getattr(neutral, k) for k in SAMPLING_KEYS},
                           temperature)


def read_counters() -> dict[str, float]:
    """vLLM's counters summed over engines, and the KV-cache usage of the fullest engine, by metric name."""
    from vllm.v1.metrics.reader import get_metrics_snapshot
    totals: dict[str, float] = {}
    for metric in get_metrics_snapshot():  # one series per engine: several with data-parallel replicas
        value = float(getattr(metric, "value", 0) or 0)
        if metric.name in COUNTERS:
            totals[metric.name] = totals.get(metric.name, 0.0) + value
        elif metric.name == KV_USAGE_GAUGE:  # each replica has its own pool: the fullest one counts
            totals[metric.name] = max(totals.get(metric.name, 0.0), value)
    return totals


async def engine_counters(engine) -> dict[str, float]:
    """read_counters() of the engine in this process, or a served engine's own (its /metrics, read off the
    event loop so that no token waits for the HTTP round trip)."""
    if hasattr(engine, "counters"):
        return await asyncio.to_thread(engine.counters, set(COUNTERS), KV_USAGE_GAUGE)
    return read_counters()


async def _one_request(engine, request: Request, t0: float, sampling: dict, answer: list | None = None) -> dict:
    """Send one request and time every token it streams back; `answer`, when given, receives its token ids."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                            **sampling)
    stamps: list[float] = []
    preemptions, finish_reason = 0, None
    submitted = time.perf_counter()
    async for out in engine.generate({"prompt_token_ids": request.prompt_token_ids}, params,
                                     request_id=f"labkit-{next(_ids)}"):
        now = time.perf_counter()
        completion = out.outputs[0]
        stamps.extend([now] * len(completion.token_ids))
        if answer is not None:
            answer.extend(completion.token_ids)
        if out.finished:
            finish_reason = completion.finish_reason
            preemptions = int(getattr(out.metrics, "num_preemptions", 0) or 0) if out.metrics else 0
    token_s = [s - t0 for s in stamps]
    ttft = (stamps[0] - submitted) * 1e3 if stamps else float("nan")
    e2e = (stamps[-1] - submitted) * 1e3 if stamps else float("nan")
    return {
        "request": request.index,
        "prompt_tokens": len(request.prompt_token_ids),
        "output_tokens": len(stamps),
        "submitted_s": submitted - t0,
        "ttft_ms": ttft,
        "tpot_ms": (e2e - ttft) / (len(stamps) - 1) if len(stamps) > 1 else float("nan"),
        "e2e_ms": e2e,
        "itl_ms": token_gaps(token_s).tolist(),  # for the stopping rule; the stored table keeps only token_s
        "token_s": token_s,
        "preemptions": preemptions,
        "finish_reason": finish_reason,
    }


@dataclass
class Watch:
    """An open-loop trial watched as it runs: `rule(sent_s, done_s, now_s)` (each sent request's send and completion
    time, NaN while in flight, seconds from the trial's start) is asked every `every_s`; once it answers True the
    requests not yet back are cancelled (the engine aborts them) and `saturated_at_s` says when."""

    rule: Callable
    every_s: float = 0.25
    saturated_at_s: float | None = None


async def _watched(tasks: list, sent: np.ndarray, done: np.ndarray, t0: float, watch: Watch) -> list[dict]:
    """The rows of the requests that came back, the rest cancelled once the watch's rule says so."""
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=watch.every_s)
        now = time.perf_counter() - t0
        known = ~np.isnan(sent)
        if pending and watch.rule(sent[known], done[known], now):
            watch.saturated_at_s = now
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            break
    rows = []
    for task in tasks:
        if task.cancelled():
            continue
        if task.exception() is not None:
            raise task.exception()
        rows.append(task.result())
    return rows


async def drive(engine, requests: list[Request], arrival, sampling: dict,
                t0: float | None = None, watch: Watch | None = None) -> tuple[list[dict], float]:
    """Send the requests under the arrival process; return per-request rows and the trial's wall time.
    Parts of a Mix share one clock `t0`, so their timestamps line up. An open-loop trial with a `watch` is ended
    early when its rule says so (a rate the engine cannot keep up with); the rows are then those that came back."""
    t0 = time.perf_counter() if t0 is None else t0
    if isinstance(arrival, Burst):
        rows = await asyncio.gather(*(_one_request(engine, r, t0, sampling) for r in requests))
    elif isinstance(arrival, Concurrency):
        queue = list(reversed(requests))
        rows = []

        async def client():
            while queue:
                rows.append(await _one_request(engine, queue.pop(), t0, sampling))
        await asyncio.gather(*(client() for _ in range(min(arrival.n, len(requests)))))
    else:  # open loop: send at the scheduled offsets whatever the engine's state
        sent, done = np.full(len(requests), np.nan), np.full(len(requests), np.nan)

        async def timed(i: int, r: Request):
            await asyncio.sleep(max(0.0, r.arrival_s - (time.perf_counter() - t0)))
            sent[i] = time.perf_counter() - t0
            row = await _one_request(engine, r, t0, sampling)
            done[i] = time.perf_counter() - t0
            return row
        if watch is None:
            rows = await asyncio.gather(*(timed(i, r) for i, r in enumerate(requests)))
        else:
            rows = await _watched([asyncio.ensure_future(timed(i, r)) for i, r in enumerate(requests)], sent, done,
                                  t0, watch)
    return sorted(rows, key=lambda row: row["request"]), time.perf_counter() - t0


async def drive_conversation(engine, conversation: Conversation, vocab, seed: int,
                             sampling: dict) -> tuple[list[dict], float]:
    """Every session of a Conversation, `concurrency` at a time; each turn resends the session's history with
    the answers the engine gave, token for token. Rows carry their session and turn."""
    system, texts, answers = conversation.contents(vocab, seed)
    gate, t0, rows = asyncio.Semaphore(conversation.concurrency), time.perf_counter(), []

    async def session(s: int):
        async with gate:
            history = list(system)
            for t in range(conversation.turns):
                prompt, answer = history + texts[s, t], []
                row = await _one_request(engine, Request(s * conversation.turns + t, prompt, int(answers[s, t]), None),
                                         t0, sampling, answer)
                rows.append({**row, "session": s, "turn": t})
                history = prompt + answer
                if conversation.think_time_s and t + 1 < conversation.turns:
                    await asyncio.sleep(conversation.think_time_s)
    await asyncio.gather(*(session(s) for s in range(conversation.sessions)))
    return sorted(rows, key=lambda row: row["request"]), time.perf_counter() - t0


async def drive_load(engine, workload, vocab, seed: int, sampling: dict,
                     watch: Watch | None = None) -> tuple[list[dict], float]:
    """A Workload, a Conversation, or every part of a Mix concurrently on one clock (rows then carry their part);
    a `watch` applies to a Workload's open-loop trial."""
    if isinstance(workload, Conversation):
        return await drive_conversation(engine, workload, vocab, seed, sampling)
    if not isinstance(workload, Mix):
        return await drive(engine, workload.build(vocab, content_seed=seed), workload.arrival, sampling,
                           watch=watch)
    t0 = time.perf_counter()
    done = await asyncio.gather(*(drive(engine, part.build(vocab, content_seed=seed + 7919 * (i + 1)),
                                        part.arrival, sampling, t0) for i, part in enumerate(workload.parts.values())))
    rows = [{**row, "part": name} for name, (part_rows, _) in zip(workload.parts, done) for row in part_rows]
    return rows, max(seconds for _, seconds in done)


async def _sample_kv_usage(engine, samples: list[float], interval: float, stop: asyncio.Event):
    while not stop.is_set():
        samples.append((await engine_counters(engine)).get(KV_USAGE_GAUGE, 0.0))
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


def content_seed(load_index: int, trial: int, attempt: int = 0) -> int:
    """Fresh token content per load, trial and attempt (warm-up is trial -1; a trial measured again after
    heavy outside load is attempt 1, 2): no load, trial or attempt is served from another's prefix cache,
    since equal seeds would draw equal leading tokens."""
    return 1_000_000 * load_index + 1000 + trial + 100_000 * attempt


async def run_trial(engine, workload: Workload, vocab, trial: int, protocol: Protocol, sampling: dict,
                    load_index: int = 0, gpu_state: GpuStateSampler | None = None, attempt: int = 0,
                    watch: Watch | None = None):
    """One timed trial: its per-request rows, and a summary row with throughput, peak KV usage, cores other
    processes kept busy, the engine counters' deltas and, where NVML answers, the GPUs' clocks, temperature,
    power and slowdowns during the trial. `attempt` > 0 measures the trial again with fresh content. A watched
    open-loop trial (`watch`) may end early: its summary says whether it did (`saturated`) and when."""
    before, others = await engine_counters(engine), OtherLoad()
    if gpu_state is not None:
        gpu_state.start()
    kv_samples: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_kv_usage(engine, kv_samples, protocol.kv_sample_interval_s, stop))
    # The client's own garbage (token stamps of every request) must not pause the engine's frontend,
    # which shares this process: collect before the trial, not during it.
    gc.collect()
    gc.disable()
    try:
        rows, duration = await drive_load(engine, workload, vocab, content_seed(load_index, trial, attempt),
                                          sampling, watch)
    finally:
        gc.enable()
    stop.set()
    await sampler
    after = await engine_counters(engine)
    gpu_columns = gpu_state.stop() if gpu_state is not None else {}
    for row in rows:
        row["trial"] = trial
    output_tokens = sum(r["output_tokens"] for r in rows)
    prompt_tokens = sum(r["prompt_tokens"] for r in rows)
    summary = {
        "trial": trial,
        "duration_s": duration,
        "requests": len(rows),
        "request_s": len(rows) / duration,
        "output_tok_s": output_tokens / duration,
        "total_tok_s": (output_tokens + prompt_tokens) / duration,
        "kv_usage_peak_pct": 100 * max(kv_samples, default=0.0),
        "host_other_cores": others.cores(),
        "threads_waiting_for_cpu": others.threads_waiting(),
    }
    if watch is not None:  # the requests sent whether or not they came back, and whether the trial was ended early
        summary.update(requests_scheduled=workload.num_requests, saturated=watch.saturated_at_s is not None,
                       saturated_at_s=watch.saturated_at_s)
    for name, column in COUNTERS.items():
        summary[column] = after.get(name, 0.0) - before.get(name, 0.0)
    return rows, {**summary, **gpu_columns}


def _first_part(workload):
    """Warm-up and the profiler window use a Mix's first part: one steady shape, not the mixture."""
    return next(iter(workload.parts.values())) if isinstance(workload, Mix) else workload


async def profile_window(engine, workload: Workload, vocab, count: int, sampling: dict,
                         load_index: int = 0) -> float:
    """A torch-profiler capture of the load in steady state, after the timed trials (never inside one:
    the profiler slows the engine down). Returns the window's wall time."""
    first = _first_part(workload)
    requests = first.build(vocab, content_seed=content_seed(load_index, 10_000))[:count]
    await engine.start_profile()
    try:
        _, seconds = await drive(engine, requests, first.arrival, sampling)
    finally:
        await engine.stop_profile()  # the worker writes its trace before this returns
    return seconds


async def warm_up(engine, workload: Workload, vocab, count: int, sampling: dict,
                  load_index: int = 0) -> None:
    """Unmeasured requests of the workload's own shape: compile caches, allocator and scheduler settle."""
    first = _first_part(workload)
    if count:
        requests = first.build(vocab, content_seed=content_seed(load_index, -1))[:count]
        await drive(engine, requests, Burst(), sampling)
