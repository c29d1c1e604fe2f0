"""Secrets are redacted in everything the lab writes or shows, whatever brought them in (the shell, an arm's
`environment` knob, engine arguments, a `vllm serve` command): the redaction itself, then each writer and printer."""
import contextlib
import io
import json
import types

import pandas as pd
import pytest

import labkit as lk
from labkit.errors import BadParameter, StoreConflict
from labkit.files import make_portable, write_json_atomic
from labkit.redact import REDACTED, redact, redact_text, secret_name, secret_values
from labkit.store import ExperimentStore

KNOB_SECRET = "knobSecretValue42"  # no token shape: found by its name only
SHELL_SECRET = "sk-ShellSecret12345"
TOKEN = "hf_EngineArgToken99"
LOAD = lk.Workload(4, lk.Fixed(8), lk.Fixed(4), lk.Burst())


def _no_secret(text, *secrets):
    text = str(text)
    leaked = [s for s in (KNOB_SECRET, SHELL_SECRET, TOKEN, *secrets) if s in text]
    assert not leaked, f"{leaked} in {text[:300]!r}"


@pytest.mark.parametrize("name", ["HF_TOKEN", "VLLM_API_KEY", "WANDB_API_KEY", "OPENAI_API_KEY", "hf_token",
                                  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "DB_PASSWORD",
                                  "NCCL_IB_AUTH_SECRET", "--api-key", "--hf-token", "apiKey", "x-api-key",
                                  "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "Authorization", "private_key"])
def test_secret_names(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["max_num_batched_tokens", "tokenizer", "tokenizer_mode", "hardware_key",
                                  "KV_CACHE_DTYPE", "kv_cache_memory_bytes", "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
                                  "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "VLLM_USE_FASTOKENS", "output_tokens",
                                  "prefix_cache_hits", "VLLM_ENABLE_PREGRAD_PASSES", "AWS_REGION", "AWS_CA_BUNDLE",
                                  "PWD", "key", "sort_key", "hf_overrides", "", None, 3])
def test_names_that_are_not_secret(name):
    assert not secret_name(name)


@pytest.mark.parametrize("text, expected", [
    ("HF_TOKEN=abc123xyz vllm serve m", "HF_TOKEN=<redacted> vllm serve m"),
    ("export VLLM_API_KEY='two words'", "export VLLM_API_KEY='<redacted>'"),
    ("LLM(model='m', hf_token='secretvalue')", "LLM(model='m', hf_token='<redacted>')"),
    ("vllm serve m --api-key abc --max-num-seqs 4", "vllm serve m --api-key <redacted> --max-num-seqs 4"),
    ("vllm serve m --hf-token=abc", "vllm serve m --hf-token=<redacted>"),
    ("vllm serve m --hf-token --max-num-seqs 4", "vllm serve m --hf-token --max-num-seqs 4"),  # a flag, no value
    ('{"VLLM_API_KEY": "abc", "VLLM_X": "1"}', '{"VLLM_API_KEY": "<redacted>", "VLLM_X": "1"}'),
    ("{'hf_token': 'abc', 'seed': 0}", "{'hf_token': '<redacted>', 'seed': 0}"),
    ('"source": "{\\"VLLM_API_KEY\\": \\"abc\\"}"', '"source": "{\\"VLLM_API_KEY\\": \\"<redacted>\\"}"'),  # JSON in JSON
    ("{'VLLM_API_KEY': 1234}", "{'VLLM_API_KEY': <redacted>}"),
    ("{'hf_token': True}", "{'hf_token': True}"),  # vLLM's "use the cached token", no secret
    ("a prefix hf_AbCdEf123456 in a log line", "a prefix <redacted> in a log line"),
    ("key sk-proj-Ab12Cd34Ef56 used", "key <redacted> used"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123 and AKIAABCDEFGHIJKLMNOP", "<redacted> and <redacted>"),
    ("Authorization: Bearer abc.def.ghi12345", "Authorization: Bearer <redacted>"),
])
def test_redact_text_forms(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # twice changes nothing more


@pytest.mark.parametrize("text", [
    "max_num_batched_tokens=2048 hf_overrides={} tokenizer=/models/m", "vllm serve m --tokenizer t --max-num-seqs 4",
    '{"hardware_key": "h200", "prefix_cache_hits": 3}', "sk-learn hf_config and hf_abc", "TOKEN_THRESHOLD=8",
    "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD=1024 KV_CACHE_DTYPE=fp8"])
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


def test_the_values_of_secret_environment_variables_are_found_without_their_name(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "plainShellValue77")
    monkeypatch.setenv("VLLM_X", "notSecretValue77")
    assert redact_text("downloading with plainShellValue77 and notSecretValue77") == \
        "downloading with <redacted> and notSecretValue77"
    assert redact_text("short: abc", secrets=["abc"]) == "short: abc"  # too short to replace everywhere
    assert redact_text("a log echoes otherSecret99", secrets=["otherSecret99"]) == "a log echoes <redacted>"


def test_redact_walks_dicts_and_lists_and_uses_the_objects_own_secrets():
    spec = {"knobs": {"environment": {"VLLM_API_KEY": KNOB_SECRET, "VLLM_X": "1"}, "max_num_seqs": 4},
            "engine_args": {"hf_token": True, "tokenizer": "t"}, "log_tail": [f"echo {KNOB_SECRET}"], "n": (1, 2)}
    out = redact(spec)
    assert out == {"knobs": {"environment": {"VLLM_API_KEY": REDACTED, "VLLM_X": "1"}, "max_num_seqs": 4},
                   "engine_args": {"hf_token": True, "tokenizer": "t"}, "log_tail": [f"echo {REDACTED}"], "n": (1, 2)}
    assert spec["knobs"]["environment"]["VLLM_API_KEY"] == KNOB_SECRET  # the real value stays for the worker
    assert secret_values(spec) == {KNOB_SECRET}
    assert redact(out) == out


# ---- writers -------------------------------------------------------------------------------------------------

def _grep_tree(root, *secrets):
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        _no_secret(path.read_bytes().decode(errors="replace"), *secrets)


def _arm_workdir(store, arm):
    work = store.new_workdir(arm)
    pd.DataFrame({"trial": [0], "ttft_ms": [1.0]}).to_parquet(work / "requests.parquet")
    pd.DataFrame({"trial": [0]}).to_parquet(work / "trials.parquet")
    (work / "engine.log").write_text(f"non-default args: {{'hf_token': '{TOKEN}'}}\nVLLM_API_KEY={KNOB_SECRET}\n"
                                     f"an echo of {KNOB_SECRET} without its name\n")
    (work / "progress.jsonl").write_text(json.dumps({"stage": "x", "note": KNOB_SECRET}) + "\n")
    return work


SPEC = {"knobs": {"environment": {"VLLM_API_KEY": KNOB_SECRET}}, "engine_args": {"hf_token": TOKEN},
        "variables": {"VLLM_API_KEY": KNOB_SECRET}}


def test_the_store_writes_no_secret_and_a_rerun_with_the_same_secret_resumes(tmp_path):
    store = ExperimentStore("exp", tmp_path)
    store.begin({"arms": {"a": SPEC["knobs"]}})
    store.commit_arm("a", _arm_workdir(store, "a"), {"arm": "a", "spec": SPEC, "facts": {}})
    store.record_failure("b", _arm_workdir(store, "b"), {"arm": "b", "spec": SPEC, "cause": "engine_error",
                                                         "log_tail": f"VLLM_API_KEY={KNOB_SECRET}"})
    store.record_skip("c", {"arm": "c", "reason": f"environment={SPEC['knobs']['environment']}", "spec": SPEC})
    _grep_tree(tmp_path)
    stored = json.loads((tmp_path / "exp" / "arms" / "a" / "arm.json").read_text())["spec"]
    assert stored["knobs"]["environment"]["VLLM_API_KEY"] == REDACTED
    assert "<redacted> without its name" in (tmp_path / "exp" / "arms" / "a" / "engine.log").read_text()
    assert store.check_resumable("a", SPEC)  # compared as stored: redacted
    with pytest.raises(StoreConflict):  # what is not secret still counts
        store.check_resumable("a", {**SPEC, "engine_args": {"hf_token": TOKEN, "seed": 1}})


def test_json_files_and_rewritten_text_files_are_redacted(tmp_path):
    write_json_atomic(tmp_path / "x.json", {"env": {"HF_TOKEN": "abcdefgh"}, "error": f"VLLM_API_KEY={KNOB_SECRET}"},
                      secrets=[SHELL_SECRET])
    assert json.loads((tmp_path / "x.json").read_text()) == {"env": {"HF_TOKEN": REDACTED},
                                                             "error": f"VLLM_API_KEY={REDACTED}"}
    (tmp_path / "out.ipynb").write_text(json.dumps({"cells": [{"outputs": [{"text": f"key {SHELL_SECRET}"}]}]}))
    (tmp_path / "engine.log").write_text(f"echo {KNOB_SECRET}\n")
    make_portable(tmp_path, secrets=[KNOB_SECRET])
    _grep_tree(tmp_path)


def test_the_journal_files_entries_redacted(tmp_path):
    from labkit import settings
    from labkit.suite import journal
    with settings.use(settings.current().replace(journal=tmp_path / "journal.jsonl")):
        shown = journal.append([{"change": f"a: {json.dumps(SPEC['knobs'])}", "evidence": f"--hf-token {TOKEN}"}])
        _no_secret(shown.to_string())
        _no_secret(journal.read().to_string())
    _grep_tree(tmp_path)


def test_a_suite_run_report_and_its_resume_hold_no_secret(tmp_path):
    from labkit.present.report import write_report
    from labkit.suite.notebooks import run_suite
    overrides = {"environment": {"VLLM_API_KEY": KNOB_SECRET}}
    write_json_atomic(tmp_path / "suite.json", {"profile": "cpu-smoke", "hardware_key": "cpu", "notebooks": [],
                                                "overrides": overrides, "environment": {}})
    write_json_atomic(tmp_path / "a.status.json", {"status": "failed", "error": f"echo {KNOB_SECRET}"},
                      secrets=secret_values(overrides))
    write_report(tmp_path, statuses=[{"notebook": "a", "status": "failed", "error": f"VLLM_API_KEY={KNOB_SECRET}"}])
    _grep_tree(tmp_path)
    # a resumed run needs the real value again, and is told so; the same secret given again is the same run
    with pytest.raises(BadParameter, match="hold a secret.*same --override"):
        run_suite(run_dir=tmp_path, progress=False)
    with pytest.raises(BadParameter, match="started with overrides"):
        run_suite(run_dir=tmp_path, progress=False, overrides={"enforce_eager": True})


# ---- printers ------------------------------------------------------------------------------------------------

def test_plans_launch_lines_and_reprs_show_no_secret_and_say_where_to_set_it(tmp_path):
    knobs = {"max_num_seqs": 4, "environment": {"VLLM_API_KEY": KNOB_SECRET, "VLLM_LOGGING_PREFIX": TOKEN}}
    exp = lk.Experiment("p", {"a": knobs}, LOAD, model="tiny-llama", engine_args={"hf_token": TOKEN},
                        results_dir=tmp_path)
    table = exp.plan_table(defaults=False)
    with pd.option_context("display.max_colwidth", None):
        _no_secret(table.to_string())
    assert table.launch[0].endswith("  # secrets are not shown: set VLLM_API_KEY, VLLM_LOGGING_PREFIX in your shell; "
                                    "add its value after --hf-token")
    for shown in (exp, exp.plans()):
        _no_secret(repr(shown))
    plan = exp.plans()["a"]
    assert plan.variables["VLLM_API_KEY"] == KNOB_SECRET  # what the worker gets is the real value
    from labkit.measure.worker import ArmJob
    _no_secret(repr(ArmJob("a", {"hf_token": TOKEN}, {}, {}, 10, "cpu", arm_variables=plan.variables)))
    from labkit.spec.launch import launch_command
    offline = launch_command("offline", "m", {"hf_token": TOKEN}, {"VLLM_API_KEY": KNOB_SECRET})
    assert offline == ("LLM(model='m')  # secrets are not shown: set VLLM_API_KEY in your shell; "
                       "add its value after hf_token=")


def test_error_messages_quote_no_secret():
    with pytest.raises(BadParameter) as refused:
        lk.Experiment("x", {"a": {"environment": {"HF_TOKEN": "hf_abc123"}}}, LOAD)
    _no_secret(str(refused.value), "hf_abc123")
    assert "HF_TOKEN" in str(refused.value)
    _no_secret(BadParameter(f"got {{'VLLM_API_KEY': {KNOB_SECRET!r}}}"))


def test_a_diagnosis_recommends_a_launch_that_says_where_the_secret_goes(tmp_path):
    from labkit import settings
    from labkit.diagnose import Diagnosis, candidate_changes
    from labkit.measure.platform import Platform
    from labkit.spec.serve_command import Launch
    from labkit.suite import journal
    knobs = {"max_num_seqs": 4, "environment": {"VLLM_API_KEY": KNOB_SECRET, "NCCL_P2P_DISABLE": "1"}}
    launch = Launch(f"VLLM_API_KEY={KNOB_SECRET} NCCL_P2P_DISABLE=1 vllm serve m --max-num-seqs 4 --hf-token {TOKEN}",
                    "m", knobs, {}, {"VLLM_API_KEY": SHELL_SECRET})
    changes = candidate_changes(knobs, Platform("cuda", (0, 26, 0), ("NVIDIA H200",), "9.0"), LOAD)
    assert "without_NCCL_P2P_DISABLE" in changes and "without_VLLM_API_KEY" not in changes  # a secret is no knob
    ranked = pd.DataFrame([{"arm": arm, "why": why, "tpot_p50_ms": 1.0, "verdict": "better"}
                           for arm, (_, why) in changes.items()])
    found = Diagnosis(launch, "tpot_p50_ms", types.SimpleNamespace(name="d", path=tmp_path / "d"), [], {}, ranked,
                      pd.DataFrame(), knobs, 1, "keep what you have")
    assert found.recommended_command() == ("NCCL_P2P_DISABLE=1 vllm serve m --max-num-seqs 4  "
                                           "# secrets are not shown: set VLLM_API_KEY in your shell")
    for shown in (repr(found), repr(launch), launch.table().to_string()):
        _no_secret(shown)
    with settings.use(settings.current().replace(journal=tmp_path / "journal.jsonl")):
        journal.append(found.journal_entries())
    _grep_tree(tmp_path)


def test_the_command_line_prints_no_secret(monkeypatch, capsys):
    from labkit import cli
    monkeypatch.setenv("VLLM_API_KEY", SHELL_SECRET)
    monkeypatch.setenv("VLLM_LOGGING_PREFIX", TOKEN)
    assert cli.main(["env"]) == 0
    printed = capsys.readouterr().out
    _no_secret(printed)
    assert json.loads(printed)["tuning_variables"]["VLLM_API_KEY"] == REDACTED
    # a command that is no `vllm serve` is refused quoting it, before vLLM or an engine
    assert cli.main(["diagnose", f"VLLM_API_KEY={KNOB_SECRET} vlm serve m"]) == cli.EXIT_BAD_INPUT
    refused = capsys.readouterr().err
    assert "VLLM_API_KEY=<redacted> vlm serve m" in refused
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli._print({"hf_token": TOKEN})
    _no_secret(out.getvalue())
