"""The lab's JupyterLab: committed evidence is read-only through it, everything else saves as usual."""
import asyncio

import nbformat
import pytest
from tornado import web

from labkit.present.lab import EvidenceContentsManager, lab_command

EVIDENCE = "data/baselines/h200/run.ipynb"
OWN = "notebooks/mine.ipynb"


@pytest.fixture
def lab_root(tmp_path):
    for path in (EVIDENCE, OWN):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), tmp_path / path)
    return tmp_path


def test_evidence_is_reported_read_only_and_a_save_is_refused_leaving_it_as_it_was(lab_root):
    manager = EvidenceContentsManager(root_dir=str(lab_root))
    before = (lab_root / EVIDENCE).read_bytes()
    model = asyncio.run(manager.get(EVIDENCE))
    assert model["writable"] is False  # JupyterLab then opens it read-only and never autosaves it
    model["content"]["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(manager.save({**model, "type": "notebook", "format": "json"}, EVIDENCE))
    assert refused.value.status_code == 403 and "Save As" in refused.value.log_message
    for change in (lambda: manager.rename_file(EVIDENCE, OWN + "2"), lambda: manager.delete_file(EVIDENCE)):
        with pytest.raises(web.HTTPError):
            asyncio.run(change())
    assert (lab_root / EVIDENCE).read_bytes() == before


def test_the_users_own_notebooks_save_as_usual(lab_root):
    manager = EvidenceContentsManager(root_dir=str(lab_root))
    model = asyncio.run(manager.get(OWN))
    assert model["writable"] is True
    model["content"]["cells"][0]["source"] = "2 + 2"
    asyncio.run(manager.save({**model, "type": "notebook", "format": "json"}, OWN))
    assert nbformat.read(lab_root / OWN, 4).cells[0].source == "2 + 2"


def test_evidence_is_the_baselines_folder_whatever_the_spelling_and_its_folders_above_hold_it(lab_root):
    (lab_root / "notebooks" / "linked").symlink_to("../data/baselines")
    manager = EvidenceContentsManager(root_dir=str(lab_root))
    for path in (EVIDENCE, "/data/baselines/x", "notebooks/../data/baselines/h200", "data//baselines/./new.ipynb",
                 "notebooks/linked/h200/run.ipynb", "data/baselines"):
        assert manager.lies_in_evidence(path) and manager.holds_evidence(path), path
    for path in ("notebooks/data/baselines/x.ipynb", "data/results/x", "data/baselines.old/x", "data\\baselines\\x"):
        assert not manager.lies_in_evidence(path) and not manager.holds_evidence(path), path
    for path in ("data", "", "notebooks/../data"):
        assert manager.holds_evidence(path) and not manager.lies_in_evidence(path), path


def test_the_lab_command_serves_the_root_with_that_manager_and_root_needs_allow_root(tmp_path):
    command = lab_command(tmp_path, port=8890, token="t", root_user=True)
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in command and "--allow-root" in command
    assert "--ServerApp.contents_manager_class=labkit.present.lab.EvidenceContentsManager" in command
    assert "--allow-root" not in lab_command(tmp_path)


def test_evidence_is_served_with_the_kernel_facts_jupyterlab_would_write_the_recorded_ones_kept(tmp_path):
    """So opening it changes nothing in JupyterLab's eyes (no modified mark, no save prompt on close); the file
    on disk stays as committed, and another notebook is served as it is."""
    from ipykernel.ipkernel import IPythonKernel
    recorded = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python", "version": "3.12.3"}}
    for path in (EVIDENCE, OWN):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")], metadata=recorded),
                       tmp_path / path)
    before = (tmp_path / EVIDENCE).read_bytes()

    from jupyter_client.kernelspec import KernelSpecManager
    from traitlets.config import Configurable

    class Server(Configurable):  # the ServerApp holds the kernelspecs JupyterLab reads the kernel's spec from
        kernel_spec_manager = KernelSpecManager()

    manager = EvidenceContentsManager(root_dir=str(tmp_path), parent=Server())
    served = asyncio.run(manager.get(EVIDENCE))["content"]["metadata"]
    spec = Server.kernel_spec_manager.get_kernel_spec("python3")
    assert served["kernelspec"] == {"name": "python3", "display_name": spec.display_name, "language": "python"}
    assert served["language_info"] == IPythonKernel.language_info
    assert served["labkit"]["recorded_kernel"] == recorded
    assert (tmp_path / EVIDENCE).read_bytes() == before
    own = asyncio.run(manager.get(OWN))["content"]["metadata"]
    assert own["language_info"] == recorded["language_info"] and "labkit" not in own
