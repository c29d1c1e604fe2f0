"""What the environment capture writes: tuning variables kept, secrets never (no engine)."""
import json

import pandas as pd

import pytest

from labkit.measure.environment import (REDACTED, cache_variables, cpu_signature, fingerprint, hardware_key,
                                     keep_multicast_off, tuning_variables)


def test_secret_looking_values_are_never_recorded():
    env = {"VLLM_API_KEY": "sk-live-123", "VLLM_ATTENTION_BACKEND": "FLASHINFER", "NCCL_P2P_DISABLE": "1",
           "VLLM_HF_TOKEN": "hf_abc", "NCCL_IB_AUTH_SECRET": "x", "HOME": "/root", "OPENAI_API_KEY": "sk-other"}
    assert tuning_variables(env) == {"NCCL_IB_AUTH_SECRET": REDACTED, "NCCL_P2P_DISABLE": "1",
                                     "VLLM_API_KEY": REDACTED, "VLLM_ATTENTION_BACKEND": "FLASHINFER",
                                     "VLLM_HF_TOKEN": REDACTED}


def test_the_fingerprint_holds_the_name_not_the_secret(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-live-123")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    facts = fingerprint()
    assert facts["tuning_variables"]["VLLM_API_KEY"] == REDACTED
    assert facts["tuning_variables"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert "sk-live-123" not in json.dumps(facts)


def test_multicast_is_turned_off_unless_the_user_chose():
    environ = {"NCCL_NVLS_ENABLE": "1"}
    table = pd.DataFrame(keep_multicast_off(environ)).set_index("variable")
    assert environ == {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    assert table.loc["NCCL_NVLS_ENABLE", "set_by"] == "you"
    assert table.loc["TORCH_SYMM_MEM_DISABLE_MULTICAST", "set_by"] == "the lab"
    fresh = {}
    keep_multicast_off(fresh)
    assert fresh == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


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
    sapphire = "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\ncpu MHz\t\t: 2100.000\n\nprocessor\t: 1\nmodel\t\t: 999\n"
    granite = sapphire.replace("model\t\t: 143", "model\t\t: 173").replace("stepping\t: 8", "stepping\t: 1")
    assert cpu_signature(sapphire) == "family 6 model 143 stepping 8"
    assert cpu_signature(granite) != cpu_signature(sapphire)
    assert cpu_signature("processor\t: 0\nmodel name\t: Apple M3\n") is None


@pytest.mark.parametrize("environ, offender", [
    ({"NCCL_NVLS_ENABLE": "1"}, "NCCL_NVLS_ENABLE='1'"),
    ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, "TORCH_SYMM_MEM_DISABLE_MULTICAST='0'"),
    ({"NCCL_NVLS_ENABLE": "", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, "NCCL_NVLS_ENABLE=''"),
])
def test_the_shell_cannot_turn_multicast_on(environ, offender):
    from labkit.errors import BadParameter
    from labkit.measure.environment import check_multicast_off
    with pytest.raises(BadParameter, match="turns NVLink multicast on") as caught:
        check_multicast_off(environ)
    assert offender in str(caught.value)


def test_the_shell_may_keep_multicast_off_or_leave_it_unset():
    from labkit.measure.environment import MULTICAST_OFF, check_multicast_off
    check_multicast_off({})
    check_multicast_off(dict(MULTICAST_OFF))


def test_an_experiment_and_a_diagnosis_refuse_a_shell_with_multicast_on_before_any_engine(tmp_path, monkeypatch):
    import labkit as lk
    from labkit import diagnose as diagnose_module, experiment as experiment_module
    from labkit.errors import BadParameter

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine would start")
    monkeypatch.setattr(experiment_module, "run_arm", no_engine)
    monkeypatch.setattr(diagnose_module, "parse_serve", no_engine)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    workload = lk.Workload(2, lk.Fixed(4), lk.Fixed(2))
    exp = lk.Experiment("mc", {"a": {}}, workload, results_dir=tmp_path)
    with pytest.raises(BadParameter, match="NCCL_NVLS_ENABLE='1'"):
        exp.run(progress=False)
    with pytest.raises(BadParameter, match="NCCL_NVLS_ENABLE='1'"):
        diagnose_module.diagnose("vllm serve tiny-llama", workload, results_dir=tmp_path, progress=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    with pytest.raises(BadParameter, match="TORCH_SYMM_MEM_DISABLE_MULTICAST='0'"):
        diagnose_module.diagnose("vllm serve tiny-llama", workload, environ={"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"},
                                 results_dir=tmp_path, progress=False)


def test_every_jit_cache_of_an_arm_goes_beneath_its_compile_cache_unless_the_user_chose(tmp_path):
    root = tmp_path / "h200-vllm0.26.0"
    caches = cache_variables(root, environ={})
    assert caches == {"VLLM_CACHE_ROOT": str(root), "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
                      "TRITON_CACHE_DIR": str(root / "triton")}
    mine = cache_variables(root, environ={"TRITON_CACHE_DIR": "/mine", "VLLM_CACHE_ROOT": "/also-mine"})
    assert mine == {"FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer")}
