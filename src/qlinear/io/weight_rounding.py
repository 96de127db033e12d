"""Round: the weights of an ONNX model with a `qlinear.rounding` method (--rounding), between "select" and
"write". For the data-driven methods, each weight's layer is found (`hessians.layer_of`), the float model runs
once over the calibration samples to sum the layers' input Hessians (`hessians.collect`), and each weight is
rounded against its Hessian; the report gets, per weight, the layer's output SQNR on the calibration data
with round-to-nearest and with the method, side by side.

A layer in an If's branch (nested Ifs too) is collected on a copy of the model with the branches inlined, over
the samples that take them (`Branches`, `onnx_branches`; a pass of its own). A weight read by several layers of one
kind is rounded against the sum of their Hessians; one read through a chain that only selects or reorders its
rows, against its layer's (`hessians.layer_through`). A weight whose layer this cannot see (in a branch no
sample takes, in a loop's body, read through a Reshape, read as different layers, an operator without a Hessian
here) is rounded to nearest, and its row says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import rounding
from ..rounding.codec import Codec, output_error
from . import hessians, report
from .activation_calibration import Segments, first
from .errors import UserError
from .formats import onnx_branches
from .formats.onnx_constants import stored_constants
from .plan import Choice, Settings, Stats
from .quantization import _add_error

_SCALE_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


@dataclass
class Outcome:
    """What rounding gave one weight: the `rounding.Rounded` tensors (None: round to nearest as usual), a
    note for the report, the weight's error figures, and the layer output SQNR (dB) on the calibration data
    by method ({"rtn": ..., "gptq": ...}; empty without a Hessian)."""

    rounded: rounding.Rounded | None
    note: str = ""
    stats: Stats | None = None
    output_db: dict | None = None
    layer: hessians.Layer | None = None


def _node_by_name(model, name: str):
    for node in model.graph.node:
        if node.name == name:
            return node
    return None


def taken_branches(proto, data, folder=None) -> dict[str, list[str | None]]:
    """Main-graph If name -> the branch ("then_branch" or "else_branch") each sample of ``data`` takes, in the
    samples' order (one run of ``proto`` over them, exposing the conditions); None for a sample whose condition
    holds several values (a batch that would take both)."""
    conditions = onnx_branches.conditions(proto)
    if not conditions:
        return {}
    seen: dict[str, list] = {}
    run = Segments(proto, sorted(set(conditions.values())), first(data), folder=folder)
    for feeds in data:
        values = {}
        for part in run(feeds):
            values.update(part)
        for name in set(conditions.values()):
            held = {bool(v) for v in np.asarray(values[name]).reshape(-1)} if name in values else set()
            seen.setdefault(name, []).append(None if len(held) != 1 else onnx_branches.BRANCHES[0 if True in held
                                                                                                  else 1])
    return {node: seen.get(cond, []) for node, cond in conditions.items()}


class Branches:
    """The If branches the calibration samples take, from the main graph down: for a branch path (`onnx_branches`:
    ((If, branch), ...)), the model with its Ifs inlined and the samples that take it, each found when first
    asked for (a nested If's condition is read on the model with the Ifs above it inlined, over their samples)."""

    def __init__(self, model, data):
        self.model, self.data = model, data
        self._inlined: dict[tuple, object] = {(): model.model}
        self._samples: dict[tuple, list[int] | None] = {(): list(range(data.samples))}
        self._taken: dict[tuple, dict] = {}  # a path -> what its inlined model's main-graph Ifs take

    def inlined(self, path: tuple):
        """The model with the Ifs of ``path`` inlined; None if a branch's names clash."""
        if path not in self._inlined:
            parent = self.inlined(path[:-1])
            self._inlined[path] = None if parent is None else onnx_branches.inline(parent, {path[-1][0]: path[-1][1]})
        return self._inlined[path]

    def samples(self, path: tuple) -> list[int] | None:
        """The indices of the samples that take every branch of ``path``; None if its model cannot be inlined."""
        if path not in self._samples:
            parent, (name, branch) = path[:-1], path[-1]
            within, model = self.samples(parent), self.inlined(parent)
            if within is None or model is None:
                self._samples[path] = None
            else:
                if parent not in self._taken:
                    self._taken[parent] = taken_branches(model, Subset(self.data, within), self.model.data_folder) \
                        if within else {}
                along = self._taken[parent].get(name, [])
                self._samples[path] = [i for i, b in zip(within, along) if b == branch]
        return self._samples[path]


class Subset:
    """The samples of ``data`` at ``indices`` (those that take one If branch), iterated as ``data`` is."""

    def __init__(self, data, indices):
        self.data, self.indices = data, frozenset(indices)
        self.samples = len(self.indices)  # (in ``data``'s order, whatever the order of ``indices``)

    def __iter__(self):
        for index, feeds in enumerate(self.data):
            if index in self.indices:
                yield feeds


def _parts(model, choice: Choice, branches: Branches | None = None):
    """The layers that read the weight, each with where it is collected (None: the model; (If name, branch): the
    model with that branch inlined), or why it has none (a string). A weight read by several nodes (an If's two
    branches, say) gets one part per node, as long as every node reads it as the same kind of layer: its
    Hessian is then the sum of theirs. A weight reaches a part directly or through a chain that only selects or
    reorders its rows (Slice, Concat, Unsqueeze: PyTorch's gate order for an LSTM). ``branches``: the If branches
    the samples take (`Branches`); a part in a branch no sample takes is left out."""
    found = choice.found
    uses = [use for use in (found.uses or ()) if use.weight]
    if not uses or len(uses) != len(found.uses or ()):
        return f"read by {len(found.uses or ())} nodes (one layer's Hessian cannot weigh its error)"
    kinds = {(use.op, use.input, use.channel_axis, use.reduction_axis) for use in uses}
    if len(kinds) != 1:
        return f"read by {len(uses)} nodes as different layers ({', '.join(sorted(u.label() for u in uses))})"
    by_node: dict[str, object] = {}
    for use in uses:
        by_node.setdefault(use.node, use)
    parts, never = [], []
    for node_name, use in by_node.items():
        scope = use.node if use.node.startswith("If '") else found.location if found.in_subgraph else ""
        key = None
        if scope:
            inside = onnx_branches.node_in_branch(model, scope, node_name)
            if inside is None:
                return "inside a subgraph (only the layers in If branches are collected, not in loop bodies)"
            key, node = inside
            taking = branches.samples(key) if branches is not None else None
            if taking is None:
                return "its If branch cannot be inlined to collect its inputs (its tensors' names clash)"
            if not taking:
                never.append(" > ".join(f"If {name!r}'s {branch}" for name, branch in key))
                continue
        else:
            node = _node_by_name(model, node_name)
            if node is None:
                return "its node has no name to find it by"
        if use.through:
            layer = hessians.layer_through(node, found.name, use, found.shape)
        else:
            layer = hessians.layer_of(node, found.name, found.shape)
        if isinstance(layer, str):
            return layer if len(by_node) == 1 else f"{node_name}: {layer}"
        if layer.state and layer.state in stored_constants(model.graph):
            return f"the {node.op_type}'s initial state is a constant (only computed states are collected)"
        parts.append((layer, key))
    if not parts:
        return f"in {' and '.join(never)}, which the calibration samples never take"
    return parts


def _scope(node_name: str) -> str:
    """The scope a use names its node after ("If 'A' then_branch > ..."), "" in the main graph."""
    return node_name.rsplit(": ", 1)[0] if node_name.startswith("If '") else ""


def codec_for(choice: Choice, settings: Settings) -> Codec:
    found = choice.found
    scale_dtype = _SCALE_TYPES.get(found.type_name, np.float32)
    return Codec(settings.qtype, bool(choice.symmetric), found.dtype, scale_dtype, settings.mx, settings.scale_rule)


class Rounding:
    """The weights of one quantization and their layers: made before the activations are calibrated (whose
    run can carry the Hessians: `also`), then `run`."""

    def __init__(self, model, choices: list[Choice], settings: Settings, activation_levels: int = 0, data=None):
        """``activation_levels``: the steps of the activations' integer type when they are quantized too (0:
        float), which AWQ's search counts (`rounding.awq.QuantizedInput`). ``data``: the samples, to find the If
        branches they take when a weight lies in one."""
        self.settings = settings
        self.activation_levels = activation_levels
        self.chosen = [c for c in choices if c.quantized]
        self.layers, self.outcomes = {}, {}
        method = settings.rounding
        branches = Branches(model, data) if method in rounding.NEEDS_DATA and data is not None else None
        # branch path -> the model with its Ifs inlined and the samples that take it: a branch's layers are
        # collected there, in a pass of their own
        self.branches: dict[tuple, tuple] = {}
        self.parts: dict[str, list] = {}  # weight name -> its layers and their keys in `branches` (None: the model)
        for choice in self.chosen:
            parts = _parts(model.model, choice, branches) if method in rounding.NEEDS_DATA else None
            if isinstance(parts, list):
                for _, key in parts:
                    if key is not None:
                        self.branches[key] = (branches.inlined(key), branches.samples(key))
            if isinstance(parts, list) and method == "awq":
                if any(layer.recurrent for layer, _ in parts):
                    parts = "awq divides a layer's input by its channel scales; a recurrent state has none to divide"
                elif (len(parts) > 1 or choice.found.uses[0].through
                      or _scope(choice.found.uses[0].node) != choice.found.scope):
                    parts = ("awq divides a layer's input by its channel scales: one layer reading it directly, in "
                             "the weight's own graph")
            if isinstance(parts, str):
                self.outcomes[choice.found.name] = Outcome(None, f"rounded to nearest: {parts}")
            elif parts is None:
                self.layers[choice.found.name] = None
            else:
                self.parts[choice.found.name] = parts
                # the layer the weight is rounded against: its parts' Hessians summed (`_combine`)
                self.layers[choice.found.name] = parts[0][0] if len(parts) == 1 else replace(parts[0][0])
        self.collected = [layer for parts in self.parts.values() for layer, _ in parts]
        for layer in self.collected:
            layer.wants_magnitudes = method == "awq"
        self.collector = None
        self.factors: dict = {}  # GPTQ's Hessian factors, shared by the weights that read one input

    def also(self, samples: int):
        """(names, consume, bytes held) for `activation_calibration.collect`: the Hessians from the same run,
        where they fit in `HESSIAN_BUDGET` all at once (otherwise `run` collects them in groups, a pass each);
        None if not."""
        if not self.collected or len(_budgeted(self.collected)) > 1 or self.branches:
            return None  # (branch layers: collected on the inlined model, a pass of their own)
        self.collector = hessians.Collector(self.collected, samples)
        return self.collector.names, self.collector.consume, self.collector.held_bytes()

    def run(self, model, data) -> dict[str, Outcome]:
        """Collect the Hessians (unless the activations' run did: `also`) and round every weight; the `Outcome`
        of each by name. The layers go in groups whose Hessians fit in `HESSIAN_BUDGET`, a pass over the
        samples per group, each group's Hessians dropped once its weights are rounded: memory stays within the
        budget (or the largest layer's Hessian) plus the segments' activations."""
        total = sum(c.found.size for c in self.chosen if c.found.name in self.layers)
        owner = {id(layer): name for name, parts in self.parts.items() for layer, _ in parts}
        if self.collector is not None:  # the Hessians came from the run that calibrated the activations
            self.collector.finish()
            groups = [(None, self.collected)]
        else:  # the main graph's layers on the model, each If branch's on it inlined with the samples taking it
            passes: dict = {}
            for name, parts in self.parts.items():
                for layer, key in parts:
                    passes.setdefault(key, []).append(layer)
            groups = [(key, group) for key, members in passes.items() for group in _budgeted(members)]
            groups = groups or [(None, [])]
        last = {owner[id(layer)]: index for index, (_, group) in enumerate(groups) for layer in group}
        for index, (key, group) in enumerate(groups):
            if group and self.collector is None:
                collected_on, on = (model.model, data) if key is None else (
                    self.branches[key][0], Subset(data, self.branches[key][1]))
                what = f" (group {index + 1} of {len(groups)})" if len(groups) > 1 else ""
                taking = (" (those taking " + " > ".join(f"If {name!r}'s {branch}" for name, branch in key) + ")"
                          if key is not None else "")
                with report.progress(on.samples, f"collecting {len(group)} layer Hessians{what} on "
                                     f"{on.samples} samples{taking}", unit="samples") as advance:
                    hessians.collect(collected_on, group, on, advance, folder=model.data_folder)
            # a weight is rounded once the last group that holds one of its layers is collected
            names = {name for name, at in last.items() if at == index}
            for name in names:
                if len(self.parts[name]) > 1:
                    _combine(self.layers[name], [layer for layer, _ in self.parts[name]])
            if index == 0:  # the weights without a layer (the methods without data) go with the first group
                names |= {name for name, layer in self.layers.items() if layer is None}
            with report.progress(total, f"rounding {len(names)} weights ({self.settings.rounding})",
                                 unit="weights") as advance:
                for choice in self.chosen:
                    if choice.found.name in names:
                        self.outcomes[choice.found.name] = _round_one(model, choice, self.settings,
                                                                      self.layers[choice.found.name], advance,
                                                                      self.factors, self.activation_levels)
            for layer in group:  # this group's Hessians are done with, unless a weight rounded later sums them
                if last[owner[id(layer)]] <= index:
                    layer.forget()
            for name in names:
                if name in self.parts and len(self.parts[name]) > 1:
                    for layer, _ in self.parts[name]:
                        layer.forget()
                    self.layers[name].forget()
            self.factors.clear()
        return self.outcomes


def write_channel_scales(model, choices: list[Choice], outcomes: dict[str, Outcome], settings: Settings) -> dict | None:
    """AWQ: each scaled layer's channel scales written into the float model before anything is written
    (`OnnxModel.divide_inputs`). The layer's float weight becomes ``W diag(s)``, what its codes round, and its
    input is divided by ``s``: folded into the node that writes it where that node's weight is float, rounded
    to nearest when written, or rounded in groups that each lie in one of its output channels with plain float
    scales (its codes then stay and those channels' scales are divided: the same rounding of a weight whose
    rows were divided first); a Div node reads the input otherwise. Returns what it did for the report (the
    tensors whose values changed under "tensors"), or None without AWQ's scales."""
    scaled = [(name, outcome) for name, outcome in outcomes.items()
              if outcome.rounded is not None and outcome.rounded.channel_scales is not None]
    if not scaled:
        return None
    by_name = {choice.found.name: choice for choice in choices}

    def foldable(writer) -> bool:
        outcome, choice = outcomes.get(writer.weight), by_name.get(writer.weight)
        if outcome is None or outcome.rounded is None or choice is None:
            return True
        gran = choice.granularity
        in_rows = (gran.kind == "axis" and gran.axis == writer.axis) or (gran.kind == "block" and gran.axis != writer.axis)
        return in_rows and settings.mx is None

    layers, in_branches = [], []
    for name, outcome in scaled:
        layer, scales = outcome.layer, np.asarray(outcome.rounded.channel_scales, np.float32)
        channels = rounding.input_channels(layer.op, tuple(by_name[name].found.shape), layer.group)
        entry = (layer.node, name, scales.astype(np.float64)[channels], scales, layer.divisor_shape(scales.size))
        (in_branches if by_name[name].found.in_subgraph else layers).append(entry)
    done = model.divide_inputs(layers, foldable)
    folded, divided, tensors = [], [], []
    for node, name, multipliers, scales, shape in in_branches:  # (weights in If branches: a Div in the branch)
        tensors.append(model.divide_branch_input(by_name[name].found, node, multipliers, scales, shape))
        divided.append(node)
    for (node, _, _, scales, _), result in zip(layers, done):
        if isinstance(result, str):
            divided.append(node)
            tensors.append(result)
            continue
        folded.append({"layer": node, "into": result.node.name or result.node.output[0]})
        tensors += result.tensors
        outcome = outcomes.get(result.weight)
        if outcome is not None and outcome.rounded is not None:
            outcome.rounded = _rows_divided(outcome.rounded, result.axis, scales, by_name[result.weight].granularity)
    return {"folded": folded, "divided": divided, "tensors": tensors}


def _rows_divided(rounded: rounding.Rounded, axis: int, scales: np.ndarray, gran) -> rounding.Rounded:
    """``rounded`` with its output channels (``axis``) divided by ``scales``: the same codes, their groups' scales
    divided (each group lies in one channel: `write_channel_scales`)."""
    divisor = np.asarray(scales, np.float64)
    full = [1] * rounded.values.ndim
    full[axis] = divisor.size
    stored = np.asarray(rounded.scale)
    if gran.kind == "axis":
        new_scale = stored.astype(np.float64) / divisor
    else:
        new_scale = stored.astype(np.float64) / divisor.reshape(full)
    return replace(rounded, scale=new_scale.astype(stored.dtype), values=rounded.values / divisor.reshape(full))


def _combine(into: hessians.Layer, parts: list) -> None:
    """``into``'s statistics: those of its ``parts`` (the layers that read one weight) together: the Hessians
    and magnitudes summed, the ranges widened, the rows counted."""
    into.sums = sum(part.sums for part in parts if part.sums is not None) if any(
        part.sums is not None for part in parts) else None
    into.rows = sum(part.rows for part in parts)
    held = [part for part in parts if part.magnitudes is not None]
    into.magnitudes = sum(part.magnitudes for part in held) if held else None
    ranged = [part for part in parts if part.lows is not None]
    into.lows = np.minimum.reduce([part.lows for part in ranged]) if ranged else None
    into.highs = np.maximum.reduce([part.highs for part in ranged]) if ranged else None


HESSIAN_BUDGET = 256 << 20  # bytes of Hessians held at once (float64 K x K per group of a layer)


def _budgeted(layers: list) -> list[list]:
    """The layers in groups whose Hessians (layers with the same features counted once) fit in `HESSIAN_BUDGET`;
    a layer larger than the budget alone. Layers that share features stay in one group."""
    shared: dict[tuple, list] = {}
    for layer in layers:
        shared.setdefault(layer.signature(), []).append(layer)
    groups, current, held = [], [], 0
    for members in shared.values():
        first = members[0]
        size = 8 * first.features_count ** 2 * first.matrices
        if current and held + size > HESSIAN_BUDGET:
            groups.append(current)
            current, held = [], 0
        current += members
        held += size
    if current:
        groups.append(current)
    return groups


def _round_one(model, choice: Choice, settings: Settings, layer, advance, factors: dict | None = None,
               activation_levels: int = 0) -> Outcome:
    found = choice.found
    x = np.asarray(model.array(found))
    codec = codec_for(choice, settings)
    method = settings.rounding
    try:
        if layer is None:
            result = rounding.round_weight(x, choice.granularity, codec, method)
        else:
            if layer.rows == 0:
                return Outcome(None, "rounded to nearest: the calibration samples never reached its layer")
            if layer.sums is not None and layer.sums.shape[-1] != layer.features_count:  # a chain took columns
                return Outcome(None, f"rounded to nearest: its layer reads {layer.sums.shape[-1]} features, not "
                               f"the weight's {layer.features_count} columns")
            ranges = (layer.lows, layer.highs) if layer.lows is not None else None
            result = rounding.round_weight(x, choice.granularity, codec, method, layer.op, layer.group, layer.sums,
                                           layer.magnitudes, layer.rows, factors=factors, ranges=ranges,
                                           activation_levels=activation_levels)
    except ValueError as error:
        raise UserError(f"--rounding {method}: {found.name!r}: {error}") from None
    applied = result.values if result.channel_scales is None else _unscaled(result, layer, x)
    output_db = _output_db(x, applied, choice, settings, layer) if layer is not None else {}
    stats = Stats()
    _add_error(stats, x.astype(np.float64), applied.astype(np.float64))
    advance(found.size)
    return Outcome(result, "", stats, output_db, layer)


def _unscaled(result: rounding.Rounded, layer, x) -> np.ndarray:
    """AWQ: the weight the layer effectively applies, the rounded values divided by the channel scales."""
    channels = rounding.input_channels(layer.op, x.shape, layer.group)
    return result.values / result.channel_scales.astype(np.float64)[channels]


def _output_db(x, applied: np.ndarray, choice: Choice, settings: Settings, layer) -> dict:
    """The layer's output SQNR on the calibration data, tr(W H Wᵀ) / tr(E H Eᵀ) in dB, for round-to-nearest
    and for the method (``applied``: the weight the layer computes with). Summed over slices of the layer's rows
    (`OUTPUT_ERROR_ROWS` values a slice), so that no float64 copy of the whole weight is made but the one round to
    nearest needs where its groups span rows."""
    from ..rounding.codec import Layout

    layout = Layout.of(layer.op, x.shape, layer.group)
    h = layer.sums
    flat, used = np.asarray(x).reshape(-1), np.asarray(applied).reshape(-1)
    groups, rows, columns = layout.index.shape
    step = max(1, OUTPUT_ERROR_ROWS // max(1, groups * columns))
    codec = codec_for(choice, settings)
    pieces = rounding.nearest_rows(x, choice.granularity, codec, layer.op, layer.group, OUTPUT_ERROR_ROWS)
    if pieces is None:  # a group spans rows: the whole weight rounded at once
        whole = rounding.round_weight(x, choice.granularity, codec, "rtn").values.reshape(-1)
        pieces = ((start, min(rows, start + step), whole[layout.index[:, start:start + step]])
                  for start in range(0, rows, step))
    signal = nearest = method = 0.0
    for start, stop, values in pieces:
        index = layout.index[:, start:stop]
        w = flat[index].astype(np.float64)
        signal += output_error(w, h)
        nearest += output_error(values - w, h)
        method += output_error(used[index] - w, h)
    return {"rtn": Stats(signal=signal, noise=nearest).sqnr_db,
            settings.rounding: Stats(signal=signal, noise=method).sqnr_db}


OUTPUT_ERROR_ROWS = 1 << 22  # layer matrix values per slice (a [G, R, K] float64 product of 32 MB)
