"""Every question the lab asks the NVIDIA driver, in one place: which GPUs this process may use, the memory
already in use on them, the driver's facts and the link matrix. NVML (the nvidia-ml-py package) answers
where it is installed; otherwise the `nvidia-smi` command does. Without either there are no GPUs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

_NVML_FIELDS = {"name", "memory.used"}


def smi(*args: str, timeout: float = 30) -> tuple[str | None, str]:
    """nvidia-smi's output, or None and why it could not be read."""
    if not shutil.which("nvidia-smi"):
        return None, "nvidia-smi is not on this machine (no NVIDIA driver)"
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi {' '.join(args)} could not run: {exc}"
    if getattr(done, "returncode", 0):
        return None, f"nvidia-smi {' '.join(args)} failed ({done.returncode}): {(done.stderr or '').strip()[:300]}"
    return done.stdout, ""


def has_driver() -> bool:
    return os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi") is not None


def nvml():
    """The NVML bindings (nvidia-ml-py, else the copy vLLM vendors), initialised; or None and why not."""
    if not has_driver():
        return None, "no NVIDIA driver on this machine"  # (and vLLM's copy is not imported for nothing)
    module = None
    for name in ("pynvml", "vllm.third_party.pynvml"):
        try:
            module = __import__(name, fromlist=["nvmlInit"])
            break
        except Exception:
            continue
    if module is None:
        return None, "NVML's Python bindings are not installed (pip install nvidia-ml-py)"
    try:
        module.nvmlInit()
    except Exception as exc:  # no driver, or a driver NVML cannot talk to
        return None, f"NVML could not start: {exc}"
    return module, ""


def _nvml_rows(field: str) -> list[tuple[str, ...]] | None:
    """(index, uuid, field) per GPU of the host from NVML, or None where NVML cannot answer."""
    if field not in _NVML_FIELDS:
        return None
    pynvml, _ = nvml()
    if pynvml is None:  # not installed, or no driver: nvidia-smi (or nothing) answers instead
        return None
    try:
        rows = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if field == "name":
                value = pynvml.nvmlDeviceGetName(handle)
                value = value.decode() if isinstance(value, bytes) else value
            else:
                value = str(pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            rows.append((str(index), uuid.decode() if isinstance(uuid, bytes) else uuid, value))
        return rows
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def _query_visible_gpus(field: str) -> list[tuple[str, ...]]:
    """(index, uuid, field) per GPU this process may use; none without a driver."""
    rows = _nvml_rows(field)
    if rows is None:
        out, _ = smi(f"--query-gpu=index,uuid,{field}", "--format=csv,noheader,nounits")
        rows = [tuple(part.strip() for part in line.split(",", 2))
                for line in (out or "").splitlines() if line.count(",") >= 2]
    return visible_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(rows: list[tuple[str, ...]], spec: str | None) -> list[tuple[str, ...]]:
    """(index, uuid, ...) rows as CUDA sees them under CUDA_VISIBLE_DEVICES=spec: entries are indices or
    (prefixes of) UUIDs, in the order given; like CUDA, the list ends at the first entry that names no GPU."""
    if spec is None or "MIG-" in spec:  # a MIG slice's GPU is not in nvidia-smi's GPU rows: keep them all
        return list(rows)
    chosen = []
    for entry in (e.strip() for e in spec.split(",")):
        match = [r for r in rows if r[0] == entry or (entry.startswith("GPU-") and r[1].startswith(entry))]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def gpu_identities() -> list[tuple[str, str]]:
    """(driver index, UUID) of each GPU this process may use: where parallel arms are placed, and what an arm
    records of the GPUs it ran on."""
    return [(index, uuid) for index, uuid, _ in _query_visible_gpus("name")]


def nvidia_gpus() -> tuple[str, ...]:
    """The names of the GPUs this process may use: the driver lists every GPU of the host,
    CUDA_VISIBLE_DEVICES narrows them (a run on one GPU of a two-GPU host is a one-GPU run, with its own
    baseline)."""
    return tuple(name for _, _, name in _query_visible_gpus("name"))


def gpu_memory_in_use() -> dict[str, float]:
    """GiB already in use on each GPU this process may use, by driver index. Read before an engine
    starts: memory another process holds (often an engine left behind by an interrupted run) shrinks the
    KV cache or fails the start with errors that do not say why (e.g. CUBLAS_STATUS_INTERNAL_ERROR)."""
    return {index: round(float(mib) / 1024, 2) for index, _, mib in _query_visible_gpus("memory.used")
            if re.fullmatch(r"[\d.]+", mib)}


def driver_facts() -> dict:
    """The driver version, the first GPU's memory and compute capability, and the CUDA version the driver
    supports; empty without a driver."""
    facts = {}
    out, _ = smi("--query-gpu=driver_version,memory.total,compute_cap", "--format=csv,noheader,nounits")
    first = out.strip().splitlines()[0].split(",") if out and out.strip() else []
    if len(first) >= 3:
        try:
            facts.update(driver=first[0].strip(), gpu_memory_mib=int(float(first[1])),
                         compute_capability=first[2].strip())
        except ValueError:
            pass
    header, _ = smi()
    match = re.search(r"CUDA Version:\s*([\d.]+)", header or "")
    if match:
        facts["cuda_driver_api"] = match.group(1)
    return facts


def topology_text() -> tuple[str | None, str]:
    """The text of `nvidia-smi topo -m`, or None and why there is none."""
    return smi("topo", "-m", timeout=60)


PCIE_FIELDS = ["pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max"]


def pcie_links() -> tuple[list[dict], str]:
    """Each visible GPU's PCIe link to the host (generation and lanes, now and at most), or [] and why not.
    An idle GPU may train its link down to save power: the current generation is read under no load."""
    out, problem = smi(f"--query-gpu=index,name,{','.join(PCIE_FIELDS)}", "--format=csv,noheader,nounits")
    if out is None:
        return [], problem
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 + len(PCIE_FIELDS):
            rows.append({"gpu": f"GPU{parts[0]}", "name": parts[1], "gen_now": parts[2], "gen_max": parts[3],
                         "lanes_now": parts[4], "lanes_max": parts[5]})
    return rows, "" if rows else f"nvidia-smi printed no PCIe rows: {out.strip()[:200]}"
