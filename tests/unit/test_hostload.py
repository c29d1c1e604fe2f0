"""The host's other load: CPU time of processes outside this one and its descendants."""
import os
import subprocess
import sys
import time

import pytest

from labkit.measure.hostload import OtherLoad

pytestmark = pytest.mark.alone

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass"


def test_a_stranger_spinning_counts_and_our_own_work_does_not(tmp_path):
    quiet = OtherLoad()  # whatever else this machine runs meanwhile: the level the others are read against
    time.sleep(1.0)
    background = quiet.cores()

    own = OtherLoad()
    end = time.time() + 1.0
    while time.time() < end:  # this process busy: not "other"
        pass
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=1.0)])  # a descendant: ours too
    child.wait()
    assert own.cores() < background + 0.5

    # a process that is not our descendant (started by a shell that exits at once): someone else's load.
    # Its load shows only where a core is free for it: with every core already busy the host's busy time
    # cannot grow, whoever spins (seen with other test runs beside this one on 2 cores: 2.00 cores busy)
    if background > (os.cpu_count() or 1) - 0.6:
        pytest.skip(f"other processes keep {background:.2f} of {os.cpu_count()} cores busy: no free core for a "
                    "stranger's load to show on")
    # it says when it spins: on a loaded machine its interpreter can take longer to start than the window lasts
    started = tmp_path / "spinning"
    spin = f"open({str(started)!r}, 'w').close()\n" + SPIN.format(s=3.0)
    subprocess.run(["sh", "-c", f"{sys.executable} -c \"{spin}\" >/dev/null 2>&1 &"], check=True)
    for _ in range(200):
        if started.exists():
            break
        time.sleep(0.05)
    stranger = OtherLoad()
    time.sleep(1.2)
    assert stranger.cores() > background + 0.4


def test_our_threads_waiting_for_a_cpu_are_counted():
    """Two of our own processes spinning on one core: one of them waits at any moment, ~1 thread on average."""
    idle = OtherLoad()
    time.sleep(0.5)
    assert idle.threads_waiting() < 0.3  # this process asleep: nothing of ours was waiting

    core = sorted(os.sched_getaffinity(0))[0]
    pinned = f"import os\nos.sched_setaffinity(0, {{{core}}})\n" + SPIN.format(s=1.5)
    crowded = OtherLoad()
    children = [subprocess.Popen([sys.executable, "-c", pinned]) for _ in range(2)]
    time.sleep(1.2)  # read while both spin (their interpreters start within the first ~0.1 s)
    waiting = crowded.threads_waiting()
    for child in children:
        child.wait()
    assert 0.4 < waiting < 1.5
