"""The house rules: analysis and presentation are pure functions of stored results (they never import the
measuring side or start engines), spec/ is plain data (it never reaches the measuring side, vLLM, or a process
of its own), and nothing the notebooks import up front loads torch or vLLM."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import labkit

PACKAGE = Path(labkit.__file__).parent
PURE = ("analyze", "present")
FORBIDDEN = ("labkit.measure", "labkit.experiment", "labkit.sweeps", "vllm", "torch", "multiprocessing")
# what to measure is data: asking vLLM (a parse, a resolution) happens in measure/, in a process of its own
FORBIDDEN_IN_SPEC = FORBIDDEN + ("subprocess",)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def rule_breaks(paths, forbidden=FORBIDDEN) -> list[str]:
    return sorted(f"{path.relative_to(PACKAGE)} imports {name}" for path in paths for name in imported_modules(path)
                  if name.startswith(forbidden))


def test_analysis_and_presentation_never_reach_the_measuring_side():
    assert rule_breaks(p for layer in PURE for p in (PACKAGE / layer).glob("*.py")) == []


def test_spec_is_plain_data():
    # the one exception: a packaged model's folder is made on first use from its GGUF file, which transformers
    # reads into torch tensors written as bf16 (no engine, no vLLM)
    assert rule_breaks((PACKAGE / "spec").glob("*.py"), FORBIDDEN_IN_SPEC) == ["spec/packaged_models.py imports torch"]


def test_the_rule_check_sees_a_break():
    """The same check names a measuring module's own imports (so a pass above means something)."""
    assert any("labkit.measure.gpu" in line for line in rule_breaks([PACKAGE / "measure" / "platform.py"]))
    assert any("subprocess" in line for line in rule_breaks([PACKAGE / "measure" / "resolve.py"], FORBIDDEN_IN_SPEC))


CODE = """
import sys, importlib, pkgutil
import labkit
for layer in ("analyze", "present", "spec", "suite"):
    package = importlib.import_module(f"labkit.{layer}")
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"labkit.{layer}.{info.name}")
import labkit.store, labkit.experiment, labkit.settings, labkit.measure.environment, labkit.measure.topology
heavy = sorted(m for m in ("vllm", "torch") if m in sys.modules)
assert not heavy, f"importing labkit loaded {heavy}"
print("light")
"""


def test_import_is_light():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "light"


def test_light_check_itself_detects_heavy_modules():
    code = "import sys, types; sys.modules['torch'] = types.ModuleType('torch')\n" + CODE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode != 0 and "torch" in done.stderr
