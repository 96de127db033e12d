"""``qlinear run MODEL.onnx --input NAME=FILE.npy ... [-o OUT.npz] [--compare]``: run an ONNX model on qlinear's kernels.

``--input`` also takes ``FILE.npy`` alone for a model with one input, and ``FILE.npz`` whose arrays are named
after the inputs (what ``-o`` writes for outputs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from qlinear.io.errors import UserError
from qlinear.onnx import _input_spec, evaluator, run


def _load_model(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        return onnx.load(str(path))
    except Exception as error:  # protobuf's DecodeError and friends: the file is not an ONNX model
        raise UserError(f"{path}: not an ONNX model ({type(error).__name__}: {error})") from None


def _load_inputs(specs: list[str], model_inputs: list[str]) -> dict[str, np.ndarray]:
    """--input NAME=FILE.npy, FILE.npy (a model with one input) or FILE.npz (its arrays by input name)."""
    inputs: dict[str, np.ndarray] = {}

    def add(name: str, value: np.ndarray, spec: str) -> None:
        if name in inputs:
            raise UserError(f"--input {spec!r}: input {name!r} given twice")
        inputs[name] = value

    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            name, file = None, spec
        elif not name or not file:
            raise UserError(f"--input {spec!r}: expected NAME=FILE.npy, FILE.npy or FILE.npz")
        path = Path(file)
        if not path.is_file():
            raise UserError(f"{path}: no such file (--input {spec})")
        try:
            value = np.load(path, allow_pickle=False)
        except Exception as error:
            raise UserError(f"{path}: not a .npy or .npz file ({error})") from None
        if isinstance(value, np.lib.npyio.NpzFile):
            with value:
                if name is not None:
                    raise UserError(f"--input {spec!r}: NAME= takes a .npy file; a .npz feeds its arrays by their names")
                for key in value.files:
                    add(key, value[key], spec)
            continue
        if name is None:
            if len(model_inputs) != 1:
                raise UserError(f"--input {spec!r}: without NAME= the model must have one input; it has {model_inputs}")
            name = model_inputs[0]
        add(name, value, spec)
    return inputs


def _onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs)))
    except Exception as error:  # onnxruntime's own errors (NOT_IMPLEMENTED type combinations, ...)
        raise UserError(f"onnxruntime cannot run the model: {error}".splitlines()[0]) from None


def _difference(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, int]:
    """(max |difference|, number of differing elements); NaN equals NaN."""
    if ours.shape != theirs.shape:
        return float("inf"), int(max(ours.size, theirs.size))
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    differing = (a != b) & ~both_nan
    if not differing.any():
        return 0.0, 0
    with np.errstate(invalid="ignore"):  # inf - inf
        gap = np.abs(a[differing] - b[differing])
    return (float("nan") if np.isnan(gap).any() else float(gap.max())), int(differing.sum())


def _as_declared_small_types(inputs: dict[str, np.ndarray], declared: dict) -> dict[str, np.ndarray]:
    """.npy cannot record ml_dtypes types (float8, int4, ...): np.save writes their bytes as a void type
    (|V1), which is read back here as the type the model declares when the item sizes agree."""
    converted = {}
    for name, value in inputs.items():
        expected = declared.get(name, (None, None))[0]
        if (value.dtype.kind == "V" and value.dtype.names is None and expected is not None
                and expected != value.dtype and expected.itemsize == value.dtype.itemsize):
            value = value.view(expected)
        converted[name] = value
    return converted


def _require_onnxruntime() -> None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise UserError("--compare needs onnxruntime, which is not installed: pip install onnxruntime") from None


def run_command(args) -> int:
    if args.compare:  # before any work: the run could take long
        _require_onnxruntime()
    model = _load_model(Path(args.model))
    initialized = {init.name for init in model.graph.initializer}
    inputs = _load_inputs(args.input, [i.name for i in model.graph.input if i.name not in initialized])
    if args.output is not None:
        from qlinear.io.atomic import check_output

        check_output(Path(args.output), [Path(args.model)], args.force)
        if Path(args.output).suffix != ".npz":
            raise UserError(f"{args.output}: the outputs are written as .npz; give a name ending in .npz")
    try:
        session = evaluator(model, requantize=args.requantize)
        inputs = _as_declared_small_types(inputs, _input_spec(session)[0])
        results = run(session, inputs)
    except (TypeError, ValueError) as error:
        raise UserError(str(error).splitlines()[0]) from None
    except (NotImplementedError, RuntimeError) as error:  # an operator neither onnx's reference nor qlinear implements, ...
        raise UserError(f"cannot run the model: {str(error).splitlines()[0]}") from None

    theirs = _onnxruntime_outputs(model, inputs) if args.compare else None
    rows = []
    for name, value in results.items():
        row = {"output": name, "dtype": str(value.dtype), "shape": list(value.shape)}
        if value.size and value.dtype.kind in "biuf":
            row["min"], row["max"] = value.min().item(), value.max().item()
        if theirs is not None:
            row["max_abs_difference"], row["differing_elements"] = _difference(value, np.asarray(theirs[name]))
        rows.append(row)

    if args.output is not None:
        from qlinear.io.atomic import atomic_output

        with atomic_output(Path(args.output)) as f:
            np.savez(f, **results)
    if args.json:
        # strict JSON has no NaN/Infinity: such a range or difference (NaN on one side only, a shape mismatch) is null
        for row in rows:
            for key in ("min", "max", "max_abs_difference"):
                if isinstance(row.get(key), float) and not np.isfinite(row[key]):
                    row[key] = None
        print(json.dumps({"model": args.model, "requantize": args.requantize, "outputs": rows}, allow_nan=False))
        return 0
    for row in rows:
        line = f"{row['output']}: {row['dtype']} {tuple(row['shape'])}"
        value = results[row["output"]]
        if "min" in row:
            line += f" in [{value.min()!s}, {value.max()!s}]"  # printed in the output's own type
        if theirs is not None:
            size = int(np.prod(row["shape"]))
            line += (f"; vs onnxruntime: max |difference| {row['max_abs_difference']:g}, "
                     f"{row['differing_elements']} of {size} elements differ")
        print(line)
    if args.output is not None:
        print(f"wrote {args.output}")
    return 0
