"""Failures survived, interrupted experiments resumed and adaptive trials stopped, on the real CPU engine."""
import json
import os
import signal
import subprocess
import sys
import time
import tempfile
import textwrap

import pytest

import labkit as lk
from labkit.analyze.stopping import REASONS, reference_values, stop_reason
from labkit.measure import rendezvous
from labkit.store import INTERRUPTED, ExperimentStore
from labkit.suite.parameters import SMOKE_OVERRIDES

pytestmark = pytest.mark.engine

WORKLOAD = lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst())
PROTOCOL = lk.Protocol(trials=1, warmup_requests=2)
# the same real engine as a smoke run starts it: eager (no compile wait), and no worker process beside the
# engine core (one import of vLLM fewer); the tests of processes left behind keep vLLM's own layout
SMOKE = SMOKE_OVERRIDES


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """An arm vLLM refuses to start beside one that runs, under the adaptive protocol (no time budget, so its
    stopping reason is reproducible): the experiment and its first run's results."""
    exp = lk.Experiment(
        "failures",
        # 1 MiB of KV cache cannot hold one 4096-token request: vLLM refuses to start this engine
        {"kv_too_small": {"kv_cache_memory_bytes": 1 << 20, "max_model_len": 4096}, "ok": {}},
        WORKLOAD, model="tiny-llama", base=SMOKE, protocol=lk.Protocol(trials="auto", warmup_requests=2, budget_s=None),
        results_dir=tmp_path_factory.mktemp("results"))
    return exp, exp.run(progress=False)


def test_failing_arm_is_recorded_and_the_rest_runs(failures):
    exp, results = failures
    arms = results.arms.set_index("arm")
    assert arms.loc["ok", "status"] == "complete"
    assert arms.loc["kv_too_small", "status"] == "failed"
    assert arms.loc["kv_too_small", "cause"] == "kv_cache_too_small", arms.loc["kv_too_small", "log_tail"]
    assert "KV cache" in arms.loc["kv_too_small", "log_tail"]
    assert len(results.requests) == 8 * arms.loc["ok", "trials_run"] and set(results.requests.arm) == {"ok"}

    first = (results.path / "arms" / "ok" / "arm.json").read_text()
    exp.run(progress=False)  # resume: the complete arm is kept as it was, the failed one retried
    assert (results.path / "arms" / "ok" / "arm.json").read_text() == first
    assert len(list((results.path / "failures").glob("kv_too_small-*"))) == 2


def test_an_adaptive_arm_stops_for_a_reason_its_stored_trials_bear_out(failures):
    """Protocol(trials="auto") on the real engine: the arm runs as many trials as the stopping rule asks,
    records why it stopped, and the rule asked again on the stored trials stops at the same trial."""
    exp, results = failures
    protocol = exp.protocol
    facts = results.facts("stopped", "trials_run", "cause").set_index("arm").loc["ok"]
    assert facts.status == "complete", facts.cause
    assert facts.stopped in REASONS
    ran = int(facts.trials_run)  # a column beside a failed arm's missing value: read as a float
    assert protocol.min_trials <= ran <= protocol.max_trials
    ok = results.trials[results.trials.arm == "ok"]
    assert ok.trial.tolist() == list(range(ran))  # the facts count what was stored
    values = reference_values(results, "ok")["default"]
    asked = [stop_reason({m: v[:n] for m, v in values.items()}, protocol) for n in range(1, ran + 1)]
    assert asked == [None] * (ran - 1) + [facts.stopped]
    print(f"adaptive arm: {ran} trials (fixed protocol default was 3), stopped {facts.stopped}; "
          f"per-trial output tok/s {[round(v) for v in values['output_tok_s']]}")


SCRIPT = textwrap.dedent("""
    import sys
    import labkit as lk
    from labkit.suite.parameters import SMOKE_OVERRIDES
    if __name__ == "__main__":
        exp = lk.Experiment("killed", {"first": {"max_num_seqs": 2}, "second": {"max_num_seqs": 4}},
                            lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst()), model="tiny-llama",
                            base=SMOKE_OVERRIDES, protocol=lk.Protocol(trials=1, warmup_requests=2),
                            results_dir=sys.argv[1])
        exp.run(progress=False)
""")


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """An experiment killed (its whole process group) once its first arm is stored: the folder, the first
    arm's record as the kill left it, and the results of running it again."""
    tmp_path = tmp_path_factory.mktemp("killed")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True)
    first_done = tmp_path / "killed" / "arms" / "first" / "arm.json"
    deadline = time.time() + 600
    while not first_done.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert first_done.exists(), "the first arm never completed"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole experiment, its worker and engine processes
    proc.wait()
    assert not (tmp_path / "killed" / "arms" / "second").exists()
    kept = first_done.read_text()
    exp = lk.Experiment("killed", {"first": {"max_num_seqs": 2}, "second": {"max_num_seqs": 4}}, WORKLOAD,
                        model="tiny-llama", base=SMOKE, protocol=PROTOCOL, results_dir=tmp_path)
    return tmp_path, kept, exp.run(progress=False)


def test_killed_experiment_keeps_completed_arms_and_runs_only_the_rest(killed):
    tmp_path, kept, results = killed
    first_done = tmp_path / "killed" / "arms" / "first" / "arm.json"
    assert first_done.read_text() == kept  # untouched, not remeasured
    assert results.complete_arms == ["first", "second"]
    assert json.loads(first_done.read_text())["recorded_utc"] <= json.loads(
        (tmp_path / "killed" / "arms" / "second" / "arm.json").read_text())["recorded_utc"]


def test_changed_spec_is_refused_before_any_engine_starts(killed):
    tmp_path, _, _ = killed
    changed = lk.Experiment("killed", {"third": {}, "first": {"max_num_seqs": 3}}, WORKLOAD, model="tiny-llama",
                            base=SMOKE, protocol=PROTOCOL, results_dir=tmp_path)
    with pytest.raises(lk.StoreConflict, match="different"):
        changed.run(progress=False)
    assert not (tmp_path / "killed" / "arms" / "third").exists()  # arm third was not run either


def test_a_worker_killed_from_outside_leaves_no_engine_process(tmp_path):
    """SIGKILL to the arm's worker alone (as the out-of-memory killer sends it): the arm is recorded as
    failed with that cause, and none of the vLLM processes its engine started is left running."""
    import psutil

    from labkit.measure.supervisor import ArmJob, run_arm

    exp = lk.Experiment("orphans", {"eager": {"enforce_eager": True}}, lk.Workload(64, lk.Fixed(16), lk.Fixed(64), lk.Burst()),
                        model="tiny-llama", protocol=lk.Protocol(trials=20, warmup_requests=2), results_dir=tmp_path)
    ref = lk.resolve_model("tiny-llama")
    spec = exp.arm_spec(exp.plans()["eager"], ref)
    job = ArmJob("eager", {"model": ref.model, **spec["engine_args"]}, spec["workloads"], spec["protocol"],
                 ref.shape.vocab_size, "cpu", exp.context)
    engine_pids = []

    def kill_worker_once_measuring(event):
        if event["stage"] != "trial" or engine_pids:
            return
        worker = next(c for c in psutil.Process().children() if "spawn_main" in " ".join(c.cmdline()))
        engine_pids.extend(c.pid for c in worker.children(recursive=True))
        worker.send_signal(signal.SIGKILL)

    outcome = run_arm(job, tmp_path / "work", timeout_s=600, on_progress=kill_worker_once_measuring)
    assert outcome.status == "failed" and outcome.cause.startswith("killed_by_signal_SIGKILL"), outcome.cause
    assert engine_pids, "the engine had started its own processes"
    time.sleep(1)
    alive = [pid for pid in engine_pids if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes left running: {alive}"


LONG_RUN = textwrap.dedent("""
    import sys
    import labkit as lk
    if __name__ == "__main__":
        exp = lk.Experiment("parent", {"eager": {"enforce_eager": True}},
                            lk.Workload(64, lk.Fixed(16), lk.Fixed(64), lk.Burst()), model="tiny-llama",
                            protocol=lk.Protocol(trials=50, warmup_requests=2), results_dir=sys.argv[1])
        exp.run(progress=False)
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["parent-killed", "ctrl-c"])
def test_ending_the_parent_leaves_no_engine_process(tmp_path, how):
    """The process that runs the experiment is killed (SIGKILL), or interrupted as a notebook's Stop button
    does (SIGINT, to that process alone): its arm's worker and every engine process go with it."""
    import psutil

    script = tmp_path / "run.py"
    script.write_text(LONG_RUN)
    # a test run started in the background inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: the experiment gets the handling of a terminal or a notebook kernel instead
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, tree = time.time() + 600, []
        while time.time() < deadline and proc.poll() is None and not tree:
            time.sleep(0.5)
            progress = [p.read_text() for p in (tmp_path / "parent" / ".work").glob("*/progress.jsonl")]
            if any('"trial"' in text for text in progress):
                tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 2, "the worker and its engine never reached a trial"
        proc.send_signal(how)
        proc.wait(timeout=120)
        _, alive = psutil.wait_procs(tree, timeout=30)
        alive = [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"processes of the arm left running after the parent ended: {alive}"
        # what the engine logged survives: at once for Ctrl-C, at the next run's clean-up for a kill
        store = ExperimentStore("parent", tmp_path)
        with store.lock():
            store.clean_work()
        arms = lk.load("parent", tmp_path).arms.set_index("arm")
        assert arms.loc["eager", "status"] == "failed" and arms.loc["eager", "cause"] == INTERRUPTED
        (kept,) = (tmp_path / "parent" / "failures").iterdir()
        assert (kept / "engine.log").stat().st_size > 0
        # ... and the torch file store it logged went with it (vLLM's own shutdown never ran)
        log = (kept / "engine.log").read_text(errors="replace").replace("<tmp>", tempfile.gettempdir())
        stores = rendezvous.file_stores(log)
        assert stores and not [store for store in stores if store.exists()], stores
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
