"""Removing what an ended engine left in the temporary folder: its socket folder and the file store it logged."""
import tempfile
from pathlib import Path

from labkit.measure import rendezvous


def test_an_arm_folder_fits_vllm_socket_paths_and_is_removed_with_its_sockets():
    folder = rendezvous.arm_folder()
    assert folder and len(folder) + 37 <= 107 and Path(folder).parent == Path(tempfile.gettempdir())
    assert not Path(folder).exists() and folder != rendezvous.arm_folder()  # its worker makes it
    rendezvous.make(folder)
    assert Path(folder).stat().st_mode & 0o777 == 0o700
    (Path(folder) / "0f0e6c1a-5b0e-4a43-9a58-1d2c3b4a5e6f").touch()  # a socket's name, as vLLM makes them
    rendezvous.remove(folder, "")
    assert not Path(folder).exists()


def test_only_the_file_stores_the_log_names_in_the_temporary_folder_are_removed(tmp_path):
    here = Path(tempfile.gettempdir())
    named, other = here / "vllm_dist_0123abcd", here / "vllm_dist_4567ef01"
    elsewhere = tmp_path / "vllm_dist_89abcdef"
    for path in (named, other, elsewhere):
        path.touch()
    log = (f"(EngineCore pid=1) INFO [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 "
           f"distributed_init_method=file://{named} backend=gloo\n"
           f"... distributed_init_method=file://{elsewhere} backend=gloo\n"
           "... distributed_init_method=tcp://127.0.0.1:29500 backend=nccl\n")
    try:
        assert rendezvous.file_stores(log) == {named}
        rendezvous.remove(None, log)
        assert not named.exists() and other.exists() and elsewhere.exists()
    finally:
        for path in (named, other):
            path.unlink(missing_ok=True)
