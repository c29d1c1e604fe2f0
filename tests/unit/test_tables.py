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
