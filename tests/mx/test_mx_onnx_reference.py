"""qlinear.mx against onnx's reference implementation (onnx 1.23.2, a dev dependency), run in the test.

(a) DequantizeLinear(codes, E8M0 scales, axis, block_size=32, output_dtype=FLOAT) at opset 24 (28 for the
    float6 types), and NVFP4 as two DequantizeLinear nodes (E4M3 block scales x float32 tensor scale ->
    float4 codes, block_size=16), equal qlinear.mx.dequantize bit for bit; every graph passes
    onnx.checker's full check.
(b) The scale rules as ONNX graphs (Reshape -> Abs -> ReduceMax -> Div -> Cast to FLOAT8E8M0): "floor" is
    Cast(amax / 2^emax, round_mode="down"), "ceil" is Cast(amax / max, round_mode="up"). They equal the
    scales qlinear.mx.quantize returns except on blocks where the float32 division's result is a float32
    subnormal, each such block named and explained.
(c) QuantizeLinear(x, E8M0 scales, block_size=32, precision=FLOAT, output_dtype=element type) reproduces
    qlinear's codes given qlinear's scales, for the float formats (and MXINT8, but for -128).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx

from . import _mx_exact as ex
from ._mx_inputs import F32, FLT_MAX, TINY, below, edge_cases, nvfp4_tie_tensor, pad_to_blocks, random_rows

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ELEMENT_TYPES = {
    "mxfp8_e4m3": TP.FLOAT8E4M3FN,
    "mxfp8_e5m2": TP.FLOAT8E5M2,
    "mxfp6_e3m2": TP.FLOAT6E3M2,
    "mxfp6_e2m3": TP.FLOAT6E2M3,
    "mxfp4": TP.FLOAT4E2M1,
    "mxint8": TP.INT8,
}
FLOAT_FORMATS = tuple(n for n in ELEMENT_TYPES if n != "mxint8")
RNG_SEED = 20260902
# The reference's own arithmetic warns on what the tests feed it on purpose: 2^127 * 6 overflows float32 in
# DequantizeLinear, and QuantizeLinear casts rint(NaN) (a NaN block) to int32.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]


def dq_opset(name: str) -> int:
    return 28 if name.startswith("mxfp6") else 24


def q_opset(name: str) -> int:
    return 28 if name.startswith("mxfp6") else 25  # QuantizeLinear's `precision` attribute: opset 25


def run(nodes, inputs: dict, input_types: dict, outputs: list[tuple[str, int, tuple]], opset: int, initializers=()):
    graph = helper.make_graph(
        nodes, "mx",
        [helper.make_tensor_value_info(k, input_types[k], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(n, t, shape) for n, t, shape in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return ReferenceEvaluator(model).run(None, inputs)


def assert_same_float32(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype == F32 and actual.shape == expected.shape, what
    same = (actual.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(actual) & np.isnan(expected))
    assert same.all(), f"{what}: {int((~same).sum())} of {same.size} differ, first at {np.argwhere(~same)[:4].tolist()}"


def inputs_for(name: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([RNG_SEED, seed, list(ELEMENT_TYPES).index(name)])
    specials = np.full((2, 70), 1.5, F32)
    specials[0, 3], specials[1, 40], specials[1, 64] = np.nan, np.inf, -np.inf
    return [random_rows(rng, 8, 70), random_rows(rng, 4, 64)] + edge_cases(name, rng) + [specials]


def mxint8_foldable(x: np.ndarray, rule: str) -> np.ndarray:
    """Rows of x whose MXINT8 blocks all have e >= -121 (onnx_scales folds 2^-6 into the scale)."""
    _, scales = mx.quantize(x, "mxint8", scale_rule=rule)
    raw = scales.view(np.uint8)
    return x[((raw >= 6) | (raw == 0xFF)).all(axis=-1)]


# ---------------------------------------------------------------------------------------------
# (a) DequantizeLinear
# ---------------------------------------------------------------------------------------------
def dequantize_linear(codes, scales, name: str, axis: int = -1):
    c, s = mx.onnx_scales(codes, scales, name)
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=axis, block_size=32, output_dtype=TP.FLOAT)
    return run([node], {"x": c, "s": s}, {"x": ELEMENT_TYPES[name], "s": TP.FLOAT8E8M0}, [("y", TP.FLOAT, c.shape)],
               dq_opset(name))[0]


@pytest.mark.parametrize("rule", ex.RULES)
@pytest.mark.parametrize("name", tuple(ELEMENT_TYPES))
def test_dequantize_linear_equals_dequantize(name, rule):
    blocks = 0
    for x in inputs_for(name, 1):
        if name == "mxint8":
            x = mxint8_foldable(x, rule)
        codes, scales = mx.quantize(x, name, scale_rule=rule)
        assert_same_float32(dequantize_linear(codes, scales, name), mx.dequantize(codes, scales), f"{name}/{rule}")
        blocks += scales.size
    assert blocks > 100


@pytest.mark.parametrize("name", tuple(ELEMENT_TYPES))
def test_dequantize_linear_every_code_and_scale(name):
    """Every element code (NaN/Inf codes of the float8 types, -128) with E8M0 scales at both ends, 2^0 and
    NaN (0xFE times the larger codes overflows float32 to Inf in both; 0x00 gives float32 subnormals). For
    MXINT8 the lowest scale is 2^-121, the lowest that takes the 2^-6 fold."""
    dtype = mx.FORMATS[name].element.dtype
    n = {"float6_e3m2fn": 64, "float6_e2m3fn": 64, "float4_e2m1fn": 16}.get(dtype.name, 256)
    scale_bytes = np.array([0x06 if name == "mxint8" else 0x00, 0x07, 0x7F, 0xFD, 0xFE, 0xFF], np.uint8)
    codes = np.tile(np.arange(n, dtype=np.uint8), (scale_bytes.size, 1)).view(dtype)
    scales = np.repeat(scale_bytes[:, None], -(-n // 32), axis=1).view(ml_dtypes.float8_e8m0fnu)
    assert_same_float32(dequantize_linear(codes, scales, name), mx.dequantize(codes, scales), name)
    # Blocks along axis 0.
    assert_same_float32(dequantize_linear(codes.T.copy(), scales.T.copy(), name, axis=0),
                        mx.dequantize(codes.T, scales.T, axis=0), f"{name} axis 0")


def test_onnx_scales_refuses_mxint8_blocks_below_2_to_the_minus_121():
    codes, scales = mx.quantize(np.asarray([[2.0**-121] * 32, [2.0**-122] * 32], F32), "mxint8")
    assert scales.view(np.uint8).tolist() == [[6], [5]]
    with pytest.raises(ValueError, match="1 MXINT8 block"):
        mx.onnx_scales(codes, scales, "mxint8")


def nvfp4_graph(codes, block_scales, g, axis: int = -1):
    """MO's two DequantizeLinear nodes: DQ1(E4M3 block scales, float32 g) -> DQ2(float4 codes, block_size=16)."""
    nodes = [
        helper.make_node("DequantizeLinear", ["s8", "g"], ["s"]),
        helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=axis, block_size=16),
    ]
    inputs = {"x": codes, "s8": block_scales, "g": np.asarray(g, F32)}
    types = {"x": TP.FLOAT4E2M1, "s8": TP.FLOAT8E4M3FN, "g": TP.FLOAT}
    return run(nodes, inputs, types, [("y", TP.FLOAT, codes.shape)], 23)[0]


def test_nvfp4_two_dequantize_linear_nodes():
    rng = np.random.default_rng([RNG_SEED, 3])
    cases = [random_rows(rng, 8, 70), nvfp4_tie_tensor(rng, -3), nvfp4_tie_tensor(rng, 90)]
    x = random_rows(rng, 6, 48).astype(np.float64)
    x *= np.ldexp(1.0, rng.integers(-30, 1, (6, 1))) / np.abs(x).max(axis=1, keepdims=True)  # tiny block scales
    cases.append(x.astype(F32))
    specials = np.full((2, 32), 2.0, F32)
    specials[0, 1], specials[1, 30] = np.nan, -np.inf
    cases += [specials, np.zeros((1, 16), F32), np.asarray([[FLT_MAX, TINY] * 8], F32)]
    for x in cases:
        codes, s, g = mx.quantize(x, "nvfp4")
        assert_same_float32(nvfp4_graph(codes, s, g), mx.dequantize(codes, s, global_scale=g), "nvfp4")
    # Every code with every E4M3 byte (NaN, negative and subnormal scales included), two tensor scales.
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, 1)).view(ml_dtypes.float4_e2m1fn)
    s = np.arange(256, dtype=np.uint8).reshape(256, 1).view(ml_dtypes.float8_e4m3fn)
    for g in (F32(2.0**-130), F32(1 / 3), F32(3e34)):
        assert_same_float32(nvfp4_graph(codes, s, g), mx.dequantize(codes, s, global_scale=g), f"every code, g={g}")
        assert_same_float32(nvfp4_graph(codes.T.copy(), s.T.copy(), g, axis=0),
                            mx.dequantize(codes.T, s.T, axis=0, global_scale=g), "axis 0")


# ---------------------------------------------------------------------------------------------
# (b) The scale rules as one Cast
# ---------------------------------------------------------------------------------------------
def scale_graph(x: np.ndarray, divisor: Fraction, round_mode: str) -> np.ndarray:
    """Cast(ReduceMax(Abs(Reshape(x, [-1, 32])), axis 1) / divisor, to=FLOAT8E8M0, round_mode) as uint8."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["b"]),
        helper.make_node("Abs", ["b"], ["a"]),
        helper.make_node("ReduceMax", ["a", "axes"], ["amax"], keepdims=0),
        helper.make_node("Div", ["amax", "divisor"], ["q"]),
        helper.make_node("Cast", ["q"], ["e"], to=TP.FLOAT8E8M0, round_mode=round_mode),
    ]
    inits = [
        helper.make_tensor("shape", TP.INT64, [2], [-1, 32]),
        helper.make_tensor("axes", TP.INT64, [1], [1]),
        helper.make_tensor("divisor", TP.FLOAT, [], [float(divisor)]),
    ]
    assert Fraction(float(F32(float(divisor)))) == divisor
    e = run(nodes, {"x": x}, {"x": TP.FLOAT}, [("e", TP.FLOAT8E8M0, (x.size // 32,))], 24, inits)[0]
    return np.asarray(e).view(np.uint8).reshape(x.shape[:-1] + (-1,))


def block_amax(x: np.ndarray) -> np.ndarray:
    b = x.reshape(x.shape[:-1] + (-1, 32))
    return np.abs(b).max(axis=-1)  # NaN propagates (as in ReduceMax)


def floor_difference_explained(amax: np.float32, spec: ex.Spec) -> bool:
    """The "floor" graph divides amax by 2^emax in float32. That is exact unless the quotient is a float32
    subnormal; rounded, it can reach 2^-126 from just below (amax = prev(2^(emax-126)), a tie that rounds
    to the even 2^-126), which Cast "down" takes as exponent -126 where the exact floor is <= -127 (0x00)."""
    exact_q = ex.exact(amax) / ex.TWO**spec.emax
    graph_q = ex.exact(F32(amax) / F32(2.0**spec.emax))
    return exact_q < ex.TWO**-126 and graph_q == ex.TWO**-126


def ceil_difference_explained(amax: np.float32, spec: ex.Spec) -> bool:
    """onnx's Cast "up" adds 1 to the exponent field of any float32 with a nonzero mantissa field, so a subnormal
    quotient float32(amax / max) in (0, 2^-127] becomes 0x01 (2^-126), where the smallest power of two at
    or above it, clamped to E8M0, is 2^-127 (0x00)."""
    q = F32(amax) / F32(float(spec.max))
    return 0 < q <= F32(2.0**-127)


@pytest.mark.parametrize("name", tuple(ELEMENT_TYPES))
def test_scale_rules_as_cast(name):
    spec = ex.SPECS[name]
    explained = {"floor": 0, "ceil": 0}
    blocks = 0
    for x in inputs_for(name, 2):
        x = pad_to_blocks(x)
        amax = block_amax(x)
        for rule, divisor, mode, why in (
            ("floor", ex.TWO**spec.emax, "down", floor_difference_explained),
            ("ceil", spec.max, "up", ceil_difference_explained),
        ):
            _, scales = mx.quantize(x, name, scale_rule=rule)
            ours, graph = scales.view(np.uint8), scale_graph(x, divisor, mode)
            for idx in np.argwhere(ours != graph):
                idx = tuple(idx)
                a = amax[idx]
                assert why(a, spec), (f"{name}/{rule}: block {idx} with amax {a!r} ({float(a).hex()}): qlinear "
                                      f"{ours[idx]:#04x}, ONNX graph {graph[idx]:#04x}, unexplained")
                assert (ours[idx], graph[idx]) == (0x00, 0x01)
                explained[rule] += 1
            blocks += ours.size
    assert blocks > 300
    # The hazard inputs reach both explained differences (a float32 subnormal quotient), except that
    # MXINT8's floor divides by 2^0.
    assert explained["ceil"] > 0
    assert explained["floor"] > 0 or spec.emax == 0


def test_scale_rule_quirks_named():
    """The documented quirks of onnx's Cast to E8M0, on single blocks: amax 0 -> 0x00 (both); Inf or NaN
    -> 0xFF (both; Cast ignores saturate for Inf); FP4 amax = prev(2^-124): floor graph 0x01, qlinear 0x00;
    amax = 6 * 2^-128: ceil graph 0x01 (a subnormal quotient "up"), qlinear 0x00."""
    spec = ex.SPECS["mxfp4"]
    x = np.zeros((4, 32), F32)
    x[1, 0], x[2, 0], x[3, 0] = np.inf, np.nan, below(F32(2.0**-124))
    floor = scale_graph(x, ex.TWO**2, "down")[:, 0]
    _, ours = mx.quantize(x, "mxfp4")
    assert floor.tolist() == [0x00, 0xFF, 0xFF, 0x01]
    assert ours.view(np.uint8)[:, 0].tolist() == [0x00, 0xFF, 0xFF, 0x00]
    y = np.zeros((1, 32), F32)
    y[0, 0] = F32(6.0 * 2.0**-128)
    assert scale_graph(y, spec.max, "up")[0, 0] == 0x01
    assert mx.quantize(y, "mxfp4", scale_rule="ceil")[1].view(np.uint8)[0, 0] == 0x00


# ---------------------------------------------------------------------------------------------
# (c) QuantizeLinear with qlinear's scales
# ---------------------------------------------------------------------------------------------
def quantize_linear(x, scales, name: str, axis: int = -1) -> np.ndarray:
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=axis, block_size=32,
                            output_dtype=ELEMENT_TYPES[name], precision=TP.FLOAT)
    return run([node], {"x": x, "s": scales}, {"x": TP.FLOAT, "s": TP.FLOAT8E8M0}, [("y", ELEMENT_TYPES[name], x.shape)],
               q_opset(name))[0]


@pytest.mark.parametrize("rule", ex.RULES)
@pytest.mark.parametrize("name", tuple(ELEMENT_TYPES))
def test_quantize_linear_reproduces_codes(name, rule):
    """The reference computes float32(x / scale), then: float8 `saturate_cast` (clip to +-max, then ml_dtypes'
    nearest-even cast: the same codes as rounding first and saturating after, for every finite quotient);
    float6/float4 ml_dtypes' cast (nearest even, saturating); int8 rint then clip to [-128, 127]. The
    division is exact except where the quotient is a float32 subnormal, and such a quotient rounds to a
    (signed) zero element either way. So the codes agree everywhere except:
    - blocks holding a NaN or an Inf: qlinear's scale is NaN (0xFF) and it stores +0 codes; the reference
      divides by NaN and stores NaN codes (float8) or whatever ml_dtypes casts NaN to (float4/6). Both
      decode to NaN: the scale is NaN.
    - MXINT8: qlinear is symmetric (+-127, as microxcaling), the reference's int8 range reaches -128: the
      elements whose V / X * 64 rounds to -128."""
    differing = 0
    for x in inputs_for(name, 3):
        if name == "mxint8":
            x = mxint8_foldable(x, rule)
        codes, scales = mx.quantize(x, name, scale_rule=rule)
        c, s = mx.onnx_scales(codes, scales, name)
        ref = np.asarray(quantize_linear(x, s, name))
        ours_raw, ref_raw = c.view(np.uint8), ref.view(np.uint8)
        nan_block = np.repeat(scales.view(np.uint8) == 0xFF, 32, axis=-1)[..., : x.shape[-1]]
        diff = ours_raw != ref_raw
        assert not (diff & ~nan_block & (name != "mxint8")).any(), (
            f"{name}/{rule}: codes differ at {np.argwhere(diff & ~nan_block)[:4].tolist()}")
        if name == "mxint8":
            d = diff & ~nan_block
            assert (c[d] == -127).all() and (ref.view(np.int8)[d] == -128).all()
            differing += int(d.sum())
        # NaN blocks: qlinear +0 codes; both decode to NaN.
        assert (ours_raw[nan_block] == 0).all()
        y_ref = mx.dequantize(ref.view(codes.dtype), scales) if name != "mxint8" else None
        if y_ref is not None:
            assert np.isnan(y_ref[nan_block]).all()
    if name == "mxint8" and rule == "floor":
        assert differing > 0  # the hazards include V / X * 64 = -127.5 (the tie that rint sends to -128)
