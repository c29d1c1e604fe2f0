import os
import shutil
from pathlib import Path

import pytest


def _has_vllm() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


# the longest chains first, so that test processes run side by side finish together: the notebook suite (one
# module, ~10 min), then the engine and browser tests, then the unit tests that fill the gaps
FIRST = ("notebooks", "engine", "browser")


def _chain(item) -> int:
    parts = Path(str(item.fspath)).parts
    return next((i for i, name in enumerate(FIRST) if name in parts), len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_chain)  # stable: the order within a module is kept
    skip_engine = pytest.mark.skip(reason="vLLM is not installed here (run `make test`, which installs it)")
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (run through the device tool)")
    skip_browser = pytest.mark.skip(reason="needs Debian's chromium and chromium-driver (`make test` installs them "
                                    "where it runs as root)")
    has_vllm, has_gpu = _has_vllm(), shutil.which("nvidia-smi") is not None
    has_browser = all(map(shutil.which, ("chromium", "chromedriver")))
    if os.environ.get("LABKIT_REQUIRE_ENGINE") == "1":  # CI: a missing engine or browser is a failure, not a skip
        has_vllm = has_browser = True
    for item in items:
        path = str(item.fspath)
        if f"{os.sep}browser{os.sep}" in path and not (has_browser and has_vllm):  # its quickstart runs an engine
            item.add_marker(skip_browser if not has_browser else skip_engine)
        elif f"{os.sep}gpu{os.sep}" in path and not has_gpu:
            item.add_marker(skip_gpu)
        elif (f"{os.sep}engine{os.sep}" in path or f"{os.sep}notebooks{os.sep}" in path) and not has_vllm:
            item.add_marker(skip_engine)


@pytest.fixture(scope="session", autouse=True)
def cores_of_this_test_process():
    """With several test processes (`make test` runs the engine and browser tests in two), each takes its own
    share of the cores, as the suite does for its notebooks: vLLM's CPU engine binds its threads to the first
    cores it may use, so engines of two processes left unbound would share those. Tests that need more cores
    (two tensor-parallel ranks) widen it for themselves."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and 1 < count <= len(cores):
        os.sched_setaffinity(0, cores[int(worker[2:]) % count::count])
    yield
    os.sched_setaffinity(0, cores)


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """Each engine test gets its own results store."""
    path = tmp_path / "results"
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(path))
    return path
