"""scripts/regression_demo.py refuses to judge without a change, before any suite runs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_judgement_without_a_change_is_refused_before_any_run(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "regression_demo.py"), str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--override KNOB=VALUE, or --after PYTHON" in done.stderr, done.stderr
    assert not (tmp_path / "demo").exists()  # nothing started, nothing written

