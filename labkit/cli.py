"""`labkit run NOTEBOOK -p NAME VALUE ...` (papermill, executed copy under data/runs/) and `labkit env`."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from labkit.spec.numbers import COUNT, NON_NEGATIVE, check_number, raise_problems


def _print(*values, **kwargs) -> None:
    """print, secrets redacted: whatever the lab prints (tables, launch lines, errors) may quote one."""
    from labkit.redact import redact_text

    print(*(redact_text(str(v)) for v in values), **kwargs)


def _value(text: str):
    """Parameters arrive as text; numbers, booleans, None and JSON become Python values."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def run_notebook(notebook: str, parameters: dict, output_dir: str | Path | None = None) -> Path:
    """The path of the executed copy of the notebook, run by papermill with its parameters checked first
    (by default into a new UTC-stamped folder under the runs folder)."""
    import papermill

    from labkit.measure.environment import hardware_key
    from labkit.errors import BadParameter
    from labkit import settings
    from labkit.files import make_portable, without_widget_state
    from labkit.suite.notebooks import utc_stamp
    from labkit.suite.parameters import check_parameters

    source = Path(notebook)
    if not source.exists():
        raise BadParameter(f"no notebook {notebook}; the lab's notebooks are under {settings.NOTEBOOKS}")
    parameters = check_parameters(source, parameters)  # before any kernel starts
    # where and when the suite's go: the runs folder, a UTC-stamped folder
    out_dir = Path(output_dir or settings.current().runs_dir / f"{utc_stamp()}-{hardware_key()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / source.name
    try:
        papermill.execute_notebook(str(source), str(output), parameters=parameters, cwd=str(source.parent),
                                   kernel_name="python3", progress_bar=True)
    except papermill.PapermillExecutionError as exc:
        raise NotebookFailed(f"{source.name} failed in cell {exc.cell_index}: {exc.ename}: {exc.evalue}; the executed "
                             f"copy with the error is {output}") from None
    finally:
        if output.exists():  # its outputs (logs, tracebacks) name this machine's paths
            make_portable(output)
            without_widget_state(output)
    return output


# Exit status, one meaning each, for schedulers and CI: 0 clean, 1 a regression against the baseline,
# 2 bad input or unusable data (the message says what to do), 3 a notebook failed.
EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_NOTEBOOK_FAILED, EXIT_INTERRUPTED = 1, 2, 3, 130


class NotebookFailed(Exception):
    """A notebook that `labkit run` executed raised an error; the executed copy keeps it."""


def compare_and_report(run: Path, baseline: list[str] | None, threshold: float, statuses: list[dict],
                       report: str | None = None) -> int:
    """Compare a suite run with its baseline (the pinned run and its replicates unless named), write the report,
    print the verdicts; the exit status."""
    import pandas as pd

    from labkit.suite.baseline import DAMAGED, baseline_runs, caution, compare_runs
    from labkit.suite.runs import environment_diff, suite_meta
    from labkit.present.report import write_report

    bases = [Path(b) for b in baseline] if baseline else baseline_runs(suite_meta(run)["hardware_key"])
    comparison = env_diff = None
    if bases:
        comparison = compare_runs(run, bases, threshold)
        env_diff = environment_diff(run, bases[0])
        counts = comparison.verdict.value_counts().to_dict()
        replicas = f" and {len(bases) - 1} replicate run(s)" if len(bases) > 1 else ""
        _print(f"against {bases[0]}{replicas}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
        if len(bases) == 1:
            _print("  one baseline run: its intervals hold the noise within one engine only; add replicates of it "
                  "with `labkit baseline RUN --replicate` to judge against the noise between runs")
        for row in comparison[comparison.verdict == DAMAGED].itertuples():
            _print(f"  DAMAGED {row.experiment}{'' if pd.isna(row.arm) else ' ' + row.arm}: {row.note}")
        for row in comparison[comparison.verdict == "regression"].itertuples():
            _print(f"  REGRESSION {row.experiment} {row.load} {row.arm} {row.metric}: {row.change:+.1%}"
                  if isinstance(row.change, float) else f"  REGRESSION {row.experiment} {row.arm}: {row.note}")
        if warning := caution(comparison):
            _print(f"  CAUTION {warning}")
    else:
        _print("no pinned baseline for this hardware: pin this run with `labkit baseline RUN`")
    _print(f"report: {write_report(run, comparison, env_diff, statuses, report)}")
    damaged = [s for s in statuses if s["status"] == "damaged"]
    for status in damaged:
        _print(f"  DAMAGED {status['error']}")
    if damaged or (comparison is not None and (comparison.verdict == DAMAGED).any()):
        print("labkit: some stored files cannot be read (DAMAGED above): the rest is judged, but the run as a whole "
              "is not; restore the files from where the run was made, or rerun those experiments", file=sys.stderr)
        return EXIT_BAD_INPUT
    if comparison is not None and (comparison.verdict == "regression").any():
        return EXIT_REGRESSION
    return EXIT_NOTEBOOK_FAILED if any(s["status"] != "ok" for s in statuses) else 0


def _suite_on_cluster(args) -> int:
    """`labkit suite --cluster`: the notebooks over the cluster's nodes, each hardware's run compared with its own
    baseline, one report; the exit status as for one run (bad data first, then a regression, then a failure)."""
    from labkit.errors import BadParameter
    from labkit.present.report import write_cluster_report
    from labkit.suite import journal, notebooks as suite_mod, on_ray
    from labkit.suite.runs import suite_meta

    problems = [f"{flag} {why}" for flag, given, why in (
        ("--jobs", args.jobs != 1, "is for one machine's cores: on a cluster each node runs one notebook at a time"),
        ("--baseline", args.baseline, "names one hardware's run: on a cluster each hardware is compared with its "
                                      "own pinned baseline (`labkit compare` takes one hardware's run and --baseline)"))
        if given]
    if problems:
        raise BadParameter("labkit suite --cluster: " + "; ".join(problems))
    top, runs = on_ray.run_on_cluster(args.cluster, args.selection, args.profile, args.resume,
                                      overrides=suite_mod.parse_overrides(args.override))
    codes = []
    for run in runs:
        journal.append(journal.entries_for_run(run, suite_meta(run)["environment"]))
        _print(f"== {run.name}")
        codes.append(compare_and_report(run, None, args.threshold, suite_mod.statuses(run)))
    _print(f"suite run: {top}\nreport: {write_cluster_report(top, runs)}")
    return next((code for code in (EXIT_BAD_INPUT, EXIT_REGRESSION, EXIT_NOTEBOOK_FAILED) if code in codes), 0)


def _diagnose(args) -> None:
    import pandas as pd

    import labkit as lk
    from labkit.diagnose import diagnose, parse_slo, user_workload
    from labkit.suite import journal

    workload = user_workload(args.requests, args.prompt_len, args.output_len, args.clients, prompt_log=args.prompt_log,
                             output_log=args.output_log, rate=args.rate)
    found = diagnose(args.launch, workload,
                     model=args.model or lk.default_model(), target=args.target, slo=parse_slo(args.slo),
                     name=args.name, protocol=lk.Protocol(trials=args.trials, warmup_requests=4), progress=False)
    journal.append(found.journal_entries())
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        _print(found.launch.table().to_string(index=False))
        _print("audit: " + ("; ".join(found.flags) or "nothing to question"))
        if not found.ranked.empty:
            _print(found.ranked.drop(columns=["why"]).round(3).to_string(index=False))
        _print(found.path.round(3).to_string(index=False))
    _print(found.cost())
    _print(f"recommended: {found.recommended_command()}")


def number_text(text: str):
    """A numeric option's text as a number (an int when it is written as one), or the text itself: the options
    are checked together after parsing (check_options), so one message names every bad one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# every numeric option (by its dest): what it must be, in labkit.spec.numbers' rules
NUMERIC_OPTIONS = {
    "threshold": NON_NEGATIVE, "port": dict(integer=True, minimum=1, maximum=65535),
    "jobs": COUNT, "prompt_len": COUNT, "output_len": COUNT, "clients": COUNT, "requests": COUNT, "trials": COUNT,
    "rate": NON_NEGATIVE,
}


def check_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse every impossible numeric option at once (NaN, inf, 2.5 clients, a negative threshold), naming each
    by its flag, before the command starts anything."""
    flags = {action.dest: action.option_strings[-1] for action in _subcommand(parser, args.command)._actions
             if action.option_strings}
    raise_problems(f"labkit {args.command}", [check_number(flags[dest], getattr(args, dest), **rules)
                                              for dest, rules in NUMERIC_OPTIONS.items()
                                              if dest in flags and getattr(args, dest, None) is not None])


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def build_parser() -> argparse.ArgumentParser:
    """The `labkit` command line's parser: every command and option."""
    parser = argparse.ArgumentParser(prog="labkit", description="the vLLM tuning lab; exit status: 0 clean, "
                                     "1 a regression, 2 bad input or unusable data, 3 a notebook failed")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="on an error, show the Python traceback too")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kwargs)  # --debug after any command

    run = command("run", help="execute a notebook with papermill; the executed copy goes under data/runs/")
    run.add_argument("notebook")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    run.add_argument("-o", "--output-dir", help="where the executed notebook goes")
    run.add_argument("--profile", help="start from a suite parameter profile (cpu-smoke, cpu, gpu, h200); "
                     "-p values override it")
    command("env", help="print the environment fingerprint as JSON")
    suite = command("suite", help="run every notebook (or a layer, or a list) unattended, compare with "
                           "the pinned baseline, write the report; exit 1 on a regression, 3 on a failed notebook")
    suite.add_argument("selection", nargs="*", help="layers (L3), folders (L3_kernel) or notebooks; default all")
    suite.add_argument("--profile", help="parameter profile (cpu-smoke, cpu, gpu, h200); default by hardware")
    suite.add_argument("--resume", metavar="RUN", help="finish an interrupted suite run")
    suite.add_argument("--override", action="append", default=[], metavar="[SELECTION:]KNOB=VALUE",
                       help="force a knob onto every arm of every experiment (e.g. enforce_eager=true), or of the "
                       "notebooks a selection names (L3_kernel/profile_hotspots:enforce_eager=true): rerun the "
                       "suite with one deliberate change")
    suite.add_argument("--jobs", type=number_text, default=1, metavar="N",
                       help="notebooks at once, each with its share of a CPU's cores (VLLM_CPU_OMP_THREADS_BIND): "
                       "a faster smoke check whose arms contend with each other; measurements run one at a time "
                       "(the default)")
    suite.add_argument("--baseline", metavar="DIR", action="append", help="compare with this run instead of the "
                       "pinned baseline (repeat it to add replicate runs of the same configuration)")
    suite.add_argument("--threshold", type=number_text, default=0.05,
                       help="smallest change that counts (0.05 = 5 %%)")
    suite.add_argument("--cluster", metavar="HOST:PORT", help="spread the notebooks over a Ray cluster's nodes by "
                       "hardware (one notebook per node at a time; each hardware's run under its own key, compared "
                       "with its own pinned baseline; one report)")
    pin = command("baseline", help="pin a suite run as the baseline for its hardware")
    pin.add_argument("run")
    pin.add_argument("--replicate", action="store_true", help="add the run to the pinned baseline as one more run "
                     "of the same configuration, so verdicts weigh the noise between runs")
    cmp = command("compare", help="compare a suite run with a baseline and write its report")
    cmp.add_argument("run")
    cmp.add_argument("--baseline", metavar="DIR", action="append",
                     help="compare with this run (repeat it for replicates) instead of the pinned baseline")
    cmp.add_argument("--threshold", type=number_text, default=0.05)
    cmp.add_argument("--report", metavar="PATH", help="write the report here instead of RUN/report.html")
    command("journal", help="print the journal: change -> metric -> conclusion")
    lab = command("lab", help="JupyterLab on the project's root, opened on notebooks/ (committed evidence under "
                  "data/baselines/ opens read-only)")
    lab.add_argument("--port", type=number_text, help="the port (default: JupyterLab's own choice, 8888 when free)")
    diag = command("diagnose", help="from a `vllm serve` command to a measured, ranked path of fixes")
    diag.add_argument("launch", help='the command line in quotes, e.g. "vllm serve MODEL --enforce-eager"')
    diag.add_argument("--model", help="what the lab measures in the command's model's place (a synthetic shape "
                      "such as llama3-8b; default: llama3-8b on a GPU, tiny-llama on a CPU)")
    diag.add_argument("--prompt-len", type=number_text, default=500, help="prompt tokens per request")
    diag.add_argument("--output-len", type=number_text, default=800, help="generated tokens per request")
    diag.add_argument("--clients", type=number_text, default=8, help="requests in flight (closed loop)")
    diag.add_argument("--requests", type=number_text, default=32, help="requests per trial")
    diag.add_argument("--prompt-log", default="", metavar="FILE", help="prompt lengths to resample, one per line "
                      "(in place of --prompt-len)")
    diag.add_argument("--output-log", default="", metavar="FILE", help="output lengths to resample, one per line "
                      "(in place of --output-len)")
    diag.add_argument("--rate", type=number_text, default=0.0, help="Poisson arrivals at this many requests a second "
                      "(in place of --clients' closed loop)")
    diag.add_argument("--trials", type=number_text, default=3)
    diag.add_argument("--target", default="tpot_p50_ms", help="the metric the path is judged on")
    diag.add_argument("--slo", action="append", default=[], metavar="METRIC=LIMIT",
                      help="stop early when the current launch meets it (e.g. tpot_p50_ms=40)")
    diag.add_argument("--name", default="diagnosis", help="results folder under data/results/")
    return parser


def _env(args) -> None:
    from labkit.measure.environment import fingerprint
    _print(json.dumps(fingerprint(), indent=2))


def _suite(args) -> int:
    if args.cluster:
        return _suite_on_cluster(args)
    from labkit.suite import journal, notebooks as suite_mod
    from labkit.suite.runs import suite_meta
    overrides = suite_mod.parse_overrides(args.override)
    run = suite_mod.run_suite(args.selection, args.profile, args.resume, overrides=overrides, jobs=args.jobs)
    journal.append(journal.entries_for_run(run, suite_meta(run)["environment"]))
    _print(f"suite run: {run}")
    return compare_and_report(run, args.baseline, args.threshold, suite_mod.statuses(run))


def _baseline(args) -> None:
    from labkit.suite.baseline import pin as pin_run
    _print(f"{'added as a replicate' if args.replicate else 'pinned'}: {pin_run(args.run, replicate=args.replicate)}")


def _compare(args) -> int:
    from labkit.suite.notebooks import statuses
    return compare_and_report(Path(args.run), args.baseline, args.threshold, statuses(args.run), args.report)


def _lab(args) -> None:
    from labkit import settings
    from labkit.present.lab import lab_command
    argv_lab = lab_command(settings.ROOT, port=args.port, root_user=os.geteuid() == 0)
    print("JupyterLab on the lab's root, opened on notebooks/: open the http://127.0.0.1:...token=... "  # fixed text
          "address it prints below; committed evidence (data/baselines/) opens read-only", flush=True)
    os.execv(argv_lab[0], argv_lab)


def _journal(args) -> int | None:
    from labkit.suite.journal import read
    import pandas as pd
    entries = read()
    if entries.empty and not entries.attrs["damaged"]:
        _print("the journal is empty: each `labkit suite` run appends its conclusions to it")
    elif not entries.empty:
        with pd.option_context("display.max_colwidth", 80, "display.width", 200):
            _print(entries[["when_utc", "experiment", "load", "change", "conclusion"]].to_string(index=False))
    if entries.attrs["damaged"]:
        _print("labkit: these journal lines cannot be read and are not shown:\n  "
               + "\n  ".join(entries.attrs["damaged"]), file=sys.stderr)
        return EXIT_BAD_INPUT
    return None


def _run(args) -> None:
    from labkit.suite.parameters import parameters_for
    params = parameters_for(args.profile, Path(args.notebook)) if args.profile else {}
    params.update({name: _value(value) for name, value in args.parameter})
    _print(f"executed notebook: {run_notebook(args.notebook, params, args.output_dir)}")


# one function per command; each returns its exit status, or None for 0
COMMANDS = {"env": _env, "run": _run, "suite": _suite, "baseline": _baseline, "compare": _compare,
            "diagnose": _diagnose, "lab": _lab, "journal": _journal}


def main(argv: list[str] | None = None) -> int:
    """The `labkit` command line; the exit status: 0, 2 on a lab error, and for `suite` and `compare` 1 on a
    regression, 3 on a failed notebook."""
    from labkit.errors import LabkitError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_options(args, parser)
        return COMMANDS[args.command](args) or 0
    except LabkitError as exc:
        if args.debug:
            raise
        _print(f"labkit: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NotebookFailed as exc:
        _print(f"labkit: {exc}", file=sys.stderr)
        return EXIT_NOTEBOOK_FAILED
    except KeyboardInterrupt:
        _print("labkit: interrupted; what was complete is kept (a suite resumes with --resume RUN)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # not a case the lab explains yet: one line, the traceback on request
        if args.debug:
            raise
        _print(f"labkit: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
