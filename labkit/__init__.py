"""labkit: measure, understand and tune vLLM inference on the hardware in front of you.

`import labkit` loads neither torch nor vLLM: engines live only in the arm worker processes.
"""
from labkit.errors import (BadParameter, DamagedStore, LabkitError, NotApplicable, StoreConflict,
                           StoreUnwritable)
from labkit.experiment import Experiment, default_model
from labkit.measure.platform import current_platform
from labkit.spec.conversation import Conversation
from labkit.spec.knobs import KNOBS, plan_arm
from labkit.spec.load_search import LoadSearch
from labkit.spec.models import SHAPES, ModelShape, resolve_model
from labkit.spec.prompts import Segment, Template
from labkit.spec.protocol import Protocol
from labkit.spec.texts import ChatText
from labkit.spec.workload import (Burst, Concurrency, Fixed, FromLog, LogNormal, Mix, Periodic, Poisson, Uniform,
                                  Workload)
from labkit.store import Results, load
from labkit.suite.parameters import smoke_overrides, smoke_parameters



def explore(experiment: str | None = None, roots: dict | None = None):
    """The results explorer (ipywidgets), opened on `experiment`: labkit.present.explore (loaded on first use)."""
    from labkit.present.explore import explore as open_explorer
    return open_explorer(experiment, roots)


__all__ = [
    "BadParameter", "DamagedStore", "LabkitError", "NotApplicable", "StoreConflict", "StoreUnwritable",
    "Experiment", "default_model", "current_platform", "KNOBS", "plan_arm", "SHAPES", "ModelShape", "resolve_model",
    "Protocol", "Burst", "Concurrency", "Fixed", "FromLog", "LogNormal", "Mix", "Periodic", "Poisson", "Uniform",
    "Workload", "LoadSearch", "Segment", "Template", "ChatText", "Conversation", "Results", "load", "smoke_parameters", "smoke_overrides",
    "explore",
]
