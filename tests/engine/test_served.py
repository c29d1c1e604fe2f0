"""A served arm on the real vLLM CPU engine: `vllm serve` started for the arm on a free port of 127.0.0.1, the
workload driven over HTTP, the engine's counters read from /metrics, and nothing left running afterwards."""
import os
import socket

import psutil
import pytest

import labkit as lk

pytestmark = pytest.mark.engine

REQUESTS, PROMPT_LEN, OUTPUT_LEN, CLIENTS = 12, 32, 16, 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    exp = lk.Experiment("served", {"default": {}}, lk.Workload.closed_loop(REQUESTS, PROMPT_LEN, OUTPUT_LEN, CLIENTS),
                        model="tiny-llama", context="served", protocol=lk.Protocol(trials=2, warmup_requests=2),
                        base={"enforce_eager": True}, results_dir=tmp_path_factory.mktemp("results"))
    return exp, exp.run(progress=False)


def test_the_served_arm_is_measured_through_the_server_token_by_token(served):
    exp, results = served
    arm = results.arms.set_index("arm").loc["default"]
    assert arm.status == "complete", results.facts("cause")
    assert arm.context == "served" and arm.served_url.startswith("http://127.0.0.1:")
    requests = results.requests
    assert len(requests) == 2 * REQUESTS and (requests.output_tokens == OUTPUT_LEN).all()  # every token streamed
    assert (requests.ttft_ms > 0).all() and (requests.e2e_ms > requests.ttft_ms).all()
    assert all(len(gaps) == OUTPUT_LEN - 1 for gaps in requests.itl_ms)
    # the server's own counters, read from /metrics around each trial: what it generated is what was asked
    assert (results.trials.engine_generation_tokens == REQUESTS * OUTPUT_LEN).all()
    assert (results.trials.engine_prompt_tokens == REQUESTS * PROMPT_LEN).all()
    assert "vllm serve" in exp.plan_table(defaults=False, prepare=False).launch[0]


def test_the_server_ends_with_the_arm_port_freed_nothing_left(served):
    _, results = served
    port = int(results.arms.served_url[0].rsplit(":", 1)[1])
    with socket.socket() as s:  # a new server can have it (as servers bind: connections of the old one may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    assert not [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN]
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and "vllm.entrypoints.cli.main" in " ".join(p.info["cmdline"])
            and str(port) in p.info["cmdline"]]
    assert left == []


@pytest.fixture(scope="module")
def running_server():
    """A server someone else started (here: the test, with the tiny model's launch)."""
    from labkit.measure.served import ServedEngine
    from labkit.spec.models import resolve_model

    probe = lk.Experiment("probe", {"default": {}}, lk.Workload.closed_loop(4, 16, 4, 2), model="tiny-llama",
                          context="served", base={"enforce_eager": True})
    args = probe._engine_args(probe.plans()["default"], resolve_model("tiny-llama"))
    server = ServedEngine.start(args["model"], args)
    yield server
    server.shutdown()
    assert not os.path.exists(server.rpc_folder)  # its sockets went with it, not left in the temporary folder


def test_a_running_server_is_measured_as_it_is_and_left_running(running_server, tmp_path):
    import urllib.request

    exp = lk.Experiment("target", {"current": {}}, lk.Workload.closed_loop(REQUESTS, PROMPT_LEN, OUTPUT_LEN, CLIENTS),
                        model="tiny-llama", context="served", server_url=running_server.url,
                        protocol=lk.Protocol(trials=1, warmup_requests=2), results_dir=tmp_path)
    results = exp.run(progress=False)
    arm = results.arms.set_index("arm").loc["current"]
    assert arm.status == "complete", results.facts("cause")
    assert arm.served_url == running_server.url and "tiny-llama" in str(arm.server_models)  # what it serves
    assert (results.requests.output_tokens == OUTPUT_LEN).all() and len(results.requests) == REQUESTS
    with urllib.request.urlopen(f"{running_server.url}/health", timeout=5) as answer:
        assert answer.status == 200  # still serving: the lab started nothing and stopped nothing
    assert any(os.scandir(running_server.rpc_folder))  # started outside a worker: its sockets in a folder of its own


def test_a_url_where_no_server_answers_is_refused_before_any_worker_starts(tmp_path):
    from labkit.measure.served import free_port

    exp = lk.Experiment("nobody", {"current": {}}, lk.Workload.closed_loop(4, 16, 4, 2), model="tiny-llama",
                        context="served", server_url=f"http://127.0.0.1:{free_port()}", results_dir=tmp_path)
    with pytest.raises(lk.BadParameter, match="no vLLM server answers at http://127.0.0.1:"):
        exp.run(progress=False)
    assert not list(tmp_path.glob("nobody/arms/*"))
