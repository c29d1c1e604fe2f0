"""The parent's side of an arm: failure causes from the worker's log and exit, notes for a busy GPU (no engine)."""
import os
import signal

import pytest

from labkit.measure.engine_log import classify_failure, failure_summary
from labkit.measure.supervisor import held_note, occupied_for_multi_gpu, occupied_note, run_arm, wait_for_gpu_memory
from labkit.measure.worker import ArmJob
from labkit.spec.launch import filter_engine_args


KV_TOO_SMALL = ("ValueError: To serve at least one request with the models's max seq len (8192), (1.00 GiB KV "
                "cache is needed, which is larger than the available KV cache memory (0.10 GiB)")


def test_timeout_wins():
    assert classify_failure("torch.OutOfMemoryError: CUDA out of memory", -9, timed_out=True) == "timeout"


def test_out_of_memory():
    tail = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert classify_failure(tail, 1, False) == "out_of_memory"


def test_kv_cache_too_small():
    assert classify_failure("INFO starting\n" + KV_TOO_SMALL, 1, False) == "kv_cache_too_small"


def test_killed_by_sigkill():
    cause = classify_failure("INFO warming up\nINFO still warming up", -signal.SIGKILL, False)
    assert cause.startswith("killed_by_signal_SIGKILL")
    assert "out-of-memory" in cause


def test_killed_by_other_signal():
    assert classify_failure("", -signal.SIGSEGV, False) == "killed_by_signal_SIGSEGV"


@pytest.mark.parametrize("tail, code", [("RuntimeError: something odd", 1), ("", None), ("", 0)])
def test_engine_error(tail, code):
    assert classify_failure(tail, code, False) == "engine_error"


@pytest.mark.parametrize("tail, cause", [
    ("ValueError: Selected backend FLASHINFER is not valid for this configuration", "backend_unavailable"),
    ("NotImplementedError: fp8 on this device", "unsupported_configuration"),
    ("TypeError: __init__() got an unexpected keyword argument 'foo'", "bad_engine_argument"),
])
def test_other_causes(tail, cause):
    assert classify_failure(tail, 1, False) == cause


def test_unsupported_argument_is_classified_as_bad_argument():
    try:
        filter_engine_args({"bogus_arg": 1}, {"model"})
    except TypeError as exc:
        message = f"{type(exc).__name__}: {exc}"  # what the worker records in result.json
    assert "bogus_arg" in message
    assert classify_failure(message, 1, False) == "bad_engine_argument"


def test_root_cause_far_above_the_tail_is_found_and_quoted():
    log = "\n".join(
        ["(EngineCore pid=1) INFO 11-29 [cpu.py:1] Warm-up op is not supported, falling back"]
        + ["(EngineCore pid=1) ERROR 11-29 [core.py:1510]   File \"x.py\", line 1"] * 5
        + ["(EngineCore pid=1) ERROR 11-29 [core.py:1510] ValueError: To serve at least one request with the "
           "model's max seq len (4096), (0.0 GiB KV cache is needed, which is larger than the available KV "
           "cache memory (0.0 GiB)."]
        + ["RuntimeError: Engine core initialization failed. See root cause above."]
        + ["(MainProcess) INFO shutdown line"] * 100)
    assert classify_failure(log, 1, False) == "kv_cache_too_small"
    summary = failure_summary(log)
    assert summary.startswith("root cause: ") and "larger than the available KV cache" in summary.splitlines()[0]


def test_a_warning_is_not_a_cause():
    log = "(Worker) WARNING something is not supported, falling back\nRuntimeError: worker died"
    assert classify_failure(log, 1, False) == "engine_error"


def test_occupied_note_names_the_gpus_another_process_holds():
    note = occupied_note({"0": 0.5, "1": 70.25})
    assert "GPU 1: 70.2 GiB" in note and "GPU 0" not in note and "rerun the arm" in note
    assert occupied_note({"0": 0.5}) == "" and occupied_note({}) == ""


def test_the_next_arm_waits_until_the_gpu_memory_is_back():
    readings = iter([{"0": 70.0}, {"0": 30.0}, {"0": 0.6}])  # the driver frees a killed engine's memory late
    waited, held = wait_for_gpu_memory({"0": 0.5}, timeout_s=10, poll_s=0, read=lambda: next(readings))
    assert held == {} and waited < 5


def test_memory_never_freed_is_reported_after_the_timeout():
    waited, held = wait_for_gpu_memory({"0": 0.5, "1": 0.5}, timeout_s=0.05, poll_s=0.01,
                                       read=lambda: {"0": 0.5, "1": 71.0})
    assert held == {"1": 71.0} and waited >= 0.05
    assert "GPU 1: 71.0 GiB" in held_note(held) and held_note({}) == ""


def test_a_multi_gpu_engine_is_not_started_beside_another_processs_memory():
    held = {"0": 0.4, "1": 70.0, "2": 60.0}
    assert occupied_for_multi_gpu({"tensor_parallel_size": 2}, held) == {"1": 70.0}
    assert occupied_for_multi_gpu({"data_parallel_size": 2, "tensor_parallel_size": 1}, {"0": 0.4, "1": 0.6}) == {}
    assert occupied_for_multi_gpu({}, held) == {}  # one GPU: left to start, its KV cache shows the cost
    assert occupied_for_multi_gpu({"tensor_parallel_size": 2}, {"0": 0.4, "1": 0.3, "2": 60.0}) == {}  # not its GPUs


def test_run_arm_records_an_occupied_gpu_as_the_cause_before_any_process_starts(tmp_path, monkeypatch):
    monkeypatch.setattr("labkit.measure.supervisor.gpu_memory_in_use", lambda: {"0": 0.4, "1": 70.0})
    job = ArmJob("tp2", {"model": "m", "tensor_parallel_size": 2}, {}, {}, 256, "cuda")
    outcome = run_arm(job, tmp_path / "arm", timeout_s=5)
    assert outcome.status == "failed" and outcome.cause == "gpu_occupied"
    assert "GPU 1: 70.0 GiB" in outcome.log_tail and "nvidia-smi" in outcome.log_tail
    assert not (tmp_path / "arm" / "engine.log").exists()  # no worker, no engine


def test_the_root_cause_is_the_classified_error_not_the_first_error_like_line():
    # a busy machine interleaves the processes' output: a library's warning that names an error can come first
    log = "\n".join(
        ["(EngineCore pid=1) W oneDNN: primitive creation fell back: UnimplementedError: jit kernel, using ref"]
        + ["(MainProcess) INFO waiting"] * 3
        + ["(EngineCore pid=1) ERROR [core.py:1] ValueError: To serve at least one request with the model's max "
           "seq len (4096), (0.5 GiB KV cache is needed, which is larger than the available KV cache memory"]
        + ["(MainProcess) INFO shutdown line"] * 60)
    assert classify_failure(log, 1, False) == "kv_cache_too_small"
    first = failure_summary(log).splitlines()[0]
    assert first.startswith("root cause: ") and "available KV cache memory" in first and "oneDNN" not in first


def test_an_unknown_failure_quotes_the_exception_its_traceback_ended_with():
    log = "\n".join(["W lib: SomethingError: only a warning", "Traceback (most recent call last):",
                     '  File "x.py", line 1', "RuntimeError: worker died for a reason nobody classified"])
    assert classify_failure(log, 1, False) == "engine_error"
    assert failure_summary(log).splitlines()[0] == "root cause: RuntimeError: worker died for a reason nobody classified"


def test_lifecycle_splits_an_arms_wall_time_into_its_phases():
    from labkit.measure.supervisor import lifecycle

    # a worker started when this arm was released: its imports are waited for
    assert lifecycle(0.0, 14.0, 50.0, 51.5, 30.0, 13.6) == {
        "worker_imports": 13.6, "waiting_for_imports": 14.0, "engine_start": 30.0, "measuring": 6.0, "ending": 1.5}
    # one started ahead of its turn had imported while the previous arm ran: its engine started at once
    assert lifecycle(0.0, 0.5, 36.5, 38.0, 30.0, 14.2)["waiting_for_imports"] == 0.5
    # a worker that never reached its engine: only what is known
    assert lifecycle(0.0, None, None, 9.0, None) == {}


def test_shared_memory_an_ended_engine_left_is_unlinked_and_untracked():
    from multiprocessing import shared_memory

    from labkit.measure.supervisor import _shared_segments, _unlink_segments

    before = _shared_segments()
    segment = shared_memory.SharedMemory(create=True, size=4096)
    assert segment.name in _shared_segments() - before
    segment.close()
    _unlink_segments({segment.name})
    assert segment.name not in _shared_segments()


def test_shared_memory_another_live_process_holds_is_not_the_ended_engines():
    """Two notebooks at once: segments made while an arm ran may be the other one's engine's, still in use."""
    import subprocess
    import sys

    from labkit.measure.supervisor import _shared_segments, mapped_elsewhere

    before = _shared_segments()
    holder = subprocess.Popen([sys.executable, "-c", "from multiprocessing import shared_memory; import sys; "
                               "s = shared_memory.SharedMemory(create=True, size=4096); print(s.name, flush=True); "
                               "sys.stdin.read(); s.close(); s.unlink()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        other = holder.stdout.readline().strip()
        from multiprocessing import shared_memory
        ours = shared_memory.SharedMemory(create=True, size=4096)
        ours.close()  # as an ended engine leaves it: named, mapped by no one
        made = {other, ours.name}
        assert made <= _shared_segments() - before  # other tests' engines may make theirs meanwhile
        assert mapped_elsewhere(made, group=os.getpgid(0)) == {other}
        assert mapped_elsewhere(made, group=holder.pid) == set()  # the holder's own group: its engine, ended
        ours.unlink()
    finally:
        holder.communicate("", timeout=30)


def test_a_worker_never_released_stops_waiting_at_its_limit(tmp_path):
    from labkit.measure.worker import RELEASED, _wait_for_release

    assert _wait_for_release(tmp_path, limit_s=0.2) is None  # the plan's early worker of a run never made
    (tmp_path / RELEASED).write_text('{"reference": null}')
    assert _wait_for_release(tmp_path, limit_s=0.2) == {"reference": None}
