"""JupyterLab as the lab serves it: the project's root, with committed evidence read-only.

Opening an executed notebook starts a kernel, and JupyterLab writes that kernel's name and Python version into
the notebook's metadata: the document is then modified and autosaved within two minutes, so evidence from an
H200 (Python 3.12.3) would come to say it was made on the viewer's machine. Files under data/baselines/ are
therefore reported not writable: JupyterLab opens them read-only (no autosave; Save offers "Save as"), and a
save that reaches the server anyway is refused. Everything else saves as usual.
"""
from __future__ import annotations

import sys
from pathlib import Path

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

EVIDENCE = "data/baselines"  # relative to the lab's root: committed executed notebooks and stores


def is_evidence(path: str) -> bool:
    """Is this API path (relative to the lab's root) committed evidence?"""
    parts = Path(path.strip("/")).parts
    return parts[:2] == tuple(EVIDENCE.split("/"))


class EvidenceContentsManager(AsyncLargeFileManager):
    """The default contents manager, but evidence cannot be written through the lab."""

    def is_writable(self, path):
        return not is_evidence(path) and super().is_writable(path)

    async def save(self, model, path=""):
        if is_evidence(path):
            raise web.HTTPError(403, f"{path} is committed evidence and stays as it was measured: "
                                     "use File > Save As to keep a copy elsewhere (e.g. under notebooks/)")
        return await super().save(model, path)

    async def rename_file(self, old_path, new_path):
        if is_evidence(old_path) or is_evidence(new_path):
            raise web.HTTPError(403, "committed evidence is not moved or renamed from the lab")
        return await super().rename_file(old_path, new_path)

    async def delete_file(self, path):
        if is_evidence(path):
            raise web.HTTPError(403, f"{path} is committed evidence: it is not deleted from the lab")
        return await super().delete_file(path)


def lab_command(root: str | Path, *, port: int | None = None, token: str | None = None,
                settings_dir: str | Path | None = None, open_at: str = "notebooks",
                root_user: bool = False) -> list[str]:
    """The `jupyter lab` command line of the lab (`make lab`, `labkit lab`, the browser test).

    Parameters
    ----------
    root: the folder served (the project's root, so notebooks/ and data/baselines/ are both reachable)
    port, token: fixed ones (a test); None leaves JupyterLab's own choice
    settings_dir: JupyterLab user settings to use instead of the user's own (a test's autosave interval)
    open_at: the path the lab opens on, under root
    root_user: pass --allow-root (JupyterLab refuses to run as root without it)

    Returns
    -------
    the argument list, starting with this Python's jupyter-lab module
    """
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={Path(root).resolve()}",
               f"--ServerApp.contents_manager_class={__name__}.EvidenceContentsManager",
               f"--LabApp.default_url=/lab/tree/{open_at}"]
    if port is not None:
        command += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if token is not None:
        command += [f"--IdentityProvider.token={token}"]
    if settings_dir is not None:
        command += [f"--LabApp.user_settings_dir={Path(settings_dir).resolve()}"]
    if root_user:
        command += ["--allow-root"]
    return command
