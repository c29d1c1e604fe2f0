"""Launches as users write them, parsed by the real vLLM's `vllm serve` parser (CPU build; no engine starts):
each flag becomes the knob it means, what the lab does not reproduce is named, and vLLM's own complaint about
a bad flag is the error."""
import pytest

from labkit.errors import BadParameter
from labkit.measure.serve_parse import parse_many

pytestmark = pytest.mark.engine

COMMANDS = {
    "plain": "vllm serve meta-llama/Meta-Llama-3-8B-Instruct",
    "debug leftover": "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --enforce-eager --port 8000 --host 0.0.0.0",
    "tuned": "vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-seqs 256 --max-num-batched-tokens 16384 "
             "--gpu-memory-utilization 0.95 --max-model-len 8192 --kv-cache-dtype fp8 --quantization fp8",
    "switches": "vllm serve m --no-enable-prefix-caching --no-enable-chunked-prefill --tensor-parallel-size 2 "
                "--attention-backend TRITON_ATTN --seed 7 --served-model-name chat --disable-custom-all-reduce",
    "graphs": "vllm serve m --compilation-config '{\"cudagraph_mode\": \"NONE\"}' --block-size 32",
    "variables": "NCCL_P2P_DISABLE=1 VLLM_LOGGING_LEVEL=INFO vllm serve m --max-num-seqs 8",
    "other variable": "CUDA_VISIBLE_DEVICES=1 vllm serve m",
    "typo": "vllm serve m --max-num-seqz 4",
    "bad value": "vllm serve m --max-num-seqs many",
    "not serve": "python -m vllm.entrypoints.openai.api_server --model m",
}


@pytest.fixture(scope="module")
def parsed():
    return dict(zip(COMMANDS, parse_many(list(COMMANDS.values()), {"VLLM_USE_V1": "1", "HOME": "/root"})))


def test_real_command_lines_become_the_knobs_they_mean(parsed):
    assert parsed["plain"].knobs == {} and parsed["plain"].model == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert parsed["debug leftover"].knobs == {"enforce_eager": True}  # host and port are the server's, not the engine's
    assert parsed["tuned"].knobs == {"max_num_seqs": 256, "max_num_batched_tokens": 16384,
                                     "gpu_memory_utilization": 0.95, "max_model_len": 8192,
                                     "kv_cache_dtype": "fp8", "quantization": "fp8"}
    assert parsed["switches"].knobs == {"enable_prefix_caching": False, "enable_chunked_prefill": False,
                                        "tensor_parallel_size": 2, "attention_backend": "TRITON_ATTN",
                                        "custom_all_reduce": False}
    assert parsed["graphs"].knobs == {"cuda_graphs": False}
    assert parsed["graphs"].unmodelled == {"block_size": 32}  # named: the lab's arms do not reproduce it
    assert parsed["plain"].variables == {"VLLM_USE_V1": "1"}
    # variables written before the command are the launch's own: an arm can leave one out
    assert parsed["variables"].knobs == {"max_num_seqs": 8, "environment": {"NCCL_P2P_DISABLE": "1",
                                                                            "VLLM_LOGGING_LEVEL": "INFO"}}


def test_bad_flags_are_refused_in_vllms_own_words(parsed):
    assert isinstance(parsed["typo"], BadParameter) and "unrecognized arguments: --max-num-seqz" in str(parsed["typo"])
    assert "invalid int value: 'many'" in str(parsed["bad value"])
    assert "a launch is a `vllm serve MODEL [flags]` command line" in str(parsed["not serve"])
    assert "sets CUDA_VISIBLE_DEVICES: the lab reproduces NCCL_* and VLLM_* variables only" in str(parsed["other variable"])
