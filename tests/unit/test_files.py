"""What the lab writes: whole files only, and no path of the machine that wrote them (no engine)."""
import json
from pathlib import Path

from labkit import settings
from labkit.files import make_portable, portable, write_json_atomic, write_table


def test_machine_paths_become_portable_and_twice_changes_nothing():
    text = (f"loading {settings.ROOT}/data/models/tiny-llama from {Path.home()}/.cache/x and "
            "/tmp/pytest-of-root/pytest-3/test0/results/e/.work/a-1-0123abcd/engine.log via "
            "/usr/lib/python3/dist-packages/vllm/engine.py")
    once = portable(text)
    assert once == ("loading data/models/tiny-llama from ~/.cache/x and <tmp>/pytest-3/test0/results/e/.work/"
                    "a-1-0123abcd/engine.log via <site-packages>/vllm/engine.py")
    assert portable(once) == once


def test_make_portable_rewrites_text_files_only(tmp_path):
    (tmp_path / "engine.log").write_text(f"model {settings.ROOT}/data/models/m\n")
    (tmp_path / "table.parquet").write_bytes(f"{settings.ROOT}/x".encode())
    (tmp_path / "clean.json").write_text("{}")
    assert make_portable(tmp_path) == [tmp_path / "engine.log"]
    assert (tmp_path / "engine.log").read_text() == "model data/models/m\n"
    assert (tmp_path / "table.parquet").read_bytes() == f"{settings.ROOT}/x".encode()
    assert make_portable(tmp_path / "engine.log") == []


def test_write_json_atomic_leaves_the_file_whole_and_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    write_json_atomic(target, {"x": 1})
    try:
        write_json_atomic(target, {"y": object.__new__(Unserialisable)})
    except TypeError:
        pass
    assert target.read_text() == '{\n "x": 1\n}' and [p.name for p in tmp_path.iterdir()] == ["a.json"]


class Unserialisable:
    def __str__(self):
        raise TypeError("cannot be written")


def test_a_gzipped_profiler_trace_loses_the_host_name_and_paths_and_stays_readable(tmp_path):
    import gzip
    import json

    from labkit.analyze.profiling import load_trace

    trace = tmp_path / "rank0.1.pt.trace.json.gz"
    header = {"host_name": "gpu-node-17", "traceName": f"{settings.ROOT}/x", "traceEvents": [
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 1.0, "dur": 2.0, "pid": 0, "tid": 0}]}
    trace.write_bytes(gzip.compress(json.dumps(header).encode()))
    assert make_portable(tmp_path) == [trace]
    text = gzip.decompress(trace.read_bytes()).decode()
    assert "gpu-node-17" not in text and str(settings.ROOT) not in text and '"host_name": "<host>"' in text
    assert load_trace(trace).name.tolist() == ["gemm"]


def test_an_executed_notebook_is_stored_without_widget_state(tmp_path):
    from labkit.files import WIDGET_VIEW, without_widget_state
    view = {WIDGET_VIEW: {"model_id": "abc", "version_major": 2}}
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}}}, "cells": [
        {"cell_type": "code", "outputs": [
            {"output_type": "display_data", "data": {**view, "text/plain": "q-smoke: arms:   0%|          | 0/2"}},
            {"output_type": "stream", "name": "stdout", "text": "arm 'a': complete in 31 s\n"}]},
        {"cell_type": "code", "outputs": [{"output_type": "execute_result", "data": {**view, "text/plain": "VBox(...)"}}]},
        {"cell_type": "markdown", "source": "text"}]}
    path = tmp_path / "run.ipynb"
    path.write_text(json.dumps(nb))
    without_widget_state(path)
    stored = json.loads(path.read_text())
    assert "widgets" not in stored["metadata"]
    assert stored["cells"][0]["outputs"] == [nb["cells"][0]["outputs"][1]]  # the bar goes, the plain line stays
    assert stored["cells"][1]["outputs"][0]["data"] == {"text/plain": "[an interactive widget: run the cell to use it]"}
    assert "outputs" not in stored["cells"][2]
    before = path.read_text()
    without_widget_state(path)
    assert path.read_text() == before  # nothing left to strip: the file is not rewritten


def test_write_table_is_lossless_and_smaller_than_pandas_default(tmp_path):
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"request": range(200), "ttft_ms": rng.gamma(2.0, 30.0, 200),
                          "itl_ms": [rng.gamma(2.0, 3.0, 100) for _ in range(200)],
                          "finish_reason": ["length"] * 200})
    frame.to_parquet(tmp_path / "default.parquet")
    write_table(frame, tmp_path / "lab.parquet")
    back = pd.read_parquet(tmp_path / "lab.parquet")
    assert back.equals(frame) and list(back.dtypes) == list(frame.dtypes)
    assert all(np.array_equal(a, b) for a, b in zip(back["itl_ms"], frame["itl_ms"]))
    group = pq.ParquetFile(tmp_path / "lab.parquet").metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["itl_ms.list.element"] and "BYTE_STREAM_SPLIT" in encodings["ttft_ms"]
    assert (tmp_path / "lab.parquet").stat().st_size < 0.85 * (tmp_path / "default.parquet").stat().st_size
