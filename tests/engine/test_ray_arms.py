"""Arms as tasks of a real Ray cluster (a head started here on 127.0.0.1, two CPUs) on the real CPU engine: two
arms at once, each on a core of its own; a Ray worker killed mid-arm recorded as the arm's failure with no engine
left behind; the driver killed mid-arm leaving the store whole; and a rerun that completes what was lost (with a
second arm beside it: the two-at-once case, in one engine start fewer)."""
import datetime as dt
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import labkit as lk
from labkit.measure.ray_arms import RAY_CAUSE, local_cluster
from labkit.store import load
from labkit.suite.parameters import SMOKE_OVERRIDES

pytestmark = pytest.mark.engine
ray = pytest.importorskip("ray", reason="the Ray tests need the labkit[ray] extra (make setup installs it)")

WORKLOAD = lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst())
PROTOCOL = lk.Protocol(trials=2, warmup_requests=2)
ARMS = {"one": {"max_num_seqs": 2}, "two": {"max_num_seqs": 4}}


@pytest.fixture(scope="module")
def cluster():
    """A Ray head on 127.0.0.1 with two CPUs (labkit.measure.ray_arms.local_cluster), stopped at the end."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))  # the head's workers inherit the cores of this process
    try:
        with local_cluster(cpus=2) as address:
            yield address
    finally:
        os.sched_setaffinity(0, own)


DRIVER = textwrap.dedent("""
    import sys
    import labkit as lk
    from labkit.suite.parameters import SMOKE_OVERRIDES
    if __name__ == "__main__":
        exp = lk.Experiment("lost", {"one": {"max_num_seqs": 2}},
                            lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst()), model="tiny-llama",
                            base=SMOKE_OVERRIDES, protocol=lk.Protocol(trials=60, warmup_requests=2),
                            results_dir=sys.argv[2])
        exp.run(progress=False, cluster=sys.argv[1])
        print("driver done")
""")


def _task_workers():
    """The Ray worker processes running an arm now, with every process below them (the arm's worker, its engine)."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        if (proc.info["cmdline"] or [""])[0].startswith("ray::run_arm_on_node"):
            found[proc] = proc.children(recursive=True)
    return found


def _wait_for_engine(limit_s=240):
    """The running task's Ray worker once its arm's engine process is up (a child holding vLLM's engine core)."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        for worker, below in _task_workers().items():
            if len(below) >= 2:  # the arm's worker and its engine core
                return worker
        time.sleep(1)
    raise AssertionError("no arm's engine came up on the cluster")


def _gone(processes, limit_s=30) -> list:
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=limit_s)
    return alive


def test_a_lost_worker_and_a_killed_driver_are_recorded_and_a_rerun_completes(cluster, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    results_dir = tmp_path / "results"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    # 1. the Ray worker running the arm is killed mid-arm: the driver records the failure and ends
    driver = subprocess.Popen([sys.executable, str(script), cluster, str(results_dir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker = _wait_for_engine()
    below = worker.children(recursive=True)
    # the arm's worker and engine run as the driver's would, not at the niceness and OMP_NUM_THREADS Ray gives a
    # task's process (15, and the task's one CPU)
    assert {p.nice() for p in below} == {os.getpriority(os.PRIO_PROCESS, 0)}, [(p.pid, p.nice()) for p in below]
    arm_worker = worker.children()[0]
    assert arm_worker.environ().get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS"), arm_worker.environ()
    worker.send_signal(signal.SIGKILL)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0 and "driver done" in out, out[-3000:]
    assert _gone(below) == [], "the arm's worker or engine outlived its Ray worker"
    arms = load("lost", results_dir).arms.set_index("arm")
    assert arms.loc["one", "status"] == "failed" and arms.loc["one", "cause"] == RAY_CAUSE
    assert "Ray worker running the arm died" in arms.loc["one", "log_tail"], arms.loc["one", "log_tail"]

    # 2. the driver itself is killed mid-arm: the store keeps what it had, whole, and the arm's engine ends
    driver = subprocess.Popen([sys.executable, str(script), cluster, str(results_dir)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = _wait_for_engine()
    below = [worker, *worker.children(recursive=True)]
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    assert _gone(below, limit_s=60) == [], "the arm's task outlived its driver"
    arms = load("lost", results_dir).arms
    assert arms.status.tolist() == ["failed"], arms  # nothing half-written, nothing damaged

    # 3. a rerun completes the lost arm, with a second arm beside it, each on a core of its own (a failed arm
    # holds no spec: the rerun may measure it shorter)
    results = lk.Experiment("lost", ARMS, WORKLOAD, model="tiny-llama", base=SMOKE_OVERRIDES, protocol=PROTOCOL,
                            results_dir=results_dir).run(progress=False, parallel=2, cluster=cluster)
    assert results.complete_arms == ["one", "two"], results.arms[["arm", "status", "cause"]]
    assert len(list((results.path / "failures").glob("one-*"))) == 1  # the killed driver's attempt left nothing
    facts = results.facts("placed_on", "arms_at_once", "node", "seconds", "recorded_utc").set_index("arm")
    assert sorted(facts.placed_on) == ["cores 0", "cores 1"] and set(facts.arms_at_once) == {2}
    node = facts.node.iloc[0]
    assert set(facts.node) == {node} and node != "local" and len(node) == 12  # the Ray node's id, not a host name
    assert socket.gethostname() not in node
    ends = {arm: dt.datetime.fromisoformat(facts.loc[arm, "recorded_utc"]) for arm in ARMS}
    starts = {arm: ends[arm] - dt.timedelta(seconds=float(facts.loc[arm, "seconds"])) for arm in ARMS}
    assert max(starts.values()) < min(ends.values()), facts  # they ran at once
    for arm in ARMS:  # vLLM bound each engine's threads to the arm's own core
        core = facts.loc[arm, "placed_on"].split()[-1]
        assert results.environment[arm]["tuning_variables"].get("VLLM_CPU_OMP_THREADS_BIND") == core
    # stored as a local run's arms are: every request of both arms' trials, with their token stamps
    assert len(results.requests) == 2 * 2 * 8 and results.requests.token_s.map(len).eq(8).all()
    assert {"output_tok_s", "host_other_cores", "load", "trial"} <= set(results.trials.columns)


def test_the_suite_over_the_cluster_lands_under_the_nodes_hardware_with_one_report(cluster, tmp_path):
    import json

    from labkit.measure.environment import hardware_key

    env = {**os.environ, "LABKIT_RUNS_DIR": str(tmp_path / "runs"), "LABKIT_JOURNAL": str(tmp_path / "journal.jsonl"),
           "LABKIT_BASELINES_DIR": str(tmp_path / "baselines")}

    def suite(*args):
        return subprocess.run([sys.executable, "-m", "labkit.cli", "suite", "--cluster", cluster, *args],
                              capture_output=True, text=True, env=env, timeout=900)

    refused = suite("--jobs", "2", "--baseline", str(tmp_path), "00_quickstart.ipynb")
    assert refused.returncode == 2 and "--jobs" in refused.stderr and "--baseline" in refused.stderr, refused.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything ran

    # the quickstart measures; explore reads its store, so it starts only once the quickstart is back
    done = suite("--profile", "cpu-smoke", "00_quickstart.ipynb", "explore.ipynb")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [top] = (tmp_path / "runs").iterdir()
    hardware = hardware_key()
    run = top / hardware
    assert top.name.endswith("-cluster") and json.loads((top / "cluster.json").read_text())["hardware"][hardware]
    status = {p.name: json.loads(p.read_text()) for p in run.glob("*.status.json")}
    assert {s["notebook"]: s["status"] for s in status.values()} == {"00_quickstart.ipynb": "ok", "explore.ipynb": "ok"}
    nodes = {s["node"] for s in status.values()}
    assert len(nodes) == 1 and len(nodes.pop()) == 12  # the Ray node's id, never its host name
    assert load("quickstart-smoke", run / "results").complete_arms  # the node's store came back whole
    assert done.stdout.index("explore.ipynb sent") > done.stdout.index("00_quickstart.ipynb ok")
    report = (top / "report.html").read_text()
    assert "on a Ray cluster" in report and hardware in report and "quickstart-smoke" in report
    # no host name (a short one such as "vm" occurs by chance in embedded images: those are left out)
    assert not re.search(rf"\b{re.escape(socket.gethostname())}\b", re.sub(r"[A-Za-z0-9+/=]{200,}", "", report))

    # resumed: nothing left to run, nothing run again
    stamps = {p: p.stat().st_mtime for p in run.glob("*.ipynb")}
    again = suite("--resume", str(top))
    assert again.returncode == 0 and "sent to node" not in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    assert {p: p.stat().st_mtime for p in run.glob("*.ipynb")} == stamps
