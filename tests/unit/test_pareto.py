"""The Pareto front: dominance on hand-made points (ties included), and the points of committed stores."""
import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.analyze import pareto, stats  # noqa: E402
from labkit.analyze.parallel import gpus_per_arm  # noqa: E402
from labkit.present import plots  # noqa: E402


def test_a_point_is_dominated_only_by_one_at_least_as_good_on_both_and_better_on_one():
    #          a: front   b: worse on both   c: front (trade)   d: ties a on x, worse y   e: better x, worse y
    xs = [10.0, 5.0, 20.0, 10.0, 15.0]
    ys = [100.0, 50.0, 40.0, 90.0, 30.0]
    assert pareto.dominated(xs, ys) == [False, True, False, True, True]  # e: c is faster and gives more


def test_equal_points_do_not_dominate_each_other_and_a_tie_on_one_axis_needs_a_gain_on_the_other():
    assert pareto.dominated([1.0, 1.0], [2.0, 2.0]) == [False, False]  # the same point twice: both on the front
    assert pareto.dominated([1.0, 1.0, 2.0], [2.0, 2.0, 2.0]) == [True, True, False]  # the third is faster
    assert pareto.dominated([3.0, 1.0], [1.0, 3.0]) == [False, False]  # a trade: neither dominates
    assert pareto.dominated([7.0], [7.0]) == [False] and pareto.dominated([], []) == []


@pytest.fixture(scope="module")
def triangle():
    return lk.load("batch-triangle", "data/baselines/h200/results")


def test_the_stored_triangles_points_per_user_and_per_gpu_with_intervals(triangle):
    points = pareto.pareto_points(triangle).set_index("arm")
    assert list(points.index) == triangle.complete_arms and set(points.load) == {"default"}
    assert set(points.gpus) == {1}
    tpot = stats.summarize(triangle, ["tpot_p50_ms", "output_tok_s"]).set_index(["arm", "metric"])
    for arm in points.index:  # 1000 / median TPOT; its interval the TPOT interval's ends inverted
        row = points.loc[arm]
        assert row.output_tok_s_per_user == pytest.approx(1000 / tpot.loc[(arm, "tpot_p50_ms"), "value"])
        assert row.output_tok_s_per_user_low == pytest.approx(1000 / tpot.loc[(arm, "tpot_p50_ms"), "ci_high"])
        assert row.output_tok_s_per_gpu == pytest.approx(tpot.loc[(arm, "output_tok_s"), "value"])
        assert row.output_tok_s_per_user_low <= row.output_tok_s_per_user <= row.output_tok_s_per_user_high
        assert row.output_tok_s_per_gpu_low <= row.output_tok_s_per_gpu <= row.output_tok_s_per_gpu_high
    # a bigger batch trades speed per user for output per GPU along the front; 64 and 128 give less per GPU
    # than vLLM's default at no gain in speed per user
    assert points.dominated.to_dict() == {"max_num_seqs=8": False, "max_num_seqs=16": False, "max_num_seqs=32": False,
                                          "max_num_seqs=64": True, "max_num_seqs=128": True, "vllm-default": False}
    assert points.loc["max_num_seqs=64", "dominated_by"] == "vllm-default · default"
    front = points[~points.dominated].sort_values("output_tok_s_per_user")
    assert front.output_tok_s_per_gpu.is_monotonic_decreasing


def test_a_replica_arm_is_divided_by_its_gpus_and_every_load_is_a_point():
    parallel = lk.load("parallelism", "data/baselines/h200x2/results")
    points = pareto.pareto_points(parallel).set_index(["load", "arm"])
    assert len(points) == 4 and points.loc[("loaded", "dp2"), "gpus"] == 2
    sizes = gpus_per_arm(parallel).set_index("arm").gpus
    assert sizes["dp2"] == 2 and sizes["tp1"] == 1
    throughput = parallel.trials.groupby(["load", "arm"]).output_tok_s.mean()
    assert points.loc[("loaded", "dp2"), "output_tok_s_per_gpu"] == pytest.approx(throughput[("loaded", "dp2")] / 2)
    # alone, two GPUs serve one user no faster than one: the replica point is dominated by tp1's
    assert points.loc[("single", "dp2"), "dominated"] and points.loc[("single", "dp2"), "dominated_by"] == "tp1 · single"


def test_the_plot_fades_dominated_points_joins_the_front_and_names_every_point(triangle):
    points = pareto.pareto_points(triangle)
    fig = plots.pareto(points)
    ax = fig.axes[0]
    front = [line for line in ax.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata()) > 1]
    assert len(front) == 1 and len(front[0].get_xdata()) == int((~points.dominated).sum())
    assert list(front[0].get_xdata()) == sorted(points[~points.dominated].output_tok_s_per_user)
    labels = " ".join(t.get_text() for t in ax.texts)
    assert all(arm in labels for arm in points.arm)
    faded = [t for t in ax.texts if "max_num_seqs=64" in t.get_text()]
    assert faded and all(t.get_color() != "black" for t in faded)
    assert "per user" in ax.get_xlabel() and "TPOT" in ax.get_xlabel() and "per GPU" in ax.get_ylabel()
    assert ax.get_legend() is not None and "95 %" in ax.get_title()
    matplotlib.pyplot.close(fig)
