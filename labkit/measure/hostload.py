"""How many cores the rest of the host kept busy while a trial ran, and how long the lab's own threads waited for a
CPU meanwhile. A launch-bound engine (eager mode, small batches) slows down when other jobs share the CPU, and
that shows up between runs as a change no knob made; recording it per trial lets a comparison tell the two apart.

The host's other load says how busy the machine was; the waiting says how much of that reached the lab's
threads, and it ranked a bound engine's slowed trials where the host's load could not
(data/baselines/cpu-amd-epyc/outside-load/).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

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


def _family() -> tuple:
    """This process and its descendants (the engine core, its workers)."""
    me = psutil.Process()
    return (me, *me.children(recursive=True))


def _own_cpu_s() -> float:
    """CPU seconds of this process and its descendants, live or reaped."""
    total = 0.0
    for proc in _family():
        try:
            times = proc.cpu_times()
        except psutil.Error:  # exited in between
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _own_wait_s() -> float | None:
    """Seconds the threads of this process and its descendants spent ready to run but waiting for a CPU since
    they started (Linux's per-thread run delay, /proc/PID/task/TID/schedstat; None elsewhere). Threads that ended
    take their waiting with them: a trial's engine threads live as long as the engine."""
    waits = []
    for proc in _family():
        for stat in Path(f"/proc/{proc.pid}/task").glob("*/schedstat"):
            try:
                waits.append(int(stat.read_text().split()[1]))
            except (OSError, ValueError, IndexError):  # a thread that ended in between
                continue
    return sum(waits) / 1e9 if waits else None


class OtherLoad:
    """Cores kept busy by processes outside this one and its descendants, from creation to `cores()`."""

    def __init__(self):
        host = _host_busy_s() if psutil else None  # without psutil our own share cannot be taken out
        self._start = (time.monotonic(), host, _own_cpu_s() if host is not None else 0.0)
        self._wait0 = _own_wait_s() if psutil else None

    def cores(self) -> float | None:
        """Mean number of cores other processes kept busy since creation; None where that cannot be measured."""
        wall0, host0, own0 = self._start
        host = _host_busy_s()
        if host is None or host0 is None:
            return None
        wall = time.monotonic() - wall0
        return max(0.0, (host - host0) - (_own_cpu_s() - own0)) / wall if wall > 0 else None

    def threads_waiting(self) -> float | None:
        """Mean number of this process's and its descendants' threads that were ready to run but waiting for a CPU
        since creation (their own threads count: more runnable threads than cores wait too); None where unread."""
        wait = _own_wait_s() if self._wait0 is not None else None
        wall = time.monotonic() - self._start[0]
        return max(0.0, wait - self._wait0) / wall if wait is not None and wall > 0 else None
