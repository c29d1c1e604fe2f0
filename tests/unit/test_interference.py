"""The interference measure on a constructed time series."""
import numpy as np
import pandas as pd
import pytest

from labkit.analyze import interference
from labkit.errors import BadParameter
from labkit.store import Results


def constructed():
    """Two streams ticking every 10 ms for 3 s; one long prompt in prefill from 1.0 s to 1.5 s, during which
    each stream gap stretches to 100 ms."""
    rows = []
    for stream in range(2):
        stamps, t = [], 0.0
        while t < 3.0:
            stamps.append(t)
            t += 0.1 if 1.0 <= t < 1.5 else 0.01
        rows.append({"arm": "a", "trial": 0, "part": "streams", "request": stream, "submitted_s": 0.0,
                     "token_s": stamps, "itl_ms": list(np.diff(stamps) * 1e3)})
    rows.append({"arm": "a", "trial": 0, "part": "long", "request": 0, "submitted_s": 1.0,
                 "token_s": [1.5, 1.51], "itl_ms": [10.0]})
    arms = pd.DataFrame([{"arm": "a", "status": "complete"}])
    return Results("x", None, {}, arms, pd.DataFrame(rows), pd.DataFrame(), {})


def test_gaps_inside_a_prefill_window_are_separated_and_measured():
    result = interference.interference(constructed(), "a")
    assert result["tbt_p99_inside_ms"] == pytest.approx(100, rel=0.01)
    assert result["tbt_p99_outside_ms"] == pytest.approx(10, rel=0.05)
    assert result["inside_over_outside"] == pytest.approx(10, rel=0.1)
    assert result["long_ttft_p50_ms"] == pytest.approx(500)
    assert result["gaps_inside"] == 2 * 5 and result["gaps_outside"] > 100


def test_missing_parts_are_explained():
    with pytest.raises(BadParameter, match="part 'injected'"):
        interference.interference(constructed(), "a", injected="injected")
