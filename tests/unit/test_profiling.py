"""Trace analysis on hand-made chrome traces whose answer is known, and on a real vLLM CPU worker trace."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.analyze import profiling as P
from labkit.errors import BadParameter

DATA = Path(__file__).parent / "data"
GEMM_K = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ATTN_K = "flash_fwd_splitkv_kernel"
NORM_K = "void vllm::rms_norm_kernel<c10::BFloat16>"
NCCL_K = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def kernel(name, ts, dur, cat="kernel", pid=0, tid=7):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def write(tmp_path, events, gz=False, name="t"):
    # The extras a real trace has (metadata, instants, the profiler span, host ops) must be ignored.
    noise = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
             {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 0},
             {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
              "ts": 0, "dur": 10**6},
             {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 0, "dur": 5000},
             {"ph": "X", "cat": "gpu_user_annotation", "name": "execute_context_1", "pid": 0, "tid": 7,
              "ts": 0, "dur": 10**5}]
    doc = {"schemaVersion": 1, "traceEvents": noise + events}
    path = tmp_path / (f"{name}.json.gz" if gz else f"{name}.json")
    raw = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def back_to_back(spec, start=1000.0, gap=0.0):
    """Kernels one after the other, with `gap` us between them: spec is [(name, dur_us, count)]."""
    out, ts = [], start
    for name, dur, count in spec:
        for _ in range(count):
            out.append(kernel(name, ts, dur))
            ts += dur + gap
    return out


def shares_of(result):
    return result["shares"].set_index("category")


@pytest.mark.parametrize("gz", [False, True])
def test_load_trace_reads_json_and_gzip(tmp_path, gz):
    df = P.load_trace(write(tmp_path, [kernel(GEMM_K, 10, 5)], gz=gz))
    assert list(df.columns) == ["name", "cat", "ts_us", "dur_us", "pid", "tid"]
    assert len(df) == 4  # the Trace span, one cpu_op, one annotation and the kernel: X events only
    assert df.loc[df["cat"] == "kernel", "dur_us"].item() == 5.0


def test_gzip_detected_from_content_not_name(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [kernel(GEMM_K, 0, 3)]}).encode()))
    assert len(P.load_trace(path)) == 1


def test_device_events_prefers_gpu_kernels(tmp_path):
    events = [kernel(GEMM_K, 10, 5), kernel("Memcpy HtoD (Pageable -> Device)", 20, 2, cat="gpu_memcpy")]
    ev, source = P.device_events(P.load_trace(write(tmp_path, events)))
    assert source == "gpu kernels"
    assert sorted(ev["cat"]) == ["gpu_memcpy", "kernel"]


@pytest.mark.parametrize("name,expected", [
    (GEMM_K, "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "gemm"),
    ("aten::mm", "gemm"),
    ("aten::addmm", "gemm"),
    ("aten::bmm", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("_C::weight_packed_linear", "gemm"),
    ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
    (ATTN_K, "attention"),
    ("kernel_unified_attention_2d", "attention"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>", "attention"),
    ("vllm::unified_attention_with_output", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", "attention"),
    (NORM_K, "norm/activation/elementwise"),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>",
     "norm/activation/elementwise"),
    ("triton_poi_fused_add_0", "norm/activation/elementwise"),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>", "norm/activation/elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
     "norm/activation/elementwise"),
    (NCCL_K, "communication"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>", "communication"),
    ("Memcpy HtoD (Pageable -> Device)", "memory copy"),
    ("Memset (Device)", "memory copy"),
    ("aten::copy_", "memory copy"),
    ("aten::to", "memory copy"),
    ("_C::fused_gumbel_argmax", "sampling"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2>", "sampling"),
    ("aten::multinomial", "sampling"),
    ("aten::slice", "other"),
])
def test_categorize_real_names(name, expected):
    assert P.categorize(name) == expected


def test_categorize_uses_copy_categories():
    assert P.categorize("whatever", "gpu_memset") == "memory copy"


@pytest.mark.parametrize("gz", [False, True])
def test_compute_bound(tmp_path, gz):
    events = back_to_back([(GEMM_K, 90, 10), (NORM_K, 10, 10)], gap=0.5)
    result = P.analyse(write(tmp_path, events, gz=gz))
    assert result["source"] == "gpu kernels"
    assert result["bottleneck"][0].startswith("compute-bound")
    assert "GEMM" in result["bottleneck"][1]
    assert result["shares"]["share_pct"].sum() == pytest.approx(100.0)
    assert shares_of(result).loc["gemm", "busy_pct"] == pytest.approx(90.0)


def test_communication_bound(tmp_path):
    events = back_to_back([(GEMM_K, 50, 10), (NCCL_K, 30, 10), (NORM_K, 20, 10)])
    label, rule = P.analyse(write(tmp_path, events))["bottleneck"]
    assert label.startswith("communication-bound") and "30.0 %" in rule


def test_launch_bound(tmp_path):
    events = back_to_back([(GEMM_K, 10, 20)], gap=10)  # busy 10 us, idle 10 us between each
    result = P.analyse(write(tmp_path, events))
    assert result["bottleneck"][0].startswith("launch/scheduling-bound")
    gaps = result["gaps"]
    assert gaps["n_gaps"] == 19 and gaps["median_gap_us"] == pytest.approx(10.0)
    assert gaps["idle_share_pct"] == pytest.approx(100 * 190 / 390)
    assert shares_of(result).loc[P.IDLE, "share_pct"] == pytest.approx(100 * 190 / 390)
    assert result["window_ms"] == pytest.approx(0.39)


def test_attention_bound(tmp_path):
    events = back_to_back([(ATTN_K, 50, 10), (GEMM_K, 40, 10), (NORM_K, 10, 10)])
    assert P.analyse(write(tmp_path, events))["bottleneck"][0].startswith("attention-bound")


def test_mixed(tmp_path):
    events = back_to_back([(ATTN_K, 30, 10), (GEMM_K, 40, 10), (NORM_K, 30, 10)])
    label, rule = P.analyse(write(tmp_path, events))["bottleneck"]
    assert label.startswith("mixed") and "no rule fired" in rule


def test_rules_apply_in_order():
    """GEMM-heavy but idle: the idle rule, since the compute rule needs a busy device."""
    shares = P.pd.DataFrame({"category": ["gemm", P.IDLE], "ms": [6.0, 4.0]})
    assert P.bottleneck(shares)[0].startswith("launch/scheduling-bound")


def test_overlapping_streams_are_not_double_counted(tmp_path):
    # A GEMM on stream 7 over [0, 100) and an all-reduce on stream 9 over [50, 150): busy 150, not 200.
    events = [kernel(GEMM_K, 0, 100, tid=7), kernel(NCCL_K, 50, 100, tid=9), kernel(NORM_K, 200, 50, tid=7)]
    result = P.analyse(write(tmp_path, events))
    shares = shares_of(result)
    assert shares.loc["gemm", "ms"] == pytest.approx(0.1)
    assert shares.loc["communication", "ms"] == pytest.approx(0.05)  # only the part past the GEMM
    assert shares.loc[P.IDLE, "ms"] == pytest.approx(0.05)
    assert shares["ms"].sum() == pytest.approx(result["window_ms"]) == pytest.approx(0.25)
    assert result["gaps"]["n_gaps"] == 1


def test_contained_kernel_counts_once(tmp_path):
    events = [kernel(GEMM_K, 0, 100, tid=7), kernel(NORM_K, 20, 10, tid=9)]
    shares = shares_of(P.analyse(write(tmp_path, events)))
    assert shares["ms"].sum() == pytest.approx(0.1)
    assert shares.loc[P.IDLE, "ms"] == 0


def test_kernel_summary(tmp_path):
    events = back_to_back([(GEMM_K, 60, 2), (NORM_K, 10, 4), ("Memcpy DtoD (Device -> Device)", 5, 8)])
    ev, _ = P.device_events(P.load_trace(write(tmp_path, events)))
    top = P.kernel_summary(ev, top=2)
    assert list(top["name"]) == [GEMM_K, NORM_K]
    assert list(top["count"]) == [2, 4]
    assert top["total_ms"].iloc[0] == pytest.approx(0.12)
    assert top["share_pct"].iloc[0] == pytest.approx(60.0)
    assert list(top["category"]) == ["gemm", "norm/activation/elementwise"]


def test_cpu_fallback_keeps_outermost_operators(tmp_path):
    def op(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    events = [op("aten::linear", 0, 100), op("aten::addmm", 0, 90), op("aten::mm", 10, 50),  # nested in linear
              op("aten::silu", 120, 30), op("aten::empty", 125, 1),
              op("aten::mm", 0, 40, tid=2),  # another thread: its own top level
              {"ph": "X", "cat": "python_function", "name": "model.py(1): forward", "pid": 1, "tid": 1,
               "ts": 0, "dur": 500}]
    doc = {"traceEvents": events}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(doc))
    ev, source = P.device_events(P.load_trace(path))
    assert source == "cpu operators"
    assert sorted(ev["name"]) == ["aten::linear", "aten::mm", "aten::silu"]
    result = P.analyse(path)
    assert result["source"] == "cpu operators"
    assert shares_of(result).loc["gemm", "ms"] == pytest.approx(0.1)  # thread 2 overlaps thread 1: once
    assert shares_of(result).loc[P.IDLE, "ms"] == pytest.approx(0.02)


def test_trace_without_operators_is_refused(tmp_path):
    path = tmp_path / "frontend.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "Trace", "name": "x", "pid": 1, "tid": 1,
                                                 "ts": 0, "dur": 1}]}))
    with pytest.raises(BadParameter, match="worker trace"):
        P.analyse(path)


def test_find_traces_skips_the_frontend(tmp_path):
    for name in ("rank0.1.pt.trace.json.gz", "host_1.async_llm.2.pt.trace.json.gz", "rank0.profiler_out.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in P.find_traces(tmp_path)] == ["rank0.1.pt.trace.json.gz"]


def test_real_cpu_worker_trace():
    """A trace vLLM 0.32 (CPU) wrote for tiny-llama: start_profile, 4 requests of 16 tokens, stop_profile."""
    result = P.analyse(DATA / "cpu_trace_tiny_llama.json.gz")
    assert result["source"] == "cpu operators"
    kernels = result["kernels"]
    assert len(kernels) > 0 and kernels["name"].iloc[0] == "_C::weight_packed_linear"
    assert set(kernels["category"]) >= {"gemm", "attention"}
    assert result["shares"]["share_pct"].sum() == pytest.approx(100.0)
    assert result["window_ms"] > 0
    label, rule = result["bottleneck"]
    assert label and rule


def test_import_stays_light():
    code = "import sys, labkit.analyze.profiling; assert not {'torch', 'vllm'} & set(sys.modules), sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_kernel_summary_shortens_templated_names_after_categorizing(tmp_path):
    long_gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8<" + "x" * 900 + ">>"
    ev, _ = P.device_events(P.load_trace(write(tmp_path, back_to_back([(long_gemm, 60, 2)]))))
    top = P.kernel_summary(ev)
    assert len(top["name"].iloc[0]) == P.NAME_WIDTH and top["name"].iloc[0].endswith("…")
    assert top["category"].iloc[0] == "gemm"


def test_find_traces_puts_rank_zero_first_even_when_older(tmp_path):
    import os
    for i, name in enumerate(["rank0.1.pt.trace.json.gz", "rank1.2.pt.trace.json.gz"]):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, (1000 - i, 1000 - i) if name.startswith("rank1") else (500, 500))
    assert [p.name for p in P.find_traces(tmp_path)] == ["rank0.1.pt.trace.json.gz", "rank1.2.pt.trace.json.gz"]


def test_the_bottleneck_outlives_a_trace_too_large_to_keep(tmp_path):
    import pandas as pd
    from labkit.store import Results

    folder = tmp_path / "arms" / "kept" / "profile"
    folder.mkdir(parents=True)
    trace = write(folder, back_to_back([(GEMM_K, 10, 20)], gap=10))
    recorded = P.summary(trace)
    assert recorded["bottleneck"].startswith("launch/scheduling-bound") and recorded["source"] == "gpu kernels"
    assert recorded["shares_pct"][P.IDLE] == pytest.approx(100 * 190 / 390, abs=0.01)
    assert len(json.dumps(recorded)) < 1000  # small enough for the arm's facts
    arms = pd.DataFrame([
        {"arm": "kept", "status": "complete", "profile_trace": "profile/t.json", "profile_summary": None},
        {"arm": "summarised", "status": "complete", "profile_trace": "profile/gone.json",
         "profile_summary": json.dumps({**recorded, "bottleneck": "compute-bound: recorded"})},
        {"arm": "neither", "status": "complete", "profile_trace": None, "profile_summary": None}])
    results = Results("x", tmp_path, {}, arms, pd.DataFrame(), pd.DataFrame(), {})
    assert P.arm_bottleneck(results, "kept")[0].startswith("launch/scheduling-bound")  # the trace first
    verdict, rule = P.arm_bottleneck(results, "summarised")
    assert verdict == "compute-bound: recorded" and rule.endswith("(from the summary recorded with the arm)")
    with pytest.raises(BadParameter, match="no profiler trace.*no summary was recorded.*measure the arm again"):
        P.arm_bottleneck(results, "neither")
