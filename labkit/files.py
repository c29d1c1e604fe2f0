"""Writing files so that a reader never sees half of one: a kill or a full disk leaves the old file or
none, never a truncated one."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def write_json_atomic(path: Path, data) -> None:
    """Write `data` as JSON to `path` through a temporary file in the same folder and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
