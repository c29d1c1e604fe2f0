"""One self-contained HTML report per suite run: the verdict table first, then each experiment's plots and
conclusion. Figures are embedded, so the file can be mailed or attached to a ticket as it is."""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import pandas as pd


from labkit.suite.baseline import DAMAGED, caution
from labkit.suite.runs import readable, suite_meta
from labkit.store import read_record
from labkit.files import make_portable
from labkit.redact import redact
from labkit.shown import change, number

_STYLE = """<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;
font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}.regression{background:#f8d0d0}
.improvement{background:#d0f0d0}</style>"""


def _figure(fig) -> str:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _verdict_table(comparison: pd.DataFrame) -> str:
    """The comparison with the baseline, one row per experiment, load, arm and metric, regressions first: both
    values rounded, the change in percent with its interval in one cell (`+3.2% [+1.0%, +5.5%]`, as every table)."""
    if comparison is None or comparison.empty:
        return "<p>No baseline for this hardware yet: pin this run with <code>labkit baseline RUN</code>.</p>"
    order = {DAMAGED: 0, "regression": 1, "missing in this run": 2, "improvement": 3, "new: no baseline": 4}
    table = comparison.assign(_o=comparison.verdict.map(order).fillna(9)).sort_values("_o").drop(columns="_o")
    if {"change", "ci_low", "ci_high"} <= set(table.columns):
        changes = [change(c, lo, hi) if not _blank(c) else "" for c, lo, hi in zip(table.change, table.ci_low, table.ci_high)]
        at = list(table.columns).index("change")
        table = table.drop(columns=["change", "ci_low", "ci_high"])
        table.insert(at, "change [95 % interval]", changes)
    rows = []
    for row in table.itertuples(index=False):
        cells = "".join(f"<td>{'' if _blank(v) else html.escape(number(v) if isinstance(v, float) else str(v))}</td>"
                        for v in row)
        rows.append(f'<tr class="{row.verdict}">{cells}</tr>')
    head = "".join(f"<th>{c}</th>" for c in table.columns)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _blank(value) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value))


def write_report(run: str | Path, comparison: pd.DataFrame | None = None, env_diff: pd.DataFrame | None = None,
                 statuses: list[dict] | None = None, path: str | Path | None = None) -> Path:
    """The path of the suite run's HTML report (RUN/report.html unless `path` is given): overrides, verdicts
    against the baseline, notebook statuses, environment changes, and each experiment's plots and conclusions."""
    from labkit.analyze import slo, stats
    from labkit.analyze.load_search import stored_slos
    from labkit.present import plots, tables
    from labkit.present.explore import goodput_table

    run = Path(run)
    parts = [f"<html><head><meta charset='utf-8'><title>labkit suite {run.name}</title>{_STYLE}</head><body>",
             f"<h1>Suite run {html.escape(run.name)}</h1>"]
    overrides = suite_meta(run).get("overrides") if (run / "suite.json").exists() else None
    if overrides:
        parts.append(f"<p class='regression'><b>Launch overrides forced onto the arms (a SELECTION: prefix "
                     f"limits one to those notebooks):</b> "
                     f"{html.escape(json.dumps(redact(overrides)))}</p>")  # redacted before escaping hides its quotes
    jobs = suite_meta(run).get("jobs", 1) if (run / "suite.json").exists() else 1
    if jobs > 1:
        parts.append(f"<p class='regression'><b>{jobs} notebooks ran at once</b>, each on its share of the cores: "
                     "their arms contended for the host, so this run checks wiring and is no measurement to "
                     "judge against a run made one notebook at a time.</p>")
    parts.append("<h2>Verdicts against the baseline</h2>")
    if comparison is not None and (bases := comparison.attrs.get("baselines")):
        bases = ["/".join(Path(b).parts[-2:]) for b in bases]  # <hardware>/<run>: the same on every checkout
        replicas = f"; replicates of it: {', '.join(bases[1:])}" if len(bases) > 1 else (
            "; one run, so the intervals hold the noise within one engine only")
        parts.append(f"<p>Baseline run: {html.escape(bases[0] + replicas)}</p>")
    if comparison is not None and (warning := caution(comparison)):
        parts.append(f"<p class='regression'><b>Caution:</b> {html.escape(warning)}</p>")
    parts.append(_verdict_table(comparison))
    if statuses:
        parts.append("<h2>Notebooks</h2>" + pd.DataFrame(statuses).to_html(index=False))
    if env_diff is not None and not env_diff.empty:
        parts.append("<h2>What changed in the environment</h2>" + env_diff.to_html(index=False))
    found, damaged = readable(run)
    for name, why in damaged.items():
        parts.append(f"<h2>{html.escape(name)}</h2><p class='regression'>Cannot be read: {html.escape(why)}</p>")
    for name, results in found.items():
        parts.append(f"<h2>{html.escape(name)}</h2>" + results.facts("cause").to_html(index=False))
        if not results.complete_arms:
            continue
        baseline_arm = results.reference_arm
        record = stats.ab_record(results, baseline_arm, stats.VERDICT_METRICS)
        for load_name, part in results.per_load():
            parts.append(f"<h3>load {html.escape(str(load_name))}</h3>")
            parts.append(_figure(plots.arm_comparison(part, stats.VERDICT_METRICS)))
        parts.append("<h3>Conclusions</h3>" + tables.conclusions(record, baseline_arm).to_html())
        if slos := stored_slos(results):  # a load search's SLOs: throughput beside what met them
            limits = ", ".join(f"{stats.metric(name).meaning} <= {limit:g} ms" for name, limit in slos.items())
            goodput = goodput_table(slo.goodput_by_load(results, slos), None).drop(columns="recommended")
            parts.append(f"<h3>Goodput at the load searches' SLOs ({html.escape(limits)})</h3>" + goodput.to_html(index=False))
    parts.append("</body></html>")
    path = Path(path or run / "report.html")
    path.write_text("\n".join(parts))
    make_portable(path)  # a report travels: it names no path of this machine
    return path


def write_cluster_report(top: str | Path, runs: list[Path]) -> Path:
    """One report for a suite run over a Ray cluster (TOP/report.html): which nodes of which hardware ran it,
    then each hardware's own report (as `write_report` made it, in RUN/report.html) in full."""
    from labkit.suite.notebooks import CLUSTER_RECORD, statuses

    top = Path(top)
    hardware = read_record(top / CLUSTER_RECORD, "hardware")["hardware"]
    rows = [{"hardware": hw, "nodes": ", ".join(entry["nodes"]), "profile": entry["profile"],
             "notebooks ok": sum(s["status"] == "ok" for s in statuses(top / hw)),
             "notebooks not ok": sum(s["status"] != "ok" for s in statuses(top / hw))} for hw, entry in hardware.items()]
    parts = [f"<html><head><meta charset='utf-8'><title>labkit suite {top.name}</title>{_STYLE}</head><body>",
             f"<h1>Suite run {html.escape(top.name)} on a Ray cluster</h1>",
             "<p>Each hardware ran the notebooks on its own nodes (Ray node ids), one notebook per node at a time, "
             "and is compared with its own pinned baseline.</p>", pd.DataFrame(rows).to_html(index=False)]
    for run in runs:
        own = (run / "report.html").read_text()
        body = own[own.find("<body>") + len("<body>"):own.rfind("</body>")]
        parts.append(f"<hr><h1>{html.escape(run.name)}</h1>" + body.replace("<h1>", "<h2>").replace("</h1>", "</h2>"))
    parts.append("</body></html>")
    path = top / "report.html"
    path.write_text("\n".join(parts))
    make_portable(path)
    return path
