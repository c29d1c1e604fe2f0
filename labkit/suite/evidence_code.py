"""Whether a stored notebook's code still runs against today's lab, read without running it: every labkit
module it imports, every name it takes from one, every attribute it reaches through one (`lk.Workload.closed_loop`,
`stats.ab_record`) and every keyword it passes to one of them must exist now. A committed evidence notebook that
fails this no longer shows what the lab does: re-execute it, or take it out of the tree (git keeps it)."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path


def code_cells(notebook: Path) -> list[str]:
    """The notebook's code cells as Python (IPython magics and shell lines left out)."""
    cells = json.loads(Path(notebook).read_text()).get("cells", [])
    sources = ["".join(c.get("source", "")) if isinstance(c.get("source"), list) else c.get("source", "")
               for c in cells if c.get("cell_type") == "code"]
    return ["\n".join(line for line in s.splitlines() if not line.lstrip().startswith(("%", "!"))) for s in sources]


def _resolve(root, chain: list[str]):
    """The object at root.a.b...; raises AttributeError naming the first missing link."""
    found = root
    for link in chain:
        found = getattr(found, link)
    return found


def problems(notebook: Path) -> list[str]:
    """What the notebook's code asks of labkit that labkit no longer has, one line each (empty: all there)."""
    found: list[str] = []
    bound: dict[str, object] = {}  # names the notebook binds to labkit modules or objects
    for number, source in enumerate(code_cells(notebook), 1):
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            found.append(f"cell {number}: not Python ({exc.msg})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "labkit":
                        _bind_module(alias.name, alias.asname or alias.name.split(".")[0], bound, found, number)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "labkit" and node.level == 0:
                try:
                    module = importlib.import_module(node.module)
                except ImportError as exc:
                    found.append(f"cell {number}: from {node.module} import ...: {exc}")
                    continue
                for alias in node.names:
                    if hasattr(module, alias.name):
                        bound[alias.asname or alias.name] = getattr(module, alias.name)
                        continue
                    try:  # a submodule (from labkit.analyze import stats)
                        bound[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        found.append(f"cell {number}: {node.module} has no {alias.name!r}")
        for node in ast.walk(tree):
            chain = _attribute_chain(node.func if isinstance(node, ast.Call) else node)
            if not chain or chain[0] not in bound or len(chain) < 2:
                continue
            try:
                target = _resolve(bound[chain[0]], chain[1:])
            except AttributeError:
                found.append(f"cell {number}: {'.'.join(chain)} no longer exists")
                continue
            if isinstance(node, ast.Call):
                found += [f"cell {number}: {'.'.join(chain)}() takes no keyword {k!r}"
                          for k in _unknown_keywords(target, node)]
    return sorted(set(found), key=found.index)


def _bind_module(name: str, as_name: str, bound: dict, found: list, number: int) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        found.append(f"cell {number}: import {name}: {exc}")
        return
    bound[as_name] = module if as_name != name.split(".")[0] else importlib.import_module(as_name)


def _attribute_chain(node) -> list[str] | None:
    """['lk', 'Workload', 'closed_loop'] for lk.Workload.closed_loop; None for anything else."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(chain)]
    return None


def _unknown_keywords(target, call: ast.Call) -> list[str]:
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [k.arg for k in call.keywords if k.arg is not None and k.arg not in parameters]
