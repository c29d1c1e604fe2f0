"""Hardware-aware templates: which class a machine falls in, each setting's reason, what is measured here and
what cannot be, the `vllm serve` line, and clear errors for a template the hardware does not fit."""
import shlex

import pytest

from labkit import templates
from labkit.errors import BadParameter

H200 = templates.Hardware("cuda", "NVIDIA H200", "9.0", 140.0, 1)
A100 = templates.Hardware("cuda", "NVIDIA A100-SXM4-80GB", "8.0", 80.0, 1)
RTX4090 = templates.Hardware("cuda", "NVIDIA GeForce RTX 4090", "8.9", 24.0, 1)
V100 = templates.Hardware("cuda", "Tesla V100-SXM2-32GB", "7.0", 32.0, 1)
CPU = templates.Hardware("cpu", "AMD EPYC")


def test_each_gpu_class_gets_its_template():
    assert templates.choose(H200, 15.0).knobs() == {"quantization": "fp8", "kv_cache_dtype": "fp8",
                                                    "max_num_batched_tokens": 32768}
    assert templates.choose(CPU, 0.1).knobs() == {"kv_cache_dtype": "fp8"}
    assert templates.choose(RTX4090, 15.0).name == "24gb"  # fp8-capable, but the memory decides


def test_a_setting_that_cannot_run_here_stays_in_the_command_and_out_of_the_arm():
    one_a100 = templates.choose(A100, 15.0)
    assert one_a100.knobs() == {"max_num_batched_tokens": 16384}
    assert "needs 2 GPUs; this machine has 1" in one_a100.table().set_index("knob").loc["tensor_parallel_size",
                                                                                         "measured here"]
    two = templates.choose(templates.Hardware("cuda", "NVIDIA A100-SXM4-80GB", "8.0", 80.0, 2), 15.0)
    assert two.knobs()["tensor_parallel_size"] == 2
    card = templates.choose(RTX4090, 15.0)
    assert "quantization" not in card.knobs() and card.knobs()["gpu_memory_utilization"] == 0.95
    words = shlex.split(card.serve_command("meta-llama/Meta-Llama-3-8B-Instruct"))
    assert words[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B-Instruct"]
    assert words[words.index("--quantization") + 1] == "awq" and words[words.index("--max-model-len") + 1] == "8192"


def test_every_setting_says_why():
    for hw in (H200, A100, RTX4090, CPU):
        assert all(len(reason) > 20 for reason in templates.choose(hw, 15.0).table().reason)


def test_a_template_the_hardware_does_not_fit_is_refused_with_the_ones_that_do():
    with pytest.raises(BadParameter, match=r"template 'hopper' is for .*this machine is a CPU.*\['cpu'\]"):
        templates.named("hopper", CPU, 0.1)
    with pytest.raises(BadParameter, match="unknown template 'h100'"):
        templates.named("h100", H200, 15.0)
    with pytest.raises(BadParameter, match="no template fits 1 x Tesla V100"):
        templates.choose(V100, 15.0)


def test_the_hardware_is_read_from_an_environment_fingerprint():
    env = {"gpus": ["NVIDIA H200", "NVIDIA H200"], "compute_capability": "9.0", "gpu_memory_mib": 143771}
    hw = templates.Hardware.from_environment(env)
    assert (hw.kind, hw.gpu_count, round(hw.memory_gib)) == ("cuda", 2, 140)
    assert templates.Hardware.from_environment({"gpus": [], "cpu_model": "AMD EPYC"}) == CPU
