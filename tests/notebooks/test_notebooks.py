"""Every notebook runs in smoke mode on the real CPU engine: papermill executes it with parameters, then
nbval re-runs the executed copy (--nbval-lax: its assertion cells must pass; the store resumes, so the
second run measures nothing twice)."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_notebook_smoke(notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path / "results"))
    executed = tmp_path / notebook.name
    papermill.execute_notebook(str(notebook), str(executed), parameters={"smoke": True},
                               cwd=str(notebook.parent), kernel_name="python3", progress_bar=False)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    nbval = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                            str(executed)], cwd=tmp_path, capture_output=True, text=True, env=os.environ.copy())
    assert nbval.returncode == 0, nbval.stdout[-4000:] + nbval.stderr[-2000:]


def test_source_notebooks_are_clean_and_parameterised():
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path}: papermill needs exactly one cell tagged 'parameters'"
        assert "smoke: bool = False" in tagged[0].source, f"{path}: the parameters cell needs `smoke: bool = False`"
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path} has outputs"
