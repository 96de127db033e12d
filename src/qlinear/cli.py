"""The ``qlinear`` command: quantize the weights people have and show what it cost and saved.

Each subcommand registers itself in `build_parser` with one ``_add_<name>`` call; its parser sets
``run=<function(args) -> int>`` with ``set_defaults``, and `main` calls it. The work itself lives in
modules (`qlinear.io`, `qlinear.calibrate`), imported when the subcommand runs so
that ``qlinear --help`` stays fast and never imports onnx.

User errors (bad file, unknown dtype, a tensor that cannot take the granularity, ...) are raised as
`qlinear.io.errors.UserError`; `main` prints them as one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys

_FORMATTER = argparse.RawDescriptionHelpFormatter


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as a single line (exit status 2, as argparse's own)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


MAIN_EPILOG = """\
examples:
  qlinear quantize examples/digits_mlp.onnx --dtype int4 -o /tmp/digits_mlp-int4.onnx --force
  qlinear quantize model.safetensors --dtype int8 -o model-int8.safetensors
  qlinear dequantize model-int8.safetensors -o model-restored.safetensors
  qlinear conformance
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qlinear",
        description="Quantize NumPy, safetensors and ONNX weights with the exact ONNX QuantizeLinear semantics, "
        "and report the accuracy cost and the bytes saved.",
        epilog=MAIN_EPILOG,
        formatter_class=_FORMATTER,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"qlinear {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_quantize(commands)
    _add_dequantize(commands)
    _add_conformance(commands)
    _add_run(commands)
    _add_bench(commands)
    return parser


# ----------------------------------------------------------------------------------------------------
# qlinear quantize

QUANTIZE_EPILOG = """\
examples:
  qlinear quantize examples/digits_mlp.onnx --dtype int4 -o /tmp/digits_mlp-int4.onnx --force
  qlinear quantize model.onnx --dtype int8 --eval lines.npz --task ctc
  qlinear quantize weights.npz --dtype int8 -o weights-int8.npz
  qlinear quantize model.safetensors --dtype float8e4m3fn --exclude '*.embed*'
  qlinear quantize examples/digits_mlp.onnx --dtype mxfp4 -o /tmp/digits_mlp-mxfp4.onnx --force
  qlinear quantize examples/digits_mlp.onnx --dtype int4,mxfp4,nvfp4
  qlinear quantize det.onnx --dtype int8 --calibrate pages/ -o det-int8.onnx
  qlinear quantize det.onnx --dtype int8 --calibrate pages/ --target qdq-portable -o det-trt.onnx

Defaults:
  which tensors  ONNX: the float weights of Conv, ConvTranspose, Gemm, MatMul (a constant operand),
                 LSTM/GRU/RNN (W and R) and Gather (an embedding table), wherever they are stored:
                 initializers, Constant nodes, the graphs of If/Loop/Scan, behind Cast/Transpose/
                 Reshape/Slice/Concat/... chains. Tensor files: every float tensor of 2+ dimensions.
                 Biases and 1-D tensors (norm scales) stay float; --include names others.
  granularity    8- and 16-bit types: one scale per output channel (ONNX: the channel axis of the
                 operator that reads the weight; tensor files: axis 0). 6 bits and fewer: blocks of 32
                 along the reduction axis (tensor files: the last axis); per output channel where that
                 axis is shorter than a block (depthwise convolutions).
  symmetric      8 and 16 bits: yes (signed types zero point 0 and the range [-qmax, qmax], unsigned
                 the middle code); 6 bits and fewer: min/max with a zero point; float8/6/4 always.
                 --symmetric or --asymmetric decides for every type.
  opset          raised to what the type and granularity need (13 per channel, 19 float8 or float16
                 scales, 21 int4/blocks, 23 float4, 25 int2), with onnx's version converter; the float
                 model before and after is run on the same inputs first, and a conversion that changes
                 its outputs is refused.

Tensor files (.npy, .npz, .safetensors) are written in the same format (a .npy input gives a .npz):
for each tensor NAME the quantized values (2/4-bit types in ONNX's packed layout), NAME.scale and
NAME.zero_point, plus metadata so that `qlinear dequantize` restores the float tensors. ONNX models
become QDQ models: each quantized constant is replaced where it is stored by quantized values and a
DequantizeLinear node that keeps its name. Models with external data are written with external data
(OUTPUT.data beside OUTPUT), a tensor at a time.

A .zarr store (one array, or a group of arrays) gives a .zarr store with the same three arrays per
tensor, quantized values one element per byte (never packed, so chunks stay independent), through
dask chunk by chunk: larger-than-memory arrays are fine. --chunks SIZE does the same for tensor files.

Microscaling formats (--dtype mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, mxint8, nvfp4;
qlinear.mx): blocks of 32 (nvfp4: 16) along each weight's reduction axis, a power-of-two float8e8m0
scale per block chosen by --scale-rule. ONNX models get a DequantizeLinear per weight with e8m0
scales, block_size and output_dtype (opset 24; 28 for the float6 formats; MXINT8's implicit 2^-6 is
folded into its scales); nvfp4 two: float8e4m3fn block scales times a float32 tensor scale, then
the float4 codes in blocks of 16 (opset 23). onnxruntime 1.32 cannot run these, so the task figure
is measured with `qlinear run`. A .safetensors file takes --dtype mxfp4 in gpt-oss's checkpoint
layout (NAME.blocks: uint8, 16 bytes per block of 32 along the last axis; NAME.scales: the e8m0
bytes), which `qlinear dequantize` reads back, as it reads gpt-oss's own checkpoints (to bfloat16).
The other tensor files have no MX layout: a list compares the formats there.

Rounding (--rounding, ONNX): below 8 bits round-to-nearest loses much of a model. gptq rounds each
weight column by column and pushes each column's error onto the columns not yet rounded, weighted by
the layer's input Hessian summed over the --calibrate samples (one float run); awq scales each input
channel by its activations' magnitude first (the model divides the layer's input by the same scale,
folded into the layer that writes it where only per-channel operators lie between, else a Div node);
adaround learns up or down per weight on the same Hessian; hqq chooses each group's zero point by a
half-quadratic solver, with no data. --activations float keeps the activations float (weights only).
Default below 8 bits: gptq given --calibrate, hqq without (int4 on the corpus: recogniser 18.7% with
rtn, 56.7% hqq, 89.3% gptq; float 93.3%).
The stored codes are the method's; DequantizeLinear of them is the weight the model computes. The
report gives each weight's layer output SQNR on the samples with rtn and with the method.

Embedding tables (Gather): onnxruntime dequantizes a whole DequantizeLinear'd table on every run
(MiniLM's int4 word embeddings: 40 ms, 15x the float model). Under --target onnxruntime (default)
an int4/uint4 table in blocks of a power of two >= 16 is read by onnxruntime's contrib
com.microsoft.GatherBlockQuantized instead, on the same codes, scales and zero points (the same
bits); --target qdq-portable keeps standard DequantizeLinear -> Gather.

Static quantization (--calibrate DATA: .npz files of sample inputs): the activations get
QuantizeLinear -> DequantizeLinear pairs too. --target onnxruntime (default) places them only where
onnxruntime's CPU provider fuses them into int8 kernels (Conv, MatMul, Gemm and the Add, Mul, Concat,
pooling, Sigmoid, Softmax and value-moving operators around them), leaving other operators float
with one conversion at each edge of a float island, and a convolution that reads a model input of
at most 4 channels (an image) float, with a depthwise convolution right after it, and gives each int8
depthwise convolution zero channels up to a multiple of 16, and each int8 dense one at least 16
output channels in a multiple of 8 (onnxruntime's vectorized kernels need them; every real channel
computes the same); --target qdq-portable puts a pair around every
operator a QDQ runtime may fuse (TensorRT, OpenVINO). The report times the float and the quantized
model in onnxruntime on 1 and 2 threads (--no-latency skips it) and says which nodes its optimized
graph runs on the codes. Each layer's bias is then corrected so that its outputs' per-channel mean on
the calibration samples is the float model's (--no-bias-correction keeps them). A written model that fails onnx.checker's full check where the input
passes it is refused: nothing is written, exit status 2.

A list (--dtype int4,mxfp4,nvfp4) quantizes the same weights once per entry and reports, per tensor,
the bytes and SQNR of each side by side, and for a model each one's task figure; nothing is written,
so -o is refused.

Labelled data (ONNX): a .npz with one array per model input (samples along the first axis) and
'labels'; --task classify (argmax against integer labels), ctc (greedy CTC decoding with the model's
'character' metadata against strings) or threshold (output > --threshold against 0/1 labels).
--recurrent OUT=IN runs the samples as a sequence, feeding output OUT back to input IN (a state).
"""


def _add_quantize(commands) -> None:
    p = commands.add_parser(
        "quantize", help="quantize a .npy/.npz/.safetensors file or an ONNX model",
        description="Quantize the weights of a model or tensor file with the exact ONNX QuantizeLinear "
        "semantics (scales from each group's absmax, or min/max with --asymmetric), per output channel or in "
        "blocks by default, then report the error, the bytes saved and, given labelled data, the task figure.",
        epilog=QUANTIZE_EPILOG, formatter_class=_FORMATTER,
    )
    p.add_argument("input", metavar="INPUT", help="a .npy, .npz, .safetensors or .onnx file, or a .zarr store")
    p.add_argument("-o", "--output", metavar="OUTPUT",
                   help="where to write (default: INPUT's name with the dtype added, beside INPUT)")
    p.add_argument("--dtype", required=True, metavar="TYPE",
                   help="the quantized type: int8, uint8, int16, uint16, int4, uint4, int2, uint2, float8e4m3fn, "
                   "float8e4m3fnuz, float8e5m2, float8e5m2fnuz, float4e2m1, float6e2m3, float6e3m2; or a microscaling "
                   "format (ONNX models; mxfp4 and nvfp4 also .safetensors): mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, mxint8, nvfp4; or a "
                   "comma-separated list of these (int4,mxfp4,nvfp4), which reports them side by side and writes "
                   "nothing")
    # qlinear.mx.SCALE_RULES and NVFP4_RULES, written out: --help imports no numpy
    p.add_argument("--scale-rule", choices=("floor", "ceil", "even", "modelopt"),
                   help="MX formats: how a block's power-of-two scale is chosen: floor (default, OCP MX v1.0: the "
                   "block maximum may clip; mxfp4 rounded by gptq defaults to even, measured better), ceil (never clips: cuBLAS, CUDA), even (torchao); nvfp4: modelopt "
                   "(TensorRT Model Optimizer's scales and codes, bit for bit) instead of the exact rule")
    p.add_argument("--granularity", choices=("tensor", "axis", "block"),
                   help="one scale per tensor, per slice along the axis, or per block along the axis (default: axis "
                   "for 8- and 16-bit types, block for 6 bits and fewer; block when --block-size is given)")
    p.add_argument("--axis", type=int, metavar="N",
                   help="the axis of per-axis or blocked quantization, for every tensor (default: each tensor's "
                   "output-channel axis, or its reduction axis for blocks)")
    p.add_argument("--block-size", type=int, metavar="B", help="elements per block (default 32)")
    scheme = p.add_mutually_exclusive_group()
    scheme.add_argument("--symmetric", action="store_true",
                        help="scale from absmax, zero point 0 (signed) or the middle code (unsigned); the default "
                        "for 8- and 16-bit types")
    scheme.add_argument("--asymmetric", action="store_true",
                        help="integer types: scale and zero point from min and max (0 widened into the range); the "
                        "default for 6 bits and fewer")
    p.add_argument("--include", action="append", metavar="GLOB", default=[],
                   help="quantize only tensors whose name matches (repeatable), weights or not")
    p.add_argument("--exclude", action="append", metavar="GLOB", default=[],
                   help="never quantize tensors whose name matches (repeatable)")
    p.add_argument("--min-elements", type=int, metavar="N",
                   help="leave tensors with fewer elements alone (default 1)")
    p.add_argument("--eval", metavar="NPZ", dest="eval_data",
                   help="ONNX: labelled data (one array per model input plus 'labels') to measure the task figure "
                   "before and after (default: INPUT's stem + '.eval.npz' when that file exists)")
    p.add_argument("--task", choices=evaluation_tasks(), default="classify",
                   help="ONNX: what --eval measures (default: classify)")
    p.add_argument("--threshold", type=float, default=0.5, help="--task threshold: the decision threshold (default 0.5)")
    p.add_argument("--recurrent", action="append", metavar="OUT=IN", default=[],
                   help="ONNX, --eval: run the samples as a sequence, feeding output OUT to input IN (repeatable)")
    p.add_argument("--no-eval", action="store_true", help="ONNX: do not measure the task figure")
    p.add_argument("--calibrate", action="append", metavar="DATA", default=[],
                   help="ONNX, static quantization: sample inputs (.npz with one array per model input, samples along "
                   "the first axis, or a folder of them; repeatable) on which the activations are calibrated")
    p.add_argument("--method", choices=("minmax", "percentile", "entropy", "mse"),
                   help="--calibrate: how an activation's range is chosen from its streamed statistics (default mse)")
    p.add_argument("--activations", metavar="TYPE",
                   help="--calibrate: the activations' type: uint8 (default), int8, uint16, int16, float8e4m3fn, or "
                   "float (weights only: the samples calibrate the --rounding of the weights, no activation is quantized)")
    p.add_argument("--rounding", choices=("rtn", "gptq", "awq", "adaround", "hqq"),
                   help="ONNX: how the weights are rounded: rtn (round to nearest), gptq, awq, adaround (these three "
                   "weigh each weight's error by its layer's inputs on the --calibrate samples), hqq (no data). "
                   "Default (measured on the corpus), for types of 6 bits and fewer: gptq when --calibrate is given, hqq "
                   "without (rtn for the float and MX types); rtn for 8 bits and more and for tensor files")
    p.add_argument("--symmetric-activations", action="store_true",
                   help="--calibrate: integer activations with a zero zero point (or the middle code)")
    p.add_argument("--keep-float", action="append", metavar="NODE_OR_OP", default=[],
                   help="--calibrate: leave this node (or every node of this operator type) float: its weight and the "
                   "activations it reads and writes")
    p.add_argument("--target", choices=("onnxruntime", "qdq-portable"),
                   help="the runtime an ONNX model is written for: onnxruntime (default: with --calibrate, pairs only "
                   "where its CPU provider fuses them into int8 kernels, float islands whole; 4-bit Gather tables "
                   "read by its contrib GatherBlockQuantized) or qdq-portable (standard operators only; with "
                   "--calibrate a pair around every operator a QDQ runtime may fuse, for TensorRT, OpenVINO and "
                   "others)")
    p.add_argument("--no-bias-correction", action="store_true",
                   help="--calibrate: keep the biases as quantized (default: each Conv, ConvTranspose and Gemm bias "
                   "moved, layer by layer, so that its outputs' per-channel mean on up to 16 calibration samples is "
                   "the float model's, with --activations float too, except for the MX formats' weights, where it "
                   "measured worse; needs onnxruntime)")
    p.add_argument("--bias-correction", action="store_true",
                   help="--calibrate --activations float: correct the biases for the MX formats' weights too")
    p.add_argument("--no-latency", action="store_true",
                   help="--calibrate: do not time the float and the quantized model in onnxruntime (default: 1 and 2 "
                   "threads on a batch of the calibration data, a few seconds)")
    p.add_argument("--report-samples", type=int, metavar="N",
                   help="--calibrate: samples the per-layer SQNR is measured on (default: up to 16, as many as hold "
                        "2 GiB of the compared activations; 0 skips it)")
    p.add_argument("--max-drop", type=float, metavar="POINTS",
                   help="--calibrate with --eval: keep layers float, one at a time, until the task figure is within "
                   "POINTS of float's: first the layer whose quantized activation alone costs the model's outputs "
                   "the most (measured on up to 8 calibration samples)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--plot", metavar="DIR",
                   help="write a PNG per tensor (histogram with the quantization levels, per-channel/per-block "
                   "error); needs matplotlib (pip install 'qlinear[plot]')")
    p.add_argument("--chunks", metavar="SIZE",
                   help="stream each tensor through dask in chunks of SIZE: bytes of input with a unit (256MiB, "
                   "1GB) or an element count (1000000); needs dask (pip install 'qlinear[dask]'); tensors above "
                   "1 GiB use dask with 64MiB chunks without it")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    p.set_defaults(run=_run_quantize)


def evaluation_tasks() -> tuple[str, ...]:
    return ("classify", "ctc", "threshold")  # qlinear.io.evaluation.TASKS, without importing numpy for --help


def _run_quantize(args) -> int:
    from .io.commands import quantize_command

    return quantize_command(args)


# ----------------------------------------------------------------------------------------------------
# qlinear dequantize

DEQUANTIZE_EPILOG = """\
examples:
  qlinear dequantize weights-int8.npz -o weights-restored.npz
  qlinear dequantize big.int8.zarr -o big-restored.zarr
  qlinear dequantize model-int4.safetensors -o model-restored.safetensors

INPUT is a file written by `qlinear quantize` (the float tensors come back under their original names
and types, and the tensors that were copied through are copied back unchanged), or a safetensors
checkpoint in gpt-oss's MXFP4 layout (NAME.blocks, NAME.scales) or TensorRT Model Optimizer's NVFP4 layout
(MODULE.weight, .weight_scale, .weight_scale_2): each quantized tensor comes back in bfloat16.
"""


def _add_dequantize(commands) -> None:
    p = commands.add_parser(
        "dequantize", help="restore the float tensors of a file written by `qlinear quantize`",
        description="The inverse of `qlinear quantize` for tensor files (.npz, .safetensors) and .zarr stores.",
        epilog=DEQUANTIZE_EPILOG, formatter_class=_FORMATTER,
    )
    p.add_argument("input", metavar="INPUT", help="a .npz or .safetensors file or .zarr store written by qlinear "
                   "quantize, or an MXFP4 (gpt-oss) or NVFP4 (Model Optimizer) safetensors checkpoint")
    p.add_argument("-o", "--output", metavar="OUTPUT", required=True,
                   help="where to write (.npz, .safetensors, or .npy for a single tensor; .zarr for a .zarr input)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    p.set_defaults(run=_run_dequantize)


def _run_dequantize(args) -> int:
    from .io.commands import dequantize_command

    return dequantize_command(args)


# ----------------------------------------------------------------------------------------------------
# qlinear conformance

CONFORMANCE_EPILOG = """\
examples:
  qlinear conformance
  qlinear conformance --json

Needs the peers: pip install 'qlinear[conformance]' (onnx, onnxruntime, tensorflow-cpu).
"""


def _add_conformance(commands) -> None:
    p = commands.add_parser(
        "conformance", help="run the official ONNX backend cases and TensorFlow's test vectors through qlinear",
        description="Run every official ONNX backend case of the operators qlinear implements, and TensorFlow's "
        "QuantizeV2/Dequantize on a fixed set of vectors, through qlinear; print a pass table per operator.",
        epilog=CONFORMANCE_EPILOG, formatter_class=_FORMATTER,
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.set_defaults(run=_run_conformance)


def _run_conformance(args) -> int:
    from .conformance import conformance_command

    return conformance_command(args)


# ----------------------------------------------------------------------------------------------------
# qlinear run

RUN_EPILOG = """\
examples:
  qlinear run model-int8.onnx --input x=x.npy -o outputs.npz
  qlinear run model-int8.onnx --input x=x.npy --compare --requantize float32

onnx's ReferenceEvaluator runs the ordinary operators; qlinear's kernels run QuantizeLinear,
DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and DynamicQuantizeLinear.
--requantize float64 (default) reproduces onnx's reference arithmetic for QLinearConv/QLinearMatMul,
float32 onnxruntime's, tflite / tflite-single TFLite's reference kernels (default / single-rounding build),
xnnpack XNNPACK's (docs/onnx.md, docs/tflite_conv.md). Needs onnx (pip install 'qlinear[onnx]'); --compare needs onnxruntime.
"""


def _add_run(commands) -> None:
    p = commands.add_parser(
        "run", help="run an ONNX model with qlinear's kernels for the quantization operators",
        description="Run an ONNX model (QDQ or QOperator) on qlinear's exact kernels, print each output's "
        "type, shape and range, optionally save them and compare them with onnxruntime.",
        epilog=RUN_EPILOG, formatter_class=_FORMATTER,
    )
    p.add_argument("model", metavar="MODEL", help="an .onnx file")
    p.add_argument("--input", action="append", metavar="NAME=FILE", default=[],
                   help="a model input from a .npy file (repeat for each input); FILE.npy alone for a model with "
                   "one input; FILE.npz feeds its arrays by name")
    p.add_argument("-o", "--output", metavar="OUT", help="write every output to this .npz file")
    p.add_argument("--compare", action="store_true",
                   help="also run onnxruntime and print, per output, the max difference and the number of differing elements")
    # the modes of qlinear.reference.requantize.REQUANTIZE_MODES, written out: --help must not import NumPy
    p.add_argument("--requantize", choices=("float64", "float32", "tflite", "tflite-single", "xnnpack"),
                   default="float64",
                   help="QLinearConv/QLinearMatMul requantization: float64 = onnx reference (default), float32 = "
                   "onnxruntime, tflite / tflite-single = TFLite's reference kernels, xnnpack = XNNPACK")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(run=_run_model)


def _run_model(args) -> int:
    from .io.errors import UserError

    try:
        from .onnx.command import run_command
    except ImportError as error:  # onnx is an optional dependency
        raise UserError(str(error)) from None
    return run_command(args)


# ----------------------------------------------------------------------------------------------------
# qlinear bench

BENCH_EPILOG = """\
examples:
  qlinear bench                                  # every case, 64K/1M/16M/64M elements, every installed peer
  qlinear bench --sizes 16M --case float8 --json bench.json
  qlinear bench --sizes 64K 1M --skip onnx tensorflow --no-jit
  qlinear bench --conv                           # QLinearConv on 1 and 2 threads, qlinear beside onnxruntime
  qlinear bench --conv --filter mobilenet --threads 1 2 4 --json conv.json

Times are the best of --repeat runs; "x" columns are a peer's time over qlinear's (above 1: qlinear is
faster); "bw" is the bandwidth probe's time over qlinear's (1.0: at the memory-bandwidth bound; the probe
reads x's bytes and writes y's into a fresh array); "bwP" the same against a copy into preallocated memory.

--conv times every distinct ResNet-50 convolution and MobileNetV2's depthwise layers (batch 1, prepacked
weights; onnxruntime with initializer weights, in a child process) at each --threads count: "ratio" is
qlinear's time over onnxruntime's (below 1: qlinear is faster), "Nt/1t" each one's gain from more threads.
"""


def _add_bench(commands) -> None:
    p = commands.add_parser(
        "bench", help="time QuantizeLinear/DequantizeLinear against onnxruntime, onnx, TensorFlow and NumPy",
        description="Time qlinear's element-wise kernels side by side with every installed peer and a "
        "memory-bandwidth probe; print a table and optionally write JSON.",
        epilog=BENCH_EPILOG, formatter_class=_FORMATTER,
    )
    p.add_argument("--sizes", nargs="+", default=["64K", "1M", "16M", "64M"], choices=["64K", "1M", "16M", "64M"],
                   help="element counts (default: all four)")
    p.add_argument("--case", nargs="+", metavar="TEXT", help="only cases whose name contains TEXT (e.g. float8, DQ)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per measurement; the best counts (default 5)")
    p.add_argument("--skip", nargs="+", choices=["onnxruntime", "onnx", "tensorflow", "numpy"], help="peers to leave out")
    p.add_argument("--no-jit", action="store_true", help="skip the cold/warm JIT measurement in fresh processes")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--conv", action="store_true",
                   help="time QLinearConv layers at each --threads count instead of the element-wise kernels")
    p.add_argument("--filter", metavar="TEXT", help="--conv: only layers whose name contains TEXT")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2], metavar="N",
                   help="--conv: thread counts to time (default 1 2)")
    p.add_argument("--weights", choices=("7bit", "8bit"), default="7bit",
                   help="--conv: weights in [-64, 63] (default) or the whole int8 range")
    p.add_argument("--min-time", type=float, default=0.2, metavar="S",
                   help="--conv: seconds of runs per measurement, the best counts (default 0.2)")
    p.add_argument("--rounds", type=int, default=2, metavar="N",
                   help="--conv: rounds alternating onnxruntime and qlinear, the best of all counts (default 2)")
    p.set_defaults(run=_run_bench)


def _run_bench(args) -> int:
    if args.conv:
        from .io.errors import UserError
        from .kernels import threads

        top = threads._max_threads()
        bad = [n for n in args.threads if not 1 <= n <= top]
        if bad:
            raise UserError(f"--threads: each count must lie in [1, {top}] (NUMBA_NUM_THREADS caps it), got {bad[0]}")
        if args.min_time <= 0:
            raise UserError(f"--min-time must be positive, got {args.min_time}")
        if args.rounds < 1:
            raise UserError(f"--rounds must be at least 1, got {args.rounds}")
        if args.case or args.no_jit or args.sizes != ["64K", "1M", "16M", "64M"]:
            raise UserError("--case, --sizes and --no-jit choose element-wise cases; --conv takes --filter")
        from .bench_conv import main as conv_main

        try:
            return conv_main(args)
        except ValueError as error:
            raise UserError(str(error)) from None
    from .bench import main as bench_main

    return bench_main(args)


# ----------------------------------------------------------------------------------------------------


def _terminate(signum, frame):
    # SIGTERM unwinds like Ctrl-C, so half-written temporary outputs are removed on the way out.
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    from .io.errors import UserError

    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (main() called from a thread): keep the default
        previous = None
    try:
        return int(args.run(args) or 0)
    except UserError as error:
        print(f"qlinear {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"qlinear {args.command}: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
