"""labkit: measure, understand and tune vLLM inference on the hardware in front of you.

`import labkit` loads neither torch nor vLLM: engines live only in the arm worker processes.
"""
from .errors import BadParameter, LabkitError, NotApplicable, StoreConflict
from .experiment import Experiment, default_model
from .knobs import KNOBS, plan_arm
from .models import SHAPES, ModelShape, resolve_model
from .platform import current_platform
from .runner import Protocol
from .store import Results, load
from .workload import Burst, Concurrency, Fixed, FromLog, LogNormal, Mix, Periodic, Poisson, Uniform, Workload

__all__ = [
    "BadParameter", "LabkitError", "NotApplicable", "StoreConflict", "Experiment", "default_model", "KNOBS",
    "plan_arm", "SHAPES", "ModelShape", "resolve_model", "current_platform", "Protocol", "Results", "load",
    "Burst", "Concurrency", "Fixed", "FromLog", "LogNormal", "Mix", "Periodic", "Poisson", "Uniform", "Workload",
]
