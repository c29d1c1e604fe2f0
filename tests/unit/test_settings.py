"""One settings object: read from LABKIT_* at the boundary, swapped in for a block, handed to child processes
and taken back (no engine)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import settings
from labkit.errors import BadParameter
from labkit.store import ExperimentStore


def test_defaults_live_in_the_checkout_and_variables_replace_them(tmp_path):
    plain = settings.Settings.from_environment({})
    assert plain.results_dir == settings.ROOT / "data" / "results" and plain.launch_overrides == {}
    given = settings.Settings.from_environment({"LABKIT_RUNS_DIR": str(tmp_path),
                                                "LABKIT_LAUNCH_OVERRIDES": '{"enforce_eager": true}'})
    assert given.runs_dir == tmp_path and given.launch_overrides == {"enforce_eager": True}
    assert given.baselines_dir == plain.baselines_dir


def test_malformed_overrides_name_the_variable():
    with pytest.raises(BadParameter, match="LABKIT_LAUNCH_OVERRIDES must be a JSON object"):
        settings.Settings.from_environment({"LABKIT_LAUNCH_OVERRIDES": "[1, 2]"})


def test_use_changes_where_stores_go_only_inside_the_block(tmp_path):
    before = ExperimentStore("x").path
    with settings.use(settings.current().replace(results_dir=tmp_path)):
        assert ExperimentStore("x").path == tmp_path / "x"
    assert ExperimentStore("x").path == before


def test_exported_settings_reach_a_child_process_and_the_environment_is_restored(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv("LABKIT_RUNS_DIR", "/elsewhere")
    child = "from labkit import settings; s = settings.current(); print(s.results_dir, s.runs_dir, s.launch_overrides)"
    wanted = settings.current().replace(results_dir=tmp_path, launch_overrides={"max_num_seqs": 8})
    with settings.exported(wanted):
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(tmp_path.resolve()), "/elsewhere", "{'max_num_seqs':", "8}"]
    assert "LABKIT_RESULTS_DIR" not in os.environ and os.environ["LABKIT_RUNS_DIR"] == "/elsewhere"
    assert settings.current().results_dir == settings.ROOT / "data" / "results"


def test_no_module_but_settings_reads_the_lab_variables():
    """The environment is a boundary, not a channel between modules."""
    package = Path(settings.__file__).parent
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if p.name != "settings.py" and any(v in p.read_text() for v in settings.VARIABLES.values()))
    assert readers == []
