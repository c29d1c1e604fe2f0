"""Array-likes where a list is meant are read as that list (one helper, labkit.spec.lists.as_list), and what is
no list (a bare string, a dict, a set, a 2-D array) is refused naming the parameter, wherever lists are taken."""
import json

import numpy as np
import pandas as pd
import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.errors import BadParameter
from labkit.spec.knobs import check_knobs, plan_arm, pool_arms
from labkit.spec.lists import as_list
from labkit.measure.platform import Platform

H200 = Platform("cuda", (0, 26, 0), ("NVIDIA H200",))


def _array_likes(items):
    return {"list": list(items), "tuple": tuple(items), "ndarray": np.array(items), "Series": pd.Series(items),
            "Index": pd.Index(items), "generator": (x for x in items), "iterator": iter(list(items))}


@pytest.mark.parametrize("kind", list(_array_likes([1, 2])))
def test_every_array_like_becomes_a_plain_list_of_python_values(kind):
    found = as_list("sizes", _array_likes([1, 2, 4])[kind])
    assert found == [1, 2, 4] and all(type(v) is int for v in found)
    json.dumps(found)


def test_a_range_is_a_list():
    assert as_list("sizes", range(1, 4)) == [1, 2, 3]


@pytest.mark.parametrize("value, complaint", [("ttft_p99_ms", "for one item write"), (b"x", "the text"),
                                              ({"a": 1}, "a dict"), ({1, 2}, "no order"),
                                              (np.array([[1, 2]]), "2-dimensional"), (np.int64(3), "0-dimensional"),
                                              (7, "got int")])
def test_what_is_no_list_is_refused_naming_the_parameter(value, complaint):
    with pytest.raises(BadParameter, match=complaint) as caught:
        as_list("sizes", value)
    assert "sizes" in str(caught.value)


@pytest.mark.parametrize("kind", ["tuple", "ndarray", "Series", "generator"])
def test_capture_sizes_take_any_array_like_and_store_it_as_a_list(kind, tmp_path):
    sizes = _array_likes([4, 1, 2])[kind]
    exp = lk.Experiment("lists", {"a": {"cudagraph_capture_sizes": sizes}}, lk.Workload(2, lk.Fixed(4), lk.Fixed(2)),
                        platform=H200, results_dir=tmp_path)
    assert exp.arms["a"]["cudagraph_capture_sizes"] == [4, 1, 2]
    plan = exp.plans()["a"]
    assert plan.engine_args["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4]
    json.dumps(plan.engine_args)
    assert plan_arm({"cudagraph_capture_sizes": _array_likes([2, 1])[kind]}, H200).engine_args == {
        "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}


@pytest.mark.parametrize("value", ["1,2", np.array([[1, 2]]), {1: 2}, []])
def test_capture_sizes_that_are_no_list_are_refused(value):
    with pytest.raises(BadParameter, match="cudagraph_capture_sizes must be a non-empty list"):
        check_knobs({"cudagraph_capture_sizes": value})


@pytest.mark.parametrize("kind", ["tuple", "ndarray", "Series", "generator"])
def test_logged_lengths_take_any_array_like(kind):
    lengths = lk.FromLog(_array_likes([3, 5])[kind])
    assert lengths.values == (3, 5)
    json.dumps(lk.Workload(2, lengths, lk.Fixed(1)).to_dict())


def test_logged_lengths_from_a_range():
    assert lk.FromLog(range(3, 6)).values == (3, 4, 5)


@pytest.mark.parametrize("kind", ["tuple", "generator", "ndarray"])
def test_template_segments_take_any_array_like(kind):
    segments = [lk.Segment("s", 4, "shared"), lk.Segment("q", 2)]
    given = np.array(segments, dtype=object) if kind == "ndarray" else _array_likes(segments)[kind]
    assert lk.Template(given).segments == tuple(segments)


def test_a_template_of_one_bare_segment_is_refused():
    with pytest.raises(BadParameter, match="non-empty list of Segments"):
        lk.Template(lk.Segment("q", 2))


class _NoArms:
    complete_arms = measured_arms = []


@pytest.mark.parametrize("kind", ["tuple", "ndarray", "Series", "generator"])
def test_metrics_take_any_array_like(kind):
    assert stats.metric_names(_array_likes(["ttft_p99_ms", "tpot_p50_ms"])[kind], ["x"]) == ["ttft_p99_ms",
                                                                                             "tpot_p50_ms"]
    stats.summarize(_NoArms(), _array_likes(["ttft_p99_ms"])[kind])


def test_a_bare_metric_name_is_refused_not_read_letter_by_letter():
    with pytest.raises(BadParameter, match=r"for one item write \['ttft_p99_ms'\]"):
        stats.summarize(_NoArms(), "ttft_p99_ms")
    assert stats.metric_names(None, ["a"]) == ["a"] and stats.metric_names([], ["a"]) == ["a"]


def test_run_only_refuses_a_bare_arm_name_before_any_engine(tmp_path, monkeypatch):
    from labkit import experiment as experiment_module

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine would start")
    monkeypatch.setattr(experiment_module, "run_arm", no_engine)
    exp = lk.Experiment("only", {"a": {}}, lk.Workload(2, lk.Fixed(4), lk.Fixed(2)), results_dir=tmp_path)
    with pytest.raises(BadParameter, match=r"only takes a list .* write \['a'\]"):
        exp.run(progress=False, only="a")
    with pytest.raises(BadParameter, match="no arm"):
        exp.run(progress=False, only=np.array(["zz"]))


def test_the_slo_search_grid_refuses_text_and_reads_arrays():
    from labkit import sweeps

    class Arms:
        arms = {}
    with pytest.raises(BadParameter, match="grid takes a list"):
        sweeps.search_max_num_seqs(Arms(), "1,2", {"ttft_p99_ms": 1.0})
    with pytest.raises(BadParameter, match=r"no arms \['max_num_seqs=3'\]"):
        sweeps.search_max_num_seqs(Arms(), np.array([3]), {"ttft_p99_ms": 1.0})


def test_pool_arms_take_arrays():
    arms, largest = pool_arms(H200, 768, np.array([0.5, 0.9]), np.array([256]))
    assert largest == "util=0.9" and arms["util=0.5"] == {"gpu_memory_utilization": 0.5}
