"""The effective-configuration audit on a stored experiment written here (no engine)."""
import dataclasses
import json

import pandas as pd
import pytest

from labkit.analyze import audit
from labkit.errors import BadParameter
from labkit.store import load

CANDIDATES = json.dumps(["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"])
GPU_ENV = {"platform": "cuda", "tuning_variables": {}}


def store(tmp_path, arms: dict[str, dict], environment: dict[str, dict] | None = None):
    """An experiment folder as the lab writes it: experiment.json and arms/<arm>/arm.json."""
    root = tmp_path / "results" / "audit"
    (root / "arms").mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps({"arms": {a: {} for a in arms}}))
    for arm, facts in arms.items():
        (root / "arms" / arm).mkdir()
        meta = {"arm": arm, "facts": {"attention_candidates": CANDIDATES, **facts},
                "spec": {"engine_args": {"max_num_seqs": 8, **facts.get("asked", {})}},
                "environment": (environment or {}).get(arm, GPU_ENV)}
        meta["facts"].pop("asked", None)
        (root / "arms" / arm / "arm.json").write_text(json.dumps(meta))
        for table in ("requests", "trials"):
            pd.DataFrame({"trial": [0]}).to_parquet(root / "arms" / arm / f"{table}.parquet")
    return load("audit", tmp_path / "results")


CLEAN = {"attention_backend": "FLASH_ATTN", "compiled": True, "cuda_graphs": True, "cudagraph_mode": "FULL_AND_PIECEWISE",
         "enforce_eager": False, "compile_mode": "VLLM_COMPILE"}


def test_a_clean_arm_has_nothing_to_question(tmp_path):
    results = store(tmp_path, {"default": CLEAN})
    assert audit.flags(results, "default") == []
    assert audit.audit_table(results).to_dict("records") == [{"arm": "default", "flag": "nothing to question"}]


def test_leftover_eager_graphs_off_and_a_fallback_backend_are_flagged(tmp_path):
    results = store(tmp_path, {
        "default": CLEAN,
        "eager": {**CLEAN, "enforce_eager": True, "compiled": False, "cuda_graphs": False, "cudagraph_mode": "NONE"},
        "no_graphs": {**CLEAN, "cudagraph_mode": "NONE", "cuda_graphs": False},
        "triton": {**CLEAN, "attention_backend": "TRITON_ATTN"},
    })
    assert any("enforce_eager is on" in f for f in audit.flags(results, "eager"))
    assert not any("torch.compile is off" in f for f in audit.flags(results, "eager"))  # said once, by eager
    assert audit.flags(results, "no_graphs") == [
        "CUDA graphs are off (cudagraph_mode NONE): every decode step pays kernel-launch overhead"]
    assert audit.flags(results, "triton") == ["attention backend TRITON_ATTN is not the platform's first choice FLASH_ATTN"]
    assert set(audit.audit_table(results).arm) == {"default", "eager", "no_graphs", "triton"}


def test_a_user_set_variable_is_flagged_but_an_image_version_is_not(tmp_path):
    env = {"platform": "cuda", "tuning_variables": {"VLLM_ATTENTION_BACKEND": "XFORMERS", "NCCL_VERSION": "2.21"}}
    results = store(tmp_path, {"default": CLEAN}, {"default": env})
    assert audit.flags(results, "default") == [
        "environment variable VLLM_ATTENTION_BACKEND=XFORMERS is set: it changes vLLM's behaviour outside the "
        "engine arguments"]


def test_graphs_off_on_a_cpu_is_not_a_finding(tmp_path):
    cpu = {"platform": "cpu", "tuning_variables": {}}
    results = store(tmp_path, {"default": {**CLEAN, "cudagraph_mode": None, "cuda_graphs": False}}, {"default": cpu})
    assert audit.flags(results, "default") == []


def test_effective_config_shows_resolved_asked_and_environment(tmp_path):
    env = {"platform": "cuda", "tuning_variables": {"NCCL_P2P_DISABLE": "1"}}
    results = store(tmp_path, {"default": {**CLEAN, "asked": {"enforce_eager": False}}}, {"default": env})
    table = audit.effective_config(results, "default").set_index("setting")
    assert table.loc["attention_backend", "source"] == "resolved by vLLM"
    assert table.loc["compiled", "source"] == "measured by the lab"
    assert table.loc["asked: max_num_seqs", "value"] == "8" and table.loc["asked: enforce_eager", "value"] == "false"
    assert table.loc["NCCL_P2P_DISABLE", ["value", "source"]].tolist() == ["1", "environment"]


def test_an_arm_without_results_is_a_clear_error(tmp_path):
    results = store(tmp_path, {"default": CLEAN})
    with pytest.raises(BadParameter, match="no complete results"):
        audit.flags(results, "missing")
    assert isinstance(audit.audit_table(results), pd.DataFrame)


def test_a_hand_set_backend_and_a_model_length_far_above_the_load_are_flagged(tmp_path):
    forced = {**CLEAN, "attention_backend": "TRITON_ATTN", "requested_attention_backend": "TRITON_ATTN",
              "attention_candidates": None, "max_model_len": 8192}
    results = store(tmp_path, {"current": forced})
    # the lab measured 500 + 256 token requests (one longer one, above the P99)
    tokens = pd.DataFrame({"arm": "current", "prompt_tokens": [500] * 199 + [3000], "output_tokens": 256})
    results = dataclasses.replace(results, requests=tokens)
    found = audit.flags(results, "current")
    assert found[0] == ("attention backend TRITON_ATTN is set by hand: vLLM's own first choice here shows only in an "
                        "arm that lets it choose")
    assert found[1].startswith("max_model_len 8,192 is 11x the workload's P99 request (756 tokens)")  # not the 3,256
    near = dataclasses.replace(results, arms=results.arms.assign(max_model_len=2048))
    assert not any("max_model_len" in f for f in audit.flags(near, "current"))  # under 4x: nothing to question
