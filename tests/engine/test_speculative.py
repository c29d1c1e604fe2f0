"""Speculative decoding by prompt lookup on the real vLLM CPU engine: the knob reaches vLLM as its
speculative config, and every trial records vLLM's own draft and acceptance counters."""
import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.suite.parameters import SMOKE_OVERRIDES

pytestmark = pytest.mark.engine

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def speculated(tmp_path_factory):
    # greedy tokens of random weights fall into loops within a few dozen tokens: the lookup finds n-grams to draft
    exp = lk.Experiment("speculative", {"k0": {}, "ngram_k3": {"speculative": NGRAM}},
                        lk.Workload.closed_loop(8, 32, 48, clients=2), model="tiny-llama", base=SMOKE_OVERRIDES,
                        protocol=lk.Protocol(trials=2, warmup_requests=2, temperature=0.0),
                        results_dir=tmp_path_factory.mktemp("results"))
    return exp.run(progress=False)


def test_the_speculating_arm_drafts_and_records_what_was_accepted(speculated):
    assert speculated.complete_arms == ["k0", "ngram_k3"], speculated.facts("cause")
    trials = speculated.trials.set_index("arm")
    assert (trials.loc["k0", "spec_drafts"] == 0).all() and trials.loc["k0", "spec_acceptance_pct"].isna().all()
    drafted = trials.loc["ngram_k3"]
    assert (drafted.spec_drafts > 0).all(), drafted.spec_drafts.tolist()
    assert (drafted.spec_draft_tokens <= 3 * drafted.spec_drafts).all()  # at most k tokens a draft
    assert (drafted.spec_accepted_tokens <= drafted.spec_draft_tokens).all()
    assert drafted.spec_acceptance_pct.between(0, 100).all()
    assert drafted.spec_accepted_length.between(1, 1 + 3).all()
    # every token still counted once: speculation changes how many steps, not how many tokens
    assert (speculated.requests.output_tokens == 48).all()
    table = stats.summarize(speculated, ["spec_acceptance_pct", "spec_accepted_length"]).set_index(["arm", "metric"])
    assert table.loc[("ngram_k3", "spec_accepted_length"), "value"] >= 1
    assert table.loc[("k0", "spec_acceptance_pct"), ["value", "ci_low", "ci_high"]].isna().all()  # drafted nothing
    print("n-gram k=3 on random weights:", table.loc["ngram_k3"][["value", "ci_low", "ci_high"]].round(2).to_dict("index"))
