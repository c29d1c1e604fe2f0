"""Reading the business levers off a prompt sweep: cost per token, the hardware floor, the cut table (no engine)."""
import pandas as pd
import pytest

from labkit.analyze import request_shape
from labkit.analyze.roofline import gpu_peaks
from labkit.errors import BadParameter
from labkit.spec.models import SHAPES

SWEEP = pd.DataFrame({"prompt_tokens": [512, 1024, 2048], "ttft_p50_ms": [20.0, 30.0, 50.0],
                      "request_s": [40.0, 30.0, 20.0]})


def test_the_cost_per_token_is_the_slope_of_the_measured_points():
    slope, fixed = request_shape.per_token_cost(SWEEP, "prompt_tokens", "ttft_p50_ms")
    assert slope == pytest.approx(30 / 1536, rel=0.05) and fixed > 0
    with pytest.raises(BadParameter, match="two or more"):
        request_shape.per_token_cost(SWEEP.iloc[:1], "prompt_tokens", "ttft_p50_ms")


def test_the_cut_table_reads_milliseconds_and_requests_off_the_curves():
    table = request_shape.cut_table(SWEEP, 2048, [1024, 512]).set_index("cut_tokens")
    assert table.loc[1024, "ttft_saved_ms"] == pytest.approx(20.0)
    assert table.loc[1024, "request_s_gain_pct"] == pytest.approx(50.0)
    assert table.loc[512, "prompt_tokens"] == 1536 and table.loc[512, "ttft_p50_ms"] == pytest.approx(40.0)
    with pytest.raises(BadParameter, match="needs both ends inside it"):
        request_shape.cut_table(SWEEP, 2048, [2000])


def test_the_prefill_floor_of_the_8b_shape_on_an_h200_grows_with_the_prompt():
    shape = SHAPES["llama3-8b"]
    floors = request_shape.prefill_floors_ms(shape, gpu_peaks("NVIDIA H200"), [512, 4096])
    # 2 FLOPs per matmul parameter per token at 989 TFLOP/s: 7.8 ms for 512 tokens, 8x that for 4096
    assert floors.iloc[0] == pytest.approx(1e3 * 2 * shape.matmul_params * 512 / 989e12) == pytest.approx(7.77, abs=0.01)
    assert floors.iloc[1] == pytest.approx(8 * floors.iloc[0])


def test_each_loads_fastest_request_is_of_the_arm_asked_for():
    import types

    # the clean clone's disturbed first load: its median far above the longer prompt's, its fastest still below
    requests = pd.DataFrame({"arm": ["default"] * 6 + ["other"],
                             "load": ["prompt=64"] * 3 + ["prompt=2048"] * 3 + ["prompt=64"],
                             "ttft_ms": [83.2, 556.4, 509.1, 120.5, 170.5, 215.0, 1.0]})
    fastest = request_shape.fastest_ms(types.SimpleNamespace(requests=requests), "default", "ttft_ms")
    assert fastest.to_dict() == {"prompt=2048": 120.5, "prompt=64": 83.2}
