"""The input Hessians of a model's layers, ``H = Σ x xᵀ`` over the calibration samples, where x runs over the
layer's input feature vectors (a Conv's im2col patches, a MatMul's rows): what GPTQ-style rounding weighs a
weight's error by (`qlinear.rounding`).

The float model runs once over the samples (`activation_calibration.Segments`, so memory stays within its
segment budget), exposing the inputs of the layers whose weights are rounded; each sample's features are
multiplied out into float64 sums as they come, and dropped. A sample gives at most `MAX_ROWS` feature
vectors per layer, and fewer as samples grow: 8 per input feature of the layer over all the samples
(between 4,096 and 131,072; positions drawn with a fixed seed). A page through the OCR detector has 170,000
positions in its first layers, which say no more about a Hessian of a few thousand inputs than some
thousands of them do; multiplying them all out took most of the time (the cost is rows x inputs^2).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from .activation_calibration import CalibrationData, Segments, first
from .errors import UserError
from .formats.onnx_constants import attributes

MAX_ROWS = 8192  # feature vectors per sample and layer, at most
FLUSH_ROWS = 2048  # feature vectors multiplied out at once (samples of 16 tokens: 128 of them),
FLUSH_BYTES = 512 << 10  # or fewer, when they hold this much (every layer holds its own: 64 layers, 32 MB)
ROWS_PER_FEATURE = 8  # feature vectors per layer over all the samples: this many per input feature,
ROW_RANGE = (1 << 12, 1 << 17)  # within these bounds, fewer per sample as samples grow
OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")
RECURRENT = ("LSTM", "GRU", "RNN")


@dataclass
class Layer:
    """A weight's layer: how its input becomes feature vectors in the order `rounding.Layout` gives the
    weight's columns (kernel positions outer, input channels inner)."""

    weight: str
    op: str  # the layout's operator: "Conv", "ConvTranspose", "MatMul", "Gemm.T"
    features_count: int  # K, the input features per output channel
    input: str  # the activation the layer reads
    node: str = ""  # the layer's node name
    group: int = 1
    kernel: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()  # begins then ends, as ONNX lists them
    auto_pad: str = "NOTSET"
    output_padding: tuple[int, ...] = ()
    transpose_input: bool = False  # Gemm transA
    sums: np.ndarray | None = field(default=None, repr=False)  # [G, K, K] float64
    magnitudes: np.ndarray | None = field(default=None, repr=False)  # [G, K]: sum of |x| (AWQ's statistic)
    lows: np.ndarray | None = field(default=None, repr=False)  # [G, K]: min and max of x (AWQ, activations quantized)
    highs: np.ndarray | None = field(default=None, repr=False)
    rows: int = 0

    limit: int = MAX_ROWS  # feature vectors per sample
    wants_magnitudes: bool = False  # sum |x| too (AWQ)
    pending: np.ndarray | None = field(default=None, repr=False)  # feature vectors not yet multiplied out
    pending_rows: int = 0
    # Recurrent layers: W reads the sequence (``input``), R the previous hidden state: the output Y shifted
    # by one step per direction (``input`` is then Y) and the initial state (``state``, "" for zeros).
    recurrent: str = ""  # "", "W" or "R"
    directions: int = 1
    reverse: bool = False  # one direction, and it is "reverse"
    batch_major: bool = False  # layout = 1: [batch, seq, ...]
    state: str = ""

    def divisor_shape(self, channels: int) -> tuple[int, ...]:
        """The shape that divides the layer's input per input channel, by broadcasting: [C, 1, ...] for a
        convolution's [N, C, ...] input, [K] for a MatMul's [..., K], [K, 1] for Gemm's transA."""
        if self.op in ("Conv", "ConvTranspose"):
            return (channels,) + (1,) * len(self.kernel)
        return (channels, 1) if self.transpose_input else (channels,)

    @property
    def matrices(self) -> int:
        """G, the matrices of the weight's layout and of its Hessian: a convolution's groups, a recurrent
        layer's directions, one otherwise."""
        return self.group if self.op in ("Conv", "ConvTranspose") or self.recurrent else 1

    def signature(self) -> tuple:
        """What the feature vectors depend on: layers that agree on it (q, k and v reading one input) share them."""
        rows = self.op in ("MatMul", "Gemm.T")
        return (self.input, "rows" if rows else self.op, self.group, self.kernel, self.strides, self.dilations,
                self.pads, self.auto_pad, self.output_padding, self.transpose_input, self.features_count,
                self.recurrent, self.state, self.reverse, self.batch_major, self.node if self.recurrent else "")

    def features(self, x: np.ndarray, rng, state: np.ndarray | None = None) -> np.ndarray:
        """[G, n, K] float32 feature vectors of one sample's input ``x`` (a recurrent R: Y, and the initial
        ``state``)."""
        if self.recurrent == "W":  # the same rows for every direction: one sum, repeated by `finish`
            x = np.asarray(x, np.float32)
            return _subsample(x.reshape(-1, x.shape[-1]), rng, self.limit)[None]
        if self.recurrent == "R":
            return self._previous_states(np.asarray(x, np.float32), state, rng)
        if self.op in ("MatMul", "Gemm.T"):
            x = np.asarray(x, np.float32)
            rows = (x.T if self.transpose_input else x).reshape(-1, x.shape[-1] if not self.transpose_input else x.shape[0])
            return _subsample(rows, rng, self.limit)[None]
        x = np.asarray(x, np.float32)
        if self.op == "ConvTranspose":
            x, pads, strides = _upsampled(x, self), _transpose_pads(x, self), (1,) * len(self.kernel)
        else:
            pads, strides = _conv_pads(x, self), self.strides
        return _patches(x, self.kernel, strides, self.dilations, pads, self.group, rng, self.limit)

    def _previous_states(self, y: np.ndarray, state, rng) -> np.ndarray:
        """The hidden states R multiplies, per direction: [h0, Y[0..T-2]] forward, [h0, Y[1..T-1]] reverse."""
        if self.batch_major:  # [B, T, D, H] -> [T, D, B, H]
            y = np.transpose(y, (1, 2, 0, 3))
            state = None if state is None else np.transpose(np.asarray(state, np.float32), (1, 0, 2))
        steps, directions, batch, hidden = y.shape
        blocks = []
        for d in range(directions):
            backward = self.reverse or d == 1
            previous = y[1:, d] if backward else y[:-1, d]
            rows = previous.reshape(-1, hidden)
            first = np.zeros((batch, hidden), np.float32) if state is None else np.asarray(state, np.float32)[d]
            blocks.append(np.concatenate([first, rows]))
        count = min(len(b) for b in blocks)
        chosen = np.sort(rng.choice(count, self.limit, replace=False)) if count > self.limit else slice(None)
        return np.stack([b[:count][chosen] for b in blocks])

    def add(self, x: np.ndarray, rng, state: np.ndarray | None = None) -> None:
        """One sample's input. Its feature vectors are copied into a buffer of the layer's own, which is
        multiplied out when full (`FLUSH_ROWS`, or `FLUSH_BYTES`): float32 products of many samples at once,
        added in float64. (A list of each sample's arrays instead left the heap fragmented: the detector's
        100 pages took 1.2 GB instead of 0.7.)"""
        f = self.features(x, rng, state)
        count = f.shape[1]
        capacity = max(1, min(FLUSH_ROWS, FLUSH_BYTES // max(1, 4 * f.shape[0] * f.shape[2])))
        if count >= capacity:
            self._multiply(f)
            return
        if self.pending is None:
            self.pending = np.empty((f.shape[0], capacity, f.shape[2]), np.float32)
        if self.pending_rows + count > self.pending.shape[1]:
            self.flush()
        self.pending[:, self.pending_rows:self.pending_rows + count] = f
        self.pending_rows += count

    def flush(self) -> None:
        if self.pending_rows:
            self._multiply(self.pending[:, :self.pending_rows])
        self.pending_rows = 0

    def forget(self) -> None:
        """Drop what was collected (the Hessian, the magnitudes, the ranges): its weight is rounded."""
        self.sums = self.magnitudes = self.lows = self.highs = None

    def release(self) -> None:
        self.flush()
        self.pending = None

    def _multiply(self, f: np.ndarray) -> None:
        h = np.matmul(f.transpose(0, 2, 1), f).astype(np.float64)
        self.sums = h if self.sums is None else self.sums + h
        if self.magnitudes is not None or self.wants_magnitudes:
            ones = np.ones((f.shape[0], 1, f.shape[1]), np.float32)
            m = np.matmul(ones, np.abs(f))[:, 0, :].astype(np.float64)  # Σ|x| per feature, through BLAS
            self.magnitudes = m if self.magnitudes is None else self.magnitudes + m
            low, high = f.min(axis=1).astype(np.float64), f.max(axis=1).astype(np.float64)
            self.lows = low if self.lows is None else np.minimum(self.lows, low)
            self.highs = high if self.highs is None else np.maximum(self.highs, high)
        self.rows += f.shape[1]


def _subsample(rows: np.ndarray, rng, limit: int) -> np.ndarray:
    if len(rows) <= limit:
        return rows
    return rows[np.sort(rng.choice(len(rows), limit, replace=False))]


def _conv_pads(x, layer: Layer) -> tuple[int, ...]:
    n = len(layer.kernel)
    if layer.auto_pad == "VALID":
        return (0,) * (2 * n)
    if layer.auto_pad in ("NOTSET", ""):
        return layer.pads or (0,) * (2 * n)
    begins, ends = [], []
    for axis in range(n):
        size = x.shape[2 + axis]
        out = -(-size // layer.strides[axis])
        total = max(0, (out - 1) * layer.strides[axis] + (layer.kernel[axis] - 1) * layer.dilations[axis] + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if layer.auto_pad == "SAME_UPPER" else large)
        ends.append(large if layer.auto_pad == "SAME_UPPER" else small)
    return tuple(begins + ends)


def _upsampled(x, layer: Layer) -> np.ndarray:
    """ConvTranspose's input with ``stride - 1`` zeros between its elements along each spatial axis."""
    n = len(layer.kernel)
    shape = x.shape[:2] + tuple((x.shape[2 + a] - 1) * layer.strides[a] + 1 for a in range(n))
    out = np.zeros(shape, x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in layer.strides)] = x
    return out


def _transpose_pads(x, layer: Layer) -> tuple[int, ...]:
    """The padding of the convolution (stride 1, flipped kernel) that ConvTranspose is over the upsampled
    input: ``d (k - 1) - pad`` at each end, plus the output padding at the end (negative: a crop)."""
    n = len(layer.kernel)
    pads = layer.pads or (0,) * (2 * n)
    extra = layer.output_padding or (0,) * n
    begins = [layer.dilations[a] * (layer.kernel[a] - 1) - pads[a] for a in range(n)]
    ends = [layer.dilations[a] * (layer.kernel[a] - 1) - pads[n + a] + extra[a] for a in range(n)]
    return tuple(begins + ends)


def _patches(x: np.ndarray, kernel, strides, dilations, pads, group: int, rng, limit: int) -> np.ndarray:
    """im2col: [group, positions, prod(kernel) * C/group], kernel positions outer, channels inner."""
    n = len(kernel)
    batch, channels = x.shape[:2]
    begins, ends = pads[:n], pads[n:]
    if any(p < 0 for p in pads):  # a negative pad crops
        crop = tuple(slice(max(0, -b), x.shape[2 + a] - max(0, -e)) for a, (b, e) in enumerate(zip(begins, ends)))
        x = x[(slice(None), slice(None)) + crop]
        begins, ends = [max(0, b) for b in begins], [max(0, e) for e in ends]
    x = np.pad(x, [(0, 0), (0, 0)] + [(b, e) for b, e in zip(begins, ends)])
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    windows = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(range(2, 2 + n)))
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
                      + tuple(slice(None, None, d) for d in dilations)]
    out_shape = windows.shape[2:2 + n]
    positions = batch * math.prod(out_shape)
    if positions > limit:  # the chosen positions only, gathered from the strided view
        chosen = np.sort(rng.choice(positions, limit, replace=False))
        where = np.unravel_index(chosen, (batch,) + tuple(out_shape))
        rows = windows[(where[0], slice(None)) + tuple(where[1:])]  # [n, C, k...]
    else:
        rows = np.moveaxis(windows, 1, 1 + n).reshape((positions, channels) + tuple(kernel))
    rows = np.moveaxis(rows, 1, -1)  # [n, k..., C]: kernel positions outer, channels inner
    per = channels // group
    grouped = np.ascontiguousarray(rows).reshape(rows.shape[:-1] + (group, per))
    grouped = np.moveaxis(grouped, -2, 0)  # [group, n, k..., C/group]
    return np.ascontiguousarray(grouped).reshape(group, grouped.shape[1], -1)


def _attribute(node, name: str, default):
    """One of `onnx_constants.attributes`, strings decoded."""
    value = attributes(node).get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def layer_of(node, weight: str, shape: tuple[int, ...]) -> Layer | str:
    """The `Layer` that reads ``weight`` (of ``shape``) in ``node``, or why its rounding needs no data
    that this module can collect (a string)."""
    op = node.op_type
    if op not in OPS:
        return f"its {op} reads no input features that a Hessian is collected for"
    inputs = list(node.input)
    if op in RECURRENT:
        return _recurrent_layer(node, weight, shape)
    if op in ("Conv", "ConvTranspose"):
        if len(inputs) < 2 or inputs[1] != weight:
            return f"it is not the {op}'s weight"
        n = len(shape) - 2
        kernel = tuple(int(k) for k in shape[2:])
        declared = _attribute(node, "kernel_shape", None)
        if declared is not None and tuple(declared) != kernel:
            return "the Conv's kernel_shape differs from its weight's"
        if op == "ConvTranspose" and (_attribute(node, "output_shape", None) is not None
                                      or _attribute(node, "auto_pad", "NOTSET") not in ("NOTSET", "")):
            return "ConvTranspose with output_shape or auto_pad: its padding is not collected yet"
        group = int(_attribute(node, "group", 1))
        per = shape[1] if op == "Conv" else shape[0] // max(1, group)
        return Layer(weight, op, per * math.prod(kernel), inputs[0], node.name, group=int(_attribute(node, "group", 1)), kernel=kernel,
                     strides=tuple(_attribute(node, "strides", [1] * n)), dilations=tuple(_attribute(node, "dilations", [1] * n)),
                     pads=tuple(_attribute(node, "pads", [0] * (2 * n))), auto_pad=_attribute(node, "auto_pad", "NOTSET"),
                     output_padding=tuple(_attribute(node, "output_padding", [0] * n)))
    if len(inputs) < 2 or inputs[1] != weight or inputs[0] == weight or len(shape) != 2:
        return f"it is not the {op}'s second (2-D) input"
    if op == "MatMul":
        return Layer(weight, "MatMul", shape[0], inputs[0], node.name)
    transposed = bool(_attribute(node, "transB", 0))
    return Layer(weight, "Gemm.T" if transposed else "MatMul", shape[1] if transposed else shape[0], inputs[0], node.name,
                 transpose_input=bool(_attribute(node, "transA", 0)))


ROW_CHAINS = frozenset({"Slice", "Concat", "Unsqueeze", "Identity"})  # ops that select or reorder rows only


def layer_through(node, weight: str, use, shape: tuple[int, ...]) -> Layer | str:
    """The `Layer` of ``node`` reading the 2-D ``weight`` of ``shape`` through a chain of `ROW_CHAINS` operators
    (``use``: its `plan.Use`, the weight's channel axis 0 and reduction axis 1): a Gemm's transposed B, or an
    LSTM's, GRU's or RNN's W or R of one direction. Its rows (output channels) may be selected, reordered or
    stacked, its columns are the layer's input features as they are: every row is weighed by the same Hessian,
    which the layer's input gives. The layout is the weight's own, rows by columns ("Gemm.T")."""
    chain = " -> ".join(use.through)
    if not set(use.through) <= ROW_CHAINS or len(shape) != 2 or (use.channel_axis, use.reduction_axis) != (0, 1):
        return f"read through {chain}"
    op = node.op_type
    if op in RECURRENT:
        if _attribute(node, "direction", "forward") == "bidirectional":
            return f"read through {chain} by a bidirectional {op} (one weight for both directions' matrices)"
        index = {"W": 1, "R": 2}.get(use.input)
        if index is None or len(node.input) <= index:
            return f"it is not the {op}'s W or R"
        layer = _recurrent_layer(node, node.input[index], (1,) + tuple(shape))
    elif op == "Gemm" and use.input == "B" and _attribute(node, "transB", 0) and not _attribute(node, "transA", 0):
        layer = Layer(weight, "Gemm.T", shape[1], node.input[0], node.name)
    else:
        return f"read through {chain}"
    if isinstance(layer, str):
        return layer
    layer.weight, layer.op, layer.features_count, layer.group = weight, "Gemm.T", int(shape[1]), 1
    return layer


class Collector:
    """Feeds the layers' input tensors, as a run over the samples exposes them, into their Hessians: ``names``
    to expose, ``consume(values)`` for each segment's tensors, ``finish()`` after the last sample. Layers whose
    features are the same (`Layer.signature`) share one sum. Each sum draws its positions from a stream seeded
    by its first weight's name, so the figures do not depend on which other layers are collected."""

    def __init__(self, layers: list[Layer], samples: int, seed: int = 0):
        self.names = list(dict.fromkeys([layer.input for layer in layers] + [l.state for l in layers if l.state]))
        self.held: dict[str, np.ndarray] = {}  # the recurrent layers' initial states, until their Y comes
        self.shared: dict[tuple, list[Layer]] = {}
        for layer in sorted(layers, key=lambda item: item.weight):
            self.shared.setdefault(layer.signature(), []).append(layer)
        self.leaders = [group[0] for group in self.shared.values()]
        for leader in self.leaders:
            leader.wants_magnitudes = any(layer.wants_magnitudes for layer in self.shared[leader.signature()])
        self.streams = {id(layer): np.random.default_rng([seed, zlib.crc32(layer.weight.encode())])
                        for layer in self.leaders}
        self.states = {layer.state for layer in self.leaders if layer.state}
        self.by_input: dict[str, list[Layer]] = {}
        for layer in self.leaders:
            total = min(ROW_RANGE[1], max(ROW_RANGE[0], ROWS_PER_FEATURE * layer.features_count))
            layer.limit = min(MAX_ROWS, -(-total // max(1, samples)))
            self.by_input.setdefault(layer.input, []).append(layer)

    def held_bytes(self) -> int:
        """What the collection holds while the samples run: each shared Hessian (float64), its float32 product
        as it is added, and its buffer of feature vectors."""
        return sum(12 * leader.features_count ** 2 * leader.matrices + FLUSH_BYTES for leader in self.leaders)

    def consume(self, values: dict) -> None:
        for name, value in values.items():
            if name in self.states:
                self.held[name] = value
            for layer in self.by_input.get(name, ()):
                layer.add(value, self.streams[id(layer)], self.held.get(layer.state) if layer.state else None)

    def finish(self) -> None:
        for group in self.shared.values():
            leader = group[0]
            leader.release()
            if leader.recurrent == "W" and leader.sums is not None and leader.directions > 1:
                leader.sums = np.repeat(leader.sums, leader.directions, axis=0)  # every direction reads the sequence
                if leader.magnitudes is not None:
                    leader.magnitudes = np.repeat(leader.magnitudes, leader.directions, axis=0)
            for layer in group[1:]:
                layer.sums, layer.magnitudes, layer.rows = leader.sums, leader.magnitudes, leader.rows
                layer.lows, layer.highs = leader.lows, leader.highs


def _recurrent_layer(node, weight: str, shape) -> Layer | str:
    """LSTM, GRU, RNN: W [D, gates*H, I] reads the sequence; R [D, gates*H, H] the previous hidden state, the
    output Y one step back (so Y must be an output of the node). GRU's R_h multiplies r * h (linear_before_reset
    0) or h (1): the Hessian of h stands for both (exact for the z and r gates)."""
    inputs, outputs = list(node.input), list(node.output)
    direction = _attribute(node, "direction", "forward")
    common = {"directions": 2 if direction == "bidirectional" else 1, "reverse": direction == "reverse",
              "batch_major": bool(_attribute(node, "layout", 0)), "group": shape[0]}
    if len(inputs) > 4 and inputs[4]:
        return "its sequence_lens may end sequences early (the states past the end are not the ones R reads)"
    if len(inputs) > 1 and inputs[1] == weight:
        return Layer(weight, node.op_type, shape[2], inputs[0], node.name, recurrent="W", **common)
    if len(inputs) > 2 and inputs[2] == weight:
        if not outputs or not outputs[0]:
            return f"its {node.op_type} does not output Y, the hidden states R reads"
        state = inputs[5] if len(inputs) > 5 else ""
        return Layer(weight, node.op_type, shape[2], outputs[0], node.name, recurrent="R", state=state, **common)
    return f"it is not the {node.op_type}'s W or R"


def collect(model, layers: list[Layer], data: CalibrationData, progress=None, seed: int = 0, folder=None) -> None:
    """Fill every layer's ``sums``, ``magnitudes`` and ``rows`` from one run of the float model over the samples.
    ``folder``: where the model's external data files are, if it has any."""
    collector = Collector(layers, data.samples, seed)
    run = Segments(model, collector.names, first(data), folder=folder)
    for index, feeds in enumerate(data):
        try:
            for values in run(feeds):
                collector.consume(values)
                del values
        except UserError:
            raise
        except Exception as error:  # noqa: BLE001 (onnxruntime's several error types: one line for the user)
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(f"--calibrate: the float model does not run on sample {index} ({text[:300]}); each "
                            f"sample is fed as a batch of one, the arrays' first axis counting the samples") from None
        if progress is not None:
            progress(1)
    collector.finish()
