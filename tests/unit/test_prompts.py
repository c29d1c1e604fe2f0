"""Prompts built from segments: the same tokens in either order, shared versions round-robin, fresh per trial,
stored and read back (no engine)."""
import pytest

import labkit as lk
from labkit.errors import BadParameter
from labkit.spec.workload import Workload

TEMPLATE = lk.Template([lk.Segment("system", 32, "shared"), lk.Segment("question", 8)])


def test_the_same_tokens_in_two_orders():
    first = Workload(4, TEMPLATE, lk.Fixed(2)).build(1000, content_seed=5)
    last = Workload(4, TEMPLATE.reordered("question", "system"), lk.Fixed(2)).build(1000, content_seed=5)
    for a, b in zip(first, last):
        assert len(a.prompt_token_ids) == 40 and a.prompt_token_ids[32:] + a.prompt_token_ids[:32] == b.prompt_token_ids
    assert len({tuple(r.prompt_token_ids[:32]) for r in first}) == 1  # one system prompt, shared
    assert len({tuple(r.prompt_token_ids[32:]) for r in first}) == 4  # a question of each request's own
    assert TEMPLATE.shared_first_tokens == 32 and TEMPLATE.reordered("question", "system").shared_first_tokens == 0


def test_shared_variants_are_assigned_round_robin_and_drawn_afresh_per_trial():
    docs = lk.Template([lk.Segment("doc", 16, "shared", variants=3), lk.Segment("q", 4)])
    trial = Workload(6, docs, lk.Fixed(1)).build(1000, content_seed=1)
    heads = [tuple(r.prompt_token_ids[:16]) for r in trial]
    assert heads[0] == heads[3] and heads[1] == heads[4] and len(set(heads)) == 3
    other = Workload(6, docs, lk.Fixed(1)).build(1000, content_seed=2)
    assert not {tuple(r.prompt_token_ids[:16]) for r in other} & set(heads)


def test_a_templated_workload_is_stored_and_read_back():
    wl = Workload(4, TEMPLATE, lk.Fixed(3), lk.Concurrency(2))
    assert Workload.from_dict(wl.to_dict()) == wl
    assert wl.longest_request() == 43


@pytest.mark.parametrize("make, words", [
    (lambda: lk.Template([]), "non-empty list of Segments"),
    (lambda: lk.Segment("s", 0), "tokens must be a whole number >= 1"),
    (lambda: lk.Segment("s", 8, "global"), "scope must be one of"),
    (lambda: lk.Segment("q", 8, "unique", variants=2), "shared segments only"),
    (lambda: lk.Template([lk.Segment("a", 4), lk.Segment("a", 4)]), "names must differ"),
    (lambda: TEMPLATE.reordered("system"), "name every segment once"),
    (lambda: Workload(4, TEMPLATE, lk.Fixed(2), shared_prefix_len=8), "names its shared segments itself"),
])
def test_bad_templates_are_clear_errors(make, words):
    with pytest.raises(BadParameter, match=words):
        make()


def test_a_template_longer_than_max_model_len_fails_before_any_engine(tmp_path):
    long = lk.Template([lk.Segment("document", 4096, "shared"), lk.Segment("question", 64)])
    exp = lk.Experiment("too-long", {"a": {"max_model_len": 2048}}, Workload(4, long, lk.Fixed(8)),
                        model="tiny-llama", results_dir=tmp_path)
    with pytest.raises(BadParameter, match="4168"):
        exp.run(progress=False)
    assert not (tmp_path / "too-long" / "arms").exists()
