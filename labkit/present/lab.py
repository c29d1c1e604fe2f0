"""JupyterLab as the lab serves it: the project's root, with committed evidence read-only.

Opening an executed notebook starts a kernel, and JupyterLab writes that kernel's name and Python version into
the notebook's metadata: the document is then modified and autosaved within two minutes, so evidence from an
H200 (Python 3.12.3) would come to say it was made on the viewer's machine. Files under data/baselines/ are
therefore reported not writable: JupyterLab opens them read-only (no autosave; Save offers "Save as"), and
whatever reaches the server anyway that would change them (a save, an upload, a move, a delete, a
checkpoint), under any spelling of their path, is refused. Everything else saves as usual.

Read-only alone still left the document marked modified, with a "Save changes?" prompt on close, although
nothing was changed: the kernel's facts differ from the H200's. So an evidence notebook is served with the
kernel facts JupyterLab is about to write (this lab's kernel and Python), which it then finds already there
and does not count as a change; what the notebook recorded is kept beside them in the served copy
(`metadata.labkit.recorded_kernel`), and the file itself is never touched.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

EVIDENCE = "data/baselines"  # relative to the lab's root: committed executed notebooks and stores
SAVE_AS = "use File > Save As to keep a copy elsewhere (e.g. under notebooks/)"


def is_within(path: str, folder: str) -> bool:
    """Is this absolute, normalised path the folder or under it?"""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class EvidenceContentsManager(AsyncLargeFileManager):
    """The default contents manager, but nothing under data/baselines/ can be written, moved, deleted or
    checkpointed through the lab.

    The contents API accepts many spellings of one file (`notebooks/../data/...`, `%2e%2e` and `%2F` decoded
    by the server, `./`, doubled slashes, a symlink from notebooks/ into the evidence), so each decision is
    made on the real path the operation would touch (os.path.realpath under the root), never on the string.
    A move or delete is refused also when its source holds the evidence (renaming `data` away). A symlink
    that leads into the evidence is itself refused as evidence: telling the link from its target apart is
    not worth a way in. Hard links and kernels (which run arbitrary code) are not guarded.
    """

    def _real(self, path: str) -> str:
        # _get_os_path normalises `..` and refuses paths outside the root (404); realpath follows symlinks,
        # also those above a file that does not exist yet
        return os.path.realpath(self._get_os_path(path.strip("/")))

    def _evidence_folders(self) -> set[str]:
        # both the folder where it is and where it resolves to, in case data/ or data/baselines/ is a symlink
        spelled = os.path.join(os.path.realpath(self.root_dir), *EVIDENCE.split("/"))
        return {spelled, os.path.realpath(spelled)}

    def lies_in_evidence(self, path: str) -> bool:
        """Does this API path resolve to data/baselines/ or something under it?"""
        real = self._real(path)
        return any(is_within(real, folder) for folder in self._evidence_folders())

    def holds_evidence(self, path: str) -> bool:
        """Does this API path resolve to data/baselines/, something under it, or a folder above it?"""
        real = self._real(path)
        return any(is_within(real, folder) or is_within(folder, real) for folder in self._evidence_folders())

    def _refuse(self, path: str, what: str) -> web.HTTPError:
        shown = path.strip("/") or "the lab's root"
        where = ("is or leads to committed evidence" if self.lies_in_evidence(path)
                 else "holds committed evidence")
        return web.HTTPError(403, f"{shown} {where} ({EVIDENCE}/), which stays as it was measured: "
                                  f"{what} is refused in the lab; {SAVE_AS}")

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if content and model.get("type") == "notebook" and self.lies_in_evidence(path):
            served_with_this_kernel(model["content"], self._kernel_names())
        return model

    def _kernel_names(self) -> dict[str, dict]:
        """name -> the kernelspec JupyterLab writes for it (display name and language), of this server."""
        manager = getattr(self.parent, "kernel_spec_manager", None)
        try:
            specs = manager.get_all_specs() if manager is not None else {}
        except Exception:  # noqa: BLE001 - without the specs the notebook is served as it is
            return {}
        return {name: {"name": name, "display_name": found["spec"].get("display_name", name),
                       "language": found["spec"].get("language")} for name, found in specs.items()}

    def is_writable(self, path):
        return not self.lies_in_evidence(path) and super().is_writable(path)

    async def save(self, model, path=""):
        # every write of the contents API ends here: a save, each chunk of an upload, a new file or folder
        # (POST into a folder), a copy of a file
        if self.lies_in_evidence(path):
            raise self._refuse(path, "saving or uploading it, or creating anything in it,")
        return await super().save(model, path)

    async def copy(self, from_path, to_path=None):
        # a folder is copied with copytree, not through save
        into = to_path if to_path is not None else from_path.strip("/").rpartition("/")[0]
        if self.lies_in_evidence(into):
            raise self._refuse(into, "copying into it")
        return await super().copy(from_path, to_path)

    async def rename_file(self, old_path, new_path):
        if self.holds_evidence(old_path):
            raise self._refuse(old_path, "moving or renaming it or a folder above it")
        if self.lies_in_evidence(new_path):
            raise self._refuse(new_path, "moving anything into it")
        return await super().rename_file(old_path, new_path)

    async def delete_file(self, path):
        if self.holds_evidence(path):
            raise self._refuse(path, "deleting it or a folder above it")
        return await super().delete_file(path)

    # Checkpoints (the REST API reaches them only through these): creating one writes under the evidence's
    # .ipynb_checkpoints/, restoring one overwrites the evidence, deleting one removes a file there. Listing
    # none means JupyterLab offers no "Revert to checkpoint" for the evidence.
    async def create_checkpoint(self, path):
        if self.lies_in_evidence(path):
            raise self._refuse(path, "creating a checkpoint of it")
        return await super().create_checkpoint(path)

    async def restore_checkpoint(self, checkpoint_id, path):
        if self.lies_in_evidence(path):
            raise self._refuse(path, "restoring a checkpoint over it")
        return await super().restore_checkpoint(checkpoint_id, path)

    async def delete_checkpoint(self, checkpoint_id, path):
        if self.lies_in_evidence(path):
            raise self._refuse(path, "deleting its checkpoint")
        return await super().delete_checkpoint(checkpoint_id, path)

    async def list_checkpoints(self, path):
        if self.lies_in_evidence(path):
            return []
        return await super().list_checkpoints(path)


def served_with_this_kernel(notebook, kernels: dict[str, dict]) -> None:
    """The notebook's kernel facts replaced in place by what JupyterLab writes once this server's kernel of the
    same name starts (its kernelspec, and the language_info of an IPython kernel on this Python), the
    recorded ones kept under metadata.labkit.recorded_kernel. A kernel this server does not have: unchanged
    (JupyterLab asks which kernel to use, and changes nothing before)."""
    metadata = notebook["metadata"]
    name = (metadata.get("kernelspec") or {}).get("name")
    if name not in kernels:
        return
    from ipykernel.ipkernel import IPythonKernel  # the language_info a python kernel of this Python reports

    recorded = {key: metadata[key] for key in ("kernelspec", "language_info") if key in metadata}
    metadata.setdefault("labkit", {})["recorded_kernel"] = recorded
    metadata["kernelspec"] = {k: v for k, v in kernels[name].items() if v is not None}
    if kernels[name].get("language") == "python":
        metadata["language_info"] = dict(IPythonKernel.language_info)


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
