"""Committed evidence cannot be changed through the lab: a real JupyterLab started as `labkit lab` starts it,
attacked through its REST API with every form of a path the contents API accepts and every operation that
writes, moves or deletes. After each attack the files under data/baselines/ are byte for byte as committed and
the answer is a 403 that says why; edits outside data/baselines/ still work."""
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from labkit.measure.served import free_port
from labkit.present.lab import lab_command

pytestmark = pytest.mark.lab_server

NOTEBOOK = "data/baselines/h200/run.ipynb"
STORE = "data/baselines/h200/store.jsonl"
# a checkpoint left next to the evidence (JupyterLab's own, from before the evidence was read-only): restoring it
# would overwrite the evidence, and it is itself under data/baselines/
CHECKPOINT = "data/baselines/h200/.ipynb_checkpoints/run-checkpoint.ipynb"
OWN = "notebooks/mine.ipynb"
REFUSED = "committed evidence"  # what every refusal says


def _notebook(source: str) -> dict:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])


def build_root(root: Path) -> None:
    """A lab root: evidence (a notebook, a store, a stale checkpoint), the user's notebook, and symlinks from
    notebooks/ into the evidence (a folder and a file)."""
    for path, source in ((NOTEBOOK, "1 + 1"), (CHECKPOINT, "'an older version'"), (OWN, "2 + 2")):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(_notebook(source), root / path)
    (root / STORE).write_text('{"arm": "a", "tokens_per_s": 1234.5}\n')
    (root / "notebooks" / "linkdir").symlink_to("../data/baselines")
    (root / "notebooks" / "link.ipynb").symlink_to("../data/baselines/h200/run.ipynb")
    (root / "notebooks" / "folder").mkdir()
    (root / "notebooks" / "folder" / "note.txt").write_text("mine\n")


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Everything under data/ (links not followed): a folder renamed away, a file added or changed all show."""
    seen: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root / "data"):
        for name in dirs:
            seen[os.path.relpath(os.path.join(folder, name), root)] = "folder"
        for name in files:
            seen[os.path.relpath(os.path.join(folder, name), root)] = Path(folder, name).read_bytes()
    return seen


class Lab:
    """A running lab and its REST API, spoken with http.client so that a path goes on the wire exactly as
    written (requests/urllib3 would remove `..` segments before sending)."""

    def __init__(self, port: int, token: str, root: Path):
        self.port, self.token, self.root = port, token, root

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """(status, answer) of `method /api/contents/<path>`; path is sent as written, body as JSON."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, "/api/contents/" + path, body=None if body is None else json.dumps(body),
                               headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """(status, the error's message, or the answer when it has none)"""
        status, answer = self.request(method, path, body)
        return status, answer.get("message", answer) if isinstance(answer, dict) else answer

    def rebuild(self) -> None:
        """The root as built, whatever an attack did to it (the server keeps serving the same folder)."""
        for child in self.root.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        build_root(self.root)


@contextmanager
def running_lab(tmp: Path):
    """`labkit lab`'s JupyterLab on tmp/lab; its settings, workspaces, runtime files and trash under tmp."""
    root = tmp / "lab"
    root.mkdir()
    build_root(root)
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "xdg"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    log = open(tmp / "jupyterlab.log", "w")
    server = subprocess.Popen(lab_command(root, port=port, token=token, settings_dir=tmp / "settings",
                                          root_user=os.geteuid() == 0)
                              + ["--no-browser", f"--LabApp.workspaces_dir={tmp / 'workspaces'}"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    lab = Lab(port, token, root)
    try:
        for _ in range(120):
            try:
                lab.call("GET", "?content=0")
                break
            except OSError:
                assert server.poll() is None, (tmp / "jupyterlab.log").read_text()[-3000:]
                time.sleep(0.25)
        yield lab
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


EDITED = {"type": "notebook", "format": "json", "content": _notebook("'changed on the viewer machine'")}
TEXT = {"type": "file", "format": "text", "content": '{"arm": "forged"}\n'}
ENCODED_UP = "notebooks/%2e%2e/"  # `..` percent-encoded: decoded by the server before the contents manager sees it
UP = "notebooks/../"

# (what, method, path on the wire, JSON body): each would change what is under data/baselines/
ATTACKS = [
    # save (PUT)
    ("save", "PUT", NOTEBOOK, EDITED),
    ("save through ..", "PUT", UP + NOTEBOOK, EDITED),
    ("save through %2e%2e", "PUT", ENCODED_UP + NOTEBOOK, EDITED),
    ("save through %2F", "PUT", NOTEBOOK.replace("/", "%2F"), EDITED),
    ("save through %2F%2F", "PUT", "data%2F%2Fbaselines/h200/run.ipynb", EDITED),
    ("save through ./", "PUT", "./data/./baselines/h200/run.ipynb", EDITED),
    ("save through a symlinked folder", "PUT", "notebooks/linkdir/h200/run.ipynb", EDITED),
    ("save through a symlinked file", "PUT", "notebooks/link.ipynb", EDITED),
    ("save a new file through ..", "PUT", UP + "data/baselines/h200/new.ipynb", EDITED),
    ("make a folder through %2e%2e", "PUT", ENCODED_UP + "data/baselines/new", {"type": "directory"}),
    # upload (chunked PUT): chunk 1 overwrites, a later chunk appends
    ("upload chunk 1", "PUT", STORE, {**TEXT, "chunk": 1}),
    ("upload chunk 1 through ..", "PUT", UP + STORE, {**TEXT, "chunk": 1}),
    ("upload chunk 2 through %2e%2e", "PUT", ENCODED_UP + STORE, {**TEXT, "chunk": 2}),
    ("upload last chunk through a symlinked folder", "PUT", "notebooks/linkdir/h200/store.jsonl",
     {**TEXT, "chunk": -1}),
    # create (POST into a folder)
    ("create a notebook in ..", "POST", UP + "data/baselines/h200", {"type": "notebook"}),
    ("create a file in a symlinked folder", "POST", "notebooks/linkdir/h200", {"type": "file", "ext": ".txt"}),
    ("create a folder in %2e%2e", "POST", ENCODED_UP + "data/baselines", {"type": "directory"}),
    # rename (PATCH) of the evidence or of a folder above it, and into the evidence
    ("rename", "PATCH", NOTEBOOK, {"path": "notebooks/run.ipynb"}),
    ("rename through ..", "PATCH", UP + NOTEBOOK, {"path": "notebooks/run.ipynb"}),
    ("rename through a symlinked folder", "PATCH", "notebooks/linkdir/h200/run.ipynb", {"path": "notebooks/r.ipynb"}),
    ("rename the folder above", "PATCH", "data/baselines/h200", {"path": "data/baselines/h100"}),
    ("rename data/baselines away", "PATCH", "data/baselines", {"path": "data/old"}),
    ("rename data away", "PATCH", "data", {"path": "data2"}),
    ("rename data away through %2e%2e", "PATCH", ENCODED_UP + "data", {"path": "data2"}),
    ("rename into", "PATCH", OWN, {"path": "data/baselines/h200/mine.ipynb"}),
    ("rename into through ..", "PATCH", OWN, {"path": UP + "data/baselines/h200/mine.ipynb"}),
    ("rename into through a symlinked folder", "PATCH", OWN, {"path": "notebooks/linkdir/h200/mine.ipynb"}),
    ("rename a folder into", "PATCH", "notebooks/folder", {"path": "data/baselines/folder"}),
    # copy into the evidence
    ("copy into", "POST", "data/baselines/h200", {"copy_from": OWN}),
    ("copy into through ..", "POST", UP + "data/baselines/h200", {"copy_from": OWN}),
    ("copy into a symlinked folder", "POST", "notebooks/linkdir/h200", {"copy_from": OWN}),
    ("copy a folder into", "POST", "data/baselines", {"copy_from": "notebooks/folder"}),
    ("copy a folder into through %2e%2e", "POST", ENCODED_UP + "data/baselines", {"copy_from": "notebooks/folder"}),
    # delete of the evidence or of a folder above it
    ("delete", "DELETE", NOTEBOOK, None),
    ("delete through ..", "DELETE", UP + NOTEBOOK, None),
    ("delete through %2F", "DELETE", STORE.replace("/", "%2F"), None),
    ("delete through a symlinked folder", "DELETE", "notebooks/linkdir/h200/run.ipynb", None),
    ("delete the folder above", "DELETE", "data/baselines/h200", None),
    ("delete data/baselines", "DELETE", "data/baselines", None),
    ("delete data", "DELETE", "data", None),
    ("delete data through ..", "DELETE", UP + "data", None),
    # checkpoints: create overwrites the stale one, restore overwrites the evidence, delete removes a file
    ("create a checkpoint", "POST", NOTEBOOK + "/checkpoints", None),
    ("create a checkpoint through a symlinked file", "POST", "notebooks/link.ipynb/checkpoints", None),
    ("restore a checkpoint", "POST", NOTEBOOK + "/checkpoints/checkpoint", None),
    ("restore a checkpoint through ..", "POST", UP + NOTEBOOK + "/checkpoints/checkpoint", None),
    ("restore a checkpoint through a symlinked folder", "POST",
     "notebooks/linkdir/h200/run.ipynb/checkpoints/checkpoint", None),
    ("delete a checkpoint", "DELETE", NOTEBOOK + "/checkpoints/checkpoint", None),
    ("delete a checkpoint through %2e%2e", "DELETE", ENCODED_UP + NOTEBOOK + "/checkpoints/checkpoint", None),
]

# Forms that look like the evidence but are other names on this filesystem (a backslash and a trailing dot are
# ordinary characters of a file name here), or that the server turns away before the contents manager sees them
# (a trailing slash matches no contents route): whatever the answer, the evidence is untouched
LOOKALIKES = [
    ("save through a trailing /", "PUT", NOTEBOOK + "/", EDITED),
    ("save through backslashes", "PUT", "data%5Cbaselines%5Ch200%5Crun.ipynb", EDITED),
    ("save through a trailing dot", "PUT", "data/baselines./h200/run.ipynb", EDITED),
    ("delete through a trailing dot", "DELETE", "data./baselines", None),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab_server")) as lab:
        yield lab


@pytest.fixture
def committed(lab):
    """The evidence as committed: the root is rebuilt first, so no test sees what an earlier one did to it."""
    lab.rebuild()
    return snapshot(lab.root)


def _changes(before: dict, after: dict) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


@pytest.mark.parametrize("what, method, path, body", ATTACKS, ids=[attack[0] for attack in ATTACKS])
def test_an_attack_on_the_evidence_is_refused_and_changes_nothing(lab, committed, what, method, path, body):
    status, message = lab.call(method, path, body)
    assert _changes(committed, snapshot(lab.root)) == [], f"{what} ({status} {message}) changed these"
    assert status == 403 and REFUSED in str(message), (status, message)


@pytest.mark.parametrize("what, method, path, body", LOOKALIKES, ids=[attack[0] for attack in LOOKALIKES])
def test_a_lookalike_path_leaves_the_evidence_as_it_was(lab, committed, what, method, path, body):
    status, message = lab.call(method, path, body)
    changed = _changes(committed, snapshot(lab.root))
    assert [path for path in changed if path.startswith(os.path.join("data", "baselines"))] == [], (status, message)


def test_evidence_is_served_read_only_in_every_form_and_has_no_checkpoints(lab, committed):
    for path in (NOTEBOOK, UP + NOTEBOOK, ENCODED_UP + NOTEBOOK, "notebooks/linkdir/h200/run.ipynb",
                 "notebooks/link.ipynb"):
        status, model = lab.request("GET", path + "?content=0")
        assert status == 200 and model["writable"] is False, (path, model)
    # the stale checkpoint is not offered: JupyterLab's "Revert to checkpoint" would be a write
    assert lab.call("GET", NOTEBOOK + "/checkpoints") == (200, [])
    status, _ = lab.call("GET", "data/baselines/h200?content=1")
    assert status == 200  # the folder is browsed as usual
    assert snapshot(lab.root) == committed


def test_edits_outside_the_evidence_still_work(lab, committed):
    assert lab.call("PUT", OWN, EDITED)[0] == 200
    assert nbformat.read(lab.root / OWN, 4).cells[0].source == "'changed on the viewer machine'"
    assert lab.call("POST", OWN + "/checkpoints")[0] == 201
    assert lab.call("POST", OWN + "/checkpoints/checkpoint")[0] == 204  # restore
    for chunk in (1, 2, -1):
        assert lab.call("PUT", "notebooks/upload.jsonl", {**TEXT, "chunk": chunk})[0] in (200, 201)
    assert (lab.root / "notebooks/upload.jsonl").read_text() == TEXT["content"] * 3
    assert lab.call("POST", "data", {"type": "directory"})[0] == 201  # a folder of one's own next to baselines/
    assert (lab.root / "data" / "Untitled Folder").is_dir()
    assert lab.call("POST", "notebooks", {"copy_from": NOTEBOOK})[0] == 201  # a copy of the evidence to work on
    assert (lab.root / "notebooks/run.ipynb").read_bytes() == (lab.root / NOTEBOOK).read_bytes()
    assert lab.call("PATCH", "notebooks/run.ipynb", {"path": "notebooks/renamed.ipynb"})[0] == 200
    assert lab.call("DELETE", "notebooks/renamed.ipynb")[0] == 204
    assert not (lab.root / "notebooks/renamed.ipynb").exists()
    assert {path: data for path, data in snapshot(lab.root).items() if "Untitled Folder" not in path} == committed
