"""The physical limit of the hardware a result ran on: peak memory bandwidth and FLOP/s, and roofline floors.

decode step >= (weight bytes + KV bytes read) / memory bandwidth   (bytes per element: see precision.py)
prefill     >= 2 * matmul parameters * prompt tokens / peak FLOP/s
The peaks are the hardware's measured ones where `hardware_profile.ipynb` recorded them (a device copy and a
dense GEMM, labkit.measure.peaks; one file per device under data/peaks/), else a GPU's datasheet figures
(dense, no sparsity), else a CPU's measured on the spot; every roofline table names which.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labkit import settings
from labkit.errors import BadParameter
from labkit.spec.models import ModelShape
from labkit.analyze import precision
from labkit.analyze.precision import WeightBytes
from labkit.shown import shows_whole

# name substring (lower case) -> (memory bandwidth GB/s, dense bf16 TFLOP/s); datasheet values.
GPU_PEAKS = {
    "h200": (4800, 989),
    "gh200": (4000, 989),
    "h100 nvl": (3900, 835),
    "h100 pcie": (2000, 756),
    "h100": (3350, 989),
    "h20": (4000, 148),
    "b200": (8000, 2250),
    "a100-sxm4-80gb": (2039, 312),
    "a100 80gb pcie": (1935, 312),
    "a100": (1555, 312),
    "l40s": (864, 362),
    "l40": (864, 181),
    "l4": (300, 121),
    "a10g": (600, 70),
    "a10": (600, 125),
    "rtx 4090": (1008, 165),
    "rtx 3090": (936, 71),
    "t4": (320, 65),
}


@dataclass(frozen=True)
class Peaks:
    """A device's peak memory bandwidth (GB/s) and dense FLOP rate (TFLOP/s), and where the figures came from."""

    device: str
    mem_bw_gbs: float
    tflops: float
    source: str  # "datasheet table", "measured ... ", "measured with NumPy" or "given"


def measured_peaks(device: str) -> Peaks | None:
    """The newest peaks measured on a device of this name (labkit.measure.peaks.record_peaks), or None."""
    folder = settings.current().peaks_dir
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a damaged file is not a measurement; the datasheet answers instead
        if record.get("device") == device and record.get("mem_bw_gbs") and record.get("tflops_bf16"):
            records.append(record)
    if not records:
        return None
    newest = max(records, key=lambda r: r.get("measured_utc", ""))
    # a floor needs the fastest rate the device reached: a CPU may run fp32 faster than bf16
    tflops = max(newest["tflops_bf16"], newest.get("tflops_fp32") or 0)
    return Peaks(device, newest["mem_bw_gbs"], tflops,
                 f"measured {newest.get('measured_utc', '')[:10]}: {newest.get('method', '')}".strip())


def gpu_peaks(name: str) -> Peaks | None:
    """The datasheet peaks of the most specific table entry the GPU name contains, or None."""
    lowered = name.lower()
    for key in sorted(GPU_PEAKS, key=len, reverse=True):  # most specific name first
        if key in lowered:
            bw, tf = GPU_PEAKS[key]
            return Peaks(name, bw, tf, "datasheet table")
    return None


def decode_step_bytes(shape: ModelShape, batch: float, context_tokens: float,
                      weight_bytes: float | WeightBytes = 2, kv_bytes: float = 2) -> float:
    """One decode step reads the weights once (of the input embedding, one row per sequence) and each
    sequence's KV cache. A number of weight bytes applies to every weight; WeightBytes splits them."""
    weights = WeightBytes.of(weight_bytes).read(shape, batch)
    return weights + batch * context_tokens * shape.kv_bytes_per_token(kv_bytes)


def decode_step_floor_s(shape: ModelShape, peaks: Peaks, batch: float, context_tokens: float,
                        weight_bytes: float | WeightBytes = 2, kv_bytes: float = 2) -> float:
    """The bandwidth floor of one decode step, or its compute floor at a batch large enough."""
    read = decode_step_bytes(shape, batch, context_tokens, weight_bytes, kv_bytes)
    compute = 2 * shape.matmul_params * batch / (peaks.tflops * 1e12)
    return max(read / (peaks.mem_bw_gbs * 1e9), compute)


def prefill_floor_s(shape: ModelShape, peaks: Peaks, tokens: float,
                    weight_bytes: float | WeightBytes = 2) -> float:
    """The floor of one prefill over `tokens` tokens, in seconds: its compute at peak FLOP/s or the read of
    its weights at peak bandwidth, whichever takes longer."""
    compute = 2 * shape.matmul_params * tokens / (peaks.tflops * 1e12)
    return max(compute, WeightBytes.of(weight_bytes).read(shape, tokens) / (peaks.mem_bw_gbs * 1e9))


def stored_peaks(results) -> Peaks:
    """The peaks of the device the results were measured on (from their stored environment): measured ones
    where recorded for that device, else a GPU's datasheet figures."""
    devices = {(env.get("gpus") or [env.get("cpu_model")])[0] for env in results.environment.values()}
    found = [peaks for device in sorted(d for d in devices if d)
             if (peaks := measured_peaks(device) or gpu_peaks(device))]
    if len(found) != 1:
        raise BadParameter(f"no single device with known peaks measured these results (devices: "
                           f"{sorted(d for d in devices if d) or 'none'}); pass peaks=, e.g. "
                           "labkit.measure.peaks.detect_peaks() for this machine's own, or measure them with "
                           "notebooks/L4_hardware/hardware_profile.ipynb")
    return found[0]


@shows_whole
def roofline_table(results, peaks: Peaks | None = None) -> pd.DataFrame:
    """Per arm: observed TPOT and TTFT against their physical floors, as % of the limit reached. The peaks are
    those given, else the datasheet figures of the GPU that measured the results.

    The decode floor uses the batch that was really decoding (Little's law: output tok/s x mean TPOT)
    and the mean context (prompt + half the output). 100 % means at the limit.
    """
    peaks = peaks or stored_peaks(results)
    if not results.spec.get("shape"):
        return pd.DataFrame()  # a hub model whose shape is unknown offline
    shape = ModelShape(**results.spec["shape"])
    rows = []
    for arm in results.complete_arms:
        facts = results.arms.set_index("arm").loc[arm]
        wbytes = precision.weight_bytes(facts.get("dtype"), facts.get("quantization"))
        kvbytes = precision.kv_bytes(facts.get("kv_cache_dtype"), facts.get("dtype"))
        req = results.requests[results.requests.arm == arm]
        trials = results.trials[results.trials.arm == arm]
        tpot_s = np.nanmean(req.tpot_ms) / 1e3
        batch = max(1.0, trials.output_tok_s.mean() * tpot_s)
        context = req.prompt_tokens.mean() + req.output_tokens.mean() / 2
        decode_floor = decode_step_floor_s(shape, peaks, batch, context, wbytes, kvbytes)
        ttft_floor = prefill_floor_s(shape, peaks, req.prompt_tokens.mean(), wbytes)
        rows.append({"arm": arm, "decoding_batch": batch, "tpot_mean_ms": tpot_s * 1e3,
                     "tpot_floor_ms": decode_floor * 1e3, "tpot_pct_of_limit": 100 * decode_floor / tpot_s,
                     "ttft_p50_ms": float(np.nanmedian(req.ttft_ms)), "ttft_floor_ms": ttft_floor * 1e3,
                     "ttft_pct_of_limit": 100 * ttft_floor * 1e3 / float(np.nanmedian(req.ttft_ms)),
                     "peaks": f"{peaks.device}: {peaks.mem_bw_gbs:g} GB/s, {peaks.tflops:g} TFLOP/s ({peaks.source})"})
    return pd.DataFrame(rows)


def peaks_against_datasheet(record: dict) -> pd.DataFrame:
    """The measured peaks (labkit.measure.peaks.measure_device_peaks) beside the datasheet's, as a share.
    A device copy reaches 85-95 % of a GPU's memory bandwidth and a large GEMM 60-80 % of its dense rate;
    much less points at clocks, power limits or another process on the GPU."""
    sheet = record.get("datasheet") or {}
    rows = [("memory bandwidth (GB/s)", record.get("mem_bw_gbs"), sheet.get("mem_bw_gbs")),
            ("dense bf16 GEMM (TFLOP/s)", record.get("tflops_bf16"), sheet.get("tflops_bf16")),
            ("dense fp8 GEMM (TFLOP/s)", record.get("tflops_fp8"),
             2 * sheet["tflops_bf16"] if sheet.get("tflops_bf16") and record.get("tflops_fp8") else None)]
    if "tflops_fp32" in record:
        rows.append(("dense fp32 GEMM (TFLOP/s)", record["tflops_fp32"], None))
    table = pd.DataFrame(rows, columns=["figure", "measured", "datasheet"])
    table["share_pct"] = (100 * table.measured / table.datasheet).round(1)
    return table
