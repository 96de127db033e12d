"""What flows through the `qlinear quantize` pipeline, stage to stage.

    read (a format adapter) -> Found tensors
    select                  -> a Choice per tensor: a Granularity, or the reason it is kept
    calibrate               -> scale and zero point
    quantize                -> quantized chunks to the writer, and Stats
    write, report

Every stage takes and returns the plain values defined here, so no stage needs to know the one
before it: the command line is parsed once into `Settings`, and no later stage sees argparse.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .. import schemas
from ..dtypes import ElementType
from ..granularity import Granularity
from ..reference import mx as mx_reference
from .errors import UserError

FORMAT_VERSION = "qlinear.quantized/1"  # the metadata that `qlinear dequantize` reads back
DEFAULT_BLOCK_SIZE = 32  # the default for types of 6 bits and fewer
MX_FORMATS = tuple(mx_reference.FORMATS)  # the microscaling formats --dtype takes (`qlinear.mx`)


# ----------------------------------------------------------------------------------------------------
# Settings


class ChunkSize:
    """A parsed --chunks value: ``nbytes`` of input per chunk, or ``elements`` per chunk."""

    def __init__(self, nbytes: int | None = None, elements: int | None = None):
        self.nbytes, self.elements = nbytes, elements

    def limit(self, itemsize: int) -> int:
        """Bytes of input per chunk for elements of ``itemsize`` bytes."""
        return self.nbytes if self.nbytes is not None else self.elements * itemsize


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_chunks(text: str) -> ChunkSize:
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or (unit and unit not in _UNITS):
        raise UserError(f"--chunks {text!r}: give an element count (e.g. 1000000) or a size with a unit "
                        f"(e.g. 256MiB, 1GB; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    count = int(match.group(1))
    if count <= 0:
        raise UserError(f"--chunks {text!r}: must be positive")
    return ChunkSize(nbytes=count * _UNITS[unit]) if unit else ChunkSize(elements=count)


@dataclass(frozen=True)
class Settings:
    """What the user asked for. ``None`` means "the default", which `select` resolves per tensor."""

    qtype: ElementType
    kind: str | None = None  # "tensor", "axis", "block"; None: per channel for 8/16-bit types, blocks below
    axis: int | None = None  # None: the tensor's own channel or reduction axis
    block_size: int | None = None  # None: DEFAULT_BLOCK_SIZE where blocks are used
    symmetric: bool | None = None  # None: symmetric for 8- and 16-bit types, min/max below
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    min_elements: int | None = None  # None: the format's default
    keep_1d: bool = True  # 1-D tensors (biases, norm scales) stay float unless --include names them
    chunks: ChunkSize | None = None  # stream tensors through dask in chunks of this size
    plot: bool = False  # keep what the --plot figures need
    mx: object | None = None  # a `qlinear.mx.MXFormat` (qtype is then its element type); None: plain Q/DQ
    scale_rule: str | None = None  # --scale-rule for the MX formats; None: qlinear.mx's default ("floor")
    rounding: str = "rtn"  # how the weights are rounded (`qlinear.rounding.METHODS`)
    weight_data: tuple = ()  # --calibrate paths for the rounding when the activations stay float
    # with weight_data: move the biases to the float model's output means (None: as the type's default,
    # `bias_correction.weights_only_default`)
    bias_correction: bool | None = None
    target: str = "onnxruntime"  # --target: the runtime an ONNX model is written for (`qlinear.io.placement`)

    @property
    def dtype_name(self) -> str:
        """The --dtype as the report names it: the MX format's name, or the quantized type's."""
        return self.mx.name if self.mx is not None else self.qtype.onnx_name


# ----------------------------------------------------------------------------------------------------
# Read: what a format adapter finds


@dataclass(frozen=True)
class Use:
    """One way a model consumes a tensor: the operator, which of its inputs, and the operator's
    output-channel and reduction axes expressed in the tensor's own axes (None where the tensor
    has no such axis, or where a reshaping chain between them loses it)."""

    op: str  # "Conv", "MatMul", "LSTM", ...
    input: str  # the input's name in the operator's schema: "W", "B", "R", "data", ...
    weight: bool  # True for the inputs that carry weights (Conv W, LSTM R, ...); False for biases, scales, ...
    channel_axis: int | None = None
    reduction_axis: int | None = None
    node: str = ""
    through: tuple[str, ...] = ()  # the constant-foldable operators between the tensor and the consumer

    def label(self) -> str:
        via = f" (through {' -> '.join(self.through)})" if self.through else ""
        return f"{self.op} {self.input}{via}"


@dataclass(frozen=True)
class Found:
    """One tensor of the input. ``dtype`` is None for a type NumPy cannot hold (copied as raw bytes)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int, ...]
    nbytes: int
    location: str = ""  # where it lives: "initializer", "Constant node", "If 'x' then_branch: Constant node", ...
    uses: tuple[Use, ...] | None = None  # how a model uses it; None for tensor files (no graph)
    code: str | None = None  # the file's own type name where NumPy has none (safetensors "F8_E4M3", ...)
    type_name: str = ""  # the type as the report shows it
    key: str = ""  # what its reader finds it by, where names repeat (a model's sibling If branches); else ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def in_subgraph(self) -> bool:
        """Inside an If/Loop/Scan body: its location names the scope first ("If 'x' then_branch: ...")."""
        return ": " in self.location

    @property
    def scope(self) -> str:
        """The If/Loop/Scan body it lives in, as its location names it ("If 'x' then_branch"); "" in the main
        graph."""
        return self.location.split(": ", 1)[0] if self.in_subgraph else ""


# ----------------------------------------------------------------------------------------------------
# Select


@dataclass(frozen=True)
class Choice:
    """What `select` decided for one tensor: a granularity (quantize it) or the reason it is kept."""

    found: Found
    granularity: Granularity | None = None
    reason: str = ""  # why it is kept; for a quantized tensor, a note (a fallback the defaults took)
    symmetric: bool | None = None  # None: symmetric for 8- and 16-bit types, min/max below

    @property
    def quantized(self) -> bool:
        return self.granularity is not None


def quantized_types() -> tuple[str, ...]:
    """The output types of the newest QuantizeLinear."""
    return schemas.SCHEMAS["QuantizeLinear"][-1].quantized_types


def min_opset(qtype: ElementType, kind: str, scale_type: str = "float") -> int:
    """The first opset whose DequantizeLinear takes this type, granularity and scale type."""
    for schema in schemas.SCHEMAS["DequantizeLinear"]:
        if (qtype.onnx_name in schema.quantized_types and kind in schema.granularities
                and scale_type in schema.scale_types):
            return schema.since
    raise UserError(f"no ONNX opset has a DequantizeLinear for {qtype.onnx_name} with {kind} granularity "
                    f"and {scale_type} scales")


def granularity_label(gran: Granularity) -> str:
    if gran.kind == "tensor":
        return "per-tensor"
    if gran.kind == "axis":
        return f"per-axis (axis {gran.axis})"
    return f"blocked (axis {gran.axis}, {gran.block_size})"


# ----------------------------------------------------------------------------------------------------
# Calibrate and quantize


@dataclass
class Stats:
    """Error figures of one tensor, accumulated over its chunks."""

    signal: float = 0.0  # sum of x**2
    noise: float = 0.0  # sum of (x - dequantized)**2
    max_abs_error: float = 0.0
    histogram: np.ndarray | None = None  # value counts over `edges` (for --plot)
    edges: np.ndarray | None = None
    group_noise: np.ndarray | None = None  # sum of squared error per scale group (for --plot)
    group_count: np.ndarray | None = None

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)


@dataclass
class Quantized:
    scale: np.ndarray
    zero_point: np.ndarray
    stats: Stats = field(default_factory=Stats)
