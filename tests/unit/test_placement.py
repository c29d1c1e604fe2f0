"""Where arms run when several run at once: the places handed out, what is refused, what an arm records."""
import threading

from labkit.measure.placement import (BIND, Place, Placer, parallel_problems, placement_facts, placement_record,
                                      split_cores)

GPUS = [("0", "GPU-aaa"), ("1", "GPU-bbb"), ("2", "GPU-ccc"), ("3", "GPU-ddd")]


def test_cores_split_into_contiguous_shares_the_first_ones_larger():
    assert split_cores([0, 1], 2) == ["0", "1"]
    assert split_cores([0, 1, 2, 3, 4], 2) == ["0,1,2", "3,4"]
    assert split_cores([4, 5, 6], 3) == ["4", "5", "6"]


def test_gpu_arms_get_the_gpus_they_need_by_uuid_and_give_them_back():
    placer = Placer(3, "cuda", GPUS)
    tp2 = placer.take(2)
    assert tp2 == Place(gpus=("0", "1"), uuids=("GPU-aaa", "GPU-bbb"))
    assert tp2.variables() == {"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}  # CUDA may number GPUs otherwise
    assert tp2.label() == "GPU 0,1"
    one = placer.take(1)
    assert one.gpus == ("2",)
    assert placer.take(2) is None  # one GPU left: a two-GPU arm waits
    placer.give_back(tp2)
    assert placer.take(2).gpus == ("0", "1")  # back in the driver's order
    capped = Placer(2, "cuda", GPUS)
    assert capped.take(1).gpus == ("0",) and capped.take(1).gpus == ("1",)
    assert capped.take(1) is None  # two arms at once is the most, though GPUs 2 and 3 are free


def test_cpu_arms_each_get_a_share_of_the_cores_for_vllms_own_binding():
    placer = Placer(2, "cpu", [], usable_cores=[0, 1])
    first, second = placer.take(0), placer.take(0)
    assert {first.variables()[BIND], second.variables()[BIND]} == {"0", "1"}
    assert placer.take(0) is None
    placer.give_back(first)
    assert placer.take(0) == first


def test_the_placer_never_hands_one_place_to_two_threads():
    placer, taken, lock = Placer(4, "cuda", GPUS), [], threading.Lock()

    def grab():
        place = placer.take(1)
        with lock:
            taken.append(place)
    threads = [threading.Thread(target=grab) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    places = [p for p in taken if p is not None]
    assert len(places) == 4 and len({p.gpus for p in places}) == 4


def test_every_reason_arms_cannot_run_at_once_is_named_together():
    assert parallel_problems(1, "cuda", [], {"a": 8}) == []  # one at a time: nothing to place
    assert parallel_problems(0, "cpu", [], {}) == ["parallel is how many arms run at once, a whole number from 1; got 0"]
    assert "got True" in parallel_problems(True, "cpu", [], {})[0]
    found = parallel_problems(4, "cuda", ["0", "1"], {"tp4": 4, "one": 1})
    assert len(found) == 2
    assert "{'tp4': 4} need more GPUs than the 2 this process may use (0, 1)" in found[0]
    assert "use parallel=2 or fewer" in found[1]
    found = parallel_problems(3, "cpu", [], {}, usable_cores=[0, 1], bind="0-1")
    assert len(found) == 2 and "use parallel=2 or fewer" in found[0] and f"{BIND}='0-1' is set" in found[1]
    assert parallel_problems(2, "cpu", [], {}, usable_cores=[0, 1], bind="auto") == []


def test_an_arm_records_its_node_place_and_gpus_without_its_variables():
    record = placement_record(Place(gpus=("1",), uuids=("GPU-bbb",)), 2)
    assert record["variables"] == {"CUDA_VISIBLE_DEVICES": "GPU-bbb"}
    assert placement_facts(record, ["GPU-bbb"]) == {"node": "local", "placed_on": "GPU 1", "arms_at_once": 2,
                                                    "gpu_uuids": ["GPU-bbb"]}
    # one arm at a time, on a CPU: the whole machine, no GPU
    assert placement_facts(None, []) == {"node": "local", "placed_on": "the whole machine", "arms_at_once": 1}
