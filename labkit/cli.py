"""`labkit run NOTEBOOK -p NAME VALUE ...` (papermill, executed copy under data/runs/) and `labkit env`."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _value(text: str):
    """Parameters arrive as text; numbers, booleans, None and JSON become Python values."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def run_notebook(notebook: str, parameters: dict, output_dir: str | Path | None = None) -> Path:
    import papermill

    from .environment import hardware_key
    from .errors import BadParameter

    source = Path(notebook)
    if not source.exists():
        raise BadParameter(f"no notebook {notebook}; the lab's notebooks are under {ROOT / 'notebooks'}")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(output_dir or ROOT / "data" / "runs" / f"{stamp}-{hardware_key()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / source.name
    papermill.execute_notebook(str(source), str(output), parameters=parameters, cwd=str(source.parent),
                               kernel_name="python3", progress_bar=True)
    return output


def main(argv: list[str] | None = None) -> int:
    from .errors import LabkitError

    parser = argparse.ArgumentParser(prog="labkit", description="the vLLM tuning lab")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a notebook with papermill; the executed copy goes under data/runs/")
    run.add_argument("notebook")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    run.add_argument("-o", "--output-dir", help="where the executed notebook goes")
    sub.add_parser("env", help="print the environment fingerprint as JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "env":
            from .environment import fingerprint
            print(json.dumps(fingerprint(), indent=2))
        else:
            params = {name: _value(value) for name, value in args.parameter}
            print(f"executed notebook: {run_notebook(args.notebook, params, args.output_dir)}")
    except LabkitError as exc:
        print(f"labkit: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
