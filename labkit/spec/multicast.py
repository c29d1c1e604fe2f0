"""The environment variables that keep NVLink multicast off, and those among a set of variables that would turn
it on (the guard on the shell and on an arm's `environment` knob: labkit.measure.environment)."""
from __future__ import annotations


# NVLink multicast (NVLS) is kept off: on shared multi-GPU hosts a program that uses it can put the
# host's GPUs out of service for a long time, and a two-GPU all-reduce gains nothing from it. vLLM's
# torch symmetric-memory all-reduce (on by default) would otherwise create multicast objects too.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def multicast_problems(variables: dict) -> list[str]:
    """Each variable among `variables` that would turn NVLink multicast on, as `NAME='value'`."""
    return [f"{name}={variables[name]!r}" for name, off in MULTICAST_OFF.items()
            if name in variables and str(variables[name]) != off]
