"""The one report of a suite run over a Ray cluster: the nodes of each hardware, its notebooks' outcomes, and each
hardware's own report in full (pure: the run folders are written here as the cluster run writes them)."""
import json

from labkit.present.report import write_cluster_report
from labkit.suite.notebooks import CLUSTER_RECORD


def _hardware_run(top, hardware, notebooks_ok, notebooks_failed, body):
    run = top / hardware
    run.mkdir()
    listed = notebooks_ok + notebooks_failed
    (run / "suite.json").write_text(json.dumps({"notebooks": listed, "profile": "cpu-smoke", "hardware_key": hardware}))
    for nb in listed:
        (run / f"{nb.replace('/', '__').removesuffix('.ipynb')}.status.json").write_text(json.dumps(
            {"notebook": nb, "status": "ok" if nb in notebooks_ok else "failed", "node": "a1b2c3d4e5f6"}))
    (run / "report.html").write_text(f"<html><head></head><body><h1>Suite run {hardware}</h1>{body}</body></html>")
    return run


def test_each_hardware_is_listed_with_its_nodes_and_its_own_report_follows(tmp_path):
    top = tmp_path / "20261207T000000Z-cluster"
    top.mkdir()
    (top / CLUSTER_RECORD).write_text(json.dumps({"hardware": {
        "h200": {"profile": "h200", "nodes": ["a1b2c3d4e5f6", "0f9e8d7c6b5a"]},
        "cpu-amd-epyc": {"profile": "cpu-smoke", "nodes": ["112233445566"]}}, "notebooks": []}))
    runs = [_hardware_run(top, "cpu-amd-epyc", ["00_quickstart.ipynb"], [], "<p>cpu section</p>"),
            _hardware_run(top, "h200", ["00_quickstart.ipynb"], ["L3_kernel/cuda_graphs.ipynb"], "<p>h200 section</p>")]
    text = write_cluster_report(top, runs).read_text()
    assert text.count("<html>") == 1 and text.count("</body>") == 1  # one document, the others' bodies inside it
    assert "a1b2c3d4e5f6, 0f9e8d7c6b5a" in text and "cpu section" in text and "h200 section" in text
    assert text.index("cpu section") < text.index("h200 section")
    # the table's counts: h200 has one notebook ok and one not
    row = text[text.index("<td>h200</td>"):]
    assert [cell.split("</td>")[0] for cell in row.split("<td>")[1:6]][-2:] == ["1", "1"], row[:300]
