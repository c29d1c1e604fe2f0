"""Where an arm's vLLM processes meet, and removing it once they are gone.

vLLM's engine core and its client find each other over ZMQ sockets made in VLLM_RPC_BASE_PATH (the temporary
folder by default), and its worker joins torch.distributed through a file store there (`vllm_dist_<hex>`). Its
own shutdown removes them; the lab ends an engine without that shutdown once the results are stored (no grace
period), and a killed or timed-out engine never runs it, so each arm used to leave its sockets and a file store
in the temporary folder (6 sockets for a one-engine arm; 1,082 sockets and 277 file stores here three hours after
the machine started). Each arm's sockets now go in a folder of its own, removed with the arm, and its file store
is removed by the name its engine logged.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

VARIABLE = "VLLM_RPC_BASE_PATH"
# a ZMQ ipc address must fit a Unix socket path (107 bytes on Linux); vLLM adds "/" and a 36-character uuid
_SOCKET_PATH_MAX = 107
_FILE_STORE = re.compile(r"distributed_init_method=file://(\S*/vllm_dist_[0-9a-f]+)")


def arm_folder() -> str | None:
    """A name for one arm's socket folder, made by its worker (`make`) once it leads its own process group, so a
    worker killed before that leaves nothing; None where the temporary folder's path is too long for sockets
    (vLLM's own default then stays)."""
    path = os.path.join(tempfile.gettempdir(), f"labkit-ipc-{uuid.uuid4().hex[:12]}")
    return None if len(path) + 1 + 36 > _SOCKET_PATH_MAX else path


def make(folder: str) -> None:
    """Create the arm's socket folder, readable by this user only (as mkdtemp makes its folders)."""
    os.mkdir(folder, 0o700)


def file_stores(log_text: str) -> set[Path]:
    """The torch file stores an engine log names, those in the temporary folder only (where vLLM makes them)."""
    here = Path(tempfile.gettempdir())
    return {Path(name) for name in _FILE_STORE.findall(log_text) if Path(name).parent == here}


def remove(folder: str | None, log_text: str) -> None:
    """Remove an ended arm's socket folder and the file stores its log names; its processes are gone."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    for store in file_stores(log_text):
        store.unlink(missing_ok=True)
