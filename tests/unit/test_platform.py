from labkit.platform import visible_gpus

ROWS = [("0", "GPU-aaaa1111", "NVIDIA H200"), ("1", "GPU-bbbb2222", "NVIDIA H200")]


def test_unset_means_every_gpu():
    assert visible_gpus(ROWS, None) == ROWS


def test_indices_in_the_order_given():
    assert visible_gpus(ROWS, "1") == [ROWS[1]]
    assert visible_gpus(ROWS, "1,0") == [ROWS[1], ROWS[0]]


def test_uuid_prefix():
    assert visible_gpus(ROWS, "GPU-bbbb") == [ROWS[1]]


def test_empty_or_invalid_hides_gpus_and_the_list_ends_at_the_first_bad_entry():
    assert visible_gpus(ROWS, "") == []
    assert visible_gpus(ROWS, "-1") == []
    assert visible_gpus(ROWS, "0,7,1") == [ROWS[0]]
    assert visible_gpus(ROWS, "0,0") == [ROWS[0]]
