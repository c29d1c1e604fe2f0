"""The real vLLM CPU engine on the tiny model: what the runner records, and that it measures real effects."""
import json
import os
import re

import numpy as np
import pytest

import labkit as lk
from labkit.analyze import stats
from labkit.measure.worker import REMEASURE_SHARE
from labkit.redact import REDACTED

pytestmark = pytest.mark.engine

OUTPUT_LEN, PROMPT_LEN = 16, 32


# secrets planted in the shell and in seqs16's `environment` knob: its engine gets the real values, and nothing
# stored in the experiment's folder holds one
SHELL_KEY, SHELL_HF = "sk-ShellApiKey123456", "hf_ShellHubToken98765"
KNOB_KEY = "knobApiKeyValue4242"  # no token shape: found by its name alone
# vLLM starts every log line with VLLM_LOGGING_PREFIX: a secret the engine echoes, so the log shows whether the
# worker's engine got the real value (a redacted one would start the lines with "<redacted>" itself, and no
# value at all would start none)
ECHO = "hf_EchoedPrefix55555"
SEQS16_VARIABLES = {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_API_KEY": KNOB_KEY, "VLLM_LOGGING_PREFIX": ECHO + " "}


@pytest.fixture(scope="module")
def batch_experiment(tmp_path_factory):
    """max_num_seqs 1 vs 16 on an offline burst, as the offline LLM class runs it: one knob changed. seqs16
    also sets variables in its own worker (vLLM's default logging level, an API key and a log prefix that the
    API server and the log use: nothing measured changes)."""
    return lk.Experiment(
        "batch", {"seqs1": {"max_num_seqs": 1}, "seqs16": {"max_num_seqs": 16, "environment": SEQS16_VARIABLES}},
        lk.Workload(24, lk.Fixed(PROMPT_LEN), lk.Fixed(OUTPUT_LEN), lk.Burst()),
        model="tiny-llama", context="offline", protocol=lk.Protocol(trials=2, warmup_requests=4),
        base={"enforce_eager": True},  # the batch effect without two compile waits (the notebooks compile)
        results_dir=tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def batch_results(batch_experiment):
    with pytest.MonkeyPatch.context() as shell:  # the secrets of the shell the experiment runs from
        shell.setenv("VLLM_API_KEY", SHELL_KEY)
        shell.setenv("HF_TOKEN", SHELL_HF)
        return batch_experiment.run(progress=False)


def test_the_engine_runs_the_deployment_context_the_plan_shows(batch_experiment, batch_results):
    """What vLLM resolved inside the worker is what the plan computed for the offline context, and differs
    from what vllm serve would have run (CPU: 4096 batched tokens offline, 2048 served)."""
    arms = batch_results.arms.set_index("arm")
    plan = batch_experiment.plan_table().set_index("arm")
    for arm in ("seqs1", "seqs16"):
        assert arms.loc[arm, "context"] == "offline" and arms.loc[arm, "usage_context"] == "LLM_CLASS"
        assert arms.loc[arm, "max_num_batched_tokens"] == plan.loc[arm, "max_num_batched_tokens"]
    assert arms.loc["seqs16", "max_num_batched_tokens"] == 4096  # vllm serve's 2048: test_serve_fidelity
    sampling = json.loads(arms.loc["seqs1", "sampling"])
    assert sampling["temperature"] == 1.0  # the synthetic model's generation config names none: vLLM's default
    assert json.loads((batch_results.path / "experiment.json").read_text())["context"] == "offline"


def test_every_arm_completes_with_exact_token_counts(batch_results):
    assert batch_results.complete_arms == ["seqs1", "seqs16"]
    req = batch_results.requests
    assert len(req) == 2 * 2 * 24
    assert (req.output_tokens == OUTPUT_LEN).all()
    assert (req.prompt_tokens == PROMPT_LEN).all()
    assert (req.finish_reason == "length").all()


def test_timings_are_positive_and_monotonic(batch_results):
    req = batch_results.requests
    assert (req.ttft_ms > 0).all()
    assert (req.e2e_ms >= req.ttft_ms).all()
    for stamps, gaps in zip(req.token_s, req.itl_ms):
        assert len(stamps) == OUTPUT_LEN and len(gaps) == OUTPUT_LEN - 1
        assert np.all(np.diff(stamps) >= 0)
        assert np.all(np.asarray(gaps) >= 0)
    tpot = (req.e2e_ms - req.ttft_ms) / (OUTPUT_LEN - 1)
    assert np.allclose(tpot, req.tpot_ms)


def test_larger_batch_has_higher_throughput(batch_results):
    verdict = stats.compare(batch_results, "seqs1", "seqs16", "output_tok_s")
    assert verdict.rel_change > 0.5, verdict.sentence()
    # the other test process can load the host during one arm's trials more than the other's: then the verdict
    # is rightly withheld, and the caution says why
    if verdict.verdict == stats.TOO_NOISY:
        assert "host load" in verdict.caution and verdict.too_noisy, verdict.sentence()
    else:
        assert verdict.verdict == stats.BETTER, verdict.sentence()


def test_engine_counters_and_trials_recorded(batch_results):
    trials = batch_results.trials
    assert len(trials) == 4
    assert (trials.engine_generation_tokens == 24 * OUTPUT_LEN).all()
    assert (trials.engine_prompt_tokens == 24 * PROMPT_LEN).all()
    assert (trials.preemptions == 0).all()
    # the engine's own processes are not "other load": counted, they alone would fill every core during a trial;
    # what other work adds depends on the machine (on an idle one it stays under one core, on a busy CI host not)
    assert trials.host_other_cores.between(0, os.cpu_count()).all(), trials.host_other_cores.tolist()
    assert (trials.host_other_cores < os.cpu_count() - 0.25).any(), trials.host_other_cores.tolist()
    # a trial measured again because the host was busy says so, and its arm keeps the discarded loads
    arms = batch_results.arms.set_index("arm")
    for arm in ("seqs1", "seqs16"):
        mine, discarded = trials[trials.arm == arm], json.loads(arms.loc[arm, "remeasured"])
        assert arms.loc[arm, "trials_remeasured"] == int((mine.remeasured > 0).sum()) <= len(discarded) <= 2
        heavy = arms.loc[arm, "remeasure_above_cores"]  # more than half the cores it may run on
        assert heavy >= REMEASURE_SHARE * batch_results.environment[arm]["cpu_count"]
        assert all(d["host_other_cores"] > heavy for d in discarded), discarded


def test_resolved_config_recorded(batch_results):
    arms = batch_results.arms.set_index("arm")
    assert arms.loc["seqs1", "max_num_seqs"] == 1 and arms.loc["seqs16", "max_num_seqs"] == 16
    for arm in ("seqs1", "seqs16"):
        assert arms.loc[arm, "attention_backend"] == "CPU_ATTN"
        assert arms.loc[arm, "kv_cache_blocks"] > 0
        assert arms.loc[arm, "kv_cache_tokens"] == arms.loc[arm, "kv_cache_tokens_logged"]
        assert arms.loc[arm, "max_concurrency"] > 0
        assert arms.loc[arm, "init_s"] > 0
        assert arms.loc[arm, "cuda_graphs"] is False or arms.loc[arm, "cuda_graphs"] == False  # noqa: E712
    env = batch_results.environment["seqs1"]
    assert env["platform"] == "cpu" and env["packages"]["torch"].startswith("2.")
    meta = json.loads((batch_results.path / "arms" / "seqs1" / "arm.json").read_text())
    assert meta["spec"]["engine_args"]["max_num_seqs"] == 1
    assert (batch_results.path / "arms" / "seqs1" / "engine.log").stat().st_size > 0


def test_the_store_names_no_host_and_no_path_of_this_machine(batch_results):
    """Every file of a whole stored experiment (results, facts, environment, engine logs) read back."""
    import gzip
    import re
    import socket
    from pathlib import Path

    from labkit import settings

    def readable(path):
        """A file's text: compressed files decompressed; tables (numbers) and embedded images (base64) left out,
        since a short host name such as "vm" occurs in any binary data by chance."""
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.suffix == ".gz" else b"" if path.suffix == ".parquet" else raw
        return re.sub(rb"(?:[A-Za-z0-9+/=]|\\n){200,}", b"", raw)

    machine = {"hostname": rf"\b{re.escape(socket.gethostname())}\b", "checkout": re.escape(str(settings.ROOT)),
               "home": re.escape(str(Path.home())) + "/", "store": re.escape(str(batch_results.path))}
    files = [p for p in batch_results.path.rglob("*") if p.is_file()]
    assert any(p.name == "engine.log" for p in files) and any(p.suffix == ".parquet" for p in files)
    found = {(str(p.relative_to(batch_results.path)), what) for p in files for what, pattern in machine.items()
             if re.search(pattern.encode(), readable(p))}
    assert not found, sorted(found)


def test_an_arm_variable_is_set_in_its_own_worker_only_and_recorded(batch_experiment, batch_results):
    import os
    from labkit.analyze import audit
    assert "VLLM_LOGGING_LEVEL" not in os.environ  # the experiment's process never had it
    own, other = batch_results.environment["seqs16"], batch_results.environment["seqs1"]
    assert own["tuning_variables"]["VLLM_LOGGING_LEVEL"] == "INFO" and own["arm_variables"] == sorted(SEQS16_VARIABLES)
    assert "VLLM_LOGGING_LEVEL" not in other["tuning_variables"] and other["arm_variables"] == []
    assert any("VLLM_LOGGING_LEVEL=INFO is set by this arm's environment knob" in f
               for f in audit.flags(batch_results, "seqs16"))
    config = audit.effective_config(batch_results, "seqs16").set_index("setting")
    assert config.loc["VLLM_LOGGING_LEVEL", "source"] == "this arm's environment knob"
    launch = batch_experiment.plan_table(defaults=False).set_index("arm").launch
    assert "VLLM_LOGGING_LEVEL=INFO" in launch["seqs16"].partition("# with ")[2] and "VLLM_LOGGING" not in launch["seqs1"]


def test_an_arm_gets_its_secrets_and_its_store_holds_none(batch_experiment, batch_results):
    stored = sorted(p for p in batch_results.path.rglob("*") if p.is_file())
    assert {"arm.json", "engine.log", "experiment.json", "requests.parquet"} <= {p.name for p in stored}
    for path in stored:
        text = path.read_bytes().decode(errors="replace")
        for secret in (SHELL_KEY, SHELL_HF, KNOB_KEY, ECHO):
            assert secret not in text, f"{secret} in {path.relative_to(batch_results.path)}"

    log = (batch_results.path / "arms" / "seqs16" / "engine.log").read_text()
    echoed = re.findall(rf"^{re.escape(REDACTED)} .*INFO", log, re.MULTILINE)
    assert len(echoed) >= 3, "vLLM in the worker did not prefix its log lines with the knob's value"
    # the worker read VLLM_API_KEY from its own environment (the knob's, over the shell's), and recorded only that
    assert batch_results.environment["seqs16"]["tuning_variables"]["VLLM_API_KEY"] == REDACTED
    knobs = batch_results.arm_spec("seqs16")["knobs"]
    assert knobs["environment"] == {"VLLM_API_KEY": REDACTED, "VLLM_LOGGING_LEVEL": "INFO",
                                    "VLLM_LOGGING_PREFIX": f"{REDACTED} "}
    recorded = json.loads((batch_results.path / "arms" / "seqs16" / "arm.json").read_text())["recorded_utc"]

    # the same secrets again: the stored (redacted) spec matches, so the arm resumes without an engine start
    again = lk.Experiment("batch", batch_experiment.arms, batch_experiment.workload, model="tiny-llama",
                          context="offline", base=batch_experiment.base, protocol=batch_experiment.protocol,
                          results_dir=batch_experiment.results_dir).run(progress=False, only=["seqs16"])
    assert again.complete_arms == ["seqs1", "seqs16"]
    assert json.loads((again.path / "arms" / "seqs16" / "arm.json").read_text())["recorded_utc"] == recorded


def test_an_ended_engine_leaves_nothing_in_the_temporary_folder(batch_results):
    """vLLM's own shutdown removes its file store and sockets; the lab ends engines without it, and removes them
    itself: the file store each arm's engine logged is gone, and the lab's socket folder is not recorded as a
    variable vLLM set."""
    import tempfile

    from labkit.measure import rendezvous
    for arm in ("seqs1", "seqs16"):
        log = (batch_results.path / "arms" / arm / "engine.log").read_text(errors="replace")
        stores = rendezvous.file_stores(log.replace("<tmp>", tempfile.gettempdir()))  # the store writes paths portably
        assert stores, f"{arm}'s engine logged no file store: vLLM's rendezvous changed, and this check with it"
        assert not [store for store in stores if store.exists()]
        environment = batch_results.environment[arm]
        assert rendezvous.VARIABLE not in {**environment["set_by_vllm"], **environment["tuning_variables"]}
