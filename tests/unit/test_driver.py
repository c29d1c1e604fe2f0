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
