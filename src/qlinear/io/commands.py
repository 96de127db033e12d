"""`qlinear quantize` and `qlinear dequantize`: the command line read once into `plan.Settings`, the
output path chosen and checked, the format's pipeline run (`qlinear.io.pipeline`), the report shown.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from .. import dtypes
from ..reference import mx as mx_reference
from . import evaluation, pipeline, report, static_quantization
from .atomic import check_output, check_output_store
from .errors import UserError
from .extras import require_dask
from .formats import format_of
from .plan import MX_FORMATS, Settings, parse_chunks, quantized_types


def parse_qtype(name: str, with_mx: bool = True):
    try:
        qtype = dtypes.resolve_dtype(name, "--dtype", "qlinear quantize")
    except (ValueError, TypeError):
        raise UserError(f"--dtype {name!r} is not a type name qlinear knows; the quantized types are "
                        f"{', '.join(quantized_types())}{_and_mx(with_mx)}") from None
    if qtype.onnx_name not in quantized_types():
        raise UserError(f"--dtype {name!r}: {qtype.onnx_name} is not a quantized type; the quantized types are "
                        f"{', '.join(quantized_types())}{_and_mx(with_mx)}")
    return qtype


def _and_mx(with_mx: bool) -> str:
    return f", and the MX formats {', '.join(MX_FORMATS)}" if with_mx else ""


def parse_format(name: str):
    """An MX format of `qlinear.mx` by its --dtype name (``mxfp4``, ``nvfp4``, ...), or None."""
    if name.lower() not in MX_FORMATS:
        return None
    return mx_reference.FORMATS[name.lower()]


def _mx_settings(args, fmt) -> Settings:
    """--dtype MX_FORMAT: blocks of the format's size along each weight's reduction axis (or --axis),
    symmetric by definition; the options that would change the format are refused."""
    if args.granularity not in (None, "block"):
        raise UserError(f"--dtype {fmt.name}: an MX format is blocked by definition, not --granularity "
                        f"{args.granularity}")
    if args.block_size is not None and args.block_size != fmt.block_size:
        raise UserError(f"--dtype {fmt.name}: its blocks are {fmt.block_size} elements (the format fixes it), not "
                        f"--block-size {args.block_size}")
    if args.asymmetric:
        raise UserError(f"--dtype {fmt.name}: an MX format is symmetric (a scale per block, no zero point); "
                        f"--asymmetric does not apply")
    if fmt.name == "nvfp4" and args.scale_rule not in (None, "modelopt"):
        raise UserError(f"--scale-rule {args.scale_rule} applies to the MX formats' power-of-two scales; nvfp4's "
                        "block scales are float8e4m3fn, rounded to nearest (or --scale-rule modelopt)")
    if fmt.name != "nvfp4" and args.scale_rule == "modelopt":
        raise UserError(f"--scale-rule modelopt is NVFP4's (TensorRT Model Optimizer's); --dtype {fmt.name} takes "
                        "floor, ceil or even")
    for flag, given in (("--chunks", args.chunks), ("--plot", args.plot),
                        ("--calibrate", args.calibrate and args.activations != "float")):
        if given:
            raise UserError(f"{flag} does not apply to --dtype {fmt.name} yet (the MX formats quantize weights "
                            f"whole, in memory, for ONNX models)")
    if args.min_elements is not None and args.min_elements < 0:
        raise UserError(f"--min-elements must be >= 0, got {args.min_elements}")
    settings = Settings(fmt.element, "block", args.axis, fmt.block_size, True, tuple(args.include), tuple(args.exclude),
                        args.min_elements, True, None, False, mx=fmt, scale_rule=args.scale_rule)
    return _with_rounding(args, settings)


def format_of_input(args) -> str | None:
    try:
        return format_of(Path(args.input))
    except (UserError, AttributeError, TypeError):
        return None


DEFAULT_ROUNDING_BITS = 6  # types of this many bits and fewer (and the MX formats) get gptq given samples


def _with_rounding(args, settings: Settings) -> Settings:
    """--rounding (and --activations float's samples) into the settings, the default resolved."""
    from .. import rounding

    method = getattr(args, "rounding", None)
    calibrate = tuple(Path(p) for p in getattr(args, "calibrate", None) or ())
    low_bit = settings.mx is not None or settings.qtype.bits <= DEFAULT_ROUNDING_BITS
    if method is None:  # measured on the corpus (benchmarks/rounding.py): gptq with samples, hqq without
        if not low_bit or format_of_input(args) != "onnx":
            method = "rtn"
        elif calibrate:
            method = "gptq"
        else:
            method = "hqq" if settings.mx is None and settings.qtype.is_integer else "rtn"
    if method == "hqq" and (settings.mx is not None or not settings.qtype.is_integer):
        raise UserError(f"--rounding hqq solves for an integer zero point; --dtype {settings.dtype_name} has none "
                        f"(use gptq, awq or rtn)")
    if method == "adaround" and (settings.mx is not None or not settings.qtype.is_integer):
        raise UserError(f"--rounding adaround rounds up or down between integer codes; --dtype {settings.dtype_name} "
                        f"has none (use gptq, awq or rtn)")
    if method in rounding.NEEDS_DATA and not calibrate:
        raise UserError(f"--rounding {method} weighs each weight's error by its layer's inputs: give sample inputs "
                        f"with --calibrate DATA.npz (and --activations float to keep the activations float)")
    weight_data = calibrate if getattr(args, "activations", None) == "float" else ()
    scale_rule = settings.scale_rule
    if scale_rule is None and method == "gptq" and settings.mx is not None and settings.mx.name == "mxfp4":
        # measured (BENCHMARKS.md, "Rounding below 8 bits"): the floor rule clips each block's largest weights to
        # 6/8 of their binade, more error than gptq can push onto the columns left; "even" clips only what rounds
        # up past the top (recogniser 72.67% -> 96.67%, held-out lines 60.00% -> 77.67%, detector 0.904 -> 0.949)
        scale_rule = "even"
    return replace(settings, rounding=method, weight_data=weight_data, scale_rule=scale_rule,
                   target=getattr(args, "target", None) or "onnxruntime",
                   bias_correction=_bias_correction(args))


def _bias_correction(args) -> bool | None:
    """--bias-correction (True), --no-bias-correction (False), or neither (None: the type's default)."""
    on, off = getattr(args, "bias_correction", False), getattr(args, "no_bias_correction", False)
    if on and off:
        raise UserError("--bias-correction and --no-bias-correction: give one of them")
    return True if on else False if off else None


def parse_settings(args) -> Settings:
    fmt = parse_format(args.dtype)
    if fmt is not None:
        return _mx_settings(args, fmt)
    if args.scale_rule == "modelopt":
        raise UserError(f"--scale-rule modelopt is NVFP4's (TensorRT Model Optimizer's), not --dtype {args.dtype}'s")
    if args.scale_rule is not None:
        raise UserError(f"--scale-rule applies to the MX formats ({', '.join(m for m in MX_FORMATS if m != 'nvfp4')}),"
                        f" not --dtype {args.dtype}")
    qtype = parse_qtype(args.dtype)
    kind = args.granularity
    block_size = args.block_size
    if block_size is not None and block_size <= 0:
        raise UserError(f"--block-size must be a positive integer, got {block_size}")
    if kind is None and block_size is not None:
        kind = "block"
    if kind not in (None, "block") and block_size is not None:
        raise UserError(f"--block-size applies to blocked quantization, not --granularity {kind}")
    if kind == "tensor" and args.axis is not None:
        raise UserError("--axis applies to --granularity axis or block, not tensor")
    if kind is None and args.axis is not None:
        kind = "axis" if qtype.bits >= 8 else "block"
    if args.symmetric and args.asymmetric:
        raise UserError("--symmetric and --asymmetric contradict each other")
    if args.min_elements is not None and args.min_elements < 0:
        raise UserError(f"--min-elements must be >= 0, got {args.min_elements}")
    chunks = None
    if args.chunks is not None:
        chunks = parse_chunks(args.chunks)
        if args.plot:
            raise UserError("--plot draws from whole tensors in memory and cannot be combined with --chunks")
        require_dask("--chunks")
    settings = Settings(qtype, kind, args.axis, block_size, True if args.symmetric else False if args.asymmetric else None,
                        tuple(args.include), tuple(args.exclude), args.min_elements, True, chunks, bool(args.plot))
    return _with_rounding(args, settings)


def _default_output(source: Path, settings: Settings, kind: str) -> Path:
    suffix = ".npz" if kind == "npy" else source.suffix
    return source.with_name(f"{source.stem}.{settings.dtype_name}{suffix}")


def _check_plot_support(args) -> None:
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UserError("--plot needs matplotlib: pip install 'qlinear[plot]'") from None
        plot_dir = Path(args.plot)
        if plot_dir.exists() and not plot_dir.is_dir():
            raise UserError(f"--plot {plot_dir}: exists and is not a folder")


def _evaluation(args, source: Path) -> pipeline.Evaluation:
    recurrent = []
    for pair in args.recurrent:
        output, sep, name = pair.partition("=")
        if not sep or not output or not name:
            raise UserError(f"--recurrent {pair!r}: expected OUTPUT=INPUT (a model output fed back to an input)")
        recurrent.append((output, name))
    task = evaluation.Task(args.task, args.threshold, tuple(recurrent))
    if args.no_eval:
        return pipeline.Evaluation(None, "--no-eval", task)
    path = Path(args.eval_data) if args.eval_data else source.with_name(source.stem + ".eval.npz")
    if not path.exists():
        if args.eval_data:
            raise UserError(f"--eval {path}: no such file")
        return pipeline.Evaluation(None, f"no evaluation data (--eval, or {path.name} beside the model)", task)
    return pipeline.Evaluation(path, "", task)


def _static(args, settings: Settings) -> static_quantization.StaticSettings | None:
    """The static quantization settings (--calibrate and the options that go with it), or None."""
    given = [flag for flag, value in (("--method", args.method), ("--activations", args.activations),
                                      ("--symmetric-activations", args.symmetric_activations),
                                      ("--keep-float", args.keep_float),
                                      ("--no-latency", args.no_latency),
                                      ("--no-bias-correction", args.no_bias_correction),
                                      ("--bias-correction", args.bias_correction),
                                      ("--max-drop", args.max_drop is not None),
                                      ("--report-samples", args.report_samples is not None)) if value]
    if not args.calibrate:
        if given:
            raise UserError(f"{given[0]} applies to static quantization: give sample inputs with --calibrate DATA.npz")
        return None
    if args.activations == "float":  # weights only; their biases are corrected unless --no-bias-correction
        others = [flag for flag in given if flag not in ("--activations", "--no-bias-correction",
                                                          "--bias-correction")]
        if others:
            raise UserError(f"{others[0]} applies to quantized activations, not --activations float")
        return None
    activation_type = parse_qtype(args.activations or "uint8", with_mx=False)
    if activation_type.bits < 8 or activation_type.onnx_name.startswith("float4") or activation_type.onnx_name.startswith("float6"):
        raise UserError(f"--activations {activation_type.onnx_name}: activations are uint8, int8, uint16, int16 or a "
                        f"float8 type")
    if args.max_drop is not None and not args.max_drop >= 0:
        raise UserError(f"--max-drop must be a number of points >= 0, got {args.max_drop}")
    if args.report_samples is not None and args.report_samples < 0:
        raise UserError(f"--report-samples must be >= 0, got {args.report_samples}")
    if args.max_drop is not None and args.report_samples == 0:
        raise UserError("--max-drop ranks the layers by their SQNR: it needs --report-samples above 0")
    return static_quantization.StaticSettings(tuple(Path(p) for p in args.calibrate), args.method or "mse",
                                              activation_type, bool(args.symmetric_activations),
                                              tuple(args.keep_float), max_drop=args.max_drop,
                                              target=args.target or "onnxruntime", latency=not args.no_latency,
                                              bias_correction=not args.no_bias_correction,
                                              **({} if args.report_samples is None
                                                 else {"report_samples": args.report_samples}))


def _rule_for(name: str, args):
    """In a --dtype list, --scale-rule goes to the formats it is a rule of (floor, ceil, even: the MX formats;
    modelopt: nvfp4); a rule that none of the list takes is an error."""
    rule = args.scale_rule
    if rule is None:
        return None
    fmt = parse_format(name)
    takes = fmt is not None and (fmt.name == "nvfp4") == (rule == "modelopt")
    if not any((f := parse_format(n.strip())) is not None and (f.name == "nvfp4") == (rule == "modelopt")
               for n in args.dtype.split(",")):
        return rule  # refused by parse_settings, with the single --dtype message
    return rule if takes else None


def _compare_command(args, source: Path, kind: str) -> int:
    """--dtype A,B,...: every entry on the same weights, reported side by side; nothing is written."""
    names = [name.strip() for name in args.dtype.split(",")]
    if any(not name for name in names) or len(set(n.lower() for n in names)) != len(names):
        raise UserError(f"--dtype {args.dtype!r}: a list names each type or format once, separated by commas")
    if args.output is not None:
        raise UserError(f"--dtype {args.dtype}: a list compares the types and writes nothing; give -o with a single "
                        f"--dtype to write a file")
    if kind == "zarr":
        raise UserError("a --dtype list compares types on ONNX models and tensor files (.npy, .npz, .safetensors), "
                        "not .zarr stores")
    if args.plot or args.calibrate:
        raise UserError(f"{'--plot' if args.plot else '--calibrate'} takes a single --dtype, not a list")
    runs = [parse_settings(argparse.Namespace(**(vars(args) | {"dtype": name, "scale_rule": _rule_for(name, args)})))
            for name in names]
    if kind != "onnx" and any(run.rounding != "rtn" for run in runs):
        raise UserError("--rounding applies to ONNX models (tensor files are rounded to nearest)")
    if kind != "onnx" and (args.eval_data or args.recurrent):
        raise UserError("--eval and --recurrent apply to ONNX models")
    measure = _evaluation(args, source) if kind == "onnx" else None
    report.show(pipeline.compare(source, kind, runs, measure), as_json=args.json)
    return 0


def quantize_command(args) -> int:
    source = Path(args.input)
    kind = format_of(source)
    if not source.exists():
        raise UserError(f"{source}: no such file")
    if "," in args.dtype:
        return _compare_command(args, source, kind)
    settings = parse_settings(args)
    if settings.mx is not None and kind != "onnx" and not (kind == "safetensors"
                                                           and settings.mx.name in ("mxfp4", "nvfp4")):
        raise UserError(f"--dtype {settings.mx.name}: the MX formats are written into ONNX models only (and MXFP4 "
                        f"and NVFP4 into .safetensors checkpoints, in gpt-oss's and Model Optimizer's layouts); "
                        f"--dtype int4,{settings.mx.name} compares them on this file without writing")
    if kind == "onnx" and settings.chunks is not None:
        raise UserError("--chunks applies to tensor files and .zarr stores, not ONNX models")
    if kind != "onnx" and (args.eval_data or args.recurrent or args.calibrate):
        raise UserError("--eval, --recurrent and --calibrate apply to ONNX models")
    if kind != "onnx" and args.target:
        raise UserError(f"--target applies to ONNX models (the runtime the model is written for), not a .{kind} input")
    if kind != "onnx" and settings.rounding != "rtn":
        raise UserError(f"--rounding {settings.rounding} applies to ONNX models (tensor files are rounded to nearest)")
    output = Path(args.output) if args.output else _default_output(source, settings, kind)
    if kind == "zarr":
        check_output_store(output, source, args.force)
        _check_plot_support(args)
        result = pipeline.quantize_store(source, output, settings)
    else:
        expected = {"npy": "npz"}.get(kind, kind)
        if format_of(output) != expected:
            extra = (" (a .npy holds a single array, so the quantized values, scale and zero point go to a .npz)"
                     if kind == "npy" else "")
            raise UserError(f"{output}: the output of a .{kind} input is a .{expected} file{extra}")
        check_output(output, [source], args.force)
        _check_plot_support(args)
        if kind == "onnx":
            static = _static(args, settings)
            if static is not None and static.max_drop is not None:
                result = pipeline.quantize_onnx_within(source, output, settings, _evaluation(args, source), static)
            else:
                result = pipeline.quantize_onnx(source, output, settings, _evaluation(args, source), static)
        else:
            result = pipeline.quantize_file(source, output, kind, settings)
    report.show(result, as_json=args.json)
    if args.plot:
        report.plot(result, Path(args.plot))
    return 0


def dequantize_command(args) -> int:
    source = Path(args.input)
    kind = format_of(source)
    output = Path(args.output)
    if kind == "zarr":
        if not source.exists():
            raise UserError(f"{source}: no such file")
        check_output_store(output, source, args.force)
        report.show(pipeline.dequantize_store(source, output), as_json=args.json)
        return 0
    if kind not in ("npz", "safetensors"):
        raise UserError(f"{source}: qlinear dequantize reads the .npz and .safetensors files that qlinear quantize "
                        f"writes, not .{kind}")
    if not source.exists():
        raise UserError(f"{source}: no such file")
    out_kind = format_of(output)
    if out_kind == "onnx":
        raise UserError(f"{output}: qlinear dequantize writes tensor files (.npy, .npz, .safetensors), not ONNX models")
    check_output(output, [source], args.force)
    report.show(pipeline.dequantize_file(source, output, out_kind), as_json=args.json)
    return 0
