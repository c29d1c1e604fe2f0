"""The `nvidia-smi topo -m` parser on the shapes nvidia-smi really prints (no GPU needed)."""
import pytest

from labkit.measure import topology
from labkit.errors import BadParameter

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""

# As piped from an HGX node: the header underlined with escape codes, tabs, an empty field before
# `GPU NUMA ID` on GPU rows, NIC rows padded with empty fields.
NVLINK_PAIR = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tPIX\tSYS\t0-47,96-143\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tPIX\t48-95,144-191\t1\t\tN/A\n"
    "NIC0\tPIX\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tPIX\tSYS\t X \t\t\t\t\n"
    + LEGEND
)

# As pasted from a terminal (tabs expanded to spaces): two PCIe cards behind one host bridge.
PCIE_PAIR_PASTED = """        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      PHB     0-31    0               N/A
GPU1    PHB      X      0-31    0               N/A
""" + LEGEND

# Four PCIe GPUs on two sockets; on GPU2 and GPU3 the CPU affinity is empty (seen on some hosts).
FOUR_PCIE = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tPIX\tSYS\tSYS\t0-23,48-71\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tSYS\tSYS\t0-23,48-71\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tPIX\t\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tPIX\t X \t\t1\t\tN/A\n"
    + LEGEND
)

ONE_GPU = "\t\x1b[4mGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \tPHB\t0-251\t0\t\tN/A\n" \
          "NIC0\tPHB\t X \t\t\t\t\n" + LEGEND


def test_nvlink_pair_with_nics_affinity_and_legend():
    topo = topology.parse(NVLINK_PAIR)
    assert topo.available and topo.gpus == ["GPU0", "GPU1"]
    assert topo.devices == ["GPU0", "GPU1", "NIC0", "NIC1"]
    assert topo.link("GPU0", "GPU1") == topo.link("GPU1", "GPU0") == "NV18"
    assert topo.link("GPU0", "GPU0") == "X" and topo.link("NIC0", "NIC1") == "SYS"
    assert topo.affinity["GPU1"] == {"CPU Affinity": "48-95,144-191", "NUMA Affinity": "1", "GPU NUMA ID": "N/A"}
    pairs = topo.pairs()
    assert len(pairs) == 1
    row = pairs.iloc[0]
    assert (row.link, row.kind, row.nvlinks) == ("NV18", "NVLink", 18)
    assert row.meaning == "Connection traversing a bonded set of 18 NVLinks"
    assert (row.numa_a, row.numa_b) == ("0", "1")
    assert "GPU0-GPU1: NV18 (NVLink" in topo.summary()


def test_pcie_pair_pasted_with_spaces():
    topo = topology.parse(PCIE_PAIR_PASTED)
    assert topo.gpus == ["GPU0", "GPU1"]
    pair = topo.pairs().iloc[0]
    assert (pair.link, pair.kind, pair.nvlinks) == ("PHB", "PCIe", 0)
    assert "PCIe Host Bridge" in pair.meaning
    assert topo.affinity["GPU0"] == {"CPU Affinity": "0-31", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}


def test_four_pcie_gpus_pix_and_sys_with_empty_cpu_affinity():
    topo = topology.parse(FOUR_PCIE)
    pairs = topo.pairs().set_index(["gpu_a", "gpu_b"])
    assert len(pairs) == 6
    assert pairs.loc[("GPU0", "GPU1"), "link"] == "PIX" and pairs.loc[("GPU2", "GPU3"), "link"] == "PIX"
    assert pairs.loc[("GPU1", "GPU2"), "link"] == "SYS"
    assert "SMP interconnect" in pairs.loc[("GPU0", "GPU3"), "meaning"]
    assert set(pairs.kind) == {"PCIe"}
    assert topo.affinity["GPU2"] == {"CPU Affinity": "", "NUMA Affinity": "1", "GPU NUMA ID": "N/A"}
    assert topo.affinity["GPU0"]["CPU Affinity"] == "0-23,48-71"


def test_one_gpu_has_no_pair():
    topo = topology.parse(ONE_GPU)
    assert topo.gpus == ["GPU0"] and topo.pairs().empty
    assert "no GPU pair" in topo.summary()


def test_the_legend_is_optional():
    without = NVLINK_PAIR.split("\nLegend:")[0]
    assert topology.parse(without).pairs().iloc[0].meaning == "Connection traversing a bonded set of 18 NVLinks"


@pytest.mark.parametrize("code, kind", [("NV4", ("NVLink", 4)), ("PIX", ("PCIe", 0)), ("SYS", ("PCIe", 0)),
                                        ("SOC", ("PCIe", 0)), ("X", ("self", 0)), ("??", ("unknown", 0))])
def test_classify(code, kind):
    assert topology.classify(code) == kind


@pytest.mark.parametrize("text", ["", "No devices were found", "GPU 0: NVIDIA H200 (UUID: GPU-1234)"])
def test_text_without_a_matrix_is_refused_with_what_to_pass(text):
    with pytest.raises(BadParameter, match="nvidia-smi topo -m"):
        topology.parse(text)


def test_truncated_row_is_refused():
    with pytest.raises(BadParameter, match="GPU1"):
        topology.parse("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-7\nGPU1\tNV18\n")


def test_unknown_link_pair_names_the_devices():
    with pytest.raises(BadParameter, match="GPU0"):
        topology.parse(NVLINK_PAIR).link("GPU0", "GPU7")


def test_without_nvidia_smi_it_says_so(monkeypatch):
    from labkit.measure import gpu
    monkeypatch.setattr(gpu, "_nvml_rows", lambda field: None)
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    topo = topology.read_topology()
    assert not topo.available and "nvidia-smi is not on this machine" in topo.summary()
    assert topo.gpus == [] and topo.pairs().empty
