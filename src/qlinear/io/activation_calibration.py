"""Calibrate activations: run the float model over the user's sample inputs once (in consecutive
segments when its activations are large: `Segments`), with the chosen intermediate tensors exposed as
outputs, and feed each sample's values to a streaming `observers.Observer` per tensor, so that peak memory
is one sample's activations whatever the number of samples. The same
machinery runs the float and the quantized model side by side for the report's per-layer SQNR.

Calibration data: ``.npz`` files (or folders of them) holding one array per model input, named after the
input, samples along the first axis. Members written by ``np.savez`` are memory-mapped and read a sample
at a time; the files are read one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kernels import calibration_stats
from .errors import UserError
from .formats.onnx_constants import names_read_inside
from .formats.tensor_files import NpzReader
from .observers import Observer

_FLOAT = 1  # TensorProto.FLOAT


@dataclass
class CalibrationData:
    """Sample inputs from .npz files (a folder: its .npz files in name order): each file holds its samples along
    the first axis of every input, each fed as a batch of one; a file whose inputs share no first axis (a
    recurrent state beside a frame, a scalar) holds one sample, fed as it is."""

    files: list[Path]
    inputs: list[str]
    samples: int
    whole: frozenset = frozenset()  # files that hold one sample as it is fed (their inputs share no first axis)

    @classmethod
    def open(cls, paths: list[Path], inputs: list[str], what: str = "--calibrate") -> "CalibrationData":
        files = []
        for path in paths:
            if path.is_dir():
                found = sorted(p for p in path.iterdir() if p.suffix == ".npz")
                if not found:
                    raise UserError(f"{what} {path}: a folder with no .npz files")
                files += found
            elif path.exists():
                files.append(path)
            else:
                raise UserError(f"{what} {path}: no such file")
        samples, whole = 0, set()
        for file in files:
            reader = NpzReader(file)
            entries = {e.name: e for e in reader.entries}
            missing = [name for name in inputs if name not in entries]
            if missing:
                raise UserError(f"{what} {file}: has no array for the model input{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(repr(m) for m in missing)} (it holds {', '.join(entries) or 'nothing'})")
            counts = {name: entries[name].shape[0] if entries[name].shape else None for name in inputs}
            if None in counts.values() or len(set(counts.values())) != 1:
                # The inputs do not share a first axis (a recurrent state [2, 1, 128] beside a frame [1, 576], a
                # scalar sample rate): the file is one sample, fed as it is.
                whole.add(file)
                samples += 1
            else:
                samples += next(iter(counts.values()))
            reader.close()
        if samples == 0:
            raise UserError(f"{what}: no samples")
        return cls(files, inputs, samples, frozenset(whole))

    def __iter__(self):
        """The feeds of each sample (a batch of one)."""
        for file in self.files:
            reader = NpzReader(file)
            entries = {e.name: e for e in reader.entries}
            arrays = {name: reader.array(entries[name]) for name in self.inputs}
            if file in self.whole:
                yield {name: np.array(array) for name, array in arrays.items()}
                reader.close()
                continue
            count = len(next(iter(arrays.values())))
            for index in range(count):
                yield {name: np.ascontiguousarray(array[index:index + 1]) for name, array in arrays.items()}
            reader.close()


GROUP_BYTES = 512 << 20  # of exposed activations per segment: what one sample holds at once, per model


def sizes(model, names: list[str], feeds: dict) -> dict[str, int]:
    """Bytes of each tensor of ``names`` for inputs shaped like ``feeds`` (onnx's shape inference with the
    inputs' shapes fixed). A tensor inference cannot size (after a Reshape of computed dims, say) is taken to be
    as large as the largest one it can: activations shrink with depth far more often than they grow."""
    import onnx
    from onnx import shape_inference

    sized = onnx.ModelProto()
    sized.CopyFrom(model)
    del sized.graph.value_info[:]
    for graph_input in sized.graph.input:
        if graph_input.name in feeds and graph_input.type.HasField("tensor_type"):
            shape = graph_input.type.tensor_type.shape
            shape.ClearField("dim")
            for length in np.shape(feeds[graph_input.name]):
                shape.dim.add().dim_value = int(length)
    try:
        inferred = shape_inference.infer_shapes(sized, data_prop=True).graph.value_info
    except Exception:  # noqa: BLE001 (inference fails on some exports: every tensor runs alone then)
        inferred = []
    known = {}
    for value in inferred:
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]
        if dims and min(dims) >= 0:
            known[value.name] = 4 * math.prod(dims)
    unknown = max((known[name] for name in names if name in known), default=None)
    return {name: known.get(name, unknown) for name in names}


def groups(model, names: list[str], feeds: dict, budget: int = GROUP_BYTES) -> list[list[str]]:
    """``names`` cut, in the order given, into groups whose activations, for inputs shaped like ``feeds``, hold
    at most ``budget`` bytes (`sizes`; when no tensor can be sized, each is a group alone)."""
    held_by = sizes(model, names, feeds)
    cut, current, held = [], [], 0
    for name in names:
        size = held_by[name] if held_by[name] is not None else budget
        if current and held + size > budget:
            cut.append(current)
            current, held = [], 0
        current.append(name)
        held += size
    if current:
        cut.append(current)
    return cut


class Segments:
    """Run a model's main graph in consecutive segments, each exposing the tensors of ``names`` its nodes
    produce, at most ``budget`` bytes of them per sample (`groups`), and handing the tensors later segments
    read (skip connections, shapes) on to them: every node runs once per sample, and only the nodes some
    tensor of ``names`` needs (onnxruntime runs every node of a graph whatever outputs a run asks for).
    A model whose activations of one sample take 1.3 GB (the OCR detector at 736x928) runs in 3 segments
    instead of holding them all at once, for the cost of one run.

    ``run(feeds)`` yields each segment's ``{name: array}``. The sessions are made on the first call, a
    segment at a time: a segment's inputs are typed after the arrays the one before it produced.
    ``folder``: where a model with external data keeps its data files (the segments keep the references)."""

    def __init__(self, model, names: list[str], feeds: dict, budget: int | None = None, cut=None, folder=None):
        from onnx import ModelProto

        budget = GROUP_BYTES if budget is None else budget
        self.folder = folder

        graph = model.graph
        stored = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
        self.inputs = {v.name: v for v in graph.input if v.name not in stored}
        self.stored = {t.name: t for t in graph.initializer}
        self.skeleton = ModelProto(ir_version=model.ir_version, producer_name="qlinear", domain=model.domain)
        self.skeleton.opset_import.extend(model.opset_import)
        self.skeleton.functions.extend(model.functions)
        self.graph_name = graph.name or "segment"
        needed, kept = set(names), []
        for node in reversed(graph.node):
            if any(output in needed for output in node.output):
                kept.append(node)
                needed.update(name for name in node.input if name)
                needed.update(names_read_inside(node))
        kept.reverse()
        order = {output: index for index, node in enumerate(kept) for output in node.output if output}
        # Graph inputs among ``names`` come straight from the feeds, before the first segment.
        self.fed = [name for name in names if name not in order]
        produced = sorted((name for name in names if name in order), key=order.__getitem__)
        #: the groups of names whose last one ends a segment (another model's `Segments` can take them, so
        #: that the float and the quantized model expose the same tensors in step)
        self.cut = groups(model, produced, feeds, budget) if cut is None else [[n for n in g if n in order] for g in cut]
        self.segments = []  # (nodes, exposed names)
        start = 0
        for group in self.cut:
            if not group:
                continue
            end = max(order[name] for name in group) + 1
            if end <= start:
                continue
            self.segments.append((kept[start:end], [name for name in produced if start <= order[name] < end]))
            start = end
        if start < len(kept):
            self.segments.append((kept[start:], [name for name in produced if order[name] >= start]))
        # What each segment reads from outside itself, and what must be carried past it.
        made = [{o for node in nodes for o in node.output if o} for nodes, _ in self.segments]
        self.reads = []
        for (nodes, _), own in zip(self.segments, made):
            read = set()
            for node in nodes:
                read.update(name for name in node.input if name)
                read.update(names_read_inside(node))
            self.reads.append(read - own)
        self.later = [set().union(*self.reads[k + 1:]) for k in range(len(self.segments))]
        self.carried = [sorted(own & later) for own, later in zip(made, self.later)]
        self.runs = None

    def _segment_model(self, k: int, held: dict):
        import onnx
        from onnx import helper

        nodes, exposed_names = self.segments[k]
        graph = onnx.GraphProto()
        graph.name = self.graph_name
        graph.node.extend(nodes)
        reads = self.reads[k]
        graph.initializer.extend(self.stored[name] for name in sorted(reads) if name in self.stored)
        feed_names = []
        for name in sorted(reads):
            if name in self.stored:
                continue
            if name in self.inputs:
                graph.input.append(self.inputs[name])
            elif name in held:
                value = np.asarray(held[name])
                graph.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(value.dtype), [None] * value.ndim))
            else:
                continue  # an outer-scope name of a subgraph that the subgraph itself makes
            feed_names.append(name)
        outputs = list(dict.fromkeys(exposed_names + self.carried[k]))
        for name in outputs:
            info = onnx.ValueInfoProto()  # untyped: onnxruntime and qlinear take the type the node gives
            info.name = name
            graph.output.append(info)
        segment = onnx.ModelProto()
        segment.CopyFrom(self.skeleton)
        segment.graph.CopyFrom(graph)
        return segment, feed_names, outputs

    def __call__(self, feeds: dict):
        if self.fed:
            yield {name: feeds[name] for name in self.fed}
        held = dict(feeds)
        build = self.runs is None
        if build:
            self.runs = []
        for k, (_, exposed_names) in enumerate(self.segments):
            if build:
                segment, feed_names, outputs = self._segment_model(k, held)
                self.runs.append((_runner(segment, outputs, self.folder), feed_names))
            run, feed_names = self.runs[k]
            values = run({name: held[name] for name in feed_names})
            held.update((name, values[name]) for name in self.carried[k])
            # Popped, not copied: while the caller holds a segment's tensors, nothing here holds them too.
            yield {name: values.pop(name) for name in exposed_names}
            del values
            for name in [n for n in held if n not in self.later[k]]:
                del held[name]


def _session(model, names: list[str], folder=None):
    """``run(feeds) -> {name: array}`` for the exposed ``names``: onnxruntime (basic optimizations, which keep
    every graph output), or qlinear's evaluator without it. ``folder``: where the external data files that
    ``model`` (a ModelProto loaded without them) refers to are; onnxruntime reads them from there."""
    try:
        import onnxruntime
    except ImportError:
        if folder is not None:
            raise UserError("calibrating a model with external data needs onnxruntime: pip install onnxruntime") \
                from None
        import qlinear.onnx

        evaluator = qlinear.onnx.evaluator(model if not isinstance(model, Path) else str(model))
        return lambda feeds: qlinear.onnx.run(evaluator, feeds, outputs=names)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.enable_cpu_mem_arena = False  # its arena keeps a run's peak (every exposed tensor) for good
    # Its idle workers spin after each run by default, taking the cores the observers bin the outputs on.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def collect(model, names: list[str], data: CalibrationData, progress=None, max_bins: int = 2048,
            also=None, folder=None) -> dict[str, Observer]:
    """An observer per tensor of ``names`` (of ``model``, a ModelProto), fed every sample of ``data``.
    ``also``: (more names, ``consume(values)``, bytes ``consume`` holds): tensors exposed in the same run and
    handed, a segment's at a time, to ``consume`` (the layers' input Hessians of `hessians`); what it holds
    comes out of the segments' budget, so that the run stays within one budget. ``folder``: where the model's
    external data files are, if it has any."""
    more, consume, held = also if also is not None else ((), None, 0)
    budget = max(GROUP_BYTES - held, GROUP_BYTES // 4)
    run = Segments(model, list(dict.fromkeys(list(names) + list(more))), first(data), budget, folder=folder)
    observers = {name: Observer(max_bins=max_bins) for name in names}
    with _Updater(observers) as update:
        for feeds in data:
            for values in run(feeds):
                if consume is not None:
                    consume(values)
                update({name: value for name, value in values.items() if name in observers})
                del values  # before the next segment runs: one segment's tensors at a time
            if progress is not None:
                progress(1)
    return observers


class _Updater:
    """Feeds one run's tensors to their observers, on as many threads as qlinear's kernels use: the binning
    kernels release the GIL, and a sample's activations (150 MB for the OCR recogniser) take longer to bin
    than the float model takes to compute them. (Running the model one sample ahead on a thread of its own
    gained nothing on 2 cores: both are busy already.)"""

    def __init__(self, observers: dict[str, Observer]):
        from ..kernels import threads

        self.observers = observers
        self.workers = threads.get_num_threads()
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="qlinear-calibration")
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown()

    def __call__(self, values: dict[str, np.ndarray]) -> None:
        if self.pool is None:
            for name, value in values.items():
                self.observers[name].update(value)
            return
        # Largest first, each to the least loaded worker.
        shares = [[] for _ in range(self.workers)]
        loads = [0] * self.workers
        for name in sorted(values, key=lambda n: -np.size(values[n])):
            k = loads.index(min(loads))
            shares[k].append(name)
            loads[k] += np.size(values[name])
        futures = [self.pool.submit(self._update, values, share) for share in shares[1:] if share]
        self._update(values, shares[0])
        for future in futures:
            future.result()

    def _update(self, values, names):
        for name in names:
            self.observers[name].update(values[name])


def ranges(observers: dict[str, Observer], method: str) -> dict[str, tuple[float, float] | ValueError]:
    """Each observer's range by ``method`` (or the ValueError it raised), on as many threads as qlinear's kernels
    use: the mse search is a kernel that releases the GIL, 6 ms per tensor."""
    def one(item):
        name, observer = item
        try:
            return name, observer.range(method)
        except ValueError as error:
            return name, error

    from ..kernels import threads

    workers = threads.get_num_threads()
    if workers > 1 and len(observers) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="qlinear-ranges") as pool:
            return dict(pool.map(one, observers.items()))
    return dict(map(one, observers.items()))


def first(data: CalibrationData) -> dict:
    return next(iter(data))


def _runner(model, names, folder=None):
    try:
        return _session(model, names, folder)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 (onnxruntime's errors: the model or a type it lacks)
        raise UserError(f"the float model cannot run with its activations exposed ({str(error).splitlines()[0]})") from None


@dataclass
class Agreement:
    """How far one tensor of the quantized model is from the float model's, over the samples run."""

    signal: float = 0.0
    noise: float = 0.0
    max_abs_error: float = 0.0

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        return -math.inf if self.signal == 0.0 else 10.0 * math.log10(self.signal / self.noise)


def compare(float_model, quantized_model, names: list[str], data: CalibrationData, limit: int | None = None,
            progress=None, folders=(None, None), channels=None, tiled=()) -> dict[str, Agreement]:
    """Run both models (`Segments` exposing the same groups of ``names`` in step) on the samples of ``data``
    (the first ``limit``) and sum each tensor's squared values and squared differences. ``folders``: where
    each model's external data files are, if it has any. ``channels``: tensor -> how many of its channels (axis
    1) are compared, for tensors that carry zero channels after them (`onnx_channel_padding`). ``tiled``: tensors
    the quantized model repeats along the float one's axes of size 1 (`placement.broadcast_gates`): their first
    repeat is compared."""
    channels = channels or {}
    feeds = first(data)
    float_run = Segments(float_model, names, feeds, folder=folders[0])
    quantized_run = Segments(quantized_model, names, feeds, cut=float_run.cut, folder=folders[1])
    agreements = {name: Agreement() for name in names}
    for count, feeds in enumerate(data):
        if limit is not None and count >= limit:
            break
        waiting = ({}, {})  # the tensors one model gave before the other (where their segments differ)
        runs = (float_run(feeds), quantized_run(feeds))
        while True:
            # Not zip(): it holds the last pair of segments while it fetches the next one.
            a, b = next(runs[0], None), next(runs[1], None)
            if a is None and b is None:
                break
            waiting[0].update(a or {})
            waiting[1].update(b or {})
            for name in [n for n in waiting[0] if n in waiting[1]]:
                x, y = np.asarray(waiting[0].pop(name)), np.asarray(waiting[1].pop(name))
                if name in channels:
                    x, y = x[:, :channels[name]], y[:, :channels[name]]
                if name in tiled and x.ndim == y.ndim:
                    y = y[tuple(slice(0, size) for size in x.shape)]
                if x.shape != y.shape:
                    raise UserError(f"tensor {name!r} has shape {x.shape} in the float model and {y.shape} quantized")
                signal, noise, worst = calibration_stats.agreement(x, y)
                agreement = agreements[name]
                agreement.signal += signal
                agreement.noise += noise
                agreement.max_abs_error = max(agreement.max_abs_error, worst)
            del a, b
        unmatched = sorted(set(waiting[0]) ^ set(waiting[1]))
        if unmatched:
            raise UserError(f"tensor {unmatched[0]!r} is in only one of the float and the quantized model")
        if progress is not None:
            progress(1)
    return agreements
