"""The analysis side of the lab must not pull in torch or vLLM (they load only in arm workers)."""
import os
import subprocess
import sys

CODE = """
import sys
import labkit, labkit.analyze.stats, labkit.store, labkit.analyze.roofline, labkit.present.plots, labkit.analyze.parallel, labkit.measure.topology
heavy = sorted(m for m in ("vllm", "torch") if m in sys.modules)
assert not heavy, f"importing labkit loaded {heavy}"
print("light")
"""


def test_import_is_light():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "light"


def test_check_itself_detects_heavy_modules():
    """The same check fails when a heavy module is in sys.modules (so a pass above means something)."""
    code = "import sys, types; sys.modules['torch'] = types.ModuleType('torch')\n" + CODE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode != 0 and "torch" in done.stderr
