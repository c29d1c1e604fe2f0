from labkit.platform import visible_gpus

ROWS = [("0", "GPU-aaaa1111", "NVIDIA H200"), ("1", "GPU-bbbb2222", "NVIDIA H200")]


def test_unset_means_every_gpu():
    assert visible_gpus(ROWS, None) == ROWS


def test_indices_in_the_order_given():
    assert visible_gpus(ROWS, "1") == [ROWS[1]]
    assert visible_gpus(ROWS, "1,0") == [ROWS[1], ROWS[0]]


def test_uuid_prefix():
    assert visible_gpus(ROWS, "GPU-bbbb") == [ROWS[1]]


def test_a_mig_slice_keeps_every_gpu_rather_than_none():
    assert visible_gpus(ROWS, "MIG-0123abcd") == ROWS


def test_empty_or_invalid_hides_gpus_and_the_list_ends_at_the_first_bad_entry():
    assert visible_gpus(ROWS, "") == []
    assert visible_gpus(ROWS, "-1") == []
    assert visible_gpus(ROWS, "0,7,1") == [ROWS[0]]
    assert visible_gpus(ROWS, "0,0") == [ROWS[0]]


def test_occupied_note_names_the_gpus_another_process_holds():
    from labkit.engine import occupied_note
    note = occupied_note({"0": 0.5, "1": 70.25})
    assert "GPU 1: 70.2 GiB" in note and "GPU 0" not in note and "rerun the arm" in note
    assert occupied_note({"0": 0.5}) == "" and occupied_note({}) == ""


def test_no_gpu_memory_is_read_without_nvidia_smi(monkeypatch):
    from labkit import platform
    monkeypatch.setattr(platform.shutil, "which", lambda name: None)
    assert platform.gpu_memory_in_use() == {}


def test_gpu_memory_in_use_reads_the_visible_gpus(monkeypatch):
    from types import SimpleNamespace
    from labkit import platform
    csv = "0, GPU-aaaa1111, 512\n1, GPU-bbbb2222, 72000\n"
    monkeypatch.setattr(platform.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(platform.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=csv))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert platform.gpu_memory_in_use() == {"0": 0.5, "1": 70.31}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert platform.gpu_memory_in_use() == {"1": 70.31}
