"""An arm's engine log read for its failure: the cause a user can act on and the line that shows it.

vLLM's processes write to one log in an order a busy machine changes, and libraries print "...Error" lines
that are only warnings, so the cause is looked for in the error lines, most specific pattern first.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

LOG_TAIL_LINES = 40

_FAILURE_CAUSES = [  # (cause, pattern in the log), most specific first
    ("kv_cache_too_small", r"larger than the (?:maximum number of tokens that can be stored|available KV cache)"
                           r"|No available memory for the cache blocks|KV cache (?:is )?(?:too small|insufficient)"
                           r"|max_model_len .* KV cache|To serve at least one request"),
    ("out_of_memory", r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|Cannot allocate memory"),
    ("backend_unavailable", r"Selected backend .* is not valid|No valid attention backend"),
    ("unsupported_configuration", r"Unsupported .* configuration|NotImplementedError|is not supported"),
    ("graph_capture_failed", r"(?:CUDA graph|cudagraph).*(?:fail|error)"),
    ("bad_engine_argument", r"TypeError: .*unexpected keyword|pydantic.*ValidationError|ValidationError"),
]


def _error_lines(log_text: str) -> list[str]:
    """The log's error lines. Warnings such as "X is not supported, falling back" are not causes."""
    return [line for line in log_text.splitlines() if "ERROR" in line or re.search(r"(?:Error|Exception)\b", line)]


def _known_cause(log_text: str) -> tuple[str, str] | None:
    """The most specific known cause found in the error lines, and the first line that shows it."""
    errors = _error_lines(log_text)
    for cause, pattern in _FAILURE_CAUSES:
        for line in errors:
            if re.search(pattern, line, re.IGNORECASE):
                return cause, line
    return None


def classify_failure(log_text: str, exitcode: int | None, timed_out: bool) -> str:
    """A short cause a user can act on, from the worker's exit and its log."""
    if timed_out:
        return "timeout"
    if found := _known_cause(log_text):
        return found[0]
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"killed_by_signal_{name}" + (
            " (often the host's out-of-memory killer)" if exitcode == -signal.SIGKILL else "")
    return "engine_error"


def read_log(path: Path) -> str:
    """The log's text (undecodable bytes replaced), or "" when there is no log."""
    return path.read_text(errors="replace") if path.exists() else ""


_EXCEPTION_LINE = re.compile(r"^.*\b(?:[A-Z]\w*Error|\w*Exception|OutOfMemoryError): .+$", re.MULTILINE)


def failure_summary(log_text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The root-cause line, then the log's tail. vLLM prints the cause well above the end of its log, and
    its processes write to one log in an order a busy machine changes: the root cause is the line that
    shows the classified cause, else the last exception a traceback ended with (an earlier "...Error" line
    may be a warning from a library, such as oneDNN's), never merely the first such line."""
    found = _known_cause(log_text)
    exceptions = [m.group(0) for m in _EXCEPTION_LINE.finditer(log_text)]
    root = found[1] if found else (exceptions[-1] if exceptions else None)
    tail = "\n".join(log_text.splitlines()[-lines:])
    return (f"root cause: {root.strip()}\n...\n" if root else "") + tail
