"""Which GPUs this process may use and what they hold, from NVML or nvidia-smi (no GPU needed)."""
import sys
import types
from types import SimpleNamespace

import pytest

from labkit.measure import gpu
from labkit.measure.gpu import visible_gpus

ROWS = [("0", "GPU-aaaa1111", "NVIDIA H200"), ("1", "GPU-bbbb2222", "NVIDIA H200")]


def test_unset_means_every_gpu():
    assert visible_gpus(ROWS, None) == ROWS


def test_indices_in_the_order_given():
    assert visible_gpus(ROWS, "1") == [ROWS[1]]
    assert visible_gpus(ROWS, "1,0") == [ROWS[1], ROWS[0]]


def test_uuid_prefix():
    assert visible_gpus(ROWS, "GPU-bbbb") == [ROWS[1]]


def test_a_mig_slice_keeps_every_gpu_rather_than_none():
    assert visible_gpus(ROWS, "MIG-0123abcd") == ROWS


def test_empty_or_invalid_hides_gpus_and_the_list_ends_at_the_first_bad_entry():
    assert visible_gpus(ROWS, "") == []
    assert visible_gpus(ROWS, "-1") == []
    assert visible_gpus(ROWS, "0,7,1") == [ROWS[0]]
    assert visible_gpus(ROWS, "0,0") == [ROWS[0]]


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setattr(gpu, "_nvml_rows", lambda field: None)


def test_no_gpu_memory_is_read_without_a_driver(monkeypatch, no_nvml):
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    assert gpu.gpu_memory_in_use() == {} and gpu.nvidia_gpus() == () and gpu.driver_facts() == {}
    text, problem = gpu.topology_text()
    assert text is None and "nvidia-smi is not on this machine" in problem


def test_gpu_memory_in_use_reads_the_visible_gpus(monkeypatch, no_nvml):
    csv = "0, GPU-aaaa1111, 512\n1, GPU-bbbb2222, 72000\n"
    monkeypatch.setattr(gpu.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=csv))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu.gpu_memory_in_use() == {"0": 0.5, "1": 70.31}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu.gpu_memory_in_use() == {"1": 70.31}


def test_nvml_answers_where_installed_and_cuda_visible_devices_still_narrows(monkeypatch):
    """A stand-in for the nvidia-ml-py module: the lab's own code path from NVML's answers to its rows."""
    devices = [("NVIDIA H200", b"GPU-aaaa1111", 512 * 2**20), ("NVIDIA H200", b"GPU-bbbb2222", 72000 * 2**20)]
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    nvml.nvmlDeviceGetName = lambda d: d[0]
    nvml.nvmlDeviceGetUUID = lambda d: d[1]
    nvml.nvmlDeviceGetMemoryInfo = lambda d: SimpleNamespace(used=d[2])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu, "has_driver", lambda: True)
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **k: pytest.fail("nvidia-smi asked although NVML answers"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu.nvidia_gpus() == ("NVIDIA H200",)
    assert gpu.gpu_memory_in_use() == {"1": 70.31}


def test_a_failing_nvidia_smi_says_why(monkeypatch, no_nvml):
    monkeypatch.setattr(gpu.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=9, stdout="", stderr="no devices"))
    text, problem = gpu.topology_text()
    assert text is None and "failed (9): no devices" in problem
    assert gpu.nvidia_gpus() == ()
