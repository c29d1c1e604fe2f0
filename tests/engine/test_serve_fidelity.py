"""Fidelity against the real vLLM (CPU build): an arm's launch is what `vllm serve` parses from the command line
the lab writes for it, and vLLM resolves the defaults of the arm's deployment context. No engine starts."""
import dataclasses
import json
import subprocess
import sys

import pytest

import labkit as lk

pytestmark = pytest.mark.engine

ARMS = {"default": {}, "eager": {"enforce_eager": True}, "batch8": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
        "no_prefix_cache": {"enable_prefix_caching": False}, "fp8_kv": {"kv_cache_dtype": "fp8"}}
# fields where vLLM's serve parser leaves None and the dataclass a falsy default: neither reaches a text model
HARMLESS = {"mm_device_do_normalize", "enable_lora", "reasoning_parser_plugin"}

PARSE = r"""
import dataclasses, json, shlex, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from labkit.measure.resolve import engine_launch

def resolved(args, usage):
    c = args.create_engine_config(usage)
    return [c.scheduler_config.max_num_seqs, c.scheduler_config.max_num_batched_tokens,
            c.cache_config.cache_dtype, c.cache_config.enable_prefix_caching, c.model_config.enforce_eager,
            str(c.compilation_config.mode), list(c.compilation_config.cudagraph_capture_sizes or [])]

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
serve = ServeSubcommand().subparser_init(parser.add_subparsers())
built = {}
for arm, (command, engine_args) in json.loads(sys.stdin.read()).items():
    words = shlex.split(command)
    assert words[:2] == ["vllm", "serve"], words
    cli = serve.parse_args(words[2:])
    cli.model = cli.model_tag
    served = AsyncEngineArgs.from_cli_args(cli)
    lab, usage = engine_launch(engine_args, "serve")
    differs = sorted(f.name for f in dataclasses.fields(lab) if getattr(lab, f.name) != getattr(served, f.name)
                     and (getattr(lab, f.name) or getattr(served, f.name)))
    built[arm] = (lab, usage, served, differs)
# resolved only once every arm is compared: resolving mutates default objects the dataclass shares
out = {arm: {"usage": usage.name, "differs": differs, "lab": resolved(lab, usage),
             "served": resolved(served, UsageContext.OPENAI_API_SERVER)}
       for arm, (lab, usage, served, differs) in built.items()}
print(json.dumps(out))
"""


def test_every_arm_is_the_vllm_serve_command_the_plan_shows(tmp_path):
    # the fp8 KV arm is planned as on a CPU with AVX-512 (its launch is parsed here, no engine starts)
    platform = dataclasses.replace(lk.current_platform(), cpu_features=("avx512f",))
    exp = lk.Experiment("fidelity", ARMS, lk.Workload(4, lk.Fixed(16), lk.Fixed(8), lk.Burst()), model="tiny-llama",
                        results_dir=tmp_path, platform=platform)
    plan = exp.plan_table(defaults=False).set_index("arm")
    ref = lk.resolve_model("tiny-llama")
    job = {arm: [plan.loc[arm, "launch"], {"model": ref.model, **exp.arm_spec(exp.plans()[arm], ref)["engine_args"]}]
           for arm in ARMS}
    done = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(job), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for arm, facts in found.items():
        assert facts["usage"] == "OPENAI_API_SERVER"
        assert set(facts["differs"]) <= HARMLESS, (arm, facts["differs"])
        assert facts["lab"] == facts["served"], arm
    assert found["batch8"]["lab"][:2] == [8, 512] and found["fp8_kv"]["lab"][2].startswith("fp8")
    assert found["eager"]["lab"][4] is True and found["no_prefix_cache"]["lab"][3] is False


def test_plan_table_shows_the_defaults_of_each_context(tmp_path):
    """vLLM's CPU rule: vllm serve 128 sequences / 2048 tokens, the offline LLM class 256 / 4096 (x world size)."""
    shown = {}
    for context in ("serve", "offline"):
        exp = lk.Experiment("ctx", {"default": {}, "batch8": {"max_num_seqs": 8}},
                            lk.Workload(4, lk.Fixed(16), lk.Fixed(8), lk.Burst()), model="tiny-llama",
                            context=context, results_dir=tmp_path)
        shown[context] = exp.plan_table().set_index("arm")
        assert (shown[context].context == context).all()
    serve, offline = shown["serve"], shown["offline"]
    assert (serve.loc["default", "max_num_seqs"], serve.loc["default", "max_num_batched_tokens"]) == (128, 2048)
    assert (offline.loc["default", "max_num_seqs"], offline.loc["default", "max_num_batched_tokens"]) == (256, 4096)
    assert serve.loc["batch8", "max_num_seqs"] == offline.loc["batch8", "max_num_seqs"] == 8
    assert serve.loc["default", "cudagraph_capture_sizes"] == "none"  # no CUDA graphs on a CPU
    assert serve.loc["default", "launch"].startswith("vllm serve ")
    assert offline.loc["default", "launch"].startswith("LLM(model=")


def test_the_first_arms_worker_resolves_the_plan_as_a_process_of_its_own_would(tmp_path, capsys):
    """The plan's resolution is answered by a fork of the first arm's worker (vLLM imported once, not twice),
    with the same values as a resolver process of its own, and none of its output in that arm's engine.log."""
    # the first arm's own variable is set in its worker; the fork resolves without it, as a separate process would
    arms = {"batch8": {"max_num_seqs": 8, "environment": {"VLLM_LOGGING_LEVEL": "DEBUG"}}, "default": {}}
    workload = lk.Workload(4, lk.Fixed(16), lk.Fixed(8), lk.Burst())
    forked = lk.Experiment("forked", arms, workload, model="tiny-llama", results_dir=tmp_path / "a")
    by_worker = forked.plan_table().set_index("arm")
    assert "in the first arm's worker" in capsys.readouterr().out
    worker = forked._early["worker"]
    assert worker.proc.is_alive()  # still waiting for its arm: the fork's end is not the worker's
    separate = lk.Experiment("separate", arms, workload, model="tiny-llama", results_dir=tmp_path / "b")
    by_process = separate.plan_table(prepare=False).set_index("arm")
    assert "in a separate process" in capsys.readouterr().out
    columns = ["max_num_seqs", "max_num_batched_tokens", "cudagraph_capture_sizes"]
    assert by_worker[columns].equals(by_process[columns]) and by_worker.loc["batch8", "max_num_seqs"] == 8
    assert not by_worker[columns].isin([None]).any().any()
    log = (worker.workdir / "engine.log").read_text()
    assert "Resolved architecture" not in log and "max_num_batched_tokens" not in log, log[-2000:]
    worker.discard()
