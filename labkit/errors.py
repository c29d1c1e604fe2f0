"""The user-boundary errors of the lab: each message says what to do next."""
import difflib
import os
import traceback

from labkit.redact import redact_text

# In a notebook the message is the whole answer: the lab's internal frames above it only push it off screen.
# `%env LABKIT_DEBUG=1` (read when the error is shown, so it works in a running kernel) brings them back.
DEBUG_VARIABLE = "LABKIT_DEBUG"


class LabkitError(Exception):
    """Base of every error a lab user is meant to read and act on. Its message is redacted: messages quote
    the values they refuse, and are printed, logged and stored in notebooks."""

    def __init__(self, *args):
        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error (its hook for exceptions that render themselves): the message
        alone, or the full traceback with LABKIT_DEBUG set. Errors that are not the lab's keep theirs."""
        if os.environ.get(DEBUG_VARIABLE):
            return "".join(traceback.format_exception(type(self), self, self.__traceback__)).splitlines()
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}",
                f"(the lab's own check; %env {DEBUG_VARIABLE}=1 and a rerun show where it was raised)"]


class BadParameter(LabkitError, ValueError):
    """A knob, workload or protocol value that cannot work; raised before any engine starts."""


class NotApplicable(LabkitError):
    """A knob that has no meaning on this platform or vLLM version (e.g. CUDA graphs on a CPU)."""


class StoreConflict(LabkitError):
    """Stored results that would be overwritten or mixed with results of a different spec."""


class DamagedStore(LabkitError):
    """A stored file that cannot be read as the lab wrote it (cut short, edited, missing): it names the file."""


class StoreUnwritable(LabkitError):
    """The store's folder cannot be written (read-only, full disk, no such place): nothing was half-written."""


def close_match(name, known) -> str:
    """' (did you mean X?)' for the known name closest to a mistyped one, else ''."""
    found = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {found[0]}?)" if found else ""
