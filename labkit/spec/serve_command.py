"""A launch as its user writes it: a `vllm serve` command line (with the environment variables in force, and
vLLM's own `--config` YAML), parsed by vLLM's own argument parser so every flag means what it means to vLLM.

vLLM's parser runs in a separate process (labkit.measure.serve_parse), like the plan's resolution, so that
vLLM's import stays out of the caller. What the command sets beyond vLLM's defaults becomes the lab's
knobs where the lab has one; the rest is kept and named (`unmodelled`): those settings are not reproduced by
the lab's arms, and a diagnosis says so rather than measure something else under the user's name.
"""
from __future__ import annotations

import dataclasses
import re

from labkit.redact import redact, redacted_repr, secret_values
from labkit.spec.knobs import ARM_VARIABLE_PREFIXES, KNOBS

# engine arguments that do not change what is measured (where the weights come from, names, logging); a
# load_format of "dummy" may (whether random weights run at the real ones' speed is an experiment,
# L3_kernel/real_vs_dummy_weights, not an assumption): to_knobs keeps it as the dummy_weights knob
NO_EFFECT = {"model", "served_model_name", "tokenizer", "revision", "tokenizer_revision", "code_revision",
             "download_dir", "trust_remote_code", "seed", "load_format", "disable_log_stats", "enable_log_requests",
             "hf_token", "hf_overrides", "config_format", "tokenizer_mode", "max_logprobs"}


@dataclasses.dataclass(frozen=True)
class Launch:
    """A parsed `vllm serve` launch: its model, the lab knobs it amounts to, what the lab cannot reproduce,
    and the VLLM_*/NCCL_* variables it ran with."""

    command: str
    model: str
    knobs: dict
    unmodelled: dict
    variables: dict

    __repr__ = redacted_repr  # the command as written may carry VLLM_API_KEY=... or --hf-token ...

    def table(self):
        """The launch's settings and where the lab takes each from (secrets redacted: the table is shown)."""
        import pandas as pd
        rows = [{"setting": k, "value": v, "lab": "knob"} for k, v in self.knobs.items() if k != "environment"]
        rows += [{"setting": k, "value": v, "lab": "environment variable on the command line (this launch's arms)"}
                 for k, v in self.knobs.get("environment", {}).items()]
        rows += [{"setting": k, "value": v, "lab": "not reproduced by the lab's arms"} for k, v in self.unmodelled.items()]
        rows += [{"setting": k, "value": v, "lab": "environment variable (set for every arm)"}
                 for k, v in self.variables.items()]
        # a row names its setting in a column, not a key: redact its value as {setting: value} would be
        rows = [{**row, "value": redact({row["setting"]: row["value"]}, secret_values(self.knobs))[row["setting"]]}
                for row in rows]
        return pd.DataFrame(redact(rows), columns=["setting", "value", "lab"])


def to_knobs(explicit: dict) -> tuple[dict, dict]:
    """The lab's knobs for engine arguments that differ from vLLM's defaults, and the rest (unmodelled)."""
    knobs, rest = {}, {}
    for name, value in explicit.items():
        if name == "load_format" and value == "dummy":
            knobs["dummy_weights"] = True
            continue
        if name in NO_EFFECT:
            continue
        if name == "compilation_config" and isinstance(value, dict):
            extra = {k: v for k, v in value.items() if k not in ("cudagraph_mode", "cudagraph_capture_sizes")}
            if str(value.get("cudagraph_mode", "")).upper().endswith("NONE"):
                knobs["cuda_graphs"] = False
            if value.get("cudagraph_capture_sizes"):
                knobs["cudagraph_capture_sizes"] = list(value["cudagraph_capture_sizes"])
            if extra:
                rest["compilation_config"] = extra
        elif name == "disable_custom_all_reduce":
            knobs["custom_all_reduce"] = not value
        elif name == "speculative_config" and isinstance(value, dict) and not KNOBS["speculative"].check(value):
            knobs["speculative"] = value  # n-gram prompt lookup, which the lab's arms reproduce
        elif name in KNOBS and name not in ("cuda_graphs", "cudagraph_capture_sizes", "environment"):
            knobs[name] = value
        else:
            rest[name] = value
    return knobs, rest


def leading_assignments(words: list[str]) -> tuple[dict, str | None]:
    """Remove the `NAME=value` words a shell command starts with (`NCCL_P2P_DISABLE=1 vllm serve ...`): the
    variables it sets, or what is wrong with them (the lab reproduces NCCL_* and VLLM_* only)."""
    assigned = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        assigned[name] = value
    other = sorted(name for name in assigned if not name.startswith(ARM_VARIABLE_PREFIXES))
    if other:
        return assigned, (f"the command sets {', '.join(other)}: the lab reproduces NCCL_* and VLLM_* variables "
                          "only; set the others in your shell (the environment the lab runs in), and leave them off the command")
    return assigned, None
