"""The in-worker driver's pure parts: engine counters across replicas, sampling, content seeds (no engine)."""


def test_engine_counters_add_up_across_replicas_and_kv_usage_takes_the_fullest_pool(monkeypatch):
    import sys
    import types
    from types import SimpleNamespace as Metric

    from labkit.measure import driver

    snapshot = [Metric(name="vllm:num_preemptions", value=2), Metric(name="vllm:num_preemptions", value=3),
                Metric(name="vllm:kv_cache_usage_perc", value=0.25), Metric(name="vllm:kv_cache_usage_perc", value=0.5),
                Metric(name="vllm:iteration_tokens_total", value=99)]
    reader = types.ModuleType("vllm.v1.metrics.reader")
    reader.get_metrics_snapshot = lambda: snapshot
    for name in ("vllm", "vllm.v1", "vllm.v1.metrics"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.metrics.reader", reader)
    assert driver.read_counters() == {"vllm:num_preemptions": 5.0, "vllm:kv_cache_usage_perc": 0.5}


def test_a_request_row_has_gaps_from_its_stamps_and_is_stored_with_the_stamps_only(monkeypatch):
    """A request whose tokens stream back in chunks (2, 1, then 3 tokens): one stamp per token, the gaps taken
    from the stamps (0 ms inside a chunk), and the table written without the gaps it derives on load."""
    import asyncio
    import sys
    import types
    from types import SimpleNamespace as Out

    import numpy as np
    import pandas as pd

    from labkit.measure import driver
    from labkit.spec.workload import Request
    from labkit.store import requests_to_store, token_gaps

    vllm, sampling = types.ModuleType("vllm"), types.ModuleType("vllm.sampling_params")
    vllm.SamplingParams = lambda **kwargs: kwargs
    sampling.RequestOutputKind = Out(DELTA="delta")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)

    class Engine:
        async def generate(self, prompt, params, request_id):
            for chunk, last in (([1, 2], False), ([3], False), ([4, 5, 6], True)):
                await asyncio.sleep(0.002)
                yield Out(outputs=[Out(token_ids=chunk, finish_reason="length" if last else None)], finished=last,
                          metrics=None)

    row = asyncio.run(driver._one_request(Engine(), Request(0, [7, 8, 9], 6, None), 0.0, {}))
    assert row["output_tokens"] == len(row["token_s"]) == 6 and row["finish_reason"] == "length"
    assert np.array_equal(row["itl_ms"], token_gaps(row["token_s"])) and len(row["itl_ms"]) == 5
    gaps = np.asarray(row["itl_ms"])
    assert gaps[0] == gaps[3] == gaps[4] == 0 and (gaps[[1, 2]] > 0).all()
    assert abs(row["token_s"][0] - row["submitted_s"] - row["ttft_ms"] / 1e3) < 1e-12
    stored = requests_to_store(pd.DataFrame([row]))
    assert "itl_ms" not in stored and "token_s" in stored
    assert "itl_ms" in requests_to_store(pd.DataFrame([{"itl_ms": [1.0]}]))  # without stamps the gaps stay


def test_a_watched_trial_ends_when_its_rule_says_so_and_keeps_what_came_back():
    import asyncio

    import numpy as np

    from labkit.measure.driver import Watch, _watched

    async def trial():
        sent, done = np.full(4, np.nan), np.full(4, np.nan)

        async def request(i, seconds):
            sent[i] = 0.0
            await asyncio.sleep(seconds)
            done[i] = seconds
            return {"request": i}
        tasks = [asyncio.ensure_future(request(i, s)) for i, s in enumerate((0.01, 0.02, 30.0, 30.0))]
        seen = []
        watch = Watch(lambda s, d, now: seen.append((len(s), int((~np.isnan(d)).sum()))) or (~np.isnan(d)).sum() >= 2,
                      every_s=0.01)
        rows = await _watched(tasks, sent, done, __import__("time").perf_counter(), watch)
        return rows, watch, tasks, seen
    rows, watch, tasks, seen = asyncio.run(asyncio.wait_for(trial(), 5))
    assert rows == [{"request": 0}, {"request": 1}] and watch.saturated_at_s is not None
    assert tasks[2].cancelled() and tasks[3].cancelled() and seen[-1] == (4, 2)
