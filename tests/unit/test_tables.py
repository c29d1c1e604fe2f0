"""Tables for people: intervals in the cell, arms in the experiment's order."""
import pandas as pd

from labkit.present.tables import cell, with_intervals


def test_arms_keep_the_experiment_order_and_every_cell_holds_its_interval():
    summary = pd.DataFrame([{"arm": a, "metric": m, "value": v, "ci_low": v * 0.9, "ci_high": v * 1.1}
                            for a, v in (("max_num_seqs=4", 100.0), ("max_num_seqs=32", 400.0))
                            for m in ("output_tok_s", "ttft_p99_ms")])
    table = with_intervals(summary, ["max_num_seqs=4", "max_num_seqs=32"])
    assert list(table.columns) == ["max_num_seqs=4", "max_num_seqs=32"]  # not sorted as text
    assert list(table.index) == ["output_tok_s", "ttft_p99_ms"]
    assert table.loc["output_tok_s", "max_num_seqs=32"] == "400 [360, 440]" == cell(400.0, 360.0, 440.0)


def test_a_long_record_becomes_one_row_per_load_and_compared_arm():
    from labkit.present.tables import record_table
    record = pd.DataFrame([
        {"load": "c8", "arm": "default", "metric": "tpot_p50_ms", "value": 5.0, "ci_low": 4.8, "ci_high": 5.2},
        {"load": "c8", "arm": "eager", "metric": "tpot_p50_ms", "value": 16.0, "ci_low": 15.0, "ci_high": 17.0,
         "change": 2.2, "change_ci_low": 2.0, "change_ci_high": 2.4, "verdict": "worse"}])
    table = record_table(record)
    assert list(table.index) == [("c8", "eager")]  # the reference arm's values are in the detail, not padded here
    assert table.loc[("c8", "eager"), "tpot_p50_ms vs default"] == "+220.0% [+200.0%, +240.0%] worse"
    detail = table._detail
    assert list(detail.index) == [("c8", "default", "tpot_p50_ms"), ("c8", "eager", "tpot_p50_ms")]
    assert detail.iloc[0].tolist() == ["5.0 [4.8, 5.2]", "reference", ""]
    assert detail.iloc[1].tolist() == ["16 [15, 17]", "+220.0% [+200.0%, +240.0%]", "worse"]


def test_a_record_with_nothing_compared_shows_its_values_with_no_detail():
    from labkit.present.tables import record_table
    record = pd.DataFrame([{"load": "c8", "arm": "default", "metric": "tpot_p50_ms", "value": 5.0, "ci_low": 4.8,
                            "ci_high": 5.2, "change": float("nan"), "verdict": None}])
    table = record_table(record)
    assert table.loc[("c8", "default"), "tpot_p50_ms"] == "5.0 [4.8, 5.2]"
    assert "nothing was compared with default" in repr(table) and "<details>" not in table._repr_html_()


def test_conclusions_are_one_row_per_load_and_arm_with_the_advice_coloured():
    from labkit.analyze.stats import conclusion
    from labkit.present.tables import conclusions
    rows = [("c1", "eager", "tpot_p50_ms", "worse"), ("c1", "eager", "output_tok_s", "worse"),
            ("c1", "narrow", "tpot_p50_ms", "no detectable difference"),
            ("c64", "eager", "tpot_p50_ms", "better"), ("c64", "eager", "ttft_p99_ms", "worse"),
            ("c64", "narrow", "output_tok_s", "better")]
    record = pd.DataFrame([{"load": "c1", "arm": "default", "metric": "tpot_p50_ms", "verdict": None}]
                          + [dict(zip(("load", "arm", "metric", "verdict"), r)) for r in rows])
    styler = conclusions(record, "default")
    table = styler.data
    assert list(zip(table.load, table.arm)) == [("c1", "eager"), ("c1", "narrow"), ("c64", "eager"), ("c64", "narrow")]
    assert list(table.advice) == ["keep default", "keep default", "choose by your SLO", "consider it"]
    assert table.iloc[0]["worse on"] == "output_tok_s, tpot_p50_ms" and table.iloc[2]["better on"] == "tpot_p50_ms"
    assert "caution" not in table  # no machine moved: no empty column
    assert "#c8e6c9" in styler.to_html()  # "consider it" is coloured
    one_load = record[record.load == "c64"]
    assert conclusion(one_load, "default") == ("eager trades ttft_p99_ms for tpot_p50_ms: choose by your SLO; "
                                               "narrow beats default on output_tok_s and loses on nothing: consider it")


def test_a_value_is_rounded_to_what_its_interval_supports_never_in_scientific_notation():
    assert cell(73730.2, 73729.9, 73730.6) == "73730.2 [73729.9, 73730.6]"
    assert cell(73730.2, 73730.2, 73730.2) == "73730 [73730, 73730]"  # no spread: four significant digits
    assert cell(5.0123, 4.91, 5.11) == "5.0 [4.9, 5.1]"
    assert cell(0.000123, 0.000121, 0.000125) == "0.000123 [0.000121, 0.000125]"
    assert cell(float("nan"), 1.0, 2.0) == "n/a" and cell(3.0, float("nan"), float("nan")) == "3.000"


def test_a_coloured_table_reads_as_text_too_not_as_an_object_repr():
    from labkit.present.tables import coloured
    shown = coloured(pd.DataFrame({"arm": ["eager"], "verdict": ["worse"]}), "verdict")
    assert "Styler" not in repr(shown) and "eager" in repr(shown) and "worse" in repr(shown)
    assert "#ffcdd2" in shown._repr_html_()


CHANGE_CELL = r"[+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\] (better|worse|no detectable difference|too noisy to judge here)"


def test_the_cuda_graphs_record_reads_as_a_short_headline_with_every_value_behind_it():
    """The committed H200 record (4 loads x 4 arms x 4 metrics = 64 rows): a headline of one row per load and
    compared arm, each change cell with its interval and the record's own verdict, the full table behind it."""
    import re

    import labkit as lk
    from labkit.analyze import stats
    from labkit.present.tables import record_table
    from labkit.shown import whole

    results = lk.load("cuda-graphs", "data/baselines/h200/results")
    metrics = ["output_tok_s", "tpot_p50_ms", "ttft_p99_ms", "tbt_p99_ms"]
    record = stats.ab_record(results, "default", metrics)
    table = record_table(record)
    compared = [a for a in results.complete_arms if a != "default"]
    assert list(table.index) == [(load, arm) for load in results.loads for arm in compared]  # 12 rows, not 64
    assert list(table.columns) == [f"{m} vs default" for m in metrics]  # no caution: the machine stayed put
    verdicts = record.set_index(["load", "arm", "metric"]).verdict
    for (load, arm), row in table.iterrows():
        for m in metrics:
            shown = row[f"{m} vs default"]
            assert re.fullmatch(CHANGE_CELL, shown), shown
            assert shown.endswith(" " + verdicts[(load, arm, m)]), (shown, verdicts[(load, arm, m)])
    assert table.loc[("batch1", "graphs_off"), "output_tok_s vs default"].startswith("-81.9% [")
    text, page = repr(table), table._repr_html_()
    for shown in (text, page):
        assert not re.search(r"\b(nan|NaN|None)\b", shown) and "Styler" not in shown and "..." not in shown
    # HTML: the headline, then the whole record collapsed under it
    head, behind = page.split("<details>")
    assert head.count("<tr") == 2 + len(table)  # two header rows (columns, index names), one per compared arm
    assert behind.startswith("<summary>Every value, change and verdict (64 rows") and behind.endswith("</details>")
    detail = table._detail
    assert len(detail) == len(record) == 64 and detail._repr_html_() in behind
    assert (detail.iloc[:, 1] == "reference").sum() == 16  # the reference arm's rows say so, 4 loads x 4 metrics
    # text: the caption, the headline, then the detail, so the text form loses nothing
    assert text.startswith("Change against default in % with its 95 % interval, and the verdict")
    assert text.index(repr(whole(pd.DataFrame(table)))) < text.index(repr(detail))
    for value in ("202.0 [201.3, 202.3]", "8446 [8396, 8502]"):  # the reference's values, only in the detail
        assert value in text and value in behind and value not in head
