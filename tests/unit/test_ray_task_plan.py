"""The Ray side's pure parts: what the cluster is asked for, what is refused before anything starts, how a node's
cores are claimed, how an arm's files travel back, and what a lost task is recorded as."""
import pytest

from labkit.errors import BadParameter
from labkit.measure import ray_arms
from labkit.measure.ray_arms import Request, claim_cores, cluster_problems, lost_cause, pack, unpack
from labkit.measure.served import free_port

NODES = [{"NodeID": "a" * 40, "Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0, "accelerator_type:H100": 1.0}},
         {"NodeID": "b" * 40, "Alive": True, "Resources": {"CPU": 2.0}}]


def test_a_task_asks_for_its_gpus_cores_and_gpu_model_and_is_never_retried_elsewhere():
    assert Request(gpus=2, cpus=1, accelerator_type="H200").options() == {
        "num_cpus": 1, "num_gpus": 2, "max_retries": 0, "accelerator_type": "H200"}
    assert Request(cpus=2).options() == {"num_cpus": 2, "num_gpus": 0, "max_retries": 0}


def test_every_arm_the_cluster_cannot_place_is_named_with_what_the_nodes_have():
    assert cluster_problems(NODES, {"tp2": Request(gpus=2), "cpu": Request(cpus=2)}) == []
    found = cluster_problems(NODES, {"tp4": Request(gpus=4), "h200": Request(gpus=1, accelerator_type="H200"),
                                     "fine": Request(gpus=1)})
    assert found[:2] == ["arm 'tp4' needs 4 GPU(s) on one node", "arm 'h200' needs 1 GPU(s) of type H200 on one node"]
    assert found[2] == ("the cluster has: node aaaaaaaaaaaa: 16 CPUs, 2 GPUs, H100; node bbbbbbbbbbbb: 2 CPUs, 0 GPUs")
    assert "no live node" in cluster_problems([], {"x": Request()})[-1]


def test_a_cluster_that_does_not_answer_is_refused_at_once_naming_the_address():
    pytest.importorskip("ray")
    port = free_port()  # nothing listens on it
    with pytest.raises(BadParameter, match=rf"no Ray cluster answers at '127.0.0.1:{port}'.*ray start --head"):
        ray_arms.connect(f"127.0.0.1:{port}")


def test_a_nodes_cores_are_claimed_in_aligned_groups_and_freed_with_their_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_arms, "CORE_LOCKS", tmp_path)
    first, held1 = claim_cores(2, usable=[0, 1, 2, 3])
    second, held2 = claim_cores(2, usable=[0, 1, 2, 3])
    assert (first, second) == ("0,1", "2,3")
    assert claim_cores(2, usable=[0, 1, 2, 3]) == (None, [])  # every group held
    for handle in held1:
        handle.close()  # what the kernel does when the holding task's process ends
    again, held3 = claim_cores(2, usable=[0, 1, 2, 3])
    assert again == "0,1"
    for handle in held2 + held3:
        handle.close()


def test_an_arms_folder_travels_back_whole(tmp_path):
    arm = tmp_path / "arm"
    (arm / "profile").mkdir(parents=True)
    (arm / "result.json").write_text('{"status": "complete"}')
    (arm / "profile" / "trace.json").write_text("{}")
    unpack(pack(arm), tmp_path / "back")
    assert (tmp_path / "back" / "result.json").read_text() == '{"status": "complete"}'
    assert (tmp_path / "back" / "profile" / "trace.json").exists()


def test_a_lost_task_is_recorded_in_words():
    class WorkerCrashedError(Exception):
        pass

    class NodeDiedError(Exception):
        pass
    assert lost_cause(WorkerCrashedError("The worker died unexpectedly\nmore")).startswith(
        "the Ray worker running the arm died (killed, or out of memory): The worker died unexpectedly")
    assert lost_cause(NodeDiedError("")).startswith("the node running the arm left the cluster")
    assert lost_cause(ValueError("x")) == "Ray: ValueError: x"


def test_an_arm_that_does_not_use_ray_starts_as_on_a_machine_without_it(tmp_path):
    """vLLM imports Ray whenever it is installed (seconds in each engine process); the arm's worker hides it from
    itself and every process it starts, unless the arm asks for Ray as vLLM's executor."""
    import subprocess
    import sys

    probe = ("import os, subprocess, sys\n"
             "from labkit.measure.worker import hide_ray\n"
             "if not hide_ray({'distributed_executor_backend': sys.argv[1]}):\n"
             "    print(False, 'without_ray' in os.environ.get('PYTHONPATH', ''))\n"
             "    sys.exit()\n"
             "child = subprocess.run([sys.executable, '-c', 'import ray'], capture_output=True, text=True)\n"
             "print(True, child.returncode, 'hidden from this engine by labkit' in child.stderr)\n")
    script = tmp_path / "probe.py"
    script.write_text(probe)
    hidden = subprocess.run([sys.executable, str(script), "mp"], capture_output=True, text=True, check=True)
    assert hidden.stdout.split() == ["True", "1", "True"], hidden.stderr
    kept = subprocess.run([sys.executable, str(script), "ray"], capture_output=True, text=True, check=True)
    assert kept.stdout.split() == ["False", "False"], kept.stderr
