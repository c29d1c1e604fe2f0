"""Sizes the lab could not hold in memory are refused with the limit named, before anything is drawn (every
case here is far past the limit: without the check it would fail with a MemoryError, or fill the host)."""
import pytest

import labkit as lk
from labkit.errors import BadParameter
from labkit.spec.limits import MAX_REQUESTS_PER_TRIAL, MAX_TOKENS_PER_REQUEST, MAX_TOKENS_PER_TRIAL

HUGE = 2 ** 40


@pytest.mark.parametrize("label, build", [
    ("num_requests", lambda: lk.Workload(HUGE, lk.Fixed(1), lk.Fixed(1))),
    ("Fixed length", lambda: lk.Fixed(HUGE)),
    ("Uniform length's high", lambda: lk.Uniform(1, HUGE)),
    ("shared_prefix_len", lambda: lk.Workload(1, lk.Fixed(1), lk.Fixed(1), shared_prefix_len=HUGE)),
    ("shared prefixes' tokens", lambda: lk.Workload(1, lk.Fixed(1), lk.Fixed(1), shared_prefix_len=1024,
                                                    num_prefixes=HUGE)),
    ("shared versions", lambda: lk.Workload(1, lk.Template([lk.Segment("doc", 1024, "shared", variants=HUGE)]),
                                            lk.Fixed(1))),
    ("longest request", lambda: lk.Workload(1, lk.Template([lk.Segment("q", HUGE)]), lk.Fixed(1))),
    ("longest request", lambda: lk.Workload(1, lk.LogNormal(2 ** 30, 3.0), lk.Fixed(1))),
    ("trial's tokens", lambda: lk.Workload(2 ** 20, lk.Fixed(2 ** 8), lk.Fixed(2 ** 8))),
    ("conversation's turns", lambda: lk.Conversation(HUGE, 2, 8, lk.Fixed(4), lk.Fixed(4))),
    ("conversation's turns", lambda: lk.Conversation(2, 2 ** 30, 8, lk.Fixed(4), lk.Fixed(4))),
    ("system", lambda: lk.Conversation(1, 1, HUGE, lk.Fixed(4), lk.Fixed(4))),
    ("last turn's request", lambda: lk.Conversation(1, 2 ** 12, 8, lk.Fixed(2 ** 12), lk.Fixed(2 ** 12))),
    ("warmup_requests", lambda: lk.Protocol(warmup_requests=HUGE)),
    ("profile_requests", lambda: lk.Protocol(profile_requests=HUGE)),
])
def test_a_size_past_the_limit_is_refused_and_names_it(label, build):
    with pytest.raises(BadParameter, match="above the lab's limit") as caught:
        build()
    assert label in str(caught.value)


def test_sizes_at_the_limits_are_accepted():
    lk.Workload(MAX_REQUESTS_PER_TRIAL, lk.Fixed(64), lk.Fixed(64))  # 2^27 tokens: exactly the trial limit
    assert MAX_REQUESTS_PER_TRIAL * 128 == MAX_TOKENS_PER_TRIAL
    lk.Workload(1, lk.Fixed(MAX_TOKENS_PER_REQUEST - 1), lk.Fixed(1))
    lk.Workload(1, lk.Template([lk.Segment("doc", 2 ** 10, "shared", variants=2 ** 17)]), lk.Fixed(1))
    lk.Protocol(warmup_requests=MAX_REQUESTS_PER_TRIAL)


def test_one_past_the_request_limit_is_refused():
    with pytest.raises(BadParameter, match="longest request"):
        lk.Workload(1, lk.Fixed(MAX_TOKENS_PER_REQUEST), lk.Fixed(1))
