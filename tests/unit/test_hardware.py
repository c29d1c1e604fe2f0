"""Datasheet peaks, roofline floors and the hardware key used to name baselines."""
import pytest

from labkit.environment import hardware_key
from labkit.hardware import Peaks, decode_step_floor_s, gpu_peaks, prefill_floor_s
from labkit.models import SHAPES

LLAMA = SHAPES["llama3-8b"]


@pytest.mark.parametrize("name, bw, tflops", [
    ("NVIDIA H200", 4800, 989),
    ("NVIDIA H100 80GB HBM3", 3350, 989),
    ("NVIDIA H100 PCIe", 2000, 756),
    ("NVIDIA A100-SXM4-80GB", 2039, 312),
    ("NVIDIA A100-SXM4-40GB", 1555, 312),
    ("NVIDIA H20", 4000, 148),
    ("NVIDIA GH200 480GB", 4000, 989),
    ("NVIDIA L40S", 864, 362),
])
def test_gpu_peaks(name, bw, tflops):
    peaks = gpu_peaks(name)
    assert peaks is not None
    assert (peaks.mem_bw_gbs, peaks.tflops) == (bw, tflops)
    assert peaks.device == name and peaks.source == "datasheet table"


@pytest.mark.parametrize("name", ["Acme Matrix Engine X", ""])
def test_unknown_gpu(name):
    assert gpu_peaks(name) is None


H200 = gpu_peaks("NVIDIA H200")


def test_decode_floor_batch_one_is_weight_bandwidth():
    floor = decode_step_floor_s(LLAMA, H200, batch=1, context_tokens=0)
    assert floor == pytest.approx(16.06e9 / 4.8e12, rel=0.02)
    assert 3.3e-3 < floor < 3.4e-3


def test_decode_floor_grows_with_kv_read():
    base = decode_step_floor_s(LLAMA, H200, 1, 0)
    bigger = decode_step_floor_s(LLAMA, H200, batch=8, context_tokens=1000)
    assert bigger > base
    assert bigger - base == pytest.approx(8 * 1000 * 131072 / 4.8e12, rel=1e-9)
    # only the product batch * context matters for the KV part
    assert decode_step_floor_s(LLAMA, H200, 4, 2000) == pytest.approx(bigger, rel=1e-12)
    # fp8 KV halves the KV bytes
    fp8 = decode_step_floor_s(LLAMA, H200, 8, 1000, kv_bytes=1)
    assert fp8 - base == pytest.approx((bigger - base) / 2, rel=1e-9)


def test_decode_floor_turns_compute_bound_at_huge_batch():
    batch = 100_000
    compute = 2 * LLAMA.matmul_params * batch / (989e12)
    assert decode_step_floor_s(LLAMA, H200, batch, 0) == pytest.approx(compute)


def test_prefill_floor_is_compute_bound_for_4096_tokens():
    compute = 2 * LLAMA.matmul_params * 4096 / 989e12
    floor = prefill_floor_s(LLAMA, H200, 4096)
    assert floor == pytest.approx(compute)
    assert floor > LLAMA.num_params * 2 / 4.8e12
    # one token is bandwidth-bound: reading the weights takes longer than the math
    assert prefill_floor_s(LLAMA, H200, 1) == pytest.approx(LLAMA.num_params * 2 / 4.8e12)


def test_given_peaks_scale_the_floor():
    slow = Peaks("given", 2400, 989, "given")
    assert decode_step_floor_s(LLAMA, slow, 1, 0) == pytest.approx(2 * decode_step_floor_s(LLAMA, H200, 1, 0))


@pytest.mark.parametrize("gpus, key", [
    (("NVIDIA H200",), "h200"),
    (("NVIDIA H200", "NVIDIA H200"), "h200x2"),
    # variants with different peaks keep distinct keys, so their baselines never mix
    (("NVIDIA H100 80GB HBM3",), "h100-80gb-hbm3"),
    (("NVIDIA H100 PCIe",), "h100-pcie"),
    (("NVIDIA A100-SXM4-80GB",) * 4, "a100-sxm4-80gbx4"),
    (("NVIDIA L4",), "l4"),
])
def test_hardware_key_gpus(gpus, key):
    assert hardware_key(gpus) == key


def test_hardware_key_cpu():
    key = hardware_key((), cpu="Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz")
    assert key.startswith("cpu-intel-xeon-platinum-8481c")
    assert key == "cpu-intel-xeon-platinum-8481c"
    amd = hardware_key((), cpu="AMD EPYC 9654 96-Core Processor")
    assert amd == "cpu-amd-epyc-9654"
    assert len(hardware_key((), cpu="X" * 200)) <= len("cpu-") + 40


def test_cpu_signature_tells_apart_hosts_whose_model_name_is_hidden():
    from labkit.environment import cpu_signature
    sapphire = "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\ncpu MHz\t\t: 2100.000\n\nprocessor\t: 1\nmodel\t\t: 999\n"
    granite = sapphire.replace("model\t\t: 143", "model\t\t: 173").replace("stepping\t: 8", "stepping\t: 1")
    assert cpu_signature(sapphire) == "family 6 model 143 stepping 8"
    assert cpu_signature(granite) != cpu_signature(sapphire)
    assert cpu_signature("processor\t: 0\nmodel name\t: Apple M3\n") is None
