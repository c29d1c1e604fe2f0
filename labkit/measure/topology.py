"""How the GPUs of this machine are linked, read from `nvidia-smi topo -m`: NVLink or PCIe between each pair.

Tensor parallelism all-reduces every layer's output across the GPUs of a group, so the link between them
sets how much of a step goes to communication: NVLink (`NV#`, a bonded set of # links) is an order of
magnitude faster than PCIe, and a PCIe path that crosses the CPUs' interconnect (`SYS`) is the slowest.

The matrix is tab-separated with a header that nvidia-smi underlines with terminal escape codes even when
piped, and each GPU row carries one more field than the header (an empty one before `GPU NUMA ID`);
copies pasted from a terminal have spaces instead of tabs. The parser takes all three.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from labkit.errors import BadParameter
from labkit.measure.gpu import topology_text

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")
# nvidia-smi's own legend, for outputs that were copied without it.
LEGEND = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}
_PCIE = {"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"}  # SOC: older drivers' name for SYS


@dataclass
class Topology:
    """The link matrix between devices (GPUs and NICs) and each GPU's CPU and NUMA affinity."""

    available: bool
    note: str  # what was read, or why nothing could be
    devices: list[str] = field(default_factory=list)
    links: dict[tuple[str, str], str] = field(default_factory=dict)  # (row, column) -> code such as NV18
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)  # GPU -> {"CPU Affinity": "0-47", ...}
    legend: dict[str, str] = field(default_factory=lambda: dict(LEGEND))

    @property
    def gpus(self) -> list[str]:
        """The GPUs among the devices, in the matrix's order."""
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        """The link code between two devices, such as NV18 or SYS; an unknown pair raises BadParameter."""
        if (a, b) not in self.links:
            raise BadParameter(f"no link {a}-{b} in this topology; its devices are {self.devices}")
        return self.links[(a, b)]

    def pairs(self) -> pd.DataFrame:
        """One row per GPU pair: the link, its kind (NVLink or PCIe), what it means and the NUMA nodes."""
        rows = []
        for i, a in enumerate(self.gpus):
            for b in self.gpus[i + 1:]:
                code = self.link(a, b)
                kind, nvlinks = classify(code)
                numa = [self.affinity.get(g, {}).get("NUMA Affinity", "") for g in (a, b)]
                rows.append({"gpu_a": a, "gpu_b": b, "link": code, "kind": kind, "nvlinks": nvlinks,
                             "meaning": self.meaning(code), "numa_a": numa[0], "numa_b": numa[1]})
        return pd.DataFrame(rows, columns=["gpu_a", "gpu_b", "link", "kind", "nvlinks", "meaning", "numa_a", "numa_b"])

    def meaning(self, code: str) -> str:
        """What a link code means, in the legend's words (for NV#, with the number of links filled in)."""
        kind, nvlinks = classify(code)
        if kind == "NVLink":
            return self.legend.get("NV#", LEGEND["NV#"]).replace("#", str(nvlinks))
        return self.legend.get(code, "not in nvidia-smi's legend")

    def summary(self) -> str:
        """One line per GPU pair with its link and what it means, or why there is no pair or no topology."""
        if not self.available:
            return self.note
        if len(self.gpus) < 2:
            return f"{len(self.gpus)} GPU here: no GPU pair, so no link for tensor parallelism to use"
        lines = [f"{p.gpu_a}-{p.gpu_b}: {p.link} ({p.kind}: {p.meaning})" for p in self.pairs().itertuples()]
        return "\n".join(lines)


def classify(code: str) -> tuple[str, int]:
    """('NVLink', links) for NV#, ('PCIe', 0) for the PCIe paths, ('self', 0) or ('unknown', 0)."""
    match = re.fullmatch(r"NV(\d+)", code)
    if match:
        return "NVLink", int(match.group(1))
    if code in _PCIE:
        return "PCIe", 0
    return ("self", 0) if code == "X" else ("unknown", 0)


def _fields(line: str) -> list[str]:
    return [f.strip() for f in line.split("\t")] if "\t" in line else line.split()


def _affinity(tail: list[str], names: list[str]) -> dict[str, str]:
    """nvidia-smi pads a GPU row's affinity fields with an extra empty one before the last: drop empty fields
    from the right (never the first, which is an empty CPU affinity on some machines) until they fit."""
    tail = list(tail)
    while len(tail) > len(names):
        empties = [i for i in range(len(tail) - 1, 0, -1) if tail[i] == ""]
        if not empties:
            break
        del tail[empties[0]]
    return {name: value for name, value in zip(names, tail)}


def parse(text: str) -> Topology:
    """Parse the text of `nvidia-smi topo -m` (with or without its legend)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    # The header names the devices and has no "X" (every row has one, on the diagonal).
    header_at = next((i for i, line in enumerate(lines) if "GPU0" in _fields(line) and "X" not in _fields(line)),
                     None)
    if header_at is None:
        raise BadParameter("no `nvidia-smi topo -m` matrix found: its header row names GPU0, GPU1, ... "
                           "and CPU Affinity; pass the command's whole output")
    devices = re.findall(r"\b(?:GPU|NIC)\d+\b", lines[header_at])
    extra = re.findall(r"CPU Affinity|NUMA Affinity|GPU NUMA ID", lines[header_at])
    topo = Topology(True, "read from nvidia-smi topo -m", devices)
    for line in lines[header_at + 1:]:
        fields = _fields(line)
        if not fields or not _DEVICE.match(fields[0]):
            break
        row, cells = fields[0], fields[1:]
        if len(cells) < len(devices):
            raise BadParameter(f"row {row} of the topology has {len(cells)} fields for {len(devices)} devices")
        for column, code in zip(devices, cells):
            topo.links[(row, column)] = code
        if row.startswith("GPU"):
            topo.affinity[row] = _affinity(cells[len(devices):], extra)
    missing = [g for g in topo.gpus if (g, g) not in topo.links]
    if missing:
        raise BadParameter(f"the topology has no row for {missing}: pass the command's whole output")
    for line in lines:
        legend = re.match(r"^\s*(\S+)\s+=\s+(.+?)\s*$", line)
        if legend:
            topo.legend[legend.group(1)] = legend.group(2)
    return topo


def read_topology() -> Topology:
    """This machine's topology, or a Topology that says in words why there is none to read."""
    text, problem = topology_text()
    if text is None:
        return Topology(False, f"{problem}: no GPU links to show")
    try:
        return parse(text)
    except BadParameter as exc:
        return Topology(False, f"nvidia-smi topo -m printed something the lab cannot read: {exc}")
