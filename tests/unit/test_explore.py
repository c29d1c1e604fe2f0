"""The results explorer on committed evidence (the H200's stores): moving a widget changes what it shows."""
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.errors import BadParameter  # noqa: E402
from labkit.present import explore  # noqa: E402

H200 = Path(__file__).resolve().parents[2] / "data" / "baselines" / "h200"
ROOTS = {"h200": H200 / "results", "h200 suite run": H200 / "20261129T225537Z-h200" / "results"}


@pytest.fixture(scope="module")
def explorer():
    return explore.Explorer(ROOTS, "cuda-graphs")


def test_it_opens_on_the_experiment_with_values_intervals_and_verdicts(explorer):
    assert explorer.experiment.value == "cuda-graphs" and set(explorer.arms.value) == {
        "default", "graphs_off", "eager", "narrow_capture"}
    table = explorer.table
    assert list(table.arm) == ["default", "graphs_off", "eager", "narrow_capture"]  # the experiment's order
    assert table.change[0] == "reference" and set(table.verdict[1:]) <= {"better", "worse", "no detectable difference"}
    assert " [" in table.tpot_p50_ms[0] and explorer.figure is not None


def test_moving_a_widget_changes_what_it_shows(explorer):
    before = explorer.table.copy()
    explorer.load.value = "c64"
    explorer.metric.value = "output_tok_s"
    assert list(explorer.table.columns)[1] == "output_tok_s" and not explorer.table.equals(before)
    explorer.arms.value = ("eager", "default")
    assert list(explorer.table.arm) == ["default", "eager"] and explorer.table.change[0] == "reference"


def test_another_run_can_be_set_beside():
    runs = {"first": H200 / "20261129T201904Z-h200" / "results", "second": H200 / "20261129T225537Z-h200" / "results"}
    explorer = explore.Explorer(runs, "profile-hotspots")
    arms = set(explorer.arms.value)
    explorer.beside.value = "second"
    assert set(explorer.table.results) == {"first", "second"} and len(explorer.table) == 2 * len(arms)


def test_a_batch_triangle_gets_an_slo_slider_that_recomputes_the_answer():
    triangle = explore.Explorer(ROOTS, "batch-triangle")
    assert triangle.slo.layout.display != "none" and triangle.metric.value == "tbt_p99_ms"
    triangle.slo.value = triangle.slo.max
    loose = triangle.answer
    triangle.slo.value = triangle.slo.step
    tight = triangle.answer
    batches = sorted(explore.triangle_arms(triangle.results()).values())
    assert loose["answer"] == batches[-2] and loose["largest_meeting"] == batches[-1]  # backed off one notch
    assert tight["answer"] is None and "no max_num_seqs on the grid meets the SLOs" in tight["sentence"]
    assert set(loose["goodput_request_s"]) == set(triangle.arms.value)
    assert list(loose["goodput"].columns) == ["arm", "requests/s", "goodput (requests/s)", "goodput (output tokens/s)",
                                              "share good (%)", "recommended"]
    assert all(" [" in c for c in loose["goodput"]["goodput (output tokens/s)"])  # each with its 95 % interval
    # at the loosest limit every request is good: goodput is the throughput, and no request is good at the tightest
    assert {float(c.split(" ")[0]) for c in loose["goodput"]["share good (%)"]} == {100.0}
    assert set(tight["goodput_request_s"].values()) == {0.0}
    assert "(ms)" in triangle.slo.description and "gap between consecutive tokens" in triangle.slo.description


def test_the_explorers_slo_answer_is_the_notebooks_search_on_the_same_points():
    """At the README's 50 ms on the H200 triangle both answer max_num_seqs=16 (largest meeting 32, backed off)."""
    from labkit.analyze import slo, stats
    triangle = explore.Explorer(ROOTS, "batch-triangle")
    triangle.slo.value = 50.0
    results = triangle.results()
    summary = stats.summarize(results, ["tbt_p99_ms"]).set_index("arm")
    arms = explore.triangle_arms(results)
    by_batch = {b: {"tbt_p99_ms": tuple(summary.loc[a, ["value", "ci_low", "ci_high"]])} for a, b in arms.items()}
    searched = slo.search(lambda b: by_batch[b], sorted(by_batch), {"tbt_p99_ms": 50.0})
    assert triangle.answer["answer"] == searched.answer == 16 and triangle.answer["binding"] == "tbt_p99_ms"
    assert triangle.answer["goodput"].set_index("arm").loc["max_num_seqs=16", "recommended"] == "yes"


def test_a_pick_that_takes_time_clears_the_last_one_and_says_it_is_working(explorer, monkeypatch):
    seen = []
    real = explore.values_table
    monkeypatch.setattr(explore, "values_table",
                        lambda *a, **k: seen.append((explorer.busy, explorer.message, explorer.table)) or real(*a, **k))
    explorer.metric.value = "ttft_p99_ms"
    busy, message, table = seen[0]
    assert busy and message.startswith("working: ttft_p99_ms") and table is None  # nothing of the last pick stays
    assert not explorer.busy and explorer.message is None and "ttft_p99_ms" in explorer.table


def test_results_under_the_baselines_are_labelled_by_hardware_and_date():
    from pathlib import Path as P
    assert explore.root_label(P("h200")) == "h200"
    assert explore.root_label(P("h200/20261129T225537Z-h200")) == "h200 · run 2026-11-29 22:55 UTC"


def test_nothing_to_explore_is_a_clear_error(tmp_path):
    with pytest.raises(BadParameter, match="no stored results to explore"):
        explore.Explorer({}, None)


def test_a_chunked_prefill_timeline_window_can_be_moved():
    run = {"suite run": H200 / "20261129T225537Z-h200" / "results"}
    timeline = explore.Explorer(run, "chunked-prefill")
    assert timeline.window.layout.display != "none" and timeline.slo.layout.display == "none"
    full = timeline.figure.axes[0].get_xlim()
    timeline.window.value = (1.0, 2.0)
    assert timeline.figure.axes[0].get_xlim() == (1.0, 2.0) != full


def test_a_named_experiment_opens_the_results_that_hold_it_or_is_a_clear_error():
    # the suite run holds no diagnosis: listed first, it is passed over for the results that hold one
    suite_run_first = dict(reversed(ROOTS.items()))
    assert explore.Explorer(suite_run_first, "diagnosis").root.value == "h200"
    with pytest.raises(BadParameter, match="no stored experiment 'nope'"):
        explore.Explorer(ROOTS, "nope")


def test_the_pareto_view_shows_every_chosen_arm_and_load_as_a_point():
    explorer = explore.Explorer(ROOTS, "cuda-graphs")
    explorer.view.value = explore.FRONT
    results = explorer.results()
    assert len(explorer.table) == len(results.complete_arms) * len(results.loads)
    assert list(explorer.table.columns) == ["arm", "load", "gpus", "output tok/s per user", "output tok/s per GPU",
                                            "front"]
    assert all(" [" in c for c in explorer.table["output tok/s per GPU"])  # each with its 95 % interval
    # without graphs every point is beaten on both axes; the front is the captured launches'
    front = explorer.table[explorer.table.front == "on the front"]
    assert "default" in set(front.arm) and not set(front.arm) & {"graphs_off", "eager"}, explorer.table
    assert explorer.figure is not None and explorer.slo.layout.display == "none"
    explorer.arms.value = ("eager",)
    assert set(explorer.table.arm) == {"eager"} and len(explorer.table) == len(results.loads)
    explorer.view.value = explore.BY_METRIC
    assert "change" in explorer.table.columns


def test_what_it_shows_is_set_as_the_output_widgets_content_never_captured(monkeypatch):
    """Capturing into the Output widget (`with out:`) makes nbclient, under papermill, answer on the kernel's shell
    socket while it waits there for the cell's reply; on a busy machine the reply was then missed until the cell's
    time limit. What the explorer shows is the widget's outputs, set whole."""
    import ipywidgets

    def captured(_):
        raise AssertionError("the explorer captured output into its Output widget")

    monkeypatch.setattr(ipywidgets.Output, "__enter__", captured)
    shown = explore.Explorer(ROOTS, "cuda-graphs")
    kinds = [(o["output_type"], sorted(o.get("data", {}))) for o in shown.out.outputs]
    assert [kind for kind, _ in kinds] == ["display_data", "display_data"], kinds  # the table, the figure
    # (outside a kernel the figure is formatted as text: a kernel's formatter gives its image)
    assert "text/html" in kinds[0][1] and "Figure" in shown.out.outputs[1]["data"]["text/plain"], kinds
    shown.experiment.value = "batch-triangle"
    assert shown.out.outputs[0]["output_type"] == "stream" and shown.answer["sentence"] in shown.out.outputs[0]["text"]
