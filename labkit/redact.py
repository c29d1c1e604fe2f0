"""Secrets never leave the lab in what it writes or shows: every stored file, printed table, launch line, repr
and error message passes through here. The real values stay where they are needed (the arm worker's environment,
the engine's arguments in memory); only what is stored or shown is redacted.

A value is secret when its name says so (`secret_name`: HF_TOKEN, VLLM_API_KEY, AWS_*, hf_token, --api-key, ...),
when it has the shape of a known kind of token (hf_..., sk-..., ghp_..., AKIA...), or when it is the value of a
secret-named variable of this process's environment (a log that echoes it without its name).
"""
from __future__ import annotations

import functools
import os
import re

REDACTED = "<redacted>"
MIN_LITERAL = 8  # a shorter secret is redacted only beside its name: replacing "1" everywhere would mangle the text

# the last word of a name that makes it secret (TOKEN last: VLLM_..._TOKEN_THRESHOLD is a count, not a secret)
_SECRET_LAST = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                "AUTH", "AUTHORIZATION", "COOKIE"}
_SECRET_ANYWHERE = {"SECRET", "PASSWORD", "PASSWD", "APIKEY"}
# KEY is secret only after one of these (hardware_key, cache_key and sort_key are not)
_KEY_QUALIFIERS = {"API", "ACCESS", "SECRET", "PRIVATE", "AUTH", "SIGNING", "ENCRYPTION", "SERVICE", "LICENSE",
                   "SESSION", "CLIENT", "MASTER", "ACCOUNT"}
_SECRET_PREFIXES = ("AWS_",)  # every AWS_* variable is treated as a credential, but for its plain settings:
_SETTING_LAST = {"REGION", "PROFILE", "BUNDLE", "FILE", "URL", "OUTPUT"}  # AWS_REGION, AWS_CA_BUNDLE (a path)

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

_TOKEN_SHAPES = re.compile("|".join([
    r"(?<![\w-])hf_(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{6,}(?!\w)",  # Hugging Face (hf_overrides, all lower case, is a name)
    r"(?<![\w-])sk-(?=[\w-]*[A-Z0-9])[\w-]{8,}",  # OpenAI-style API keys
    r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,})",  # GitHub
    r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])",  # AWS access key ids
    r"(?<![\w-])xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
]))
_BEARER = re.compile(r"(?i)\b(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_QUOTED = r"\"[^\"]*\"|'[^']*'"
# NAME=value (a shell assignment, a keyword argument, a log line)
_ASSIGNMENT = re.compile(rf"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=({_QUOTED}|[^\s'\",;&)}}\]]+)")
# --flag value and --flag=value (a command line)
_FLAG = re.compile(rf"(?<![\w-])(--[A-Za-z][\w-]*)(=|\s+)(?!-)({_QUOTED}|[^\s'\"]+)")
# "name": "value" and 'name': 'value' (JSON, a dict's repr; also JSON inside a JSON string, its quotes escaped).
# Keys are found alone and values read after them, so a value holding JSON of its own is searched too.
_KEY = re.compile(r"(\\?[\"'])([A-Za-z_][\w.-]*)\1\s*:\s*")
_VALUE = re.compile(r"(\\?[\"'])((?:(?!\1).)*)\1|([^\s,}\]\"'\\]+)")
_PLAIN = {"true", "false", "True", "False", "null", "None"}  # a flag such as hf_token=True holds no secret


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    text = name.lstrip("-")
    words = [w.upper() for w in _WORDS.findall(text)]
    if text.upper().startswith(_SECRET_PREFIXES):
        return words[-1] not in _SETTING_LAST
    if not words:
        return False
    if words[-1] in _SECRET_LAST or _SECRET_ANYWHERE & set(words):
        return True
    return words[-1] in ("KEY", "KEYS") and len(words) > 1 and words[-2] in _KEY_QUALIFIERS


def secret_name(name) -> bool:
    """Whether a variable, argument, flag or key of this name holds a secret: HF_TOKEN, VLLM_API_KEY,
    WANDB_API_KEY, AWS_*, hf_token, --api-key, apiKey; not max_num_batched_tokens, tokenizer, hardware_key,
    KV_CACHE_... or VLLM_..._TOKEN_THRESHOLD."""
    return isinstance(name, str) and bool(name) and _secret_name(name)


def environment_secrets(environ=None) -> set[str]:
    """The values of this process's secret-named environment variables that are long enough to find in text."""
    environ = os.environ if environ is None else environ
    return {v for k, v in environ.items() if secret_name(k) and len(v) >= MIN_LITERAL}


def secret_values(obj) -> set[str]:
    """The text values held under secret names anywhere in a nest of dicts and lists."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if secret_name(key) and isinstance(value, str) and value:
                found.add(value)
            found |= secret_values(value)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            found |= secret_values(value)
    return found


def _quote_like(original: str) -> str:
    return f"{original[0]}{REDACTED}{original[0]}" if original[:1] in "\"'" and len(original) > 1 else REDACTED


def _literals(secrets) -> list[str]:
    """The literal secrets to look for, the longest first (a secret that holds another is replaced whole)."""
    return sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_LITERAL} | environment_secrets(),
                  key=len, reverse=True)


def redact_text(text: str, secrets=()) -> str:
    """`text` with every secret replaced by <redacted>: the value of a secret-named `NAME=value`, `--flag value`
    or `"name": "value"`, a token-shaped word, a Bearer credential, and every literal occurrence of `secrets`
    and of this process's secret environment values. Applying it twice changes nothing more."""
    return _redact_text(text, _literals(secrets))


def _redact_text(text: str, literals: list[str]) -> str:
    if not isinstance(text, str) or not text:
        return text
    for value in literals:
        text = text.replace(value, REDACTED)
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={_quote_like(m.group(2))}" if secret_name(m.group(1))
                           else m.group(0), text)
    text = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{_quote_like(m.group(3))}" if secret_name(m.group(1))
                     else m.group(0), text)
    return _redact_pairs(text)


def _redact_pairs(text: str) -> str:
    out, last = [], 0
    for key in _KEY.finditer(text):
        if key.start() < last or not secret_name(key.group(2)):
            continue
        value = _VALUE.match(text, key.end())
        if not value or value.group(3) in _PLAIN:
            continue
        quote = value.group(1)
        out += [text[last:key.end()], f"{quote}{REDACTED}{quote}" if quote is not None else REDACTED]
        last = value.end()
    return "".join(out) + text[last:]


def redact(obj, secrets=()):
    """A copy of a nest of dicts, lists and text with every secret redacted: a secret-named key's value
    (not a flag such as hf_token=True, not an absent one) and, in every text, what `redact_text` finds, the
    object's own secret values included (a log tail that echoes the arm's VLLM_API_KEY)."""
    literals = _literals(set(secrets) | secret_values(obj))

    def walk(value):
        if isinstance(value, dict):
            return {k: (REDACTED if secret_name(k) and v is not None and not isinstance(v, bool) and v != ""
                        else walk(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        if isinstance(value, str):
            return _redact_text(value, literals)
        return value
    return walk(obj)


def redacted_repr(self) -> str:
    """A dataclass's repr with its secrets redacted (use as `__repr__ = redacted_repr`): reprs reach notebooks,
    tracebacks and logs."""
    import dataclasses

    fields = ", ".join(f"{f.name}={redact(getattr(self, f.name))!r}" for f in dataclasses.fields(self) if f.repr)
    return redact_text(f"{type(self).__name__}({fields})", secret_values(
        {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}))
