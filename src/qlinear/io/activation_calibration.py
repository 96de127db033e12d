"""Calibrate activations: run the float model over the user's sample inputs once, with the chosen
intermediate tensors exposed as outputs, and feed each sample's values to a streaming `observers.Observer`
per tensor, so that peak memory is one sample's activations whatever the number of samples. The same
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
from .formats.tensor_files import NpzReader
from .observers import Observer

_FLOAT = 1  # TensorProto.FLOAT


@dataclass
class CalibrationData:
    """Sample inputs from .npz files (a folder: its .npz files in name order)."""

    files: list[Path]
    inputs: list[str]
    samples: int

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
        samples = 0
        for file in files:
            reader = NpzReader(file)
            entries = {e.name: e for e in reader.entries}
            missing = [name for name in inputs if name not in entries]
            if missing:
                raise UserError(f"{what} {file}: has no array for the model input{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(repr(m) for m in missing)} (it holds {', '.join(entries) or 'nothing'})")
            counts = {name: entries[name].shape[0] if entries[name].shape else None for name in inputs}
            if None in counts.values() or len(set(counts.values())) != 1:
                raise UserError(f"{what} {file}: every input needs the same number of samples along its first axis "
                                f"(got {counts})")
            samples += next(iter(counts.values()))
            reader.close()
        if samples == 0:
            raise UserError(f"{what}: no samples")
        return cls(files, inputs, samples)

    def __iter__(self):
        """The feeds of each sample (a batch of one)."""
        for file in self.files:
            reader = NpzReader(file)
            entries = {e.name: e for e in reader.entries}
            arrays = {name: reader.array(entries[name]) for name in self.inputs}
            count = len(next(iter(arrays.values())))
            for index in range(count):
                yield {name: np.ascontiguousarray(array[index:index + 1]) for name, array in arrays.items()}
            reader.close()


GROUP_BYTES = 512 << 20  # of exposed activations per run: what one sample holds at once, per model


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
    """``names`` cut into groups whose activations, for inputs shaped like ``feeds``, hold at most ``budget``
    bytes (`sizes`; when no tensor can be sized, each runs alone). Each group is a run of the model per sample:
    a model whose activations of one sample take 1 GB (the OCR detector at 736x928) runs 3 times per sample
    instead of holding them all at once."""
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


def exposed(model, names: list[str]):
    """A copy of ``model`` whose outputs are ``names`` (float tensors of its main graph), without the nodes
    none of them needs: onnxruntime runs every node of a graph whatever outputs a run asks for, so a group of
    early activations would otherwise pay for the whole model (the OCR detector's first of three groups of a
    page: a third of the work). The graph inputs stay, so that every sample's feeds still fit."""
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    needed = set(names)
    kept = []
    for node in reversed(graph.node):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            needed.update(_names_read_inside(node))
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    value_info = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    del graph.output[:]
    for name in names:
        graph.output.append(helper.make_tensor_value_info(name, _FLOAT, None))
    return copy


def _names_read_inside(node) -> set[str]:
    """Every name the subgraphs of ``node`` (If, Loop, Scan) read, outer-scope ones among them."""
    found = set()
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in graph.node:
                found.update(name for name in inner.input if name)
                found.update(_names_read_inside(inner))
    return found


def _session(model, names: list[str]):
    """``run(feeds) -> {name: array}`` for the exposed ``names``: onnxruntime (basic optimizations, which keep
    every graph output), or qlinear's evaluator without it."""
    try:
        import onnxruntime
    except ImportError:
        import qlinear.onnx

        evaluator = qlinear.onnx.evaluator(model if not isinstance(model, Path) else str(model))
        return lambda feeds: qlinear.onnx.run(evaluator, feeds, outputs=names)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.enable_cpu_mem_arena = False  # its arena keeps a run's peak (every exposed tensor) for good
    # Its idle workers spin after each run by default, taking the cores the observers bin the outputs on.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def collect(model, names: list[str], data: CalibrationData, progress=None, max_bins: int = 2048) -> dict[str, Observer]:
    """An observer per tensor of ``names``, fed every sample of ``data``. ``model``: a ModelProto (or a
    function that makes the model with some names exposed, for a model with external data)."""
    runs = [_runner(_exposing(model, group), group) for group in groups(_proto(model), names, first(data))]
    observers = {name: Observer(max_bins=max_bins) for name in names}
    with _Updater(observers) as update:
        for feeds in data:
            for run in runs:
                update(run(feeds))
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


def _proto(model):
    return model(None) if callable(model) else model


def _exposing(model, names):
    """The model (a ModelProto, or what the maker gives) with ``names`` exposed."""
    return model(names) if callable(model) else exposed(model, names)


def _runner(model, names):
    try:
        return _session(model, names)
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
            progress=None) -> dict[str, Agreement]:
    """Run both models (``names`` exposed in turn, a group at a time) on the samples of ``data`` (the first
    ``limit``) and sum each tensor's squared values and squared differences."""
    cut = groups(_proto(float_model), names, first(data))
    pairs = [(_runner(_exposing(float_model, group), group), _runner(_exposing(quantized_model, group), group))
             for group in cut]
    agreements = {name: Agreement() for name in names}
    for count, feeds in enumerate(data):
        if limit is not None and count >= limit:
            break
        for first_run, second_run in pairs:
            a = first_run(feeds)
            b = second_run(feeds)
            for name in a:
                x, y = np.asarray(a[name]), np.asarray(b[name])
                if x.shape != y.shape:
                    raise UserError(f"tensor {name!r} has shape {x.shape} in the float model and {y.shape} quantized")
                signal, noise, worst = calibration_stats.agreement(x, y)
                agreement = agreements[name]
                agreement.signal += signal
                agreement.noise += noise
                agreement.max_abs_error = max(agreement.max_abs_error, worst)
            del a, b
        if progress is not None:
            progress(1)
    return agreements
