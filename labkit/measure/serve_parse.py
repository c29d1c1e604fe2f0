"""A `vllm serve` command line parsed by vLLM's own argument parser, in a separate process (`python -m
labkit.measure.serve_parse`) so that vLLM's import stays out of the caller: every flag means what it means to
vLLM, and what the command sets beyond a plain `vllm serve MODEL` becomes a labkit.spec.serve_command.Launch.
"""
from __future__ import annotations

import dataclasses
import io
import json
import shlex
import subprocess
import sys
from contextlib import redirect_stderr

from labkit.errors import BadParameter
from labkit.spec.numbers import POSITIVE, check_numbers
from labkit.spec.serve_command import Launch, leading_assignments, to_knobs


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
        assigned, problem = leading_assignments(words)
        bad = problem or ((words[:2] != ["vllm", "serve"] or len(words) < 3)
                          and f"a launch is a `vllm serve MODEL [flags]` command line; got {command!r}")
        out.append(BadParameter(bad) if bad else None)
        jobs.append([] if bad else words[2:])
        written.append(assigned)
    if all(out):
        return out  # nothing for vLLM to parse
    done = subprocess.run([sys.executable, "-m", "labkit.measure.serve_parse"], input=json.dumps(jobs),
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
