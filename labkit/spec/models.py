"""Synthetic, architecture-shaped models: a config.json plus a generated tokenizer, loaded with dummy weights.

Decode and prefill speed depend on tensor shapes, not on weight values, so an architecture-shaped model
with `load_format="dummy"` measures the real engine without a model hub. A local model folder or a hub id
is accepted too; then the real weights are loaded, as they are for a model shipped in a package
(labkit.spec.packaged_models: `smollm2-135m`, and `smollm2-135m-dummy`, its synthetic twin).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter, close_match
from labkit.files import make_folder_atomically
from labkit.spec.numbers import COUNT, POSITIVE, check_numbers
from labkit.spec.packaged_models import DUMMY_SUFFIX, PACKAGED, model_folder, packaged_name

# Ids below FIRST_TEXT_ID are the special tokens of the generated tokenizer.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
FIRST_TEXT_ID = 4


@dataclass(frozen=True)
class ModelShape:
    """The tensor shapes of a decoder-only transformer: all that speed depends on."""

    name: str
    architecture: str  # a vLLM model class, e.g. "LlamaForCausalLM"
    model_type: str  # the Hugging Face config's model_type
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    extra_config: dict = field(default_factory=dict)

    def __post_init__(self):
        sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings")
        check_numbers(f"model shape {self.name!r}", {**{name: (getattr(self, name), COUNT) for name in sizes},
                                                     "rope_theta": (self.rope_theta, POSITIVE)})
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise BadParameter(f"model shape {self.name!r}: hidden_size must divide by num_heads, "
                               "and num_heads by num_kv_heads")
        if self.vocab_size <= FIRST_TEXT_ID:
            raise BadParameter(f"model shape {self.name!r}: vocab_size must exceed {FIRST_TEXT_ID}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: hidden_size / num_heads."""
        return self.hidden_size // self.num_heads

    @property
    def linear_params(self) -> int:
        """The decoder layers' projection weights (q, k, v, o, gate, up, down): what weight quantization
        such as fp8 shrinks; embeddings, the LM head and the norms keep the model's dtype."""
        attention = self.hidden_size * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attention + mlp)

    @property
    def num_params(self) -> int:
        """Every parameter: the projections, the embedding table (and an untied LM head) and the norms."""
        h = self.hidden_size
        norms = (2 * self.num_layers + 1) * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.linear_params + embeddings + norms

    @property
    def matmul_params(self) -> int:
        """Parameters touched by matmuls per token: every weight except the input embedding lookup."""
        return self.num_params - self.vocab_size * self.hidden_size * (0 if self.tie_word_embeddings else 1)

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> float:
        """KV-cache bytes of one token: keys and values of every layer's KV heads, at `kv_dtype_bytes` each."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def hf_config(self) -> dict:
        """The config.json of a Hugging Face model of this shape, with `extra_config` applied last."""
        config = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        }
        config.update(self.extra_config)
        return config

    @classmethod
    def from_hf_config(cls, config: dict, name: str) -> "ModelShape":
        """The shape of a real model, from its config.json (for the roofline of a local model)."""
        text = config.get("text_config", config)
        heads = text["num_attention_heads"]
        return cls(
            name=name,
            architecture=(config.get("architectures") or ["unknown"])[0],
            model_type=text.get("model_type", "unknown"),
            hidden_size=text["hidden_size"],
            num_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads", heads),
            intermediate_size=text["intermediate_size"],
            vocab_size=text["vocab_size"],
            max_position_embeddings=text.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            rope_theta=float(text.get("rope_theta", 10000.0)),
            extra_config={"rms_norm_eps": text["rms_norm_eps"]} if text.get("rms_norm_eps", 1e-5) != 1e-5 else {},
        )


SHAPES: dict[str, ModelShape] = {s.name: s for s in [
    # For tests: runs in milliseconds per step on two CPU cores (head_dim 64: the CPU attention kernels need it).
    ModelShape("tiny-llama", "LlamaForCausalLM", "llama", hidden_size=256, num_layers=2, num_heads=4,
               num_kv_heads=2, intermediate_size=512, vocab_size=512, max_position_embeddings=4096),
    # A laptop-sized real-world shape (Qwen2.5-0.5B): 0.5 B parameters, grouped-query attention.
    ModelShape("qwen2.5-0.5b", "Qwen2ForCausalLM", "qwen2", hidden_size=896, num_layers=24, num_heads=14,
               num_kv_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
               tie_word_embeddings=True, rope_theta=1000000.0, extra_config={"rms_norm_eps": 1e-6}),
    # The GPU default: Llama-3-8B.
    ModelShape("llama3-8b", "LlamaForCausalLM", "llama", hidden_size=4096, num_layers=32, num_heads=32,
               num_kv_heads=8, intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
               rope_theta=500000.0),
]}


@dataclass(frozen=True)
class ModelRef:
    """What an engine is given: a model path or hub id, how to load it, and its shape for the roofline."""

    model: str
    load_format: str
    shape: ModelShape | None
    synthetic: bool

    def to_dict(self) -> dict:
        """The reference as plain data, its shape as a dict (None when unknown)."""
        return {"model": self.model, "load_format": self.load_format, "synthetic": self.synthetic,
                "shape": asdict(self.shape) if self.shape else None}


# A hub id is exactly `org/name`; anything else with a separator, or a home/relative prefix, is meant as a folder
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")
# files one of which a folder needs for vLLM to build its tokenizer (fast, sentencepiece, BPE, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def looks_like_path(name: str) -> bool:
    """Whether a model argument is meant as a local folder rather than a hub id (`org/name`): it starts with
    /, ./, ../ or ~, uses a backslash or a drive, ends with a separator, or has more than one `/`."""
    return (name.startswith(_PATH_PREFIXES) or "\\" in name or name.endswith("/") or name.count("/") > 1
            or (len(name) > 1 and name[1] == ":") or name in (".", ".."))


def read_model_config(folder: Path) -> dict:
    """The config.json of a local model folder, or BadParameter naming the file and every problem with it
    (unreadable, not JSON, no `architectures` or `model_type`, no tokenizer file beside it)."""
    config_file = folder / "config.json"
    fix = "pass a model folder saved by transformers (save_pretrained), a hub id or one of " + ", ".join(SHAPES)
    if not config_file.is_file():
        raise BadParameter(f"{folder} has no config.json: {fix}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadParameter(f"{config_file} cannot be read as JSON ({exc}): {fix}") from None
    if not isinstance(config, dict):
        raise BadParameter(f"{config_file} holds a {type(config).__name__}, not a JSON object: {fix}")
    problems = []
    architectures = config.get("architectures")
    if not (isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)):
        problems.append(f"`architectures` must be a list of model class names such as [\"LlamaForCausalLM\"], "
                        f"got {architectures!r}")
    if not isinstance(config.get("model_type"), str) or not config.get("model_type"):
        problems.append(f"`model_type` must name the model family such as \"llama\", got {config.get('model_type')!r}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer beside it (none of {', '.join(TOKENIZER_FILES)} in {folder})")
    if problems:
        raise BadParameter(f"{config_file}: " + "; ".join(problems) + f"; {fix}")
    return config


def check_model(name_or_path: str) -> None:
    """Raise BadParameter unless the name is a synthetic shape, a local model folder (its config.json and
    tokenizer checked) or a hub id (org/name); writes nothing, so an experiment can check its model when it is
    defined. A name meant as a folder that does not exist is refused, never sent to a hub."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise BadParameter(f"model must be a name, a model folder or a hub id (text), got {name_or_path!r}")
    if name_or_path in SHAPES or packaged_name(name_or_path):
        return
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        read_model_config(local)
        return
    if looks_like_path(name_or_path) or local.exists():
        what = "is a file, not a model folder" if local.exists() else "does not exist"
        raise BadParameter(f"model folder {name_or_path!r} {what} (resolved: {local.resolve()}): pass an existing "
                           f"model folder, a hub id such as 'meta-llama/Llama-3.1-8B' or one of {', '.join(SHAPES)}")
    if name_or_path.count("/") == 1 and all(name_or_path.split("/")):
        return
    names = [*SHAPES, *PACKAGED, *(name + DUMMY_SUFFIX for name in PACKAGED)]
    raise BadParameter(f"unknown model {name_or_path!r}{close_match(name_or_path, names)}: use one of {', '.join(names)}, "
                       "a local model folder or a hub id such as 'meta-llama/Llama-3.1-8B'")


def resolve_model(name_or_path: str, models_dir: str | Path | None = None) -> ModelRef:
    """A synthetic shape name, a local model folder or a hub id, made ready for an engine."""
    check_model(name_or_path)
    if name_or_path in SHAPES:
        shape = SHAPES[name_or_path]
        path = materialize(shape, models_dir)
        return ModelRef(str(path), "dummy", shape, synthetic=True)
    packaged = packaged_name(name_or_path)
    local = model_folder(packaged[0], models_dir) if packaged else Path(name_or_path).expanduser()
    if local.is_dir():
        config = read_model_config(local)
        try:
            shape = ModelShape.from_hf_config(config, local.name)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, BadParameter):
            # vLLM may still run it (other field names, other families); only the roofline needs the shape
            shape = None
        if packaged and packaged[1]:  # the dummy twin: the real model's folder, its weights' values left out
            return ModelRef(str(local), "dummy", shape, synthetic=True)
        return ModelRef(str(local), "auto", shape, synthetic=False)
    return ModelRef(name_or_path, "auto", None, synthetic=False)  # a hub id; its shape is unknown offline


def materialize(shape: ModelShape, models_dir: str | Path | None = None) -> Path:
    """Write the model folder once (atomically); later calls reuse it while the shape is unchanged."""
    root = Path(models_dir) if models_dir else settings.current().models_dir
    config = shape.hf_config()
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    target = root / f"{shape.name}-{digest}"
    if (target / "tokenizer.json").exists():
        return target

    def fill(staging: Path) -> None:
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        (staging / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}))
        _write_tokenizer(staging, shape.vocab_size, shape.max_position_embeddings)

    return make_folder_atomically(target, fill)


def _write_tokenizer(folder: Path, vocab_size: int, max_len: int) -> None:
    """A word-level tokenizer whose vocabulary covers every id, so any sampled id decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<unk>": UNK_ID}
    vocab.update({f"t{i}": i for i in range(FIRST_TEXT_ID, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": max_len,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }, indent=2))
