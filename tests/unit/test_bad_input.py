"""Inputs a hurried user gets wrong: each is a LabkitError whose message names the fix, never a raw Python
error (no engine; stored results come from the committed H200 evidence)."""
import pytest

import labkit as lk
from labkit.analyze import memory, profiling, stats
from labkit.present import plots

W = lk.Workload.closed_loop(4, 16, 4, 2)
H200 = "data/baselines/h200/results"

CASES = {
    "lengths given as text": (lambda: lk.LogNormal("x", 1.0), "LogNormal lengths need"),
    "a rate given as text": (lambda: lk.Poisson("fast"), "Poisson arrivals need"),
    "a file path given to FromLog": (lambda: lk.FromLog("lengths.txt"), "FromLog.read('lengths.txt')"),
    "a length log that is not there": (lambda: lk.FromLog.read("/nonexistent.txt"), "cannot read the length log"),
    "a bare number for a length": (lambda: lk.Workload(4, 16, 4, lk.Burst()), "lk.Fixed(128)"),
    "no arrival process": (lambda: lk.Workload(4, lk.Fixed(16), lk.Fixed(4), None), "arrival must be"),
    "a negative sampling interval": (lambda: lk.Protocol(kv_sample_interval_s=-1), "kv_sample_interval_s"),
    "an arm's knobs as text": (lambda: lk.Experiment("e", {"a": "eager"}, W), "knobs must be a dict"),
    "a model given as a number": (lambda: lk.Experiment("e", {"a": {}}, W, model=123), "model must be a name"),
    "a model name with a typo": (lambda: lk.Experiment("e", {"a": {}}, W, model="tiny-lama"),
                                 "unknown model 'tiny-lama' (did you mean tiny-llama?)"),
    "an experiment named by a number": (lambda: lk.Experiment(5, {"a": {}}, W), "experiment name 5"),
    "a results folder given as a number": (lambda: lk.Experiment("e", {"a": {}}, W, results_dir=5), "results_dir"),
    "a time limit given as text": (lambda: lk.Experiment("e", {"a": {}}, W, arm_timeout_s="10"), "arm_timeout_s"),
    "a comparison with an arm that is not there": (
        lambda: stats.ab_record(lk.load("quickstart", H200), "nope", ["ttft_p50_ms"]), "no complete arm 'nope'"),
    "a latency column that is not there": (
        lambda: plots.latency_cdf(lk.load("quickstart", H200), "ttft"), "no per-request latency 'ttft'"),
    "a trace that is not there": (lambda: profiling.analyse("/nonexistent.json"), "cannot read the profiler trace"),
    "no lengths to fit": (lambda: memory.fitted_max_model_len([], []), "needs request lengths"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_clear_error_names_the_fix(case):
    call, words = CASES[case]
    with pytest.raises(lk.LabkitError) as caught:
        call()
    assert words in str(caught.value)


def test_every_bad_knob_of_an_experiment_is_named_at_once_with_a_close_match():
    arms = {"small": {"max_num_seq": 4}, "eager": {"enforce_eager": "yes"}, "ok": {"max_num_seqs": 8}}
    with pytest.raises(lk.BadParameter) as caught:
        lk.Experiment("e", arms, W, base={"gpu_memory_utilisation": 0.5})
    message = str(caught.value)
    assert "3 problems, nothing started" in message, message
    assert "base: unknown knob 'gpu_memory_utilisation' (did you mean gpu_memory_utilization?)" in message
    assert "arm 'small': unknown knob 'max_num_seq' (did you mean max_num_seqs?)" in message
    assert "arm 'eager': enforce_eager" in message
    assert message.count("gpu_memory_utilisation") == 1, "a base problem is named once, not again for every arm"
    assert "'ok'" not in message


def test_in_a_notebook_the_labs_error_is_its_message_without_the_internal_traceback(monkeypatch):
    """IPython shows an exception's `_render_traceback_` instead of its frames: the lab's errors render as the
    message alone (a traceback only with LABKIT_DEBUG), so the fix is the first thing a user reads."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shown = []
    monkeypatch.setattr(shell, "_showtraceback", lambda etype, value, stb: shown.append("\n".join(stb)))
    monkeypatch.delenv("LABKIT_DEBUG", raising=False)
    shell.run_cell("import labkit as lk\nlk.Experiment('e', {'a': {'max_num_seq': 4}}, "
                   "lk.Workload.closed_loop(4, 16, 4, 2))")
    monkeypatch.setenv("LABKIT_DEBUG", "1")
    shell.run_cell("lk.Experiment('e', {'a': {'max_num_seq': 4}}, lk.Workload.closed_loop(4, 16, 4, 2))")
    brief, full = shown
    assert "did you mean max_num_seqs?" in brief and "LABKIT_DEBUG=1" in brief
    assert "Traceback" not in brief and "experiment.py" not in brief
    assert "experiment.py" in full and "did you mean max_num_seqs?" in full
    shell.run_cell("1 / 0")  # not the lab's: its traceback stays
    assert "Traceback (most recent call last)" in shown[-1] and "ZeroDivisionError" in shown[-1], shown[-1]
