"""ONNX models: read a model's float constants, write the QDQ model.

Reading: `OnnxModel` loads the graph without its external data (so a model of any size loads in
little memory), lists every float constant with the uses `onnx_weights` found (`found`), and reads a
constant's values on demand (`array`): inline data as a NumPy view, external data as a memory map of
its file, each checked against its dims first (a short tensor or external file is a UserError, never
a reshape traceback).

Writing: each quantized constant W is replaced where it is stored. An initializer becomes the
initializers ``W_quantized`` (2/4/6-bit types in the packed raw_data layout), ``W_scale`` (W's float
type) and ``W_zero_point`` (integer types), read by a DequantizeLinear node at the top of its graph; a
Constant node becomes Constant nodes of the same three and the DequantizeLinear, at the node's place.
The DequantizeLinear's output keeps the name W, so every reader, in the graph or in a subgraph that
sees it, reads the same name as before, and the chains between a constant and its operator (casts,
transposes, an LSTM's gate reordering) compute what they did, on the dequantized values.

Models whose input has external data, or whose output would pass protobuf's 2 GB limit, are written
with external data: the tensors go to ``OUTPUT.data`` beside the model as they are quantized, and the
tensors that are kept are copied there chunk by chunk, so memory stays near the largest tensor.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import numpy as np

from ... import dtypes
from ..errors import UserError
from ..extras import import_onnx
from ..plan import Found
from ..storage import to_storage
from . import onnx_weights
from .onnx_constants import attributes

PROTOBUF_LIMIT = 2**31 - 1  # bytes in one serialized message
INLINE_LIMIT = 2**31 - (64 << 20)  # above this much tensor data the output uses external data
SMALL_TENSOR = 1024  # bytes; smaller tensors stay inline in models with external data
_FLOAT_NAMES = {"float": "float32", "float16": "float16", "bfloat16": "bfloat16", "double": "float64"}


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


@functools.lru_cache(maxsize=8)
def _constant_types(opset: int) -> frozenset[int]:
    """The TensorProto data types a Constant node may hold at ``opset`` (float6 not, up to onnx 1.23)."""
    from onnx import TensorProto, defs

    allowed = defs.get_schema("Constant", min(opset, defs.onnx_opset_version())).type_constraints[0].allowed_type_strs
    return frozenset(value for name, value in TensorProto.DataType.items() if f"tensor({name.lower()})" in allowed)


def _small_array(tensor):
    from onnx import numpy_helper

    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # an integer constant the search cannot read: it just does not fold
        return None


class OnnxModel:
    """A model read for quantization. ``found`` lists every float constant, ``constants`` the same
    by name with where each is stored."""

    def __init__(self, source: Path):
        onnx = import_onnx()
        self.source = source
        self.base = source.resolve().parent
        try:
            self.model = onnx.load(str(source), load_external_data=False)
        except Exception as error:  # protobuf's DecodeError and friends: the file is not a model
            raise UserError(f"{source}: not a readable ONNX model ({_first_line(error)})") from None
        if not self.model.graph.node and not self.model.graph.initializer:
            raise UserError(f"{source}: not a readable ONNX model (no graph)")
        self.external = _uses_external_data(self.model)
        self.stored_bytes = source.stat().st_size + sum(
            (self.base / location).stat().st_size for location in _data_files(self.model)
            if (self.base / location).is_file())
        self.refresh()

    def refresh(self):
        """Search the (possibly converted) model for its constants again."""
        # Keyed by scope and name: sibling graphs (an If's two branches) may each define a constant "w".
        self.constants = {_key_of(c): c for c in onnx_weights.find_constants(self.model, attributes, _small_array)}
        self.found = [_found(c) for c in self.constants.values()]

    @property
    def data_folder(self) -> Path | None:
        """Where the external data files the model's tensors name are (its folder), or None without them: what a
        session made from the in-memory model needs to read them."""
        return self.base if self.external else None

    @property
    def opset(self) -> int:
        return default_opset(self.model)

    def array(self, found: Found) -> np.ndarray:
        constant = self.constants[found.key]
        return read_tensor(constant.tensor, self.base, f"{self.source}: {constant.location} {found.name!r}")

    def stored_value(self, name: str) -> np.ndarray | None:
        """A main-graph constant's values by name (an initializer or a Constant node's output), or None."""
        constant = self._main_constants().get(name)
        if constant is None:
            return None
        return np.asarray(read_tensor(constant.tensor, self.base, f"{self.source}: {constant.location} {name!r}"))

    def _main_constants(self) -> dict:
        return {c.name: c for c in self.constants.values() if not c.scope}

    def constant_values(self):
        """A `ConstantValues` of the main graph: stored constants and shape operators on them."""
        from .onnx_constants import ConstantValues

        return ConstantValues(self.model, self.stored_value)

    def fold_for_static(self, onnxruntime: bool = False) -> list:
        """Fold each main-graph Conv's BatchNormalization (or Mul/Add by constants) into its weights, with
        ``onnxruntime`` also the rewrites that let onnxruntime fuse more (a HardSigmoid after a Conv into it as a
        Clip, a Max or Min with a scalar as a Clip: `onnx_folding`), and drop what nothing reads any more; returns
        what was folded."""
        from . import onnx_folding
        from .onnx_constants import prune_unused

        read, write = self._constant_editor(self.constant_values())
        folded = onnx_folding.fold(self.model, read, write, onnxruntime)
        if folded:
            prune_unused(self.model.graph)
            self.refresh()
        return folded

    def pad_channels(self, names: set[str] | None = None) -> list:
        """Give the main graph's Convs (those named, or all) zero channels up to what onnxruntime's int8 kernels
        take, with every tensor that must carry them (`onnx_channel_padding`); returns what was padded."""
        from . import onnx_channel_padding

        read, write = self._constant_editor(self.stored_value)
        padded = onnx_channel_padding.pad_channels(self.model, read, write, names)
        if padded:
            self.refresh()
        return padded

    def divide_inputs(self, layers, foldable) -> list:
        """AWQ's channel scales (`onnx_channel_scales`): for each (node name, weight name, multipliers of the
        weight's shape, scales, divisor shape) in ``layers``, the weight is multiplied by the multipliers (its
        columns by their channels' scales) and the node's input is divided by the scales: folded into the node that writes it where ``foldable(writer)``
        agrees, else by a Div node. Returns, per layer, the `onnx_channel_scales.Writer` folded into or the
        divided tensor's name."""
        from . import onnx_channel_scales

        read, write = self._constant_editor(self.stored_value)
        graph = self.model.graph
        taken = _all_names(self.model)
        done = []
        for node_name, weight, multipliers, scales, divisor_shape in layers:
            node = next(n for n in graph.node if n.name == node_name)
            value = read(weight)  # as earlier folds left it
            write(weight, (value * multipliers).astype(value.dtype))
            writer = onnx_channel_scales.writer_of(graph, node, read)
            if writer is not None and foldable(writer):
                onnx_channel_scales.fold(writer, scales, read, write)
                done.append(writer)
            else:
                done.append(onnx_channel_scales.divide(graph, node, np.reshape(scales, divisor_shape),
                                                       lambda name: _unique(name, taken)))
        self.refresh()
        return done

    def divide_branch_input(self, found: Found, node_name: str, multipliers, scales, divisor_shape) -> str:
        """`divide_inputs` for a weight ``found`` inside an If branch, read by the node ``node_name`` of the same
        branch: the weight multiplied in place, a Div node before the node in the branch (nothing folded: the
        node that writes its input may lie outside the branch). Returns the divided tensor's name."""
        from onnx import numpy_helper

        from . import onnx_channel_scales

        constant = self.constants[found.key]
        value = self.array(found)
        constant.tensor.CopyFrom(numpy_helper.from_array((value * multipliers).astype(value.dtype),
                                                         constant.tensor.name))
        graph = constant.graph
        node = next(n for n in graph.node if n.name == node_name)
        taken = _all_names(self.model)
        divided = onnx_channel_scales.divide(graph, node, np.reshape(scales, divisor_shape),
                                             lambda name: _unique(name, taken))
        self.refresh()
        return divided

    def _constant_editor(self, values):
        """``read(name)``, ``write(name, array)`` over the main graph's constants: ``values`` reads them, a
        written value replaces the stored tensor (a new name becomes an initializer) and is what ``read`` gives
        from then on."""
        from onnx import numpy_helper

        main = self._main_constants()
        written: dict[str, np.ndarray] = {}

        def read(name):
            return written[name] if name in written else values(name)

        added = {}

        def write(name, array):
            written[name] = array
            constant = main.get(name)
            if constant is None:  # a new bias: an initializer of the main graph (once, then rewritten)
                if name in added:
                    added[name].CopyFrom(numpy_helper.from_array(array, name))
                else:
                    self.model.graph.initializer.append(numpy_helper.from_array(array, name))
                    added[name] = self.model.graph.initializer[-1]
                return
            replacement = numpy_helper.from_array(array, constant.tensor.name)
            constant.tensor.CopyFrom(replacement)

        return read, write

    def raise_opset(self, target: int):
        """Convert the model to opset ``target`` with onnx's version converter; a UserError when it cannot."""
        onnx = import_onnx()
        from onnx import version_converter

        try:
            converted = version_converter.convert_version(self.model, target)
        except Exception as error:
            raise UserError(f"{self.source}: the model is at opset {self.opset} and {target} is needed for this type "
                            f"and granularity, but onnx's version converter cannot raise it "
                            f"({_first_line(error)})") from None
        # The converter may leave the IR version below what the new opset needs.
        converted.ir_version = max(converted.ir_version, onnx.helper.find_min_ir_version_for(list(converted.opset_import)))
        repair_value_info(converted, self.model)
        self.model = converted
        self.refresh()


def repair_value_info(model, original=None) -> None:
    """Drop the converter's leftovers that onnx.checker refuses, in place: every ``value_info`` (optional hints,
    which the version converter writes without shapes, or with the old opset's shapes) in every graph, a shape
    for each main-graph input and output that lost it (the original model's), and a declared output shape that
    the new opset's shape inference contradicts (PyTorch exporters declare shapes that older opsets could not
    check: a Reshape's rank-3 output declared as rank 2): the inferred one replaces it."""
    from .onnx_constants import subgraphs

    def clear(graph):
        del graph.value_info[:]
        for node in graph.node:
            for sub in subgraphs(node):
                clear(sub)

    clear(model.graph)
    if original is None:
        return
    before = {v.name: v for v in list(original.graph.input) + list(original.graph.output)}
    for value in list(model.graph.input) + list(model.graph.output):
        old = before.get(value.name)
        if (value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape") and old is not None
                and old.type.tensor_type.HasField("shape")):
            value.type.tensor_type.shape.CopyFrom(old.type.tensor_type.shape)


def _inferred_outputs(model) -> dict:
    """The main graph's output shapes as onnx's shape inference tells them with the declared ones set aside."""
    onnx = import_onnx()
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for value in bare.graph.output:
        value.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(bare)
    except Exception:  # noqa: BLE001 (inference fails on some exports: nothing to learn)
        return {}
    return {v.name: v.type.tensor_type.shape for v in list(inferred.graph.value_info) + list(inferred.graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def repair_output_shapes(model) -> list[str]:
    """Replace each declared main-graph output shape whose rank contradicts shape inference by the inferred one,
    in place; returns the outputs changed."""
    inferred = _inferred_outputs(model)
    changed = []
    for value in model.graph.output:
        shape = inferred.get(value.name)
        declared = value.type.tensor_type.shape if value.type.tensor_type.HasField("shape") else None
        if shape is not None and (declared is None or len(declared.dim) != len(shape.dim)):
            value.type.tensor_type.shape.CopyFrom(shape)
            changed.append(value.name)
    return changed


def _key_of(constant: onnx_weights.Constant) -> str:
    return f"{constant.scope}\n{constant.name}"


def _found(constant: onnx_weights.Constant) -> Found:
    element = dtypes.BY_TENSORPROTO.get(constant.tensor.data_type)
    shape = tuple(int(d) for d in constant.tensor.dims)
    return Found(constant.name, element.dtype, shape, math.prod(shape) * element.dtype.itemsize,
                 location=constant.location, uses=tuple(constant.uses), type_name=_FLOAT_NAMES[element.onnx_name],
                 key=_key_of(constant))


def _data_files(model) -> set[str]:
    from onnx.external_data_helper import _get_all_tensors

    return {entry.value for tensor in _get_all_tensors(model) if tensor.data_location == 1
            for entry in tensor.external_data if entry.key == "location"}


def _uses_external_data(model) -> bool:
    from onnx.external_data_helper import _get_all_tensors

    return any(t.data_location == 1 for t in _get_all_tensors(model))


def _external_info(tensor) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def read_tensor(tensor, base: Path, where: str) -> np.ndarray:
    """A float tensor's values, checked against its dims: external data as a read-only memory map."""
    element = dtypes.BY_TENSORPROTO[tensor.data_type]
    shape = tuple(int(d) for d in tensor.dims)
    count = math.prod(shape)
    expected = count * element.dtype.itemsize
    if tensor.data_location == 1:  # EXTERNAL
        info = _external_info(tensor)
        location = info.get("location", "")
        path = (base / location).resolve()
        if not location or os.path.isabs(location) or base not in path.parents:
            raise UserError(f"{where}: external data location {location!r} is not a file beside the model")
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", expected))
            size = path.stat().st_size
        except ValueError:
            raise UserError(f"{where}: corrupt external data fields {info}") from None
        except OSError as error:
            raise UserError(f"{where}: external data file {location!r}: {error.strerror}") from None
        if length != expected:
            raise UserError(f"{where}: its external data is {length} bytes, and its dims {list(shape)} of "
                            f"{element.onnx_name} need {expected}")
        if offset < 0 or offset + expected > size:
            raise UserError(f"{where}: external data file {location!r} has {size} bytes, and the tensor needs bytes "
                            f"[{offset}, {offset + expected})")
        if count == 0:
            return np.zeros(shape, element.dtype)
        return np.memmap(path, dtype=element.dtype, mode="r", offset=offset, shape=shape)
    if tensor.raw_data:
        if len(tensor.raw_data) != expected:
            raise UserError(f"{where}: has {len(tensor.raw_data)} bytes of data, and its dims {list(shape)} of "
                            f"{element.onnx_name} need {expected}")
        return np.frombuffer(tensor.raw_data, element.dtype).reshape(shape)
    field = {"float": tensor.float_data, "double": tensor.double_data}.get(element.onnx_name, tensor.int32_data)
    if len(field) != count:
        raise UserError(f"{where}: has {len(field)} values, and its dims {list(shape)} need {count}")
    if element.onnx_name in ("float", "double"):
        return np.asarray(field, element.dtype).reshape(shape)
    # float16 and bfloat16 values are stored as their bit patterns in int32_data
    return np.asarray(field, np.int32).astype(np.uint16).view(element.dtype).reshape(shape)


# ----------------------------------------------------------------------------------------------------
# Writing


class ExternalData:
    """The output's external data file, written as tensors arrive (``offset`` aligned to 64 bytes)."""

    def __init__(self, file, location: str):
        self.file, self.location, self.offset = file, location, 0

    def begin(self) -> int:
        padding = -self.offset % 64
        if padding:
            self.file.write(b"\0" * padding)
            self.offset += padding
        return self.offset

    def write(self, data) -> None:
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        self.file.write(view)
        self.offset += view.nbytes

    def point(self, tensor, start: int) -> None:
        """Make ``tensor`` refer to the bytes written since ``start``."""
        del tensor.external_data[:]
        tensor.ClearField("raw_data")
        for key, value in (("location", self.location), ("offset", str(start)), ("length", str(self.offset - start))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = 1


class QdqWriter:
    """Replaces constants of ``model`` by quantized constants and DequantizeLinear nodes."""

    def __init__(self, model: OnnxModel, external: ExternalData | None):
        self.model, self.external = model, external
        self.taken = _all_names(model.model)
        self.dequantize_nodes = 0

    def sink(self, found: Found, qtype):
        """A sink for `quantization.quantize_tensor` and the function that finishes the values tensor."""
        onnx = import_onnx()
        tensor = onnx.TensorProto()
        tensor.data_type = qtype.tensorproto
        tensor.dims.extend(found.shape)
        if self.external is not None and found.nbytes >= SMALL_TENSOR:
            start = self.external.begin()
            return (lambda q: self.external.write(to_storage(q, qtype))), (lambda: self.external.point(tensor, start) or tensor)
        pieces = []

        def finish():
            q = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0) if pieces else np.zeros(found.shape, qtype.dtype)
            tensor.raw_data = np.ascontiguousarray(to_storage(q.reshape(found.shape), qtype)).tobytes()
            return tensor
        return pieces.append, finish

    def replace(self, found: Found, values, scale: np.ndarray, zero_point: np.ndarray | None, gran, qtype) -> int:
        """Put the quantized ``values`` (a TensorProto from `sink`) in place of constant ``found``; returns the
        bytes the three new tensors hold."""
        from onnx import helper

        constant = self.model.constants[found.key]
        name = found.name
        q_name, s_name, z_name = (_unique(f"{name}_{suffix}", self.taken) for suffix in ("quantized", "scale", "zero_point"))
        values.name = q_name
        scale = np.asarray(scale)
        new = [values, self._parameter(helper, s_name, scale, dtypes.BY_DTYPE[scale.dtype])]
        if qtype.is_integer:
            new.append(self._parameter(helper, z_name, np.asarray(zero_point, qtype.dtype), qtype))
        attributes = {}
        if gran.kind != "tensor":
            attributes["axis"] = gran.axis
        if gran.kind == "block":
            attributes["block_size"] = gran.block_size
        weight_type = dtypes.BY_DTYPE[np.dtype(found.dtype)]
        cast = weight_type.dtype != scale.dtype  # bfloat16 weights: float32 scales, then a Cast
        dequantized = _unique(f"{name}_dequantized", self.taken) if cast else name
        node = helper.make_node("DequantizeLinear", [t.name for t in new], [dequantized],
                                name=_unique(f"{name}_DequantizeLinear", self.taken), **attributes)
        nodes = [node]
        if cast:
            nodes.append(helper.make_node("Cast", [dequantized], [name], to=weight_type.tensorproto,
                                          name=_unique(f"{name}_Cast", self.taken)))
        self._put(constant, new, nodes)
        self.dequantize_nodes += 1
        return sum(_stored_bytes(t) for t in new)

    def replace_mx(self, found: Found, fmt, codes: np.ndarray, scales: np.ndarray, global_scale, gran) -> int:
        """Put an MX weight in place of constant ``found``: DequantizeLinear(codes, e8m0 scales, axis,
        block_size, output_dtype = the weight's type); NVFP4 as two, DequantizeLinear(e4m3 block scales,
        float32 tensor scale) -> float32 scales -> DequantizeLinear(float4 codes, those, axis, block_size=16).
        Returns the bytes the new tensors hold."""
        from onnx import helper

        constant = self.model.constants[found.key]
        name = found.name
        weight_type = dtypes.BY_DTYPE[np.dtype(found.dtype)]
        q_name, s_name = (_unique(f"{name}_{suffix}", self.taken) for suffix in ("quantized", "scale"))
        new = [self._parameter(helper, q_name, np.asarray(codes), dtypes.BY_DTYPE[np.asarray(codes).dtype]),
               self._parameter(helper, s_name, np.asarray(scales), dtypes.BY_DTYPE[np.asarray(scales).dtype])]
        blocked = {"axis": gran.axis, "block_size": gran.block_size, "output_dtype": weight_type.tensorproto}
        if global_scale is None:
            nodes = [helper.make_node("DequantizeLinear", [q_name, s_name], [name],
                                      name=_unique(f"{name}_DequantizeLinear", self.taken), **blocked)]
        else:
            g_name, b_name = (_unique(f"{name}_{suffix}", self.taken) for suffix in ("global_scale", "block_scale"))
            new.append(self._parameter(helper, g_name, np.asarray(global_scale, np.float32).reshape(()),
                                       dtypes.BY_DTYPE[np.dtype(np.float32)]))
            nodes = [helper.make_node("DequantizeLinear", [s_name, g_name], [b_name],
                                      name=_unique(f"{b_name}_DequantizeLinear", self.taken)),
                     helper.make_node("DequantizeLinear", [q_name, b_name], [name],
                                      name=_unique(f"{name}_DequantizeLinear", self.taken), **blocked)]
        self._put(constant, new, nodes)
        self.dequantize_nodes += len(nodes)
        return sum(_stored_bytes(t) for t in new)

    def _put(self, constant, new: list, nodes: list) -> None:
        """Replace ``constant`` where it is stored by the tensors ``new`` (initializers, or Constant nodes at
        the Constant node's place) and the ``nodes`` that compute it from them."""
        from onnx import helper

        graph, name = constant.graph, constant.name
        if constant.node is None:
            graph.initializer.remove(constant.tensor)
            graph.initializer.extend(new)
            for graph_input in list(graph.input):
                if graph_input.name == name:  # old models list initializers as inputs too
                    graph.input.remove(graph_input)
            for offset, made_node in enumerate(nodes):
                graph.node.insert(offset, made_node)
        else:
            position = list(graph.node).index(constant.node)
            # a type the Constant operator does not take at the model's opset (float6: DequantizeLinear's only)
            # becomes an initializer of the same graph, which any graph may hold
            storable = _constant_types(default_opset(self.model.model))
            graph.initializer.extend(t for t in new if t.data_type not in storable)
            made = [helper.make_node("Constant", [], [t.name], value=t, name=_unique(f"{t.name}_Constant", self.taken))
                    for t in new if t.data_type in storable]
            del graph.node[position]
            for offset, made_node in enumerate(made + nodes):
                graph.node.insert(position + offset, made_node)

    def _parameter(self, helper, name: str, array: np.ndarray, element):
        """A scale or zero point: inline, or in the data file when there is one and it is not small (the
        blocked scales of a large weight are 1/32 of it, and would otherwise all stay in memory)."""
        raw = to_storage(array, element) if element.packs else np.ascontiguousarray(array)
        if self.external is None or raw.nbytes < SMALL_TENSOR:
            return helper.make_tensor(name, element.tensorproto, list(array.shape), raw.tobytes(), raw=True)
        tensor = import_onnx().TensorProto(name=name, data_type=element.tensorproto, dims=list(array.shape))
        start = self.external.begin()
        self.external.write(raw.reshape(-1).view(np.uint8))
        self.external.point(tensor, start)
        return tensor

    def move_kept(self, chosen: list[Found]) -> None:
        """Write every tensor that is not quantized into the output's data file (external data chunk by
        chunk, inline data of SMALL_TENSOR bytes or more at once), before the quantized ones arrive."""
        from onnx import numpy_helper
        from onnx.external_data_helper import _get_all_tensors

        skip = {_key(self.model.constants[found.key].tensor) for found in chosen}
        for tensor in _get_all_tensors(self.model.model):
            if _key(tensor) in skip:
                continue
            if tensor.data_location == 1:
                self._copy_external(tensor)
            elif tensor.raw_data and len(tensor.raw_data) >= SMALL_TENSOR:
                start = self.external.begin()
                self.external.write(np.frombuffer(tensor.raw_data, np.uint8))
                self.external.point(tensor, start)
            elif not tensor.raw_data and math.prod(tensor.dims) * 4 >= SMALL_TENSOR and tensor.data_type != 8:
                array = numpy_helper.to_array(tensor)  # typed fields: their raw little-endian bytes
                start = self.external.begin()
                self.external.write(np.ascontiguousarray(array).view(np.uint8).reshape(-1))
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    tensor.ClearField(field)
                self.external.point(tensor, start)

    def _copy_external(self, tensor) -> None:
        info = _external_info(tensor)
        where = f"{self.model.source}: tensor {tensor.name!r}"
        location = info.get("location", "")
        path = (self.model.base / location).resolve()
        if not location or os.path.isabs(location) or self.model.base not in path.parents:
            raise UserError(f"{where}: external data location {location!r} is not a file beside the model")
        try:
            offset = int(info.get("offset", 0))
            size = path.stat().st_size
            length = int(info.get("length", size - offset))
        except ValueError:
            raise UserError(f"{where}: corrupt external data fields {info}") from None
        except OSError as error:
            raise UserError(f"{where}: external data file {location!r}: {error.strerror}") from None
        if offset < 0 or length < 0 or offset + length > size:
            raise UserError(f"{where}: external data file {location!r} has {size} bytes, and the tensor needs bytes "
                            f"[{offset}, {offset + length})")
        start = self.external.begin()
        with open(path, "rb") as f:
            f.seek(offset)
            remaining = length
            while remaining > 0:
                block = f.read(min(remaining, 64 << 20))
                self.external.write(np.frombuffer(block, np.uint8))
                remaining -= len(block)
        self.external.point(tensor, start)


def _key(tensor) -> tuple:
    """What tells a tensor apart from the others: its external bytes, or its name, dims and size (an
    inline tensor that matches a quantized one by these merely stays inline)."""
    if tensor.data_location == 1:
        info = _external_info(tensor)
        return ("external", info.get("location"), info.get("offset", "0"), info.get("length"))
    return ("inline", tensor.name, tuple(tensor.dims), len(tensor.raw_data))


def _raw(helper, name: str, array: np.ndarray, element):
    """A TensorProto with raw_data in ONNX's layout (2/4-bit types packed)."""
    raw = to_storage(array, element) if element.packs else np.ascontiguousarray(array)
    return helper.make_tensor(name, element.tensorproto, list(array.shape), raw.tobytes(), raw=True)


def _stored_bytes(tensor) -> int:
    if tensor.data_location == 1:
        return int(_external_info(tensor).get("length", 0))
    return len(tensor.raw_data)


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


def _all_names(model) -> set[str]:
    """Every value and node name of the model, subgraphs included (a new name must clash with none)."""
    names: set[str] = set()

    def visit(graph):
        names.update(i.name for i in graph.initializer)
        names.update(i.name for i in graph.input)
        names.update(o.name for o in graph.output)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
            for attribute in node.attribute:
                if attribute.type == 5:  # GRAPH
                    visit(attribute.g)
                elif attribute.type == 10:  # GRAPHS
                    for sub in attribute.graphs:
                        visit(sub)
    visit(model.graph)
    return names


def inline_bytes(model) -> int:
    """The bytes of tensor data held inside the model proto (what counts against protobuf's limit)."""
    from onnx.external_data_helper import _get_all_tensors

    return sum(len(t.raw_data) for t in _get_all_tensors(model) if t.data_location != 1)


def serialize(model, where: str) -> bytes:
    try:
        return model.SerializeToString()
    except ValueError as error:  # protobuf refuses messages over 2 GB
        raise UserError(f"{where}: the quantized model cannot be serialized ({_first_line(error)})") from None
