"""A real arm on the tiny model with secrets planted in its `environment` knob and in the shell: the worker's
engine gets the real values, and nothing stored in the experiment's folder holds one."""
import json
import re

import pytest

import labkit as lk
from labkit.redact import REDACTED

pytestmark = pytest.mark.engine

SHELL_KEY, SHELL_HF = "sk-ShellApiKey123456", "hf_ShellHubToken98765"
KNOB_KEY = "knobApiKeyValue4242"  # no token shape: found by its name alone
# vLLM starts every log line with VLLM_LOGGING_PREFIX: a secret the engine echoes, so the log shows whether the
# worker's engine got the real value (a redacted one would start the lines with "<redacted>" itself, and no
# value at all would start none)
ECHO = "hf_EchoedPrefix55555"


def test_an_arm_gets_its_secrets_and_its_store_holds_none(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", SHELL_KEY)
    monkeypatch.setenv("HF_TOKEN", SHELL_HF)
    experiment = lk.Experiment(
        "secrets", {"planted": {"max_num_seqs": 4,
                                "environment": {"VLLM_API_KEY": KNOB_KEY, "VLLM_LOGGING_PREFIX": ECHO + " "}}},
        lk.Workload(8, lk.Fixed(16), lk.Fixed(8), lk.Burst()), model="tiny-llama", context="offline",
        protocol=lk.Protocol(trials=1, warmup_requests=2), results_dir=tmp_path)
    results = experiment.run(progress=False)
    assert results.complete_arms == ["planted"]

    stored = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert {"arm.json", "engine.log", "experiment.json", "requests.parquet"} <= {p.name for p in stored}
    for path in stored:
        text = path.read_bytes().decode(errors="replace")
        for secret in (SHELL_KEY, SHELL_HF, KNOB_KEY, ECHO):
            assert secret not in text, f"{secret} in {path.relative_to(tmp_path)}"

    log = (results.path / "arms" / "planted" / "engine.log").read_text()
    echoed = re.findall(rf"^{re.escape(REDACTED)} .*INFO", log, re.MULTILINE)
    assert len(echoed) >= 3, "vLLM in the worker did not prefix its log lines with the knob's value"
    environment = results.environment["planted"]
    # the worker read VLLM_API_KEY from its own environment (the knob's, over the shell's), and recorded only that
    assert environment["tuning_variables"]["VLLM_API_KEY"] == REDACTED
    assert environment["arm_variables"] == ["VLLM_API_KEY", "VLLM_LOGGING_PREFIX"]
    spec = results.arm_spec("planted")
    assert spec["knobs"]["environment"] == {"VLLM_API_KEY": REDACTED, "VLLM_LOGGING_PREFIX": f"{REDACTED} "}
    recorded = json.loads((results.path / "arms" / "planted" / "arm.json").read_text())["recorded_utc"]

    # the same secrets again: the stored (redacted) spec matches, so the arm resumes without an engine start
    again = lk.Experiment("secrets", experiment.arms, experiment.workload, model="tiny-llama", context="offline",
                          protocol=experiment.protocol, results_dir=tmp_path).run(progress=False)
    assert again.complete_arms == ["planted"]
    assert json.loads((again.path / "arms" / "planted" / "arm.json").read_text())["recorded_utc"] == recorded
