"""What the driver of a suite run over a Ray cluster writes when a notebook's task ends: the node's files put in
place (a store replaced whole, the executed notebook, the journal lines, the status with the node's id), or a
lost task recorded as the notebook's failure. Ray's get is stood in for here (pure logic: what comes back is
given); the real cluster path is tests/engine/test_ray_arms.py."""
import json
import types

import pytest

from labkit import settings
from labkit.measure import ray_arms
from labkit.suite import on_ray
from labkit.suite.notebooks import NOTEBOOKS

ray = pytest.importorskip("ray", reason="needs the labkit[ray] extra")
NOTEBOOK = NOTEBOOKS / "00_quickstart.ipynb"


def _ray_answering(monkeypatch, answer=None, raises=None):
    def get(task):
        if raises:
            raise raises
        return answer
    monkeypatch.setattr(ray_arms, "ray_module", lambda: types.SimpleNamespace(get=get, exceptions=ray.exceptions))


def test_a_lost_task_is_its_notebooks_failure_with_the_node_and_the_cause(tmp_path, monkeypatch):
    _ray_answering(monkeypatch, raises=ray.exceptions.WorkerCrashedError())
    on_ray._collect(object(), tmp_path, NOTEBOOK, "a1b2c3d4e5f6a7b8", 12.0, [], progress=False)
    status = json.loads((tmp_path / "00_quickstart.status.json").read_text())
    assert status["status"] == "failed" and status["node"] == "a1b2c3d4e5f6"
    assert status["error"].startswith("ray_lost: the Ray worker running the notebook died"), status["error"]
    assert not (tmp_path / "00_quickstart.ipynb").exists()


def test_the_nodes_files_are_put_in_place_and_a_store_is_replaced_whole(tmp_path, monkeypatch):
    run, node_store = tmp_path / "run", tmp_path / "node" / "quickstart-smoke"
    (run / "results" / "quickstart-smoke").mkdir(parents=True)
    (run / "results" / "quickstart-smoke" / "old-arm.json").write_text("{}")  # what the node started from
    (run / "results" / "other").mkdir()
    (run / "results" / "other" / "kept.json").write_text("{}")  # a store the notebook did not touch
    node_store.mkdir(parents=True)
    (node_store / "old-arm.json").write_text("{}")
    (node_store / "new-arm.json").write_text('{"arm": "new"}')
    answer = {"node": "a1b2c3d4e5f6", "status": {"notebook": "00_quickstart.ipynb", "status": "ok", "seconds": 3.0},
              "notebook": b'{"cells": []}', "stores": {"quickstart-smoke": ray_arms.pack(node_store)},
              "journal": '{"change": "x"}\n', "differs": {"niceness": 15}}
    _ray_answering(monkeypatch, answer=answer)
    with settings.use(settings.current().replace(journal=tmp_path / "journal.jsonl")):
        on_ray._collect(object(), run, NOTEBOOK, "a1b2c3d4e5f6a7b8", 3.0, [], progress=False)
    assert sorted(p.name for p in (run / "results" / "quickstart-smoke").iterdir()) == ["new-arm.json", "old-arm.json"]
    assert (run / "results" / "other" / "kept.json").exists()
    assert not list((run / "results").glob(".*"))  # no staging or replaced copy left beside the stores
    assert (run / "00_quickstart.ipynb").read_bytes() == b'{"cells": []}'
    assert (tmp_path / "journal.jsonl").read_text() == '{"change": "x"}\n'
    status = json.loads((run / "00_quickstart.status.json").read_text())
    # the node and, where the task could not run its kernel as the driver's would, what differed
    assert status["node"] == "a1b2c3d4e5f6" and status["niceness"] == 15
