"""The SLO search run on an experiment: one engine start per point it needs, stored points reused (no engine:
the experiment and its measurements are stand-ins)."""
import pandas as pd

from labkit import sweeps


def test_settings_read_from_the_store_are_not_counted_as_engine_starts(monkeypatch):
    # an experiment whose store already holds 64 (a resumed sweep): the search evaluates 32 and 64 (as on
    # the H200) but starts only one engine
    class Store:
        def completed_spec(self, arm):
            return {} if arm == "max_num_seqs=64" else None

    class Results:
        def __init__(self, arm):
            self.complete_arms, self.arm = [arm], arm

    class Sweep:
        arms = {f"max_num_seqs={b}": {} for b in (8, 16, 32, 64, 128)}
        store = Store()

        def run(self, progress, only):
            return Results(only[0])

    def summarize(results, metrics):
        tbt = 5 + 0.5 * int(results.arm.split("=")[1])
        return pd.DataFrame([{"arm": results.arm, "metric": "tbt_p99_ms", "value": tbt, "ci_low": tbt, "ci_high": tbt}])

    monkeypatch.setattr("labkit.analyze.stats.summarize", summarize)
    result = sweeps.search_max_num_seqs(Sweep(), [8, 16, 32, 64, 128], {"tbt_p99_ms": 30}, progress=False)
    assert result.largest_meeting == 32 and sorted(result.measured) == [32, 64]
    assert (result.engine_starts, result.from_store) == (1, 1)
    assert "1 engine starts and 1 settings read from the store" in result.sentence()
