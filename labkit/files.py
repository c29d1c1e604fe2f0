"""Files the lab writes: never half of one (a kill or a full disk leaves the old file or none, never a
truncated one), and never the paths of the machine that wrote them."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from labkit.redact import redact, redact_text

_CHECKOUT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".json", ".jsonl", ".ipynb", ".log", ".txt", ".html", ".md"}
_PORTABLE = [  # (machine path, what is written instead), most specific first
    (re.compile(r"(?:/[\w.+-]+)*/(?:site|site-packages|dist-packages)/"), "<site-packages>/"),
    (re.compile(r"(?:/[\w.+-]+)*/\.pyenv/versions/[\w.]+/lib/python[\d.]+/"), "<python>/"),
    (re.compile(re.escape(str(_CHECKOUT)) + r"/"), ""),
    (re.compile(r"/work/main/"), ""),  # the lent GPU machine's copy of the checkout
    (re.compile(re.escape(str(Path.home())) + r"/"), "~/"),
    (re.compile(r"/root/"), "~/"),
    (re.compile(r"/tmp/[\w.+-]+/"), "<tmp>/"),
    (re.compile(r"/tmp/(?=[\w.+-]+[\"'\s])"), "<tmp>/"),  # a temporary file named on its own
    (re.compile(r'("host_?name"\s*:\s*)"[^"]*"', re.IGNORECASE), r'\1"<host>"'),  # the profiler's trace header
]


def write_json_atomic(path: Path, data, secrets=()) -> None:
    """Write `data` as JSON to `path` through a temporary file in the same folder and an atomic rename, its
    secrets (and `secrets` wherever they appear) redacted: every JSON file the lab stores passes here."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(redact_text(json.dumps(redact(data, secrets), indent=1, default=str), secrets))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def new_folder(parent: Path, name: str) -> Path:
    """A folder made for this caller alone: parent/name, or name-2, name-3, ... when another run (started in
    the same second, say) made that one first. mkdir either creates or fails, so two callers never share."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        folder = parent / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent} holds {name} and 9,999 numbered variants of it")


def make_folder_atomically(target: Path, fill) -> Path:
    """The folder `target`, filled by `fill(staging)` in a staging folder beside it and renamed into place, so
    a reader sees the whole folder or none; where another process made it first, theirs is kept (both were
    made from the same inputs)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(staging)
        try:
            staging.rename(target)
        except OSError:  # another process made it first; theirs is identical
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_table(frame, path: Path) -> None:
    """Write a DataFrame as parquet, compressed for evidence that travels and is committed: zstd level 19
    over floats split into byte streams, without dictionary pages (per-token times are mostly random low bits:
    one H200 request table took 3.81 MB as pandas writes it, 1.80 MB so). Lossless: the table reads back
    equal."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    floats = [field.name + (".list.element" if pa.types.is_list(field.type) else "")
              for field in table.schema
              if pa.types.is_floating(field.type.value_type if pa.types.is_list(field.type) else field.type)]
    pq.write_table(table, path, compression="zstd", compression_level=19, use_dictionary=False,
                   use_byte_stream_split=floats)


def portable(text: str) -> str:
    """`text` with the machine's paths made portable: a path inside the checkout becomes relative to it,
    site-packages <site-packages>, the home folder ~, a temporary folder <tmp>. Applying it twice changes
    nothing more."""
    for pattern, replacement in _PORTABLE:
        text = pattern.sub(replacement, text)
    return text


def make_portable(*paths: Path, secrets=()) -> list[Path]:
    """Rewrite the text files among `paths` and under those that are folders (logs, JSON, notebooks, HTML,
    and gzipped JSON such as profiler traces) with portable paths, no host name and no secret (those
    redact_text finds, and `secrets` wherever they appear: an engine log that echoes an arm's variable);
    tables (parquet) hold none. Returns the files changed."""
    files = [p for path in map(Path, paths) for p in ([path] if path.is_file() else sorted(path.rglob("*")))]
    changed = []
    for path in files:
        zipped = path.suffix == ".gz" and Path(path.stem).suffix in TEXT_SUFFIXES
        if not path.is_file() or not (zipped or path.suffix in TEXT_SUFFIXES):
            continue
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if zipped else raw).decode(errors="surrogateescape")
        clean = redact_text(portable(text), secrets)
        if clean != text:
            data = clean.encode(errors="surrogateescape")
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(gzip.compress(data, compresslevel=6) if zipped else data)
            os.replace(tmp, path)
            changed.append(path)
    return changed


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def without_widget_state(path: Path) -> None:
    """Store an executed notebook without ipywidgets state: a stored widget has no kernel behind it, and would
    show as "Error displaying widget" or a frozen 0 % bar. Progress bars go (the plain line each arm prints
    says what happened); any other widget keeps a note in its place."""
    nb = json.loads(Path(path).read_text())
    changed = nb.get("metadata", {}).pop("widgets", None) is not None
    for cell in nb.get("cells", []):
        kept = []
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                changed = True
                if "%|" in "".join(data.get("text/plain", "")):  # a tqdm bar: its text is a frozen snapshot
                    continue
                output["data"] = {"text/plain": "[an interactive widget: run the cell to use it]"}
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
    if changed:
        write_json_atomic(Path(path), nb)
