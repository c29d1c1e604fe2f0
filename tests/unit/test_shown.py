"""The lab's tables and facts are shown whole and rounded, in HTML and in plain text alike."""
import pandas as pd

import labkit as lk
from labkit.analyze import slo
from labkit.shown import Facts, Whole, number, whole

LAUNCH = "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --max-num-seqs 4 --max-num-batched-tokens 8192 --enforce-eager"


def test_a_long_cell_and_many_columns_are_shown_whole_in_html_and_text():
    frame = whole(pd.DataFrame([{"arm": "small", "launch": LAUNCH, **{f"col{i}": i for i in range(30)}}]))
    for shown in (frame._repr_html_(), repr(frame)):
        assert LAUNCH in shown and "col29" in shown and "..." not in shown
    assert isinstance(frame.round(2), Whole) and isinstance(frame[["arm", "launch"]], Whole)  # derived ones too
    assert "..." in pd.DataFrame(frame)._repr_html_()  # what pandas itself shows: the launch cut


def test_numbers_are_rounded_to_four_significant_digits_never_in_scientific_notation():
    assert [number(v) for v in (398.3909, 73730.2, 0.0123456, 5.0, 0.0)] == ["398.4", "73730", "0.01235", "5", "0"]
    text = repr(whole(pd.DataFrame({"init_s": [398.3909, 12.5], "tok_s": [73730.2, 8.86e-05]})))
    assert "398.4" in text and "73730" in text and "e+" not in text and "e-" not in text and "398.390900" not in text


def test_facts_read_as_a_table_not_a_line_of_braces():
    facts = Facts(predicted_onset=5, observed_onset=None, profile={"bottleneck": "compute-bound", "idle_pct": 6.912})
    assert repr(facts).splitlines()[0].startswith("predicted_onset") and "{" not in repr(facts)
    assert "idle_pct: 6.912" in repr(facts) and "<th" in facts._repr_html_()
    assert facts["predicted_onset"] == 5  # still a dict to the code that reads it


def test_the_labs_tables_come_back_whole():
    results = lk.load("batch-triangle", "data/baselines/h200/results")
    facts = results.facts("init_s", "max_num_seqs")
    assert isinstance(facts, Whole) and "init_s" in repr(facts) and "e+" not in repr(facts)
    assert isinstance(slo.preemption_onset(results, {"max_num_seqs=8": 8}, 640), Facts)
    found = slo.from_points({8: {"tbt_p99_ms": (20.0, 19.0, 21.0)}, 16: {"tbt_p99_ms": (60.0, 55.0, 65.0)}},
                            {"tbt_p99_ms": 50})
    table = found.table()
    assert list(table.max_num_seqs) == [8, 16] and list(table.meets) == ["yes", "no"]
    assert list(table["tbt_p99_ms (upper end)"]) == [21.0, 65.0]


def test_a_headline_carries_its_caption_and_its_detail_in_html_and_text_but_a_derived_frame_does_not():
    from labkit.shown import with_detail
    detail = pd.DataFrame({"arm": ["eager"], "launch": [LAUNCH]})
    shown = with_detail(pd.DataFrame({"arm": ["eager"], "init_s": [398.3909]}), detail, "every launch", "A sentence.")
    page, text = shown._repr_html_(), repr(shown)
    assert page.startswith("<p>A sentence.</p>") and "398.4" in page.split("<details>")[0]
    assert "<details><summary>every launch</summary>" in page and LAUNCH in page.split("<details>")[1]
    assert text.splitlines()[0] == "A sentence." and text.index("398.4") < text.index("every launch:") < text.index(LAUNCH)
    derived = shown[["init_s"]]
    assert isinstance(derived, Whole) and "<details>" not in derived._repr_html_() and LAUNCH not in repr(derived)
    assert "<details>" not in with_detail(detail, None, "", "")._repr_html_()
