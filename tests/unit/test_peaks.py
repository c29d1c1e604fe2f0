"""Measured peaks: torch's own measurement on this CPU, kept per device, and preferred by every roofline of
that device over the datasheet; what a compute capability unlocks; a GPU's PCIe link as nvidia-smi says."""
import json

import pandas as pd
import pytest

from labkit import settings
from labkit.analyze.roofline import measured_peaks, peaks_against_datasheet, stored_peaks
from labkit.measure import gpu, peaks
from labkit.spec import capabilities
from labkit.store import Results


@pytest.fixture
def peaks_dir(tmp_path):
    with settings.use(settings.current().replace(peaks_dir=tmp_path / "peaks")):
        yield tmp_path / "peaks"


def on(device: str) -> Results:
    facts = pd.DataFrame([{"arm": "a", "status": "complete"}])
    return Results("m", None, {}, facts, pd.DataFrame(), pd.DataFrame(), {"a": {"gpus": [device]}})


def test_this_cpu_is_measured_with_torch_and_says_why_fp8_is_not():
    record = peaks.measure_device_peaks(copy_mib=16, gemm_n=256, repeats=2)
    assert record["kind"] == "cpu" and record["mem_bw_gbs"] > 0.1
    assert record["tflops_bf16"] > 0 and record["tflops_fp32"] > 0
    assert record["tflops_fp8"] is None and "CPU" in record["fp8_why_not"]
    assert "16 MiB" in record["method"] and record["datasheet"] is None


def test_recorded_peaks_replace_the_datasheet_in_rooflines_of_that_device(peaks_dir):
    assert stored_peaks(on("NVIDIA H200")).source == "datasheet table"
    record = {"device": "NVIDIA H200", "hardware_key": "h200", "mem_bw_gbs": 4310.0, "tflops_bf16": 702.5,
              "tflops_fp8": 1301.0, "measured_utc": "2026-12-01T08:00:00Z", "method": "torch cuda copy"}
    path = peaks.record_peaks(record)
    assert json.loads(open(path).read()) == record
    used = stored_peaks(on("NVIDIA H200"))
    assert (used.mem_bw_gbs, used.tflops) == (4310.0, 702.5) and used.source.startswith("measured 2026-12-01")
    assert measured_peaks("NVIDIA H100 80GB HBM3") is None  # another device keeps its datasheet


def test_a_damaged_peaks_file_is_not_a_measurement(peaks_dir):
    peaks_dir.mkdir()
    (peaks_dir / "h200.json").write_text("{not json")
    assert measured_peaks("NVIDIA H200") is None
    assert stored_peaks(on("NVIDIA H200")).source == "datasheet table"


def test_a_cpu_floor_uses_its_fastest_measured_rate(peaks_dir):
    peaks.record_peaks({"device": "AMD EPYC", "hardware_key": "cpu-amd-epyc", "mem_bw_gbs": 20.0,
                        "tflops_bf16": 0.03, "tflops_fp32": 0.19, "measured_utc": "2026-12-01T08:00:00Z"})
    assert measured_peaks("AMD EPYC").tflops == 0.19


@pytest.mark.parametrize("cc, fa3, fp8, fp4", [("9.0", True, True, False), ("8.9", False, True, False),
                                               ("8.0", False, False, False), ("10.0", False, True, True),
                                               (None, False, False, False)])
def test_what_a_compute_capability_unlocks(cc, fa3, fp8, fp4):
    table = capabilities.unlocks(cc).set_index("feature").available
    assert (table["FlashAttention 3"], table["fp8 weights (W8A8)"], table["fp4 (NVFP4)"]) == (fa3, fp8, fp4)
    assert (peaks.fp8_problem(cc) is None) == fp8


def test_measured_peaks_are_set_against_the_datasheet():
    table = peaks_against_datasheet(
        {"mem_bw_gbs": 4320.0, "tflops_bf16": 742.0, "tflops_fp8": 1400.0,
         "datasheet": {"mem_bw_gbs": 4800, "tflops_bf16": 989}}).set_index("figure")
    assert table.loc["memory bandwidth (GB/s)", "share_pct"] == 90.0
    assert table.loc["dense fp8 GEMM (TFLOP/s)", "datasheet"] == 1978


def test_pcie_links_as_nvidia_smi_reports_them(monkeypatch):
    monkeypatch.setattr(gpu, "smi", lambda *a, **k: ("0, NVIDIA H200, 5, 5, 16, 16\n1, NVIDIA H200, 1, 5, 16, 16\n", ""))
    links, why = gpu.pcie_links()
    assert why == "" and links[1] == {"gpu": "GPU1", "name": "NVIDIA H200", "gen_now": "1", "gen_max": "5",
                                      "lanes_now": "16", "lanes_max": "16"}
    monkeypatch.setattr(gpu, "smi", lambda *a, **k: (None, "nvidia-smi is not on this machine"))
    assert gpu.pcie_links() == ([], "nvidia-smi is not on this machine")
