"""Where the lab keeps things, and the launch overrides a suite run forces onto every arm: one object.

Modules ask `current()`; nothing else reads these environment variables. The environment is only the
boundary: a shell or CI sets `LABKIT_*` for the lab, and the suite hands a notebook kernel its settings
through `exported()`, which restores the environment afterwards. Code that wants other folders for a while
(a test, a script) wraps it in `use(settings.replace(...))` instead of changing the environment.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

from labkit.errors import BadParameter

ROOT = Path(__file__).resolve().parent.parent  # the checkout: notebooks/ and data/ live here
NOTEBOOKS = ROOT / "notebooks"
VARIABLES = {  # field -> the environment variable that sets it at the boundary
    "results_dir": "LABKIT_RESULTS_DIR",
    "runs_dir": "LABKIT_RUNS_DIR",
    "baselines_dir": "LABKIT_BASELINES_DIR",
    "models_dir": "LABKIT_MODELS_DIR",
    "peaks_dir": "LABKIT_PEAKS_DIR",
    "numerics_dir": "LABKIT_NUMERICS_DIR",
    "journal": "LABKIT_JOURNAL",
    "compile_cache_dir": "LABKIT_COMPILE_CACHE_DIR",
    "launch_overrides": "LABKIT_LAUNCH_OVERRIDES",
    "ray_address": "LABKIT_RAY_ADDRESS",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The lab's folders (results, suite runs, baselines, models, measured peaks and numerics, journal) and the knobs forced onto every arm."""

    results_dir: Path = ROOT / "data" / "results"  # experiment stores (a suite run has its own)
    runs_dir: Path = ROOT / "data" / "runs"  # suite runs and `labkit run` outputs, one UTC-stamped folder each
    baselines_dir: Path = ROOT / "data" / "baselines"  # pinned suite runs, one folder per hardware key
    models_dir: Path = ROOT / "data" / "models"  # generated synthetic models
    peaks_dir: Path = ROOT / "data" / "peaks"  # measured peaks, one file per hardware (hardware_profile.ipynb)
    numerics_dir: Path = ROOT / "data" / "numerics"  # fp8 against bf16 greedy agreement, one file per hardware (precision.ipynb)
    journal: Path = ROOT / "data" / "journal.jsonl"  # conclusions, appended
    # vLLM's compile cache (VLLM_CACHE_ROOT of every arm), one folder per machine and vLLM version beneath it:
    # a rerun of a launch reuses what its first run compiled; an upgrade or another machine starts clean
    compile_cache_dir: Path = ROOT / "data" / "results" / ".compile-cache"
    launch_overrides: dict = dataclasses.field(default_factory=dict)  # knobs forced onto every arm
    # a Ray cluster (HOST:PORT, or "auto") whose nodes run the arms (labkit.measure.ray_arms); None: this machine
    ray_address: str | None = None

    @classmethod
    def from_environment(cls, environ=None) -> "Settings":
        """The settings a shell gives the lab: each LABKIT_* variable that is set replaces its default."""
        environ = os.environ if environ is None else environ
        given = {name: Path(environ[var]) for name, var in VARIABLES.items()
                 if name not in ("launch_overrides", "ray_address") and environ.get(var)}
        return cls(**given, launch_overrides=_overrides_from_text(environ.get(VARIABLES["launch_overrides"], "")),
                   ray_address=environ.get(VARIABLES["ray_address"]) or None)

    def environment(self) -> dict[str, str]:
        """The variables that give a child process (a notebook kernel) these same settings."""
        values = {name: str(Path(value).resolve()) for name, value in dataclasses.asdict(self).items()
                  if name not in ("launch_overrides", "ray_address")}
        values["launch_overrides"] = json.dumps(self.launch_overrides)
        if self.ray_address:
            values["ray_address"] = self.ray_address
        return {VARIABLES[name]: value for name, value in values.items()}

    def replace(self, **changes) -> "Settings":
        """A copy of these settings with the given fields changed."""
        return dataclasses.replace(self, **changes)


def _overrides_from_text(text: str) -> dict:
    if not text:
        return {}
    try:
        knobs = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = str(exc)
    else:
        if isinstance(knobs, dict):
            return knobs
        problem = "not an object"
    raise BadParameter(f"{VARIABLES['launch_overrides']} must be a JSON object of knobs such as "
                       f'{{"enforce_eager": true}}, got {text!r} ({problem})')


_active: list[Settings] = []


def current() -> Settings:
    """The settings in force: those of the innermost `use()`, else the environment's (read at each call,
    so a notebook kernel started with other LABKIT_* variables sees them)."""
    return _active[-1] if _active else Settings.from_environment()


@contextlib.contextmanager
def use(settings: Settings):
    """Make `settings` current inside the block, for this process."""
    _active.append(settings)
    try:
        yield settings
    finally:
        _active.pop()


@contextlib.contextmanager
def exported(settings: Settings):
    """Put `settings` into the environment for child processes started inside the block, then restore it."""
    wanted = settings.environment()
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        with use(settings):
            yield settings
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
