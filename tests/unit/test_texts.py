"""Requests written in words (ChatText): the tasks, their messages, the length bound, and where they can run."""
import numpy as np
import pytest

import labkit as lk
from labkit.spec.texts import PASSAGES, Vocabulary, written_in_words, _misspelled


def byte_chat(message: str) -> list[int]:
    """A stand-in chat tokenizer with a byte per token, the most tokens a byte-level tokenizer can make."""
    return [32 + b % 200 for b in ("<user>" + message + "<assistant>").encode()]


def test_each_task_writes_its_message_and_copying_tasks_carry_a_passage():
    rng = np.random.default_rng(0)
    for task in ("copy", "edit", "quote"):
        message = lk.ChatText(task).messages(1, rng)[0]
        assert lk.ChatText(task).copying and message.startswith("Request ")
        words = set(message.split())
        assert any(len(words & set(p.split())) > 40 for p in PASSAGES), message  # a passage, nearly whole
    opened = lk.ChatText("open").messages(1, rng)[0]
    assert not lk.ChatText("open").copying and "story" in opened and not any(p[:40] in opened for p in PASSAGES)


def test_an_edit_passage_keeps_its_words_with_letters_swapped_in_some():
    passage = PASSAGES[0]
    edited = _misspelled(passage, np.random.default_rng(3), share=0.5)
    before, after = passage.split(" "), edited.split(" ")
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and changed
    assert all(sorted(a) == sorted(b) and len(a) >= 5 for a, b in changed)  # the same letters, two swapped


def test_content_is_fresh_per_trial_and_the_same_for_the_same_seed():
    workload = lk.Workload(4, lk.ChatText("copy"), lk.Fixed(64), lk.Concurrency(2))
    vocab = Vocabulary(1000, byte_chat)
    first, again, other = (workload.build(vocab, seed) for seed in (1, 1, 2))
    assert [r.prompt_token_ids for r in first] == [r.prompt_token_ids for r in again]
    assert [r.prompt_token_ids for r in first] != [r.prompt_token_ids for r in other]
    assert len({tuple(r.prompt_token_ids[:40]) for r in first}) == 4  # each request numbered: no shared cache start
    assert all(r.max_tokens == 64 for r in first)


def test_the_length_bound_covers_every_prompt_a_byte_level_tokenizer_makes():
    for task in ("copy", "edit", "quote", "open"):
        text = lk.ChatText(task)
        longest = max(len(byte_chat(m)) for m in text.messages(200, np.random.default_rng(5)))
        assert longest <= text.bound()


def test_words_need_the_models_tokenizer():
    workload = lk.Workload(2, lk.ChatText("copy"), lk.Fixed(8))
    with pytest.raises(lk.BadParameter, match="need the model's tokenizer"):
        workload.build(1000, 0)


def test_a_bad_task_is_named_with_the_closest_one():
    with pytest.raises(lk.BadParameter, match="did you mean quote"):
        lk.ChatText("qoute")


def test_a_chat_load_round_trips_and_is_recognised_in_any_load_form():
    workload = lk.Workload(3, lk.ChatText("edit"), lk.Fixed(16), lk.Concurrency(1))
    assert lk.Workload.from_dict(workload.to_dict()) == workload
    assert written_in_words(workload.to_dict())
    assert written_in_words(lk.Mix({"a": lk.Workload.closed_loop(2, 8, 8, 1), "b": workload}).to_dict())
    assert not written_in_words(lk.Workload.closed_loop(2, 8, 8, 1).to_dict())


def test_words_on_a_synthetic_shape_are_refused_before_any_engine(tmp_path):
    workload = lk.Workload(2, lk.ChatText("copy"), lk.Fixed(8))
    with pytest.raises(lk.BadParameter, match="synthetic 'tiny-llama' cannot read"):
        lk.Experiment("words", {"a": {}}, workload, model="tiny-llama", results_dir=tmp_path)
    with pytest.raises(lk.BadParameter, match="share only their chat template"):
        lk.Workload(2, lk.ChatText("copy"), lk.Fixed(8), shared_prefix_len=16)
