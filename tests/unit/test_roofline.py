"""Datasheet peaks, roofline floors and the hardware key used to name baselines."""
from dataclasses import asdict

import pandas as pd
import pytest

from labkit.analyze.roofline import Peaks, stored_peaks, decode_step_bytes, decode_step_floor_s, gpu_peaks, prefill_floor_s, roofline_table
from labkit.spec.models import SHAPES
from labkit.analyze.precision import WeightBytes
from labkit import settings
from labkit.errors import BadParameter
from labkit.store import Results, load

LLAMA = SHAPES["llama3-8b"]
GIB = 2**30
# what one bf16 decode step reads of Llama-3-8B's weights: all but the input embedding, plus one of its rows
LLAMA_BF16_READ = (LLAMA.num_params - LLAMA.vocab_size * LLAMA.hidden_size + LLAMA.hidden_size) * 2


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
    assert floor == pytest.approx(LLAMA_BF16_READ / 4.8e12, rel=1e-12)
    # 15.01 GB, not all 16.06 GB of weights: the 1.05 GB embedding table is looked up, not streamed
    assert 3.1e-3 < floor < 3.2e-3


def test_decode_reads_one_embedding_row_per_sequence():
    assert decode_step_bytes(LLAMA, 1, 0) == LLAMA_BF16_READ
    assert decode_step_bytes(LLAMA, 8, 0) - decode_step_bytes(LLAMA, 1, 0) == 7 * LLAMA.hidden_size * 2
    # a tied table is the LM head too, so it is read in full, and only once
    qwen = SHAPES["qwen2.5-0.5b"]
    assert decode_step_bytes(qwen, 1, 0) == qwen.num_params * 2


def test_decode_floor_grows_with_kv_read():
    def kv_part(batch, context, kv_bytes=2):
        return (decode_step_floor_s(LLAMA, H200, batch, context, kv_bytes=kv_bytes)
                - decode_step_floor_s(LLAMA, H200, batch, 0, kv_bytes=kv_bytes))

    assert kv_part(8, 1000) == pytest.approx(8 * 1000 * 131072 / 4.8e12, rel=1e-9)
    # only the product batch * context matters for the KV part
    assert kv_part(4, 2000) == pytest.approx(kv_part(8, 1000), rel=1e-9)
    # fp8 KV halves the KV bytes
    assert kv_part(8, 1000, kv_bytes=1) == pytest.approx(kv_part(8, 1000) / 2, rel=1e-9)


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
    assert prefill_floor_s(LLAMA, H200, 1) == pytest.approx(LLAMA_BF16_READ / 4.8e12, rel=1e-12)


def _roofline_decode_bytes(arms: dict[str, dict], context: int) -> dict[str, float]:
    """Bytes per decode step, read back from the roofline's TPOT floor, for arms decoding one sequence."""
    facts = pd.DataFrame([{"arm": arm, "status": "complete", **f} for arm, f in arms.items()])
    requests = pd.DataFrame([{"arm": arm, "tpot_ms": 10.0, "ttft_ms": 50.0, "prompt_tokens": context - 100,
                              "output_tokens": 200} for arm in arms])
    trials = pd.DataFrame([{"arm": arm, "output_tok_s": 50.0} for arm in arms])  # batch 0.5 x -> 1 sequence
    results = Results("m", None, {"shape": asdict(LLAMA)}, facts, requests, trials, {})
    table = roofline_table(results, H200).set_index("arm")
    assert (table.decoding_batch == 1).all()
    return {arm: ms / 1e3 * H200.mem_bw_gbs * 1e9 for arm, ms in table.tpot_floor_ms.items()}


ARMS = {"bf16": {"dtype": "bfloat16", "quantization": None, "kv_cache_dtype": "auto"},
        "fp8_weights": {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "auto"},
        "fp8_both": {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8"}}


def test_roofline_fp8_weights_halve_only_the_projections():
    read = _roofline_decode_bytes(ARMS, context=1100)
    assert read["bf16"] - read["fp8_weights"] == pytest.approx(LLAMA.linear_params * 1, rel=1e-9)


def test_roofline_auto_kv_cache_keeps_the_model_dtype_under_fp8_weights():
    read = _roofline_decode_bytes(ARMS, context=1100)
    assert read["fp8_weights"] - read["fp8_both"] == pytest.approx(1100 * LLAMA.kv_bytes_per_token(1), rel=1e-9)


def test_roofline_decode_bytes_leave_out_the_embedding_table():
    read = _roofline_decode_bytes(ARMS, context=1100)
    assert read["bf16"] == pytest.approx(LLAMA_BF16_READ + 1100 * 131072, rel=1e-9)


@pytest.mark.parametrize("quantization, computed_gib, measured_gib", [("fp8", 8.46, 8.49), (None, 14.96, 14.96)])
def test_roofline_weights_are_the_ones_an_h200_loaded(quantization, computed_gib, measured_gib):
    """The roofline's weights plus the embedding rows a step leaves unread are what the H200 loaded
    (vLLM 0.26, Llama-3-8B shape): the same rule as memory.breakdown."""
    read = _roofline_decode_bytes({"a": {"dtype": "bfloat16", "quantization": quantization,
                                         "kv_cache_dtype": "auto"}}, context=1100)["a"]
    loaded = read - 1100 * 131072 + (LLAMA.vocab_size - 1) * LLAMA.hidden_size * 2
    assert loaded / GIB == pytest.approx(computed_gib, abs=0.005)
    assert abs(loaded / GIB - measured_gib) < 0.1
    assert loaded == pytest.approx(WeightBytes(1 if quantization else 2, 2).loaded(LLAMA), rel=1e-9)


def test_given_peaks_scale_the_floor():
    slow = Peaks("given", 2400, 989, "given")
    assert decode_step_floor_s(LLAMA, slow, 1, 0) == pytest.approx(2 * decode_step_floor_s(LLAMA, H200, 1, 0))


def test_peaks_default_to_the_datasheet_of_the_gpu_that_measured_the_results(tmp_path):
    with settings.use(settings.current().replace(peaks_dir=tmp_path)):  # no measured peaks recorded
        _datasheet_peaks_by_device()


def test_committed_h200_results_use_the_peaks_measured_on_the_h200():
    """data/peaks/h200.json (hardware_profile.ipynb on the lent H200) is what H200 rooflines read."""
    results = load("request-shape", settings.ROOT / "data" / "baselines" / "h200" / "results")
    used = stored_peaks(results)
    assert used.source.startswith("measured") and used.tflops < H200.tflops and used.mem_bw_gbs < H200.mem_bw_gbs


def _datasheet_peaks_by_device():
    facts = pd.DataFrame([{"arm": "a", "status": "complete"}])
    on_h200 = Results("m", None, {}, facts, pd.DataFrame(), pd.DataFrame(), {"a": {"gpus": ["NVIDIA H200"]}})
    assert stored_peaks(on_h200) == H200
    on_cpu = Results("m", None, {}, facts, pd.DataFrame(), pd.DataFrame(), {"a": {"gpus": []}})
    with pytest.raises(BadParameter, match="pass peaks="):
        stored_peaks(on_cpu)
