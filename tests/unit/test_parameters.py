"""Notebook parameters: each notebook's smoke values fit its parameters cell, and a wrong name or type is refused
before any kernel starts, with the list of what the notebook takes (papermill reads the cells; no kernel)."""
import ast
import json
from pathlib import Path

import pytest

from labkit import cli
from labkit.errors import BadParameter
from labkit.suite import parameters
from labkit.suite.notebooks import discover

QUICKSTART = parameters.NOTEBOOKS / "00_quickstart.ipynb"


def test_every_notebook_has_smoke_values_that_its_parameters_cell_takes():
    notebooks = {parameters.relative(nb): nb for nb in discover()}
    assert set(parameters.SMOKE) == set(notebooks)
    for name, values in parameters.SMOKE.items():
        assert parameters.check_parameters(notebooks[name], values) == values, name


def test_papermill_sees_every_parameter_a_parameters_cell_assigns():
    # papermill skips a line with a second "=" (one in its help comment is enough): that parameter would then
    # be refused by `labkit run -p` and never injected
    for nb in discover():
        cell = next(c for c in json.loads(nb.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
        assigned = {node.target.id for node in ast.parse("".join(cell["source"])).body if isinstance(node, ast.AnnAssign)}
        assert set(parameters.declared(nb)) == assigned, nb


def test_a_notebook_reads_its_smoke_values_by_its_own_path():
    for nb in discover():
        source = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
        assert f'lk.smoke_parameters("{parameters.relative(nb)}")' in source, nb
    with pytest.raises(BadParameter, match="no smoke values"):
        parameters.smoke_parameters("L9/none.ipynb")


def test_unknown_name_lists_the_parameters_and_their_types():
    with pytest.raises(BadParameter) as caught:
        parameters.check_parameters(QUICKSTART, {"num_request": 8})
    message = str(caught.value)
    assert "'num_request' is not a parameter" in message and "num_requests: int = 256" in message


@pytest.mark.parametrize("value, expected", [(True, True), ("true", True), ("False", False)])
def test_booleans_take_true_and_false(value, expected):
    assert parameters.check_parameters(QUICKSTART, {"smoke": value}) == {"smoke": expected}


@pytest.mark.parametrize("name, value, words", [("smoke", "no", "smoke must be true or false"),
                                                ("smoke", 1, "smoke must be true or false"),
                                                ("num_requests", "three", "num_requests must be a whole number >= 0"),
                                                ("num_requests", 2.5, "num_requests must be a whole number >= 0"),
                                                ("model", 3, "model must be text")])
def test_wrong_types_are_refused(name, value, words):
    with pytest.raises(BadParameter, match=words):
        parameters.check_parameters(QUICKSTART, {name: value})


def test_a_float_parameter_takes_an_integer():
    triangle = parameters.NOTEBOOKS / "L2_engine" / "batch_triangle.ipynb"
    assert parameters.check_parameters(triangle, {"slo_ms": 30}) == {"slo_ms": 30.0}


def test_profiles_name_only_parameters_their_notebooks_take():
    for profile in parameters.PROFILES:
        for nb in discover():
            parameters.check_parameters(nb, parameters.parameters_for(profile, nb))


def test_labkit_run_refuses_a_mistyped_parameter_before_a_kernel_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("papermill.execute_notebook", lambda *a, **k: pytest.fail("a kernel was started"))
    code = cli.main(["run", str(QUICKSTART), "-p", "num_request", "8", "-o", str(tmp_path)])
    assert code == 2 and "not a parameter" in capsys.readouterr().err
    code = cli.main(["run", str(QUICKSTART), "-p", "smoke", "no", "-o", str(tmp_path)])
    assert code == 2 and "smoke must be true or false" in capsys.readouterr().err
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (3, 3), ("4", 4)])
def test_trials_take_auto_or_a_whole_number(value, expected):
    assert parameters.check_parameters(QUICKSTART, {"trials": value}) == {"trials": expected}


@pytest.mark.parametrize("value", [0, -1, 2.5, "many", True, float("nan")])
def test_trials_refuse_anything_else_naming_both_forms(value):
    with pytest.raises(BadParameter, match='trials must be "auto" or a whole number >= 1'):
        parameters.check_parameters(QUICKSTART, {"trials": value})


def test_a_smoke_run_starts_eager_engines_and_the_settings_overrides_win():
    from labkit import settings
    from labkit.suite.parameters import smoke_overrides

    single_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert smoke_overrides(True) == {"enforce_eager": True, "environment": single_process}
    assert smoke_overrides(False) == {}
    forced = settings.current().replace(launch_overrides={"enforce_eager": False, "max_num_seqs": 8})
    with settings.use(forced):
        assert smoke_overrides(True) == {"enforce_eager": False, "max_num_seqs": 8, "environment": single_process}
        assert smoke_overrides(False) == {"enforce_eager": False, "max_num_seqs": 8}


def test_a_list_of_counts_takes_one_count_and_a_mistyped_name_gets_a_close_match():
    cuda_graphs = parameters.NOTEBOOKS / "L3_kernel" / "cuda_graphs.ipynb"
    assert parameters.check_parameters(cuda_graphs, {"cliff_clients": 8}) == {"cliff_clients": "8"}  # -p cliff_clients 8
    with pytest.raises(BadParameter, match="cliff_clients must be text"):
        parameters.check_parameters(cuda_graphs, {"cliff_clients": True})
    with pytest.raises(BadParameter, match=r"'clif_clients' is not a parameter of this notebook \(did you mean cliff_clients\?\)"):
        parameters.check_parameters(cuda_graphs, {"clif_clients": "8"})
