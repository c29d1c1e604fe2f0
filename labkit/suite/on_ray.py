"""`labkit suite --cluster HOST:PORT`: the suite spread over a Ray cluster's nodes, by hardware.

Each live node is asked what it is (its hardware key, on the node itself); the nodes of one hardware key share
that key's notebooks, one notebook at a time per node (a measuring notebook owns its node's GPUs, or its cores),
each notebook one Ray task pinned to its node. The task runs the suite's own `run_notebook` in a folder of the
node's, starting from the driver's copy of that hardware's stores (so a resumed experiment measures nothing
twice), and sends back the executed notebook, its status and the experiment stores it changed. The driver alone
writes the run: one folder, `<UTC time>-cluster/`, holding an ordinary suite run per hardware key
(`<UTC time>-cluster/<hardware>/`, which `labkit compare` and `labkit baseline` take as they are) and one report.
A task whose node or worker is lost is recorded as its notebook's failure (`ray_lost`, with Ray's words) and
the rest goes on; `--resume` on the cluster folder runs what is not done.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter
from labkit.files import new_folder, write_json_atomic
from labkit.measure import ray_arms
from labkit.redact import REDACTED, secret_values
from labkit.store import read_record
from labkit.suite.notebooks import (CELL_LIMITS_S, CLUSTER_RECORD, NOTEBOOKS, _slug, _write_status, check_overrides, default_profile, discover,
                                    may_start, pending, run_notebook, utc_stamp, write_suite_record)
from labkit.suite.parameters import check_parameters, parameters_for


def node_facts() -> dict:
    """On a node: what it is (its hardware key and environment facts)."""
    from labkit.measure.environment import fingerprint

    found = fingerprint()
    return {"hardware_key": found["hardware_key"], "environment": found}


def notebook_on_node(notebook: str, parameters: dict, knobs: dict, secrets: list[str], stores: bytes | None,
                     cell_limit_s: int | None, driver: dict) -> dict:
    """A Ray task's body, on its node: one notebook executed by the suite's own runner in a folder of the node's,
    from the driver's copy of its hardware's stores, its kernel started as the driver would start it (`driver`:
    ray_arms.driver_process()); returns the executed notebook, its status record, the stores it changed (packed),
    the journal lines it wrote and what of the process still differs from the driver's."""
    import ray

    os.environ.pop(settings.VARIABLES["ray_address"], None)  # its arms run on this node, not on the cluster again
    differs = ray_arms.as_the_driver_runs(driver)
    with tempfile.TemporaryDirectory(prefix="labkit-suite-") as work:
        run = Path(work)
        if stores:
            ray_arms.unpack(stores, run / "results")
        began = time.time()
        node_settings = settings.current().replace(results_dir=run / "results", journal=run / "journal.jsonl")
        run_notebook(NOTEBOOKS / notebook, run, parameters, knobs, secrets, node_settings, cell_limit_s=cell_limit_s)
        slug = _slug(NOTEBOOKS / notebook)
        changed = {store.name: ray_arms.pack(store) for store in sorted((run / "results").glob("*"))
                   if store.is_dir() and any(p.stat().st_mtime >= began for p in store.rglob("*"))}
        executed = run / f"{slug}.ipynb"
        journal = run / "journal.jsonl"
        return {"node": ray.get_runtime_context().get_node_id()[:12],
                "status": read_record(run / f"{slug}.status.json", "status"),
                "notebook": executed.read_bytes() if executed.exists() else None, "stores": changed,
                "journal": journal.read_text() if journal.exists() else "", "differs": differs}


def whole_node(node: dict) -> dict:
    """Task options that give one task the whole of one node: pinned to it, with all its GPUs and CPUs (Ray hides
    the GPUs a task did not ask for, and sizes its thread pools by the CPUs it did), and never retried elsewhere."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False),
            "num_gpus": int(node["Resources"].get("GPU", 0)), "num_cpus": node["Resources"].get("CPU", 0),
            "max_retries": 0}


def survey(nodes: list[dict]) -> dict[str, dict]:
    """Each live node's facts (node id -> node_facts()), asked on the node itself."""
    ray = ray_arms.ray_module()
    ask = ray.remote(node_facts)
    tasks = {node["NodeID"]: ask.options(**whole_node(node)).remote() for node in nodes}
    return {node_id: ray.get(task) for node_id, task in tasks.items()}


def _replace_store(store: Path, packed: bytes) -> None:
    """A store as the node left it, put in place whole: it started from this copy and only adds to it."""
    staging = Path(tempfile.mkdtemp(prefix=f".{store.name}-", dir=store.parent))
    ray_arms.unpack(packed, staging)
    if store.exists():
        old = store.with_name(f".{store.name}-replaced")
        store.rename(old)
        staging.rename(store)
        shutil.rmtree(old)
    else:
        staging.rename(store)


def run_on_cluster(address: str, selection: list[str] | None = None, profile: str | None = None,
                   run_dir: str | Path | None = None, overrides: dict | None = None, progress: bool = True
                   ) -> tuple[Path, list[Path]]:
    """Run the suite over the cluster at `address`: (the cluster run's folder, its runs by hardware). `profile`
    applies on every hardware where given; otherwise each hardware gets its own default profile. Bad input and
    a cluster that does not answer are refused before any notebook starts."""
    ray = ray_arms.ray_module()
    nodes = ray_arms.connect(address)
    facts, node_of = survey(nodes), {node["NodeID"]: node for node in nodes}
    by_hardware: dict[str, list[str]] = {}
    for node_id, found in facts.items():
        by_hardware.setdefault(found["hardware_key"], []).append(node_id)
    if run_dir:
        top = Path(run_dir)
        if not (top / CLUSTER_RECORD).exists():
            raise BadParameter(f"{top} is not a cluster suite run (no {CLUSTER_RECORD}): name a folder "
                               "`labkit suite --cluster` made")
        meta = read_record(top / CLUSTER_RECORD, "hardware", "notebooks")
        missing = sorted(set(meta["hardware"]) - set(by_hardware))
        if missing:
            raise BadParameter(f"{top} ran on {sorted(meta['hardware'])}; the cluster at {address} has no node of "
                               f"{missing} now: resume it where those nodes are")
        stored = meta.get("overrides", {})  # as stored: secrets redacted
        if not overrides and REDACTED in json.dumps(stored):
            raise BadParameter(f"{top} was started with overrides that hold a secret, which the lab does not store "
                               f"({stored}): resume it with the same --override options again")
        notebooks, overrides = discover(meta["notebooks"]), overrides or stored
        profiles = {hw: entry["profile"] for hw, entry in meta["hardware"].items()}
    else:
        notebooks, overrides = discover(selection), overrides or {}
        profiles = {hw: profile or default_profile(hw) for hw in by_hardware}
        for hw, chosen in profiles.items():  # every bad parameter of every hardware's profile, before anything runs
            for nb in notebooks:
                check_parameters(nb, parameters_for(chosen, nb))
        check_overrides(overrides, notebooks)
        stamp = utc_stamp()
        top = new_folder(settings.current().runs_dir, f"{stamp}-cluster")
        for hw, node_ids in by_hardware.items():
            (top / hw).mkdir()
            write_suite_record(top / hw, profiles[hw], hw, stamp, notebooks, overrides, 1,
                               facts[node_ids[0]]["environment"], nodes=[n[:12] for n in node_ids])
        # node ids only: an address or host name of the cluster is not kept
        write_json_atomic(top / CLUSTER_RECORD, {
            "started_utc": stamp, "notebooks": [str(p.relative_to(NOTEBOOKS)) for p in notebooks],
            "overrides": overrides, "hardware": {hw: {"profile": profiles[hw], "nodes": [n[:12] for n in ids]}
                                                 for hw, ids in by_hardware.items()}})
    runs = {hw: top / hw for hw in profiles}
    secrets = secret_values(overrides)
    work = {hw: pending(runs[hw], notebooks, profiles[hw], overrides)[1] for hw in runs}
    order = {hw: [item[0] for item in items] for hw, items in work.items()}
    task_of = ray.remote(notebook_on_node)
    running: dict = {}  # task -> (node id, hardware, notebook, started)
    try:
        while any(work.values()) or running:
            busy = {entry[0] for entry in running.values()}
            for hw, node_ids in by_hardware.items():
                for node_id in node_ids:
                    if node_id in busy or hw not in work:
                        continue
                    unfinished = {item[0] for item in work[hw]} | {e[2] for e in running.values() if e[1] == hw}
                    ready = next((item for item in work[hw] if may_start(item[0], order[hw], unfinished)), None)
                    if ready is None:
                        continue
                    work[hw].remove(ready)
                    nb, parameters, knobs = ready
                    stores = ray_arms.pack(runs[hw] / "results") if (runs[hw] / "results").is_dir() else None
                    task = task_of.options(**whole_node(node_of[node_id])).remote(
                        str(nb.relative_to(NOTEBOOKS)), parameters, knobs, secrets, stores,
                        CELL_LIMITS_S.get(profiles[hw]), ray_arms.driver_process())
                    running[task] = (node_id, hw, nb, time.monotonic())
                    busy.add(node_id)
                    if progress:
                        print(f"{hw}: {nb.relative_to(NOTEBOOKS)} sent to node {node_id[:12]}", flush=True)
            if not running:
                break
            ready_tasks, _ = ray.wait(list(running), num_returns=1)
            for task in ready_tasks:
                node_id, hw, nb, started = running.pop(task)
                _collect(task, runs[hw], nb, node_id, time.monotonic() - started, secrets, progress)
    except BaseException:
        for task in running:
            ray.cancel(task, force=True)
        raise
    return top, [runs[hw] for hw in sorted(runs)]


def _collect(task, run: Path, nb: Path, node_id: str, seconds: float, secrets: list[str], progress: bool) -> None:
    """One notebook's task ended: its files written into the hardware's run (or its loss recorded)."""
    ray = ray_arms.ray_module()
    try:
        answer = ray.get(task)
    except ray.exceptions.RayError as exc:
        why = ray_arms.lost_cause(exc, "notebook")
        _write_status(run, nb, f"{ray_arms.RAY_CAUSE}: {why}", seconds, None, secrets, node=node_id[:12])
        if progress:
            print(f"{nb.relative_to(NOTEBOOKS)} lost on node {node_id[:12]}: {why}", flush=True)
        return
    (run / "results").mkdir(exist_ok=True)
    for name, packed in answer["stores"].items():
        _replace_store(run / "results" / name, packed)
    if answer["notebook"] is not None:
        (run / f"{_slug(nb)}.ipynb").write_bytes(answer["notebook"])
    if answer["journal"]:
        journal = settings.current().journal
        journal.parent.mkdir(parents=True, exist_ok=True)
        with open(journal, "a") as handle:
            handle.write(answer["journal"])
    write_json_atomic(run / f"{_slug(nb)}.status.json", {**answer["status"], "node": answer["node"], **answer["differs"]},
                      secrets=secrets)
    if progress:
        state = answer["status"]["status"]
        print(f"{nb.relative_to(NOTEBOOKS)} {state} on node {answer['node']} in {seconds:.0f} s", flush=True)

