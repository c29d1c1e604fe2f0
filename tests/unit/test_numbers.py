"""No impossible number is accepted: every numeric field of the public dataclasses, every numeric argument of the
public functions and every numeric command-line option refuses NaN, the infinities, booleans, non-integers where
a whole number is meant and values out of range, with a LabkitError that names the parameter, and accepts a valid
value. The dataclasses are walked by their fields, so a new numeric field fails here until it is given a rule.
(No engine: the CLI's commands are replaced by stand-ins that fail the test if they are ever reached.)"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import labkit as lk
from labkit import cli, diagnose, templates
from labkit.analyze import memory, request_shape, slo, stats
from labkit.measure import peaks
from labkit.present import explore, plots
from labkit.errors import LabkitError
from labkit.measure.platform import Platform
from labkit.measure import resolve, serve_parse
from labkit.spec.knobs import KNOBS, check_knobs, pool_arms
from labkit.spec.numbers import check_number, check_numbers, number_problem
from labkit.suite import baseline

NAN, INF = float("nan"), float("inf")
# what each kind of number refuses (the valid value of each parameter is in its own table below)
REFUSED = {
    "count": [NAN, INF, -INF, True, -1, 0, 2.5, 2.0, "4"],
    "count0": [NAN, INF, -INF, True, -1, 2.5, "4"],
    "positive": [NAN, INF, -INF, True, -1, 0, "4"],
    "nonneg": [NAN, INF, -INF, True, -1, "4"],
    "fraction": [NAN, INF, -INF, True, -1, 0, 1.5, "0.5"],
    "probability": [NAN, INF, -INF, True, 0, 1, 1.5],
    "nonneg_or_none": [NAN, INF, -INF, True, -1, "4"],
    "positive_or_none": [NAN, INF, -INF, True, -1, 0, "4"],
    "count_or_none": [NAN, INF, -INF, True, -1, 0, 2.5, "4"],
    "median": [NAN, INF, -INF, True, -1, 0, 0.5],
}

W = lk.Workload.closed_loop(4, 16, 4, 2)
CPU = Platform("cpu", (0, 32, 0))

# every public dataclass with numbers: how to build a valid one, and each numeric field's kind and a valid value
DATACLASSES = {
    lk.Fixed: (dict(n=8), {"n": ("count", 16)}),
    lk.Uniform: (dict(low=1, high=64), {"low": ("count", 2), "high": ("count", 8)}),
    lk.LogNormal: (dict(median=100, sigma=0.5, low=1, high=None),
                   {"median": ("median", 50.5), "sigma": ("nonneg", 0.0), "low": ("count", 2),
                    "high": ("count_or_none", 400)}),
    lk.Concurrency: (dict(n=2), {"n": ("count", 3)}),
    lk.Poisson: (dict(rate=2.0), {"rate": ("positive", 0.5), "burstiness": ("positive", 0.3)}),
    lk.Periodic: (dict(first_s=0.0, interval_s=1.0), {"first_s": ("nonneg", 0.1), "interval_s": ("positive", 0.2)}),
    lk.Workload: (dict(num_requests=4, prompt_len=lk.Fixed(8), output_len=lk.Fixed(4)),
                  {"num_requests": ("count", 5), "shared_prefix_len": ("count0", 16), "num_prefixes": ("count", 2),
                   "seed": ("count0", 7)}),
    lk.Conversation: (dict(sessions=2, turns=2, system=8, message=lk.Fixed(4), output_len=lk.Fixed(4)),
                      {"sessions": ("count", 3), "turns": ("count", 3), "system": ("count0", 0),
                       "concurrency": ("count", 2), "think_time_s": ("nonneg", 0.5), "seed": ("count0", 3)}),
    lk.Segment: (dict(name="doc", tokens=8, scope="shared"), {"tokens": ("count", 9), "variants": ("count", 2)}),
    lk.Protocol: (dict(), {"trials": ("count", 2), "warmup_requests": ("count0", 0),
                           "kv_sample_interval_s": ("positive", 0.5), "profile_requests": ("count0", 2),
                           "temperature": ("nonneg_or_none", 0.7), "min_trials": ("count", 2),
                           "max_trials": ("count", 4), "precision": ("positive", 0.05),
                           "budget_s": ("positive_or_none", 120.0), "decide_threshold": ("nonneg", 0.1)}),
    lk.ModelShape: (dict(name="m", architecture="LlamaForCausalLM", model_type="llama", hidden_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, intermediate_size=128, vocab_size=64,
                         max_position_embeddings=256),
                    {"hidden_size": ("count", 128), "num_layers": ("count", 2), "num_heads": ("count", 4),
                     "num_kv_heads": ("count", 2), "intermediate_size": ("count", 64), "vocab_size": ("count", 128),
                     "max_position_embeddings": ("count", 512), "rope_theta": ("positive", 500000.0)}),
    templates.Hardware: (dict(kind="cuda", name="NVIDIA H200", compute_capability="9.0"),
                         {"memory_gib": ("positive_or_none", 140.0), "gpu_count": ("count0", 2)}),
    lk.LoadSearch: (dict(slos={"tbt_p99_ms": 50}, clients=(1, 8), prompt_len=8, output_len=4),
                    {"requests": ("count", 16), "per_client": ("count", 2), "seconds": ("positive", 5.0),
                     "steps_per_doubling": ("count", 2), "seed": ("count0", 3)}),
    lk.Experiment: (dict(name="e", arms={"a": {}}, workload=W, model="tiny-llama", platform=CPU),
                    {"arm_timeout_s": ("positive", 60.0)}),
}
# fields that hold numbers but are not themselves one (checked element by element, below)
NOT_SCALARS = {(lk.FromLog, "values")}


def _numeric(annotation: str) -> bool:
    return any(word in annotation.replace("|", " ").replace("[", " ").split() for word in ("int", "float"))


def test_every_numeric_field_of_a_public_dataclass_has_a_rule():
    public = [getattr(lk, n) for n in lk.__all__ if dataclasses.is_dataclass(getattr(lk, n))] + [templates.Hardware]
    missing = [f"{cls.__name__}.{f.name}" for cls in public for f in dataclasses.fields(cls)
               if _numeric(str(f.type)) and (cls, f.name) not in NOT_SCALARS
               and f.name not in DATACLASSES.get(cls, ({}, {}))[1]]
    assert not missing, f"give these numeric fields a rule in DATACLASSES: {missing}"


FIELD_CASES = [(cls, name, bad) for cls, (_, rules) in DATACLASSES.items() for name, (kind, _) in rules.items()
               for bad in REFUSED[kind]]


@pytest.mark.parametrize("cls,name,bad", FIELD_CASES,
                         ids=[f"{c.__name__}.{n}={b!r}" for c, n, b in FIELD_CASES])
def test_an_impossible_field_is_refused_naming_it(cls, name, bad, tmp_path):
    valid, _ = DATACLASSES[cls]
    extra = {"results_dir": tmp_path} if cls is lk.Experiment else {}
    with pytest.raises(LabkitError, match=name):
        cls(**{**valid, **extra, name: bad})


@pytest.mark.parametrize("cls", list(DATACLASSES), ids=lambda c: c.__name__)
def test_every_valid_field_value_is_accepted(cls, tmp_path):
    valid, rules = DATACLASSES[cls]
    extra = {"results_dir": tmp_path} if cls is lk.Experiment else {}
    for name, (_, value) in rules.items():
        made = cls(**{**valid, **extra, name: value})
        assert getattr(made, name) == value
    # numpy's numbers are numbers too (a length drawn with numpy, a rate from a DataFrame)
    for name, (kind, value) in rules.items():
        if kind.startswith("count") and value is not None:
            assert getattr(cls(**{**valid, **extra, name: np.int64(value)}), name) == value


def test_a_constructor_names_every_impossible_number_at_once():
    with pytest.raises(LabkitError) as caught:
        lk.Protocol(trials=0, warmup_requests=True, kv_sample_interval_s=NAN, profile_requests=-1, temperature=INF)
    for name in ("trials", "warmup_requests", "kv_sample_interval_s", "profile_requests", "temperature"):
        assert name in str(caught.value)
    with pytest.raises(LabkitError) as caught:
        lk.Conversation(0, 2.5, -1, lk.Fixed(4), lk.Fixed(4), concurrency=True, think_time_s=INF)
    for name in ("sessions", "turns", "system", "concurrency", "think_time_s"):
        assert name in str(caught.value)


@pytest.mark.parametrize("bad", [NAN, INF, True, 0, -3, 2.5])
def test_every_logged_length_must_be_a_positive_whole_number(bad):
    with pytest.raises(LabkitError, match="FromLog"):
        lk.FromLog((4, bad))
    assert lk.FromLog((4, np.int64(5))).values == (4, 5)


@pytest.mark.parametrize("text", ["nan", "inf", "2.5", "-1", "0"])
def test_a_length_log_with_an_impossible_line_is_refused(tmp_path, text):
    log = tmp_path / "lengths.txt"
    log.write_text(f"12\n{text}\n")
    with pytest.raises(LabkitError, match="lengths.txt"):
        lk.FromLog.read(log)
    log.write_text("12\n30.0\n")  # a whole number written as a float, as exports do
    assert lk.FromLog.read(log).values == (12, 30)


# ---- knobs -------------------------------------------------------------------------------------------
KNOB_RULES = {"max_num_seqs": "count", "max_num_batched_tokens": "count", "kv_cache_memory_bytes": "count",
              "max_model_len": "count", "tensor_parallel_size": "count", "data_parallel_size": "count",
              "api_server_count": "count", "gpu_memory_utilization": "fraction"}
KNOB_VALID = {"max_num_seqs": 8, "max_num_batched_tokens": 4096, "kv_cache_memory_bytes": 1 << 30,
              "max_model_len": 2048, "tensor_parallel_size": 1, "data_parallel_size": 1, "api_server_count": 1,
              "gpu_memory_utilization": 1}


def test_every_numeric_knob_has_a_rule():
    numeric = {name for name, knob in KNOBS.items() if knob.check(1) is None and knob.check(True) is not None}
    assert numeric == set(KNOB_RULES)


KNOB_CASES = [(knob, bad) for knob, kind in KNOB_RULES.items() for bad in REFUSED[kind]]


@pytest.mark.parametrize("knob,bad", KNOB_CASES, ids=[f"{k}={b!r}" for k, b in KNOB_CASES])
def test_an_impossible_knob_value_is_refused_naming_it(knob, bad):
    with pytest.raises(LabkitError, match=knob):
        check_knobs({knob: bad})
    check_knobs({knob: KNOB_VALID[knob]})


@pytest.mark.parametrize("sizes", [[1, True], [1, 2.5], [NAN], [0, 4], [-1]])
def test_capture_sizes_are_positive_whole_numbers(sizes):
    with pytest.raises(LabkitError, match="cudagraph_capture_sizes"):
        check_knobs({"cudagraph_capture_sizes": sizes})
    check_knobs({"cudagraph_capture_sizes": [1, 2, np.int64(4)]})


# ---- functions ---------------------------------------------------------------------------------------
SAMPLE, TTFT = [np.array([10.0, 12.0, 11.0]), np.array([9.0, 13.0, 12.0])], stats.metric("ttft_p50_ms")
FUNCTIONS = {
    # name: (call with one numeric argument, the argument's name in the message, its kind, a valid value)
    "SLO limit (check_slos)": (lambda v: slo.check_slos({"tbt_p99_ms": v}), "tbt_p99_ms", "positive", 50),
    "SLO search grid": (lambda v: slo.search(lambda x: {}, [1, v], {"tbt_p99_ms": 50}), "grid", "count", None),
    "SLO limit (parse_slo)": (lambda v: diagnose.parse_slo([f"tpot_p50_ms={v}"]),
                              "tpot_p50_ms", "positive", 40),
    "comparison threshold": (lambda v: stats.compare_groups(SAMPLE, SAMPLE, TTFT, threshold=v), "threshold",
                             "nonneg", 0.05),
    "confidence level": (lambda v: stats.compare_groups(SAMPLE, SAMPLE, TTFT, confidence=v), "confidence",
                         "probability", 0.9),
    "baseline threshold": (lambda v: baseline.compare_runs("/nonexistent-run", "/nonexistent-base", v), "threshold",
                           "nonneg", None),
    "diagnosis rate": (lambda v: diagnose.user_workload(8, 16, 4, 2, rate=v),
                       "rate", "nonneg", 2.0),
    "diagnosis clients": (lambda v: diagnose.user_workload(8, 16, 4, v),
                          "clients", "count", 4),
    "implied defaults time limit": (lambda v: resolve.implied_defaults("offline", {}, timeout_s=v), "timeout_s",
                                    "positive", None),  # a valid one starts vLLM's configuration in a process
    "serve parse time limit": (lambda v: serve_parse.parse_serve("vllm serve tiny-llama", {}, timeout_s=v),
                               "timeout_s", "positive", None),
    "fitted quantile": (lambda v: memory.fitted_max_model_len([10, 20], [5, 5], quantile=v), "quantile",
                        "fraction", 0.5),
    "fitted multiple": (lambda v: memory.fitted_max_model_len([10, 20], [5, 5], multiple=v), "multiple", "count", 16),
    "summary confidence": (lambda v: stats.summarize(UNREAD, ["ttft_p50_ms"], confidence=v), "confidence",
                           "probability", None),
    "given memory bandwidth": (lambda v: peaks.detect_peaks(v, 10.0), "mem_bw_gbs", "positive", 100.0),
    "given GEMM rate": (lambda v: peaks.detect_peaks(100.0, v), "tflops", "positive", 10.0),
    "CPU peak copy size": (lambda v: peaks.measure_cpu_peaks(v), "size_mib", "count", None),
    "CPU peak repeats": (lambda v: peaks.measure_cpu_peaks(8, v), "repeats", "count", None),
    "device peak copy size": (lambda v: peaks.measure_device_peaks(copy_mib=v), "copy_mib", "count0", None),
    "device peak GEMM size": (lambda v: peaks.measure_device_peaks(gemm_n=v), "gemm_n", "count0", None),
    "device peak repeats": (lambda v: peaks.measure_device_peaks(repeats=v), "repeats", "count", None),
    "explorer SLO limit": (lambda v: explore.slo_answer(UNREAD, "tbt_p99_ms", v), "tbt_p99_ms", "positive", None),
    "batch triangle SLO line": (lambda v: plots.batch_triangle(UNREAD, {}, slo=v), "slo", "positive", None),
    "prompt cut start": (lambda v: request_shape.cut_table(SWEEP, v, [16]), "current_prompt", "count", 64),
    "prompt cut": (lambda v: request_shape.cut_table(SWEEP, 64, [v]), "cut", "count", 16),
    "pool fitted length": (lambda v: pool_arms(CPU, v, [0.5], [64]), "fitted_max_model_len", "count", 1024),
    "pool utilization": (lambda v: pool_arms(CPU, 1024, [v], [64]), "utilization", "fraction", 0.9),
    "pool KV MiB": (lambda v: pool_arms(CPU, 1024, [0.5], [v]), "cpu_kv_mib", "count", 128),
}
SWEEP = pd.DataFrame({"prompt_tokens": [32, 64, 128], "ttft_p50_ms": [5.0, 8.0, 14.0], "request_s": [9.0, 8.0, 6.0]})

UNREAD = object()  # stands for stored results: an impossible number is refused before they are read
# parse_slo reads text: "4" is its valid spelling of a limit, not a number given as text
FUNCTION_CASES = [(case, bad) for case, (_, _, kind, _) in FUNCTIONS.items() for bad in REFUSED[kind]
                  if not (isinstance(bad, str) and case == "SLO limit (parse_slo)")]


@pytest.mark.parametrize("case,bad", FUNCTION_CASES, ids=[f"{c}={b!r}" for c, b in FUNCTION_CASES])
def test_an_impossible_argument_is_refused_naming_it(case, bad):
    call, name, _, _ = FUNCTIONS[case]
    with pytest.raises(LabkitError, match=name):
        call(bad)


@pytest.mark.parametrize("case", [c for c, (_, _, _, ok) in FUNCTIONS.items() if ok is not None])
def test_a_valid_argument_is_accepted(case):
    call, _, _, valid = FUNCTIONS[case]
    call(valid)


def test_the_shared_check_words_a_problem_once_and_says_what_is_wanted():
    assert check_number("clients", 2.5, integer=True, minimum=1) == "clients must be a whole number >= 1, got 2.5"
    assert check_number("rate", 0, minimum=0, exclusive_minimum=True) == "rate must be a finite number > 0, got 0"
    assert check_number("temperature", None, minimum=0, allow_none=True) is None
    assert number_problem(np.float32(0.5), minimum=0, maximum=1) is None
    assert number_problem(np.bool_(True), integer=True) is not None
    assert math.isnan(NAN) and number_problem(NAN) is not None
    with pytest.raises(LabkitError) as caught:
        check_numbers("here", {"a": (NAN, {}), "b": (1, {}), "c": (True, {"integer": True})})
    assert "a must" in str(caught.value) and "c must" in str(caught.value) and "b must" not in str(caught.value)


# ---- the command line ----------------------------------------------------------------------------------
# every numeric option: the command that takes it, its kind, and a valid value
CLI_OPTIONS = {
    ("diagnose", "--prompt-len"): ("count", "64"), ("diagnose", "--output-len"): ("count", "16"),
    ("diagnose", "--clients"): ("count", "2"), ("diagnose", "--requests"): ("count", "8"),
    ("diagnose", "--rate"): ("nonneg", "2.5"), ("diagnose", "--trials"): ("count", "2"),
    ("suite", "--threshold"): ("nonneg", "0.1"), ("compare", "--threshold"): ("nonneg", "0.1"),
    ("suite", "--jobs"): ("count", "1"),
    ("lab", "--port"): ("port", "8899"),
}
CLI_REFUSED = {"count": ["nan", "inf", "-inf", "True", "-1", "0", "2.5"],
               "nonneg": ["nan", "inf", "-inf", "True", "-1", "NaN", "Infinity"],
               "port": ["nan", "inf", "True", "-1", "0", "2.5", "70000"]}
POSITIONAL = {"diagnose": ["vllm serve tiny-llama"], "compare": ["some-run"], "suite": [], "lab": []}


def test_every_numeric_option_has_a_rule():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    numeric = {(command, action.option_strings[-1]) for command, sub in commands.items() for action in sub._actions
               if action.type in (int, float, cli.number_text)
               or (isinstance(action.default, (int, float)) and not isinstance(action.default, bool))}
    assert numeric == set(CLI_OPTIONS)
    ruled = {(command, action.option_strings[-1]) for command, sub in commands.items() for action in sub._actions
             if action.dest in cli.NUMERIC_OPTIONS and action.option_strings}
    assert ruled == set(CLI_OPTIONS)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every command's work replaced by a stand-in: an impossible option must fail before it is reached."""
    reached = []
    monkeypatch.setitem(cli.COMMANDS, "diagnose", lambda args: reached.append("diagnose"))
    monkeypatch.setattr(cli, "compare_and_report", lambda *a, **k: reached.append("compare") or 0)
    monkeypatch.setattr("labkit.suite.notebooks.run_suite", lambda *a, **k: reached.append("suite"))
    monkeypatch.setattr("labkit.present.lab.lab_command", lambda *a, **k: reached.append("lab") or ["true"])
    monkeypatch.setattr(cli.os, "execv", lambda *a: None)
    return reached


CLI_CASES = [(cmd, opt, bad) for (cmd, opt), (kind, _) in CLI_OPTIONS.items() for bad in CLI_REFUSED[kind]]


@pytest.mark.parametrize("command,option,bad", CLI_CASES, ids=[f"{c} {o} {b}" for c, o, b in CLI_CASES])
def test_an_impossible_option_exits_2_naming_it_before_anything_runs(command, option, bad, nothing_runs, capsys):
    assert cli.main([command, *POSITIONAL[command], f"{option}={bad}"]) == cli.EXIT_BAD_INPUT
    assert option in capsys.readouterr().err
    assert nothing_runs == []


@pytest.mark.parametrize("command,option", list(CLI_OPTIONS))
def test_a_valid_option_reaches_its_command(command, option, nothing_runs, monkeypatch):
    monkeypatch.setattr("labkit.suite.notebooks.parse_overrides", lambda items: {})
    monkeypatch.setattr("labkit.suite.journal.append", lambda entries: None)
    monkeypatch.setattr("labkit.suite.journal.entries_for_run", lambda *a: [])
    monkeypatch.setattr("labkit.suite.runs.suite_meta", lambda run: {"environment": {}})
    monkeypatch.setattr("labkit.suite.notebooks.statuses", lambda run: [])
    cli.main([command, *POSITIONAL[command], f"{option}={CLI_OPTIONS[(command, option)][1]}"])
    assert nothing_runs and nothing_runs[0] == command


@pytest.mark.parametrize("limit", ["nan", "inf", "-5", "0"])
def test_an_impossible_slo_limit_on_the_command_line_exits_2(limit, nothing_runs, capsys, monkeypatch):
    monkeypatch.undo()  # the real _diagnose parses the SLO; the diagnosis itself stays a stand-in
    monkeypatch.setattr(diagnose, "diagnose", lambda *a, **k: nothing_runs.append("diagnose"))
    assert cli.main(["diagnose", "vllm serve tiny-llama", "--slo", f"tpot_p50_ms={limit}"]) == cli.EXIT_BAD_INPUT
    assert "tpot_p50_ms" in capsys.readouterr().err
    assert nothing_runs == []



NOTEBOOK = "notebooks/01_diagnose.ipynb"  # rate is a float parameter there, clients an int one
# (-Infinity is left out: argparse reads a word starting with "-" that is no number as an option)
NOTEBOOK_CASES = [("rate", bad) for bad in ("NaN", "Infinity", "-1", "true", '"2"')] + [
    ("clients", bad) for bad in ("NaN", "Infinity", "-1", "2.5", "true", "2.0")]


@pytest.mark.parametrize("name,bad", NOTEBOOK_CASES, ids=[f"{n}={b}" for n, b in NOTEBOOK_CASES])
def test_an_impossible_notebook_parameter_exits_2_before_any_kernel(name, bad, monkeypatch, capsys, tmp_path):
    import papermill
    started = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: started.append(a))
    assert cli.main(["run", NOTEBOOK, "-p", name, bad, "-o", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert f"{name} must be" in capsys.readouterr().err
    assert started == []
    assert cli.main(["run", NOTEBOOK, "-p", name, "2", "-o", str(tmp_path)]) == 0 and len(started) == 1
