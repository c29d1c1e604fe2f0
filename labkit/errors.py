"""The user-boundary errors of the lab: each message says what to do next."""


from labkit.redact import redact_text


class LabkitError(Exception):
    """Base of every error a lab user is meant to read and act on. Its message is redacted: messages quote
    the values they refuse, and are printed, logged and stored in notebooks."""

    def __init__(self, *args):
        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))


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
