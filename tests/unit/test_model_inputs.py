"""A model argument meant as a folder that is not there is refused (never sent to a hub), and a broken model
folder names its file and every problem, all before any engine starts."""
import json

import pytest

import labkit as lk
from labkit.errors import BadParameter
from labkit.spec.models import check_model, looks_like_path, resolve_model

GOOD = lk.SHAPES["tiny-llama"].hf_config()


@pytest.mark.parametrize("name", ["/no/such/model", "./nope", "../nope", "~/no-such-model-here", "a/b/c", "nope/",
                                  "models/../x", "C:\\models\\x", "."])
def test_a_path_like_model_that_does_not_exist_is_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_path(name)
    for call in (check_model, resolve_model):
        with pytest.raises(BadParameter, match="model folder|no config.json"):
            call(name)


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B-Instruct"])
def test_a_hub_id_is_still_accepted(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not looks_like_path(name)
    check_model(name)
    assert resolve_model(name).shape is None


def test_a_file_given_as_the_model_is_refused(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    with pytest.raises(BadParameter, match="is a file, not a model folder"):
        check_model(str(weights))


def _folder(tmp_path, name, *, raw=None, config=None, tokenizer=True):
    folder = tmp_path / name
    folder.mkdir()
    if raw is not None:
        (folder / "config.json").write_bytes(raw)
    elif config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return str(folder)


@pytest.mark.parametrize("label, kwargs, complaint", [
    ("not-json", dict(raw=b"{not json"), "cannot be read as JSON"),
    ("empty", dict(raw=b""), "cannot be read as JSON"),
    ("not-utf8", dict(raw=b"\xff\xfe\x00"), "cannot be read as JSON"),
    ("a-list", dict(raw=b"[1, 2]"), "not a JSON object"),
    ("no-architectures", dict(config={k: v for k, v in GOOD.items() if k != "architectures"}), "`architectures`"),
    ("architectures-text", dict(config={**GOOD, "architectures": "LlamaForCausalLM"}), "`architectures`"),
    ("no-model-type", dict(config={k: v for k, v in GOOD.items() if k != "model_type"}), "`model_type`"),
    ("no-tokenizer", dict(config=GOOD, tokenizer=False), "no tokenizer"),
    ("no-config", dict(), "no config.json"),
])
def test_a_broken_model_folder_names_its_file_and_the_problem(tmp_path, label, kwargs, complaint):
    path = _folder(tmp_path, label, **kwargs)
    for call in (check_model, resolve_model):
        with pytest.raises(BadParameter, match=complaint) as caught:
            call(path)
        assert label in str(caught.value)
    with pytest.raises(BadParameter, match=complaint):
        lk.Experiment("m", {"a": {}}, lk.Workload(2, lk.Fixed(4), lk.Fixed(2)), model=path,
                      results_dir=tmp_path / "results")


def test_every_problem_of_a_config_is_named_at_once(tmp_path):
    path = _folder(tmp_path, "bare", config={"hidden_size": 8}, tokenizer=False)
    with pytest.raises(BadParameter) as caught:
        check_model(path)
    assert all(part in str(caught.value) for part in ("`architectures`", "`model_type`", "no tokenizer"))


def test_a_config_the_roofline_cannot_read_still_runs_without_a_shape(tmp_path):
    # vLLM knows more model families than the roofline's field names: the shape is unknown, the model is not refused
    path = _folder(tmp_path, "gpt2-like", config={"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                                   "n_embd": 768})
    ref = resolve_model(path)
    assert ref.shape is None and ref.model == path
