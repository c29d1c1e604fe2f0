"""What the environment capture writes: tuning variables kept, secrets never (no engine)."""
import json

from labkit.measure.environment import REDACTED, fingerprint, tuning_variables


def test_secret_looking_values_are_never_recorded():
    env = {"VLLM_API_KEY": "sk-live-123", "VLLM_ATTENTION_BACKEND": "FLASHINFER", "NCCL_P2P_DISABLE": "1",
           "VLLM_HF_TOKEN": "hf_abc", "NCCL_IB_AUTH_SECRET": "x", "HOME": "/root", "OPENAI_API_KEY": "sk-other"}
    assert tuning_variables(env) == {"NCCL_IB_AUTH_SECRET": REDACTED, "NCCL_P2P_DISABLE": "1",
                                     "VLLM_API_KEY": REDACTED, "VLLM_ATTENTION_BACKEND": "FLASHINFER",
                                     "VLLM_HF_TOKEN": REDACTED}


def test_the_fingerprint_holds_the_name_not_the_secret(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-live-123")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    facts = fingerprint()
    assert facts["tuning_variables"]["VLLM_API_KEY"] == REDACTED
    assert facts["tuning_variables"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert "sk-live-123" not in json.dumps(facts)
