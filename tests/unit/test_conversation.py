"""Multi-turn sessions as a workload: lengths that grow with the history, stored and read back, bad input
refused before any engine starts (no engine; the driver's turns run in the L1 prefix-cache notebook)."""
import pytest

import labkit as lk
from labkit.errors import BadParameter


def test_each_turn_resends_the_history_and_a_new_message():
    chat = lk.Conversation(sessions=2, turns=3, system=100, message=lk.Fixed(10), output_len=lk.Fixed(5))
    assert chat.prompt_lengths().tolist() == [[110, 125, 140]] * 2
    assert chat.longest_request() == 145 and chat.num_requests == 6
    first = chat.build(1000, content_seed=1)
    assert [len(r.prompt_token_ids) for r in first] == [110, 110]
    assert first[0].prompt_token_ids[:100] == first[1].prompt_token_ids[:100]  # the shared system prompt
    assert first[0].prompt_token_ids[100:] != first[1].prompt_token_ids[100:]
    assert chat.build(1000, content_seed=2)[0].prompt_token_ids[:100] != first[0].prompt_token_ids[:100]


def test_a_conversation_is_stored_and_read_back_and_is_a_closed_loop():
    chat = lk.Conversation(4, 2, 64, lk.Uniform(8, 16), lk.Fixed(4), concurrency=2, think_time_s=0.5, seed=3)
    assert lk.Workload.from_dict(chat.to_dict()) == chat
    assert chat.arrival == lk.Concurrency(2)


@pytest.mark.parametrize("kwargs, words", [
    (dict(sessions=0), "sessions must be a whole number >= 1"), (dict(turns=0), "turns must be a whole number >= 1"), (dict(system=-1), "system must be"),
    (dict(message=16), "message must be a length distribution"), (dict(think_time_s=-1), "think_time_s"),
])
def test_zero_sessions_or_turns_and_other_bad_input_are_clear_errors(kwargs, words):
    args = dict(sessions=2, turns=2, system=16, message=lk.Fixed(8), output_len=lk.Fixed(4)) | kwargs
    with pytest.raises(BadParameter, match=words):
        lk.Conversation(**args)


def test_a_history_longer_than_max_model_len_fails_before_any_engine(tmp_path):
    chat = lk.Conversation(2, 8, 512, lk.Fixed(128), lk.Fixed(128))
    exp = lk.Experiment("chat", {"a": {"max_model_len": 2048}}, chat, model="tiny-llama", results_dir=tmp_path)
    with pytest.raises(BadParameter, match=str(chat.longest_request())):
        exp.run(progress=False)


def test_the_offline_llm_class_cannot_hold_a_conversation(tmp_path):
    chat = lk.Conversation(2, 2, 16, lk.Fixed(8), lk.Fixed(4))
    with pytest.raises(BadParameter, match="offline LLM class"):
        lk.Experiment("chat", {"a": {}}, chat, model="tiny-llama", context="offline", results_dir=tmp_path)
