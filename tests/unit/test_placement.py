"""Where arms run when several run at once: the places handed out, what is refused, what an arm records."""
import json
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.errors import BadParameter
from labkit.measure import supervisor
from labkit.measure.placement import (BIND, Place, Placer, parallel_problems, placement_facts, placement_record,
                                      split_cores)
from labkit.store import Results

GPUS = [("0", "GPU-aaa"), ("1", "GPU-bbb"), ("2", "GPU-ccc"), ("3", "GPU-ddd")]


def test_cores_split_into_contiguous_shares_the_first_ones_larger():
    assert split_cores([0, 1], 2) == ["0", "1"]
    assert split_cores([0, 1, 2, 3, 4], 2) == ["0,1,2", "3,4"]
    assert split_cores([4, 5, 6], 3) == ["4", "5", "6"]


def test_gpu_arms_get_the_gpus_they_need_by_uuid_and_give_them_back():
    placer = Placer(3, "cuda", GPUS, usable_cores=list(range(6)))
    tp2 = placer.take(2)
    assert tp2 == Place(gpus=("0", "1"), uuids=("GPU-aaa", "GPU-bbb"), cores="0,1")  # its host side on cores of its own
    assert tp2.variables() == {"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}  # CUDA may number GPUs otherwise
    assert tp2.label() == "GPU 0,1 (cores 0,1)"
    assert placement_record(tp2, 3)["affinity"] == "0,1"
    one = placer.take(1)
    assert one.gpus == ("2",)
    assert placer.take(2) is None  # one GPU left: a two-GPU arm waits
    placer.give_back(tp2)
    assert placer.take(2).gpus == ("0", "1")  # back in the driver's order
    capped = Placer(2, "cuda", GPUS, usable_cores=[0, 1])
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
    placer, taken, lock = Placer(4, "cuda", GPUS, usable_cores=list(range(8))), [], threading.Lock()

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
    assert record["variables"] == {"CUDA_VISIBLE_DEVICES": "GPU-bbb"} and record["affinity"] is None
    assert placement_facts(record, ["GPU-bbb"]) == {"node": "local", "placed_on": "GPU 1", "arms_at_once": 2,
                                                    "gpu_uuids": ["GPU-bbb"]}
    # one arm at a time, on a CPU: the whole machine, no GPU
    assert placement_facts(None, []) == {"node": "local", "placed_on": "the whole machine", "arms_at_once": 1}


# ---- what a verdict between arms measured apart says (labkit.analyze.placement), on constructed results ----
GPU_ENV = {"cpu_count": 16, "platform": "cuda"}


def _results(arms: dict, environment=GPU_ENV):
    """arms: name -> (output tok/s per trial, facts)."""
    trials = [{"arm": arm, "trial": t, "output_tok_s": v, "host_other_cores": 0.1}
              for arm, (values, _) in arms.items() for t, v in enumerate(values)]
    rows = [{"arm": arm, "status": "complete", **{k: json.dumps(v) if isinstance(v, list) else v for k, v in facts.items()}}
            for arm, (_, facts) in arms.items()]
    return Results("fake", Path("/nonexistent"), {}, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(trials),
                   {arm: dict(environment) for arm in arms})


def _on(gpu, at_once=2, node="local"):
    return {"gpu_uuids": [gpu], "arms_at_once": at_once, "node": node, "placed_on": "GPU ?"}


def test_arms_on_different_gpus_without_a_control_carry_a_caution_and_keep_their_verdict():
    res = _results({"default": ([100.0, 101.0, 99.0], _on("GPU-aaaaaaaa-1111")),
                    "eager": ([80.0, 81.0, 79.0], _on("GPU-bbbbbbbb-2222"))})
    c = stats.compare(res, "default", "eager", "output_tok_s")
    assert c.verdict == stats.WORSE
    assert "measured on different GPUs (GPU-aaaaaaaa and GPU-bbbbbbbb)" in c.caution
    assert "GPU-to-GPU spread was not measured (run with control=True)" in c.caution


def test_a_change_within_the_gpu_to_gpu_spread_of_the_control_is_too_noisy_to_judge():
    control_moved = {"default": ([100.0, 100.5, 99.5], _on("GPU-a")),
                     "default-control": ([95.0, 95.5, 94.5], _on("GPU-b")),  # the same launch, 5 % apart
                     "small_change": ([97.0, 97.5, 96.5], _on("GPU-b")),
                     "big_change": ([60.0, 60.5, 59.5], _on("GPU-b"))}
    res = _results(control_moved)
    small = stats.compare(res, "default", "small_change", "output_tok_s")
    assert small.verdict == stats.TOO_NOISY and "between two GPUs (control)" in small.too_noisy, small.sentence()
    assert "the same launch moved -5.0% between two GPUs (control)" in small.caution
    big = stats.compare(res, "default", "big_change", "output_tok_s")
    assert big.verdict == stats.WORSE and "(control)" in big.caution
    # on one GPU nothing is said: the spread between GPUs does not enter
    same = stats.compare(_results({"a": ([100.0, 101.0, 99.0], _on("GPU-a")),
                                   "b": ([97.0, 97.5, 96.5], _on("GPU-a"))}), "a", "b", "output_tok_s")
    assert same.verdict == stats.WORSE and same.caution is None


# The H100's real-against-dummy run, had the reference been measured again last: dummy ran second, from the
# compile cache real had just written, and decoded 24.7 % slower; nothing in that run told its weights from its order.
ALONE = {"arms_at_once": 1, "node": "local"}


def test_a_change_within_the_reference_repeats_drift_is_too_noisy_and_the_repeat_keeps_its_own_verdict():
    res = _results({"real": ([100.0, 100.5, 99.5], ALONE), "dummy": ([80.0, 80.5, 79.5], ALONE),
                    "fp8": ([60.0, 60.5, 59.5], ALONE),
                    "real-repeat": ([78.0, 78.5, 77.5], ALONE)})  # the same launch, 22 % slower at the end
    dummy = stats.compare(res, "real", "dummy", "output_tok_s")
    assert dummy.verdict == stats.TOO_NOISY, dummy.sentence()
    assert "real's launch measured again after the other arms moved output_tok_s -22.0% (repeat)" in dummy.caution
    assert "the arms' order or the machine's drift alone could have made it" in dummy.too_noisy
    fp8 = stats.compare(res, "real", "fp8", "output_tok_s")  # -40 %: beyond the drift, with a caution
    assert fp8.verdict == stats.WORSE and "(repeat)" in fp8.caution
    repeat = stats.compare(res, "real", "real-repeat", "output_tok_s")  # the drift's own measurement
    assert repeat.verdict == stats.WORSE and repeat.caution is None
    outcome = stats.arm_outcomes(stats.ab_record(res, "real", ["output_tok_s"]), "real").set_index("arm")
    assert outcome.loc["dummy", "advice"] == "rerun with the arms in another order, or on a quieter machine"
    assert "the machine or the arms' order can explain the change" in outcome.loc["dummy", "sentence"]
    # the repeat is the same launch: no advice to take it, only what it moved
    assert outcome.loc["real-repeat", "advice"] == "none: it is the run's drift"
    assert outcome.loc["real-repeat", "sentence"].startswith(
        "real-repeat: real's launch measured again after the other arms, worse on output_tok_s")
    # a repeat that did not move leaves the verdicts alone
    steady = _results({"real": ([100.0, 100.5, 99.5], ALONE), "dummy": ([80.0, 80.5, 79.5], ALONE),
                       "real-repeat": ([100.2, 99.8, 100.0], ALONE)})
    assert stats.compare(steady, "real", "dummy", "output_tok_s").verdict == stats.WORSE


def test_cpu_arms_at_once_say_they_shared_the_host_and_different_nodes_are_named():
    cpu = {"cpu_count": 2, "platform": "cpu"}
    res = _results({"a": ([100.0, 101.0, 99.0], {"arms_at_once": 2, "placed_on": "cores 0", "node": "n1"}),
                    "b": ([90.0, 91.0, 89.0], {"arms_at_once": 2, "placed_on": "cores 1", "node": "n2"})}, cpu)
    c = stats.compare(res, "a", "b", "output_tok_s")
    assert "measured on different machines (n1 and n2)" in c.caution
    assert "measured 2 arms at once on this host (cores 0; cores 1): they shared its memory bandwidth" in c.caution
    alone = _results({"a": ([100.0, 101.0, 99.0], {"arms_at_once": 1, "node": "local"}),
                      "b": ([90.0, 91.0, 89.0], {"arms_at_once": 1, "node": "local"})}, cpu)
    assert stats.compare(alone, "a", "b", "output_tok_s").caution is None


def test_arms_at_once_that_cannot_be_are_refused_before_any_worker_starts(tmp_path, monkeypatch):
    def no_worker(*args, **kwargs):
        raise AssertionError("a worker started before the refusal")
    monkeypatch.setattr(supervisor.ArmWorker, "__init__", no_worker)
    exp = lk.Experiment("at-once", {"a": {}, "b": {"max_num_seqs": 2}}, lk.Workload(4, lk.Fixed(8), lk.Fixed(4),
                        lk.Burst()), model="tiny-llama", results_dir=tmp_path)
    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(BadParameter, match=f"use parallel={too_many - 1} or fewer"):
        exp.run(progress=False, parallel=too_many)
    with pytest.raises(BadParameter, match="whole number from 1; got 0"):
        exp.run(progress=False, parallel=0)
    with pytest.raises(BadParameter) as refused:
        exp.run(progress=False, control=True)  # on a CPU, one at a time: two reasons, both named
    assert "spread between GPUs" in str(refused.value) and "give parallel=2 or more" in str(refused.value)
    with pytest.raises(BadParameter) as refused:  # a repeat of a reference left out, with arms at once
        exp.run(progress=False, repeat=True, parallel=2, only=["b"])
    assert "run without parallel, control or a cluster" in str(refused.value)
    assert "the reference arm 'a' is not among the arms to run here" in str(refused.value)
    assert not (tmp_path / "at-once" / "arms").exists()
