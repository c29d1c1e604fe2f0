"""A load search on the real vLLM CPU engine and the tiny model: three searches on one engine (no restart between
load levels): a loose SLO never broken at the top of its range, a tight one broken at its smallest load, and a
Poisson rate far beyond what two sequences at a time can serve, recognised as saturated and ended early."""
import json

import pytest

import labkit as lk
from labkit.analyze import load_search as ls
from labkit.suite.parameters import SMOKE_OVERRIDES  # eager, and no worker process beside the engine core

pytestmark = pytest.mark.engine

PROMPT_LEN, OUTPUT_LEN = 16, 16
FLOOD_RATE, FLOOD_OUTPUT_LEN, FLOOD_SECONDS = 400, 64, 4
CLOSED = dict(clients=(1, 4), prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN, requests=8, per_client=2)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    loads = {
        "loose": lk.LoadSearch({"e2e_p99_ms": 1e6, "tbt_p99_ms": 1e5}, **CLOSED),
        "tight": lk.LoadSearch({"ttft_p99_ms": 1e-3}, **CLOSED),
        # two sequences at a time, 64 tokens each, serve ~25 requests/s on a fast 2-core machine (16 tokens: ~100/s,
        # which a fast CI machine met): 400/s never drains
        "flood": lk.LoadSearch({"e2e_p99_ms": 1e6}, rate=(FLOOD_RATE, 2 * FLOOD_RATE), prompt_len=PROMPT_LEN,
                               output_len=FLOOD_OUTPUT_LEN, requests=8, seconds=FLOOD_SECONDS),
    }
    exp = lk.Experiment("search", {"two": {"max_num_seqs": 2}}, loads, model="tiny-llama",
                        protocol=lk.Protocol(trials=2, warmup_requests=2), base=SMOKE_OVERRIDES,
                        results_dir=tmp_path_factory.mktemp("results"))
    return exp.run(progress=False)


def test_every_probe_is_stored_and_the_answers_say_why(searched):
    results = searched
    arm = results.arms.set_index("arm").loc["two"]
    assert arm.status == "complete", results.facts("cause")
    found = json.loads(arm.load_search)
    loose, tight, flood = (ls.LoadSearchResult.from_dict(found[name]) for name in ("loose", "tight", "flood"))
    # never broken: grown 1, 2, 4 and no silent largest value
    assert [p.level for p in loose.probes] == [1, 2, 4] and loose.answer is None and loose.largest_meeting == 4
    assert "never broken at the largest load" in loose.note and not loose.bracketed
    # broken at once: one probe
    assert [p.level for p in tight.probes] == [1] and tight.answer is None and tight.binding_constraint == "ttft_p99_ms"
    assert "already broken at the smallest load" in tight.note
    # saturated at the smallest rate: ended early, counted as a violation
    assert [p.level for p in flood.probes] == [FLOOD_RATE] and flood.probes[0].saturated and flood.answer is None
    assert flood.binding_constraint == ls.SATURATED
    # every probe's rows are stored under a load of its own, with the trials the protocol asked for
    loads = {"loose.c1", "loose.c2", "loose.c4", "tight.c1", f"flood.rate={FLOOD_RATE}"}
    assert set(results.loads) == loads and set(results.requests.load) == loads
    trials = results.trials.groupby("load").size()
    assert all(trials[f"loose.c{c}"] == 2 for c in (1, 2, 4)) and trials[f"flood.rate={FLOOD_RATE}"] == 1
    flooded = results.trials.set_index("load").loc[f"flood.rate={FLOOD_RATE}"]
    # ended, not waited out
    assert flooded.saturated and flooded.requests < flooded.requests_scheduled == FLOOD_RATE * FLOOD_SECONDS
    stored = results.select("loose.c4").requests
    assert len(stored) == 2 * 8 and (stored.output_tokens == OUTPUT_LEN).all()
    # the probes' measurements are the lab's own intervals over the stored rows
    c4 = loose.probes[-1].measurement["e2e_p99_ms"]
    assert c4[1] <= c4[0] <= c4[2] and c4[0] == pytest.approx(stored.e2e_ms.quantile(0.99), rel=0.05)


def test_one_engine_served_every_load_and_the_search_reads_back_as_a_table(searched):
    results = searched
    log = results.arm_file("two", "engine.log").read_text(errors="replace")
    assert log.count("Initializing a V1 LLM engine") == 1
    table = results.load_search()
    assert len(table) == 5 and set(table.search) == {"loose", "tight", "flood"}
    assert table.loc[table.search == "flood", "saturated"].tolist() == ["yes"]
    assert (table.loc[table.search == "loose", "meets"] == "yes").all()
    assert "[" in table.loc[table.search == "loose", "e2e_p99_ms (limit 1000000)"].iloc[0]
    assert "two/loose" in table.attrs["answers"] and "never broken" in table.attrs["answers"]["two/loose"]
