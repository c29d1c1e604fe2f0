"""A launch as its user writes it: a `vllm serve` command line (with the environment variables in force, and
vLLM's own `--config` YAML), parsed by vLLM's own argument parser so every flag means what it means to vLLM.

The parse runs in a separate process (`python -m labkit.spec.serve_command`), like the plan's resolution, so
that vLLM's import stays out of the caller. What the command sets beyond vLLM's defaults becomes the lab's
knobs where the lab has one; the rest is kept and named (`unmodelled`): those settings are not reproduced by
the lab's arms, and a diagnosis says so rather than measure something else under the user's name.
"""
from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stderr

from labkit.errors import BadParameter
from labkit.redact import redact, redacted_repr, secret_values
from labkit.spec.knobs import ARM_VARIABLE_PREFIXES, KNOBS
from labkit.spec.numbers import POSITIVE, check_numbers

# engine arguments that do not change what is measured (where the weights come from, names, logging); a
# load_format of "dummy" does (random weights decoded 24.7 % slower than real ones on one H100,
# data/baselines/h100/real-vs-dummy-2026-12-06): to_knobs keeps it as the dummy_weights knob
NO_EFFECT = {"model", "served_model_name", "tokenizer", "revision", "tokenizer_revision", "code_revision",
             "download_dir", "trust_remote_code", "seed", "load_format", "disable_log_stats", "enable_log_requests",
             "hf_token", "hf_overrides", "config_format", "tokenizer_mode", "max_logprobs"}


@dataclasses.dataclass(frozen=True)
class Launch:
    """A parsed `vllm serve` launch: its model, the lab knobs it amounts to, what the lab cannot reproduce,
    and the VLLM_*/NCCL_* variables it ran with."""

    command: str
    model: str
    knobs: dict
    unmodelled: dict
    variables: dict

    __repr__ = redacted_repr  # the command as written may carry VLLM_API_KEY=... or --hf-token ...

    def table(self):
        """The launch's settings and where the lab takes each from (secrets redacted: the table is shown)."""
        import pandas as pd
        rows = [{"setting": k, "value": v, "lab": "knob"} for k, v in self.knobs.items() if k != "environment"]
        rows += [{"setting": k, "value": v, "lab": "environment variable on the command line (this launch's arms)"}
                 for k, v in self.knobs.get("environment", {}).items()]
        rows += [{"setting": k, "value": v, "lab": "not reproduced by the lab's arms"} for k, v in self.unmodelled.items()]
        rows += [{"setting": k, "value": v, "lab": "environment variable (set for every arm)"}
                 for k, v in self.variables.items()]
        # a row names its setting in a column, not a key: redact its value as {setting: value} would be
        rows = [{**row, "value": redact({row["setting"]: row["value"]}, secret_values(self.knobs))[row["setting"]]}
                for row in rows]
        return pd.DataFrame(redact(rows), columns=["setting", "value", "lab"])


def to_knobs(explicit: dict) -> tuple[dict, dict]:
    """The lab's knobs for engine arguments that differ from vLLM's defaults, and the rest (unmodelled)."""
    knobs, rest = {}, {}
    for name, value in explicit.items():
        if name == "load_format" and value == "dummy":
            knobs["dummy_weights"] = True
            continue
        if name in NO_EFFECT:
            continue
        if name == "compilation_config" and isinstance(value, dict):
            extra = {k: v for k, v in value.items() if k not in ("cudagraph_mode", "cudagraph_capture_sizes")}
            if str(value.get("cudagraph_mode", "")).upper().endswith("NONE"):
                knobs["cuda_graphs"] = False
            if value.get("cudagraph_capture_sizes"):
                knobs["cudagraph_capture_sizes"] = list(value["cudagraph_capture_sizes"])
            if extra:
                rest["compilation_config"] = extra
        elif name == "disable_custom_all_reduce":
            knobs["custom_all_reduce"] = not value
        elif name == "speculative_config" and isinstance(value, dict) and not KNOBS["speculative"].check(value):
            knobs["speculative"] = value  # n-gram prompt lookup, which the lab's arms reproduce
        elif name in KNOBS and name not in ("cuda_graphs", "cudagraph_capture_sizes", "environment"):
            knobs[name] = value
        else:
            rest[name] = value
    return knobs, rest


def parse_serve(command: str, environ: dict | None = None, timeout_s: float = 120.0) -> Launch:
    """Parse a `vllm serve MODEL [flags]` command with vLLM's own parser (in a separate process). A flag vLLM
    does not know, or a malformed value, is a BadParameter naming vLLM's own complaint; nothing starts."""
    found = parse_many([command], environ, timeout_s)[0]
    if isinstance(found, BadParameter):
        raise found
    return found


def parse_many(commands: list[str], environ: dict | None = None, timeout_s: float = 300.0) -> list:
    """Several command lines with one import of vLLM: a Launch for each, or the BadParameter that says why not."""
    check_numbers("parse_serve", {"timeout_s": (timeout_s, POSITIVE)})
    variables = {k: v for k, v in (environ or {}).items() if k.startswith(("VLLM_", "NCCL_"))}
    out, jobs, written = [], [], []
    for command in commands:
        words = shlex.split(command)
        assigned, problem = _leading_assignments(words)
        bad = problem or ((words[:2] != ["vllm", "serve"] or len(words) < 3)
                          and f"a launch is a `vllm serve MODEL [flags]` command line; got {command!r}")
        out.append(BadParameter(bad) if bad else None)
        jobs.append([] if bad else words[2:])
        written.append(assigned)
    if all(out):
        return out  # nothing for vLLM to parse
    done = subprocess.run([sys.executable, "-m", "labkit.spec.serve_command"], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        raise BadParameter(f"vLLM could not parse the launch: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    for i, (command, parsed) in enumerate(zip(commands, json.loads(lines[-1]))):
        if out[i] is not None:
            continue
        if "error" in parsed:
            out[i] = BadParameter(f"`vllm serve` refuses {command!r}: {parsed['error']}")
        else:
            knobs, unmodelled = to_knobs(parsed["explicit"])
            if written[i]:  # set on the command line: this launch's own, so an arm can leave one out
                knobs["environment"] = written[i]
            out[i] = Launch(command, parsed["model"], knobs, unmodelled, variables)
    return out


def _leading_assignments(words: list[str]) -> tuple[dict, str | None]:
    """Remove the `NAME=value` words a shell command starts with (`NCCL_P2P_DISABLE=1 vllm serve ...`): the
    variables it sets, or what is wrong with them (the lab reproduces NCCL_* and VLLM_* only)."""
    assigned = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        assigned[name] = value
    other = sorted(name for name in assigned if not name.startswith(ARM_VARIABLE_PREFIXES))
    if other:
        return assigned, (f"the command sets {', '.join(other)}: the lab reproduces NCCL_* and VLLM_* variables "
                          "only; set the others in your shell (the environment the lab runs in), and leave them off the command")
    return assigned, None


def _jsonable(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _explicit(served, defaults) -> dict:
    """Engine arguments whose value differs from a plain `vllm serve MODEL`'s; for a nested config only the
    fields that differ."""
    out = {}
    for field in dataclasses.fields(served):
        mine, theirs = getattr(served, field.name), getattr(defaults, field.name)
        if dataclasses.is_dataclass(mine) and dataclasses.is_dataclass(theirs):
            a, b = _jsonable(mine), _jsonable(theirs)
            differs = {k: v for k, v in a.items() if b.get(k) != v}
            if differs:
                out[field.name] = differs
        elif _jsonable(mine) != _jsonable(theirs):
            out[field.name] = _jsonable(mine)
    return out


def _main() -> None:
    jobs = json.loads(sys.stdin.read())
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM 0.26
        from vllm.utils import FlexibleArgumentParser

    def parse(args):
        parser = FlexibleArgumentParser(prog="vllm")
        serve = ServeSubcommand().subparser_init(parser.add_subparsers())
        complaint = io.StringIO()
        try:
            with redirect_stderr(complaint):
                cli = serve.parse_args(args)
        except SystemExit:  # argparse's way of refusing: its message is the error
            lines = [line for line in complaint.getvalue().strip().splitlines() if line.strip()]
            raise ValueError(lines[-1] if lines else "refused") from None
        cli.model = cli.model_tag
        return AsyncEngineArgs.from_cli_args(cli)

    found = []
    for words in jobs:
        if not words:
            found.append({"error": "not a vllm serve command"})
            continue
        try:
            served, plain = parse(words), parse(words[:1])
            found.append({"model": served.model, "explicit": _explicit(served, plain)})
        except Exception as exc:  # one refused command does not hide the others
            found.append({"error": f"{exc}"})
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    _main()
