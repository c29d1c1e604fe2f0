"""fp8 numerics against bf16: the greedy agreement table from hand-made answers, the engine run's bad input refused
before any engine starts, the error line a failed launch is recorded with, and the diagnosis citing a stored
measurement."""
import math

import pytest

from labkit import settings
from labkit.analyze.numerics import agreement_phrase, compare, numerics_table
from labkit.errors import BadParameter
from labkit.measure.greedy import chosen_logprobs, last_error_line
from labkit.measure.platform import Platform

H200 = Platform("cuda", (0, 26, 0), ("NVIDIA H200",), "9.0")


def answer(ids, logprobs=None):
    return {"ids": ids, "logprobs": logprobs}


REF = [answer([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4]),
       answer([5, 6, 7, 8], [-1.0, -1.0, -1.0, -1.0])]


def test_identical_answers():
    row = compare(REF, REF)
    assert row == {"prompts": 2, "tokens": 4, "mean_leading_agreement": 4.0, "identical_share": 1.0,
                   "position_agreement": 1.0, "mean_abs_dlogprob": 0.0, "compared_logprobs": 8}


def test_answers_that_part_and_the_logprobs_over_the_common_prefix_only():
    other = [answer([1, 2, 9, 4], [-0.15, -0.1, -5.0, -0.4]),  # parts at the third token; the fourth agrees again
             answer([5, 6, 7, 8], [-1.5, -1.0, -1.0, -0.5])]
    row = compare(REF, other)
    assert row["mean_leading_agreement"] == 3.0  # (2 + 4) / 2
    assert row["identical_share"] == 0.5
    assert row["position_agreement"] == 7 / 8  # position 4 of the first prompt agrees by chance: counted
    assert row["compared_logprobs"] == 6  # 2 + 4: only where both chose the same token after the same text
    assert row["mean_abs_dlogprob"] == pytest.approx((0.05 + 0.1 + 0.5 + 0 + 0 + 0.5) / 6)


def test_first_token_differs_and_lengths_differ():
    other = [answer([9, 2, 3, 4], [-0.1] * 4), answer([5, 6], [-1.0, -1.0])]  # the second stops early (EOS)
    row = compare(REF, other)
    assert row["mean_leading_agreement"] == 1.0  # (0 + 2) / 2
    assert row["identical_share"] == 0.0
    assert row["position_agreement"] == 5 / 8  # 3 by chance + 2; the missing 2 positions differ
    assert row["compared_logprobs"] == 2 and row["mean_abs_dlogprob"] == 0.0
    first = compare(REF[:1], [answer([9, 9, 9, 9], [-0.1] * 4)])
    assert first["mean_leading_agreement"] == 0 and math.isnan(first["mean_abs_dlogprob"])
    table = numerics_table({"bf16": {"answers": REF[:1]}, "fp8": {"answers": [answer([9, 9, 9, 9])]}}, "bf16")
    assert table.word[0] == "differs from the first token"


def test_empty_answers_and_no_logprobs():
    row = compare([answer([]), answer([])], [answer([]), answer([])])
    assert row["prompts"] == 2 and row["tokens"] == 0 and row["identical_share"] == 1.0
    assert math.isnan(row["position_agreement"]) and math.isnan(row["mean_abs_dlogprob"])
    no_logprobs = compare([answer([1, 2])], [answer([1, 2])])
    assert no_logprobs["identical_share"] == 1 and math.isnan(no_logprobs["mean_abs_dlogprob"])
    assert math.isnan(compare([], [])["mean_leading_agreement"])
    with pytest.raises(BadParameter, match="different prompt sets"):
        compare(REF, REF[:1])
    table = numerics_table({"a": {"answers": [answer([])]}, "b": {"answers": [answer([])]}}, "a")
    assert list(table.word) == ["no tokens to compare (empty answers)"]
    assert list(numerics_table({"a": {"answers": []}, "b": {"answers": []}}, "a").word) == ["no prompts to compare"]


def test_the_table_with_words_and_failed_launches():
    runs = {"bf16": {"answers": REF},
            "fp8_weights": {"answers": [REF[0], answer([5, 6, 0, 0], [-1.0, -1.1, -2, -2])]},
            "fp8_kv": {"answers": REF},
            "fp8_both": {"cause": "ValueError: fp8 is not supported on this GPU"}}
    table = numerics_table(runs, "bf16").set_index("launch")
    assert list(table.index) == ["fp8_weights", "fp8_kv", "fp8_both"]
    assert table.word["fp8_weights"] == "agrees for 3.0 of 4 tokens on average (1 of 2 prompts identical)"
    assert table.mean_abs_dlogprob["fp8_weights"] == pytest.approx(0.1 / 6)
    assert table.word["fp8_kv"] == "identical"
    assert table.word["fp8_both"] == "did not run" and "not supported" in table.cause["fp8_both"]
    assert math.isnan(table.mean_leading_agreement["fp8_both"])
    failed_reference = numerics_table({"bf16": {"cause": "out of memory"}, "fp8_kv": {"answers": REF}}, "bf16")
    assert failed_reference.word[0] == "not compared" and "out of memory" in failed_reference.cause[0]
    with pytest.raises(BadParameter, match="reference launch 'fp16'"):
        numerics_table(runs, "fp16")


def test_the_last_meaningful_error_line():
    stderr = """INFO 11-20 vLLM is starting
Traceback (most recent call last):
  File "/x/vllm/engine.py", line 10, in <module>
    raise ValueError("fp8 quantization is not supported")
ValueError: fp8 quantization is not supported for this GPU (compute capability 8.0)
INFO 11-20 shutting down
"""
    assert last_error_line(stderr) == ("ValueError: fp8 quantization is not supported for this GPU "
                                       "(compute capability 8.0)")
    assert last_error_line("killed\n\n") == "killed" and last_error_line("") == ""
    tagged = "(EngineCore_DP0 pid=7) ERROR 11-20 failed\n(EngineCore_DP0 pid=7) RuntimeError: no fp8 kernel\n"
    assert last_error_line(tagged) == "RuntimeError: no fp8 kernel"


def test_the_chosen_logprob_of_each_step():
    class Logprob:
        def __init__(self, value):
            self.logprob = value

    class Output:
        token_ids = [7, 3]
        logprobs = [{7: Logprob(-0.25), 1: Logprob(-2.0)}, {3: Logprob(-1.5)}]

    assert chosen_logprobs(Output()) == [-0.25, -1.5]
    Output.logprobs = None
    assert chosen_logprobs(Output()) is None


def test_bad_numerics_input_is_refused_at_once_before_any_engine():
    from labkit.measure.numerics import run_launches
    with pytest.raises(BadParameter) as raised:
        run_launches("tiny-llama", {"bf16": {}, "fp8": {"quantisation": "fp8"}}, max_tokens=0, questions=[])
    text = str(raised.value)
    assert "4 problems, nothing started" in text
    assert "dummy weights" in text and "'quantisation'" in text and "quantization" in text
    assert "max_tokens" in text and "questions" in text
    with pytest.raises(BadParameter, match="non-empty dict"):
        run_launches("smollm2-135m", {})


def test_the_diagnosis_cites_a_stored_agreement(tmp_path):
    from labkit.diagnose import fp8_quality, profile_changes
    from labkit.measure.numerics import record_numerics, stored_numerics
    compute = "compute-bound: at the GEMM limit (quantize, or a bigger GPU)"
    with settings.use(settings.current().replace(numerics_dir=tmp_path)):
        assert fp8_quality(H200, "fp8_weights") == "check its quality before deploying"
        assert "check its quality" in profile_changes({}, H200, compute, "FLASH_ATTN")["fp8_weights"][1]
        table = numerics_table({"bf16": {"answers": REF},
                                "fp8_weights": {"answers": [REF[0], answer([5, 6, 0, 0], [-1.0, -1.1, -2, -2])]},
                                "fp8_kv": {"cause": "engine failed"}}, "bf16")
        path = record_numerics(table, "smollm2-135m", H200, max_tokens=4)
        assert path == str(tmp_path / "h200.json")
        assert stored_numerics(H200)["rows"][1]["mean_leading_agreement"] is None  # NaN kept as null
        why = profile_changes({}, H200, compute, "FLASH_ATTN")["fp8_weights"][1]
        assert ("measured against bf16: greedy tokens agreed for 3.0 of 4 on average on smollm2-135m (2 prompts, "
                "mean |delta logprob| 0.017; measured on h200, ") in why
        assert fp8_quality(H200, "fp8_kv") == "check its quality before deploying"  # it did not run: no claim
        h100 = Platform("cuda", (0, 26, 0), ("NVIDIA H100 80GB HBM3",), "9.0")
        assert fp8_quality(h100, "fp8_weights") == "check its quality before deploying"  # another GPU's file
        assert agreement_phrase({"rows": []}, "fp8_weights") is None
