"""How many cores the rest of the host kept busy while a trial ran. A launch-bound engine (eager mode, small
batches) slows down when other jobs share the CPU, and that shows up between runs as a change no knob
made; recording it per trial lets a comparison tell the two apart."""
from __future__ import annotations

import os
import time

try:
    import psutil  # comes with vLLM; without it the measurement is simply missing
except ImportError:  # pragma: no cover - analysis-only installs
    psutil = None


def _host_busy_s() -> float | None:
    """CPU seconds the whole host spent busy since boot (Linux /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait; steal (another guest on the hypervisor) counts as busy
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its descendants (the engine core, its workers), live or reaped."""
    me = psutil.Process()
    total = 0.0
    for proc in (me, *me.children(recursive=True)):
        try:
            times = proc.cpu_times()
        except psutil.Error:  # exited in between
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class OtherLoad:
    """Cores kept busy by processes outside this one and its descendants, from creation to `cores()`."""

    def __init__(self):
        host = _host_busy_s() if psutil else None  # without psutil our own share cannot be taken out
        self._start = (time.monotonic(), host, _own_cpu_s() if host is not None else 0.0)

    def cores(self) -> float | None:
        """Mean number of cores other processes kept busy since creation; None where that cannot be measured."""
        wall0, host0, own0 = self._start
        host = _host_busy_s()
        if host is None or host0 is None:
            return None
        wall = time.monotonic() - wall0
        return max(0.0, (host - host0) - (_own_cpu_s() - own0)) / wall if wall > 0 else None
