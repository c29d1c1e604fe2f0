"""Length distributions, arrival processes and request building: seeded and exact."""
import json

import numpy as np
import pytest

from labkit.errors import BadParameter
from labkit.spec.models import FIRST_TEXT_ID
from labkit.spec.workload import Burst, Concurrency, Fixed, FromLog, LogNormal, Poisson, Uniform, Workload


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- length distributions ----------------------------------------------------------------------------
def test_fixed():
    out = Fixed(7).sample(rng(), 50)
    assert out.dtype == np.int64 and out.shape == (50,)
    assert (out == 7).all()
    assert (Fixed(np.int64(3)).sample(rng(), 2) == 3).all()


@pytest.mark.parametrize("n", [0, -1, 2.5, "8", None])
def test_fixed_rejects(n):
    with pytest.raises(BadParameter):
        Fixed(n)


def test_uniform_bounds_inclusive_and_reproducible():
    out = Uniform(3, 6).sample(rng(1), 2000)
    assert out.min() == 3 and out.max() == 6  # both ends reached with 2000 draws
    assert set(np.unique(out)) == {3, 4, 5, 6}
    assert np.array_equal(out, Uniform(3, 6).sample(rng(1), 2000))
    assert not np.array_equal(out, Uniform(3, 6).sample(rng(2), 2000))
    assert (Uniform(5, 5).sample(rng(), 10) == 5).all()


@pytest.mark.parametrize("low, high", [(0, 5), (6, 5), (-2, 3)])
def test_uniform_rejects(low, high):
    with pytest.raises(BadParameter):
        Uniform(low, high)


def test_lognormal_clipped_and_reproducible():
    dist = LogNormal(median=100, sigma=1.5, low=20, high=300)
    out = dist.sample(rng(3), 5000)
    assert out.min() >= 20 and out.max() <= 300
    assert out.min() == 20 and out.max() == 300  # a wide sigma hits both clips
    assert np.array_equal(out, dist.sample(rng(3), 5000))
    assert 80 <= np.median(out) <= 120


def test_lognormal_without_high_is_unbounded_above_and_at_least_low():
    out = LogNormal(median=50, sigma=1.0).sample(rng(4), 5000)
    assert out.min() >= 1
    assert out.max() > 300  # a long tail, not clipped
    assert out.dtype.kind == "i"


def test_lognormal_zero_sigma_is_the_median():
    assert (LogNormal(median=64, sigma=0).sample(rng(), 10) == 64).all()


@pytest.mark.parametrize("kwargs", [dict(median=0.5, sigma=1), dict(median=10, sigma=-1),
                                    dict(median=10, sigma=1, low=0), dict(median=10, sigma=1, low=50, high=20)])
def test_lognormal_rejects(kwargs):
    with pytest.raises(BadParameter):
        LogNormal(**kwargs)


def test_fromlog_resamples_only_logged_values():
    dist = FromLog((10, 20, 30))
    out = dist.sample(rng(5), 1000)
    assert set(np.unique(out)) == {10, 20, 30}
    assert np.array_equal(out, dist.sample(rng(5), 1000))


@pytest.mark.parametrize("values", [(), (0, 5), (3, -1)])
def test_fromlog_rejects(values):
    with pytest.raises(BadParameter):
        FromLog(values)


def test_fromlog_read(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("12\n40\n  7.0\n\n100\n")
    dist = FromLog.read(path)
    assert dist.values == (12, 40, 7, 100)
    out = dist.sample(rng(), 500)
    assert set(np.unique(out)) <= {12, 40, 7, 100}
    assert FromLog.read(str(path)) == dist


@pytest.mark.parametrize("content", ["12\nabc\n", "", "0\n", "5\n-3\n", "nan\n"])
def test_fromlog_read_bad_content(tmp_path, content):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(BadParameter):
        FromLog.read(path)


def test_fromlog_read_infinity_is_bad_parameter(tmp_path):
    path = tmp_path / "inf.txt"
    path.write_text("10\ninf\n")
    with pytest.raises(BadParameter):
        FromLog.read(path)


# ---- arrivals ------------------------------------------------------------------------------------------
def test_poisson_offsets():
    offsets = Poisson(rate=20.0).offsets(rng(6), 4000)
    assert offsets[0] == 0.0
    assert (np.diff(offsets) > 0).all()
    rate = (len(offsets) - 1) / offsets[-1]
    assert 20 * 0.93 < rate < 20 * 1.07
    assert np.array_equal(offsets, Poisson(rate=20.0).offsets(rng(6), 4000))


def test_bursty_poisson_keeps_the_mean_rate_but_more_variance():
    smooth = np.diff(Poisson(rate=10.0).offsets(rng(7), 5000))
    bursty = np.diff(Poisson(rate=10.0, burstiness=0.25).offsets(rng(7), 5000))
    assert abs(bursty.mean() - 0.1) < 0.01
    assert bursty.std() > 1.5 * smooth.std()


@pytest.mark.parametrize("kwargs", [dict(rate=0), dict(rate=-1), dict(rate=1, burstiness=0)])
def test_poisson_rejects(kwargs):
    with pytest.raises(BadParameter):
        Poisson(**kwargs)


@pytest.mark.parametrize("n", [0, -2, 1.5])
def test_concurrency_rejects(n):
    with pytest.raises(BadParameter):
        Concurrency(n)


def test_burst_and_concurrency_have_no_offsets():
    assert Burst().offsets(rng(), 5) is None
    assert Concurrency(4).offsets(rng(), 5) is None


# ---- workload ------------------------------------------------------------------------------------------
VOCAB = 512


def test_build_exact_lengths_and_ids():
    wl = Workload(40, prompt_len=Uniform(5, 50), output_len=Uniform(1, 30), shared_prefix_len=8, seed=3)
    prompt, output, arrivals = wl.lengths()
    assert arrivals is None
    requests = wl.build(VOCAB, content_seed=0)
    assert [r.index for r in requests] == list(range(40))
    assert [len(r.prompt_token_ids) for r in requests] == prompt.tolist()
    assert [r.max_tokens for r in requests] == output.tolist()
    assert all(13 <= len(r.prompt_token_ids) <= 58 for r in requests)
    ids = np.concatenate([r.prompt_token_ids for r in requests])
    assert ids.min() >= FIRST_TEXT_ID and ids.max() < VOCAB
    assert all(type(t) is int for t in requests[0].prompt_token_ids)
    assert all(r.arrival_s is None for r in requests)
    assert wl.longest_request() == int((prompt + output).max())


def test_lengths_reproducible_for_a_seed():
    a = Workload(30, Uniform(1, 100), LogNormal(20, 1.0), seed=5)
    b = Workload(30, Uniform(1, 100), LogNormal(20, 1.0), seed=5)
    c = Workload(30, Uniform(1, 100), LogNormal(20, 1.0), seed=6)
    for x, y in zip(a.lengths()[:2], b.lengths()[:2]):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.lengths()[0], c.lengths()[0])


def test_content_seed_changes_content_not_lengths():
    wl = Workload(20, Uniform(10, 40), Fixed(5), shared_prefix_len=6, seed=1)
    first, again, second = wl.build(VOCAB, 0), wl.build(VOCAB, 0), wl.build(VOCAB, 1)
    assert [r.prompt_token_ids for r in first] == [r.prompt_token_ids for r in again]
    assert [len(r.prompt_token_ids) for r in first] == [len(r.prompt_token_ids) for r in second]
    assert [r.max_tokens for r in first] == [r.max_tokens for r in second]
    assert all(a.prompt_token_ids != b.prompt_token_ids for a, b in zip(first, second))
    # the shared prefix too is drawn afresh per trial (no cross-trial prefix cache hits)
    assert first[0].prompt_token_ids[:6] != second[0].prompt_token_ids[:6]


def test_single_shared_prefix_within_a_trial():
    wl = Workload(10, Fixed(20), Fixed(3), shared_prefix_len=12, seed=2)
    requests = wl.build(VOCAB, content_seed=4)
    prefixes = {tuple(r.prompt_token_ids[:12]) for r in requests}
    assert len(prefixes) == 1
    suffixes = {tuple(r.prompt_token_ids[12:]) for r in requests}
    assert len(suffixes) == 10  # the rest is per request
    assert all(len(r.prompt_token_ids) == 32 for r in requests)


def test_several_prefixes_round_robin():
    wl = Workload(9, Fixed(4), Fixed(2), shared_prefix_len=16, num_prefixes=3, seed=0)
    requests = wl.build(VOCAB, content_seed=0)
    prefix = [tuple(r.prompt_token_ids[:16]) for r in requests]
    for i in range(9):
        assert prefix[i] == prefix[i % 3]
    assert len({prefix[0], prefix[1], prefix[2]}) == 3


def test_no_prefix():
    wl = Workload(5, Fixed(9), Fixed(1))
    assert [len(r.prompt_token_ids) for r in wl.build(VOCAB, 0)] == [9] * 5


def test_poisson_workload_arrivals():
    wl = Workload(500, Fixed(4), Fixed(2), arrival=Poisson(rate=50.0), seed=9)
    requests = wl.build(VOCAB, content_seed=0)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0
    assert all(isinstance(a, float) for a in arrivals)
    assert all(b > a for a, b in zip(arrivals, arrivals[1:]))
    assert 50 * 0.85 < (len(arrivals) - 1) / arrivals[-1] < 50 * 1.15
    # arrivals belong to the workload seed, not to the trial's content
    assert [r.arrival_s for r in wl.build(VOCAB, content_seed=1)] == arrivals


@pytest.mark.parametrize("arrival", [Burst(), Concurrency(4)])
def test_closed_loop_and_burst_have_no_arrival_times(arrival):
    wl = Workload(6, Fixed(4), Fixed(2), arrival=arrival)
    assert all(r.arrival_s is None for r in wl.build(VOCAB, 0))


def test_vocab_too_small():
    with pytest.raises(BadParameter):
        Workload(2, Fixed(4), Fixed(2)).build(FIRST_TEXT_ID + 1, 0)


@pytest.mark.parametrize("kwargs", [dict(num_requests=0), dict(num_requests=2.0), dict(shared_prefix_len=-1),
                                    dict(num_prefixes=0)])
def test_workload_rejects(kwargs):
    args = dict(num_requests=4, prompt_len=Fixed(4), output_len=Fixed(2))
    args.update(kwargs)
    with pytest.raises(BadParameter):
        Workload(**args)


@pytest.mark.parametrize("wl", [
    Workload(8, Fixed(10), Uniform(1, 5)),
    Workload(16, LogNormal(200, 0.8, low=10, high=2000), LogNormal(50, 0.5), arrival=Poisson(4.0, 0.5),
             shared_prefix_len=32, num_prefixes=2, seed=11),
    Workload(3, FromLog((5, 9, 200)), Fixed(7), arrival=Concurrency(2), seed=4),
])
def test_dict_round_trip(wl):
    data = wl.to_dict()
    assert Workload.from_dict(data) == wl
    through_json = json.loads(json.dumps(data))  # what is stored on disk and sent to workers
    restored = Workload.from_dict(through_json)
    assert restored == wl
    assert [r.prompt_token_ids for r in restored.build(VOCAB, 2)] == [r.prompt_token_ids for r in wl.build(VOCAB, 2)]


def test_to_dict_names_kinds():
    data = Workload(2, Fixed(3), Uniform(1, 2), arrival=Poisson(2.0)).to_dict()
    assert data["prompt_len"] == {"kind": "Fixed", "n": 3}
    assert data["output_len"] == {"kind": "Uniform", "low": 1, "high": 2}
    assert data["arrival"] == {"kind": "Poisson", "rate": 2.0, "burstiness": 1.0}


def test_closed_loop_is_fixed_lengths_at_fixed_concurrency():
    w = Workload.closed_loop(requests=12, prompt_len=64, output_len=16, clients=4)
    assert w == Workload(12, Fixed(64), Fixed(16), Concurrency(4))
    assert w.longest_request() == 80
