"""Protocol(trials="auto") on the real vLLM CPU engine: one tiny-model arm, one engine start, runs as many
trials as the stopping rule asks, records why it stopped, and the stored trials agree with that reason."""
import pytest

import labkit as lk
from labkit.analyze.stopping import REASONS, reference_values, stop_reason

pytestmark = pytest.mark.engine


def test_an_adaptive_arm_stops_for_a_reason_its_stored_trials_bear_out(tmp_path):
    protocol = lk.Protocol(trials="auto", warmup_requests=2, budget_s=None)  # no budget: the reason is reproducible
    exp = lk.Experiment("adaptive", {"eager": {"enforce_eager": True}},
                        lk.Workload(16, lk.Fixed(32), lk.Fixed(16), lk.Burst()), model="tiny-llama",
                        context="offline", protocol=protocol, results_dir=tmp_path)
    results = exp.run(progress=False)
    facts = results.facts("stopped", "trials_run", "cause").set_index("arm").loc["eager"]
    assert facts.status == "complete", facts.cause
    assert facts.stopped in REASONS
    assert protocol.min_trials <= facts.trials_run <= protocol.max_trials
    assert results.trials.trial.tolist() == list(range(facts.trials_run))  # the facts count what was stored
    # the rule, asked again on the stored per-trial values, stops at the same trial for the same reason
    values = reference_values(results, "eager")["default"]
    asked = [stop_reason({m: v[:n] for m, v in values.items()}, protocol) for n in range(1, facts.trials_run + 1)]
    assert asked == [None] * (facts.trials_run - 1) + [facts.stopped]
    print(f"adaptive arm: {facts.trials_run} trials (fixed protocol default was 3), stopped {facts.stopped}; "
          f"per-trial output tok/s {[round(v) for v in values['output_tok_s']]}")
