"""What the command tells a person (a rich table) or a program (``--json``), and the ``--plot`` PNGs.

A report is a plain dict: the command, input and output, one row per tensor, totals, and for ONNX
models a "model" section (opset, checker, accuracy before and after). Rows carry private keys
(starting with "_") with the arrays that --plot needs; they are left out of the JSON.
"""

from __future__ import annotations

import json
import math
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .plan import Choice, Found, Quantized, granularity_label

PROGRESS_MIN_BYTES = 32 << 20


# ----------------------------------------------------------------------------------------------------
# Rows


def quantized_row(choice: Choice, qtype, after: int, result: Quantized, plot: bool = False, to: str | None = None
                  ) -> dict:
    """A quantized tensor's row. Its scale and zero point stay in the row only for ``plot`` (the blocked
    parameters of a large weight are megabytes, and a model has many weights). ``to`` names the format
    where it is not the type (an MX format: "mxfp4" of float4e2m1 codes)."""
    found, gran, stats = choice.found, choice.granularity, result.stats
    return {
        "name": found.name, "shape": list(found.shape), "from": found.type_name or str(found.dtype),
        "to": to or qtype.onnx_name, "granularity": granularity_label(gran) if found.shape else "per-tensor",
        "symmetric": bool(choice.symmetric or not qtype.is_integer), "location": found.location,
        "bytes_before": int(found.nbytes), "bytes_after": int(after),
        "sqnr_db": stats.sqnr_db, "max_abs_error": stats.max_abs_error, "quantized": True, "note": choice.reason,
        "_stats": stats, "_scale": result.scale if plot else None, "_zero_point": result.zero_point if plot else None,
        "_qtype": qtype, "_gran": gran,
    }


def copied_row(found: Found, reason: str) -> dict:
    kind = found.type_name or str(found.code or found.dtype)
    return {
        "name": found.name, "shape": list(found.shape), "from": kind, "to": kind, "granularity": None,
        "location": found.location, "bytes_before": int(found.nbytes), "bytes_after": int(found.nbytes),
        "sqnr_db": None, "max_abs_error": None, "quantized": False, "note": reason,
    }


def restored_row(name, shape, from_dtype, to_dtype, before, after) -> dict:
    return {
        "name": name, "shape": list(shape), "from": from_dtype, "to": to_dtype, "granularity": None,
        "bytes_before": int(before), "bytes_after": int(after), "sqnr_db": None, "max_abs_error": None,
        "quantized": False, "note": "dequantized",
    }


def summary(command: str, source, output, rows: list[dict], **extra) -> dict:
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    quantized = [r for r in rows if r["quantized"]]
    totals = {
        "tensors": len(rows), "quantized": len(quantized), "bytes_before": before, "bytes_after": after,
        "ratio": (before / after) if after else None,
    }
    if quantized:
        signal = sum(r["_stats"].signal for r in quantized)
        noise = sum(r["_stats"].noise for r in quantized)
        totals["sqnr_db"] = math.inf if noise == 0 else 10 * math.log10(signal / noise) if signal else -math.inf
        totals["max_abs_error"] = max(r["max_abs_error"] for r in quantized)
    if command == "quantize":
        totals["weights"] = _weights(rows)
    return {"command": command, "input": str(source), "output": str(output), **extra, "tensors": rows, "totals": totals}


def comparison(source, formats: list[str], summaries: list[dict]) -> dict:
    """``--dtype A,B,...``: the summaries of one run per type or format, merged per tensor (rows matched by
    name and location), with each format's totals and, for ONNX models, its model figures."""
    tensors: dict[tuple, dict] = {}
    for name, result in zip(formats, summaries):
        for row in result["tensors"]:
            key = (row["name"], row.get("location", ""))
            merged = tensors.setdefault(key, {
                "name": row["name"], "shape": row["shape"], "from": row["from"], "location": row.get("location", ""),
                "bytes_before": row["bytes_before"], "formats": {}})
            merged["formats"][name] = {k: row[k] for k in ("quantized", "to", "granularity", "bytes_after", "sqnr_db",
                                                           "max_abs_error", "note")}
    totals = {name: result["totals"] | ({"model": result["model"]} if "model" in result else {})
              for name, result in zip(formats, summaries)}
    return {"command": "compare", "input": str(source), "output": None, "formats": list(formats),
            "tensors": list(tensors.values()), "totals": totals}


FLOAT_NAMES = {"float32", "float16", "bfloat16", "float64", "F32", "F16", "BF16", "F64"}


def _place(location: str) -> str:
    """A row's location as the report groups it: "initializer", "Constant node", "subgraph Constant
    node", ... (the subgraph's own name is in the row)."""
    if ": " in location:
        return "subgraph " + location.rsplit(": ", 1)[1]
    return location or "tensor file"


def _weights(rows: list[dict]) -> dict:
    """Float tensors of two or more dimensions (the weights, by the default rule): how many bytes were
    found, and quantized, per place they live in."""
    places: dict[str, dict] = {}
    found = quantized = 0
    for row in rows:
        if row["from"] not in FLOAT_NAMES or len(row["shape"]) < 2:
            continue
        place = places.setdefault(_place(row.get("location", "")),
                                  {"tensors": 0, "bytes": 0, "quantized_tensors": 0, "quantized_bytes": 0})
        place["tensors"] += 1
        place["bytes"] += row["bytes_before"]
        found += row["bytes_before"]
        if row["quantized"]:
            place["quantized_tensors"] += 1
            place["quantized_bytes"] += row["bytes_before"]
            quantized += row["bytes_before"]
    return {"bytes": found, "quantized_bytes": quantized, "share": quantized / found if found else None,
            "places": places}


# ----------------------------------------------------------------------------------------------------
# Showing


def _public(value):
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [_public(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no infinity; an exact round trip has SQNR null and max_abs_error 0
    if isinstance(value, (np.floating, np.integer)):
        return _public(value.item())
    return value


def to_json(report: dict) -> str:
    return json.dumps(_public(report), indent=2)


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _db(value) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "exact" if value > 0 else "-inf"
    return f"{value:.1f}"


def _err(value) -> str:
    return "" if value is None else f"{value:.3g}"


def show(report: dict, as_json: bool = False, file=None) -> None:
    file = file or sys.stdout
    if as_json:
        print(to_json(report), file=file)
        return
    from rich.console import Console
    from rich.table import Table

    probe = Console(file=file)
    console = Console(file=file, width=probe.width if probe.is_terminal else 160)
    if report["command"] == "compare":
        _show_comparison(console, report)
        return
    table = Table(title=f"{report['input']} -> {report['output']}", title_justify="left")
    quantizing = report["command"] == "quantize"
    columns = (("tensor", "left"), ("shape", "left"), ("type", "left"), ("granularity", "left"), ("bytes", "right"),
               ("SQNR dB", "right"), ("max |err|", "right"), ("where", "left"), ("note", "left"))
    if not quantizing:  # dequantize: no granularity or error figures to show
        columns = tuple(c for c in columns if c[0] not in ("granularity", "SQNR dB", "max |err|"))
    rounded = next((row["rounding"] for row in report["tensors"] if row.get("output_sqnr_db")), None)
    if rounded:  # --rounding: each layer's output SQNR on the calibration samples, round-to-nearest's and the method's
        columns = columns[:6] + ((f"layer out dB rtn / {rounded}", "right"),) + columns[6:]
    located = any(_place(row.get("location", "")) not in ("tensor file", "zarr array") for row in report["tensors"])
    if not located:  # tensor files: every tensor lives in the file
        columns = tuple(c for c in columns if c[0] != "where")
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold", no_wrap=column not in ("note", "where"))
    for row in report["tensors"]:
        kept = not row["quantized"] and row["note"] != "dequantized"
        types = f"{row['from']} (kept)" if kept else f"{row['from']} -> {row['to']}"
        sizes = _bytes(row["bytes_before"]) if kept else f"{_bytes(row['bytes_before'])} -> {_bytes(row['bytes_after'])}"
        note = "" if row["note"] == "dequantized" else row["note"]
        shape = "x".join(map(str, row["shape"])) or "scalar"
        cells = [row["name"], shape, types]
        if quantizing:
            cells += [row["granularity"] or "", sizes, _db(row["sqnr_db"])]
            if rounded:
                layer = row.get("output_sqnr_db") or {}
                cells.append(f"{_db(layer['rtn'])} / {_db(layer[rounded])}" if rounded in layer else
                             ("rtn" if row.get("rounding") == "rtn" else ""))
            cells.append(_err(row["max_abs_error"]))
        else:
            cells += [sizes]
        if located:
            cells.append(row.get("location", ""))
        table.add_row(*cells, note)
    console.print(table)
    totals = report["totals"]
    line = f"total: {_bytes(totals['bytes_before'])} -> {_bytes(totals['bytes_after'])}"
    if totals["ratio"] and report["command"] == "quantize":
        saved = totals["bytes_before"] - totals["bytes_after"]
        line += f" ({totals['ratio']:.2f}x smaller, {_bytes(saved)} saved)"
        line += f"; {totals['quantized']} of {totals['tensors']} tensors quantized"
        if "sqnr_db" in totals:
            line += f", overall SQNR {_db(totals['sqnr_db'])} dB, max |err| {_err(totals['max_abs_error'])}"
    console.print(line)
    rules = sorted({row["scale_rule"] for row in report["tensors"] if row.get("scale_rule")})
    if rules:
        console.print(f"MX scale rule: {', '.join(rules)}")
    weights = totals.get("weights")
    if weights and weights["bytes"]:
        places = ", ".join(f"{name}: {v['quantized_tensors']} of {v['tensors']}, {_bytes(v['quantized_bytes'])} of "
                           f"{_bytes(v['bytes'])}" for name, v in weights["places"].items())
        console.print(f"float tensors of 2+ dimensions: {_bytes(weights['quantized_bytes'])} of {_bytes(weights['bytes'])} "
                      f"quantized ({100 * weights['share']:.1f}%); by where they live: {places}")
    if "files" in report:
        files = report["files"]
        console.print(f"file size: {_bytes(files['before'])} -> {_bytes(files['after'])} "
                      f"({files['before'] / files['after']:.2f}x smaller)")
    model = report.get("model")
    if model:
        console.print(f"model: opset {model['opset_before']} -> {model['opset_after']}, "
                      f"{model['dequantize_nodes']} DequantizeLinear nodes; onnx.checker: {model['checker']}"
                      + (f"; external data: {model['external_data']}" if model.get("external_data") else ""))
        if model.get("gather_block_quantized"):
            tables = model["gather_block_quantized"]
            console.print(f"onnxruntime: {len(tables)} 4-bit Gather table{'s' * (len(tables) > 1)} read through "
                          f"com.microsoft.GatherBlockQuantized (only the gathered rows are dequantized; --target "
                          f"qdq-portable keeps DequantizeLinear -> Gather)")
        if model.get("dequantized_per_run"):
            console.print(f"onnxruntime: {model['dequantized_per_run']} convolution and recurrent weights are dequantized "
                          f"on every run (no int8 activations to fuse with; 1.3-1.7x float's time on the OCR models); "
                          f"the session option session.disable_quant_qdq=1 folds them once at load (float's speed and "
                          f"memory, the file stays small)")
        conversion = model.get("conversion")
        if conversion:
            console.print(f"opset conversion: {conversion['note']}")
        scales = model.get("channel_scales")
        if scales:
            console.print(f"awq: {len(scales['folded'])} layers' inputs divided by their channel scales in the layer "
                          f"before them, {len(scales['divided'])} by a Div node"
                          + (f" (the float model moved by {scales['max_difference']:.3g})"
                             if "max_difference" in scales else ""))
        if report.get("activations"):
            _show_activations(console, report["activations"])
        if report.get("bias_correction") is not None:  # weights only, with samples
            _show_bias_correction(console, report["bias_correction"])
        _show_accuracy(console, model)
        if "latency" in model:
            _show_latency(console, model["latency"])


def _show_comparison(console, report: dict) -> None:
    """One row per tensor, a bytes and an SQNR column per format; then each format's totals and, for a
    model, its task figure."""
    from rich.table import Table

    formats = report["formats"]
    table = Table(title=f"{report['input']}: {', '.join(formats)} side by side (nothing written)", title_justify="left")
    for column, justify in (("tensor", "left"), ("shape", "left"), ("type", "left"), ("bytes", "right")):
        table.add_column(column, justify=justify, overflow="fold", no_wrap=True)
    for name in formats:
        table.add_column(f"{name} bytes", justify="right", no_wrap=True)
        table.add_column(f"{name} SQNR dB", justify="right", no_wrap=True)
    for row in report["tensors"]:
        cells = [row["name"], "x".join(map(str, row["shape"])) or "scalar", row["from"], _bytes(row["bytes_before"])]
        for name in formats:
            entry = row["formats"].get(name)
            if entry is None or not entry["quantized"]:
                cells += ["kept", ""]
            else:
                cells += [_bytes(entry["bytes_after"]), _db(entry["sqnr_db"])]
        table.add_row(*cells)
    console.print(table)
    first = next(iter(report["totals"].values()))
    console.print(f"total before: {_bytes(first['bytes_before'])}")
    for name, totals in report["totals"].items():
        line = f"{name}: {_bytes(totals['bytes_after'])}"
        if totals["ratio"]:
            line += f" ({totals['ratio']:.2f}x smaller)"
        line += f"; {totals['quantized']} of {totals['tensors']} tensors quantized"
        if "sqnr_db" in totals:
            line += f", overall SQNR {_db(totals['sqnr_db'])} dB, max |err| {_err(totals['max_abs_error'])}"
        model = totals.get("model")
        if model:
            line += f"; opset {model['opset_after']}, onnx.checker {model['checker']}"
            accuracy = model.get("accuracy")
            if accuracy:
                drop = 100 * (accuracy["quantized"] - accuracy["float"])
                line += (f"; {_TASK_WORDS[accuracy.get('task', 'classify')]} {100 * accuracy['quantized']:.2f}% "
                         f"(float {100 * accuracy['float']:.2f}%, {drop:+.2f} points; {accuracy['runtime']})")
            else:
                line += f"; accuracy not measured ({model.get('accuracy_note', 'no evaluation data')})"
        console.print(line)


SHOWN_LAYERS = 12  # the worst activations the table shows (--json has them all)


def _show_bias_correction(console, corrected: dict) -> None:
    if "layers" not in corrected:
        console.print(f"bias correction: not run ({corrected['note']})")
        return
    moved = corrected["layers"]
    largest = max((row["max_abs_shift"] for row in moved), default=0.0)
    console.print(f"bias correction: {len(moved)} layers' biases moved to the float model's output means on "
                  f"{corrected['samples']} samples (largest shift {largest:.3g}; {corrected['seconds']:.1f} s)")
    if corrected.get("note"):
        console.print(f"  ({corrected['note']})")


def _show_activations(console, activations: dict) -> None:
    """Static quantization: what was folded, calibrated and kept, and the per-layer SQNR, worst first."""
    from rich.table import Table

    folded = activations.get("folded") or {}
    if folded.get("nodes"):
        moved = (f"the float model moved by {folded['max_difference']:.3g} at most" if "max_difference" in folded
                 else f"the folded float model was {folded.get('note', 'not run to check it')}")
        console.print(f"folded into the convolutions before quantizing: {len(folded['nodes'])} nodes "
                      f"(BatchNormalization, Mul/Add by constants); {moved}")
    padded = folded.get("padded") or {}
    if padded.get("layers"):
        sizes = ", ".join(f"{row['channels']}->{row['to']}" for row in padded["layers"])
        moved = (f"the float model moved by {padded['max_difference']:.3g} at most" if "max_difference" in padded
                 else f"not run to check it ({padded.get('note')})")
        regions = len(padded["layers"])
        console.print(f"zero channels for onnxruntime's int8 convolution kernels: {regions} region{'s' * (regions > 1)} "
                      f"({sizes} channels); {moved}")
    console.print(f"activations: {activations['pairs']} QuantizeLinear/DequantizeLinear pairs, {activations['type']}"
                  f"{' symmetric' if activations['symmetric'] else ''}, ranges by {activations['method']} over "
                  f"{activations['calibration_samples']} calibration samples; {len(activations['kept'])} kept float")
    if activations.get("gates_tiled"):
        count = len(activations["gates_tiled"])
        console.print(f"channel gates tiled to their maps for onnxruntime (its broadcast QLinearMul runs on one "
                      f"thread): {count} Mul node{'s' * (count > 1)}")
    if activations.get("bias_correction") is not None:
        _show_bias_correction(console, activations["bias_correction"])
    layers = activations["per_layer"]
    if not layers["samples"]:
        console.print("per-layer SQNR: not measured (--report-samples 0)")
        return
    table = Table(title=f"SQNR of the quantized activations against the float model's, worst first "
                        f"({layers['samples']} samples)", title_justify="left")
    for column, justify in (("tensor", "left"), ("written by", "left"), ("SQNR dB", "right"), ("max |err|", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in layers["layers"][:SHOWN_LAYERS]:
        table.add_row(row["tensor"], row["producer"], _db(row["sqnr_db"]), _err(row["max_abs_error"]))
    if len(layers["layers"]) > SHOWN_LAYERS:
        table.add_row(f"... {len(layers['layers']) - SHOWN_LAYERS} more (--json)", "", "", "")
    for row in layers["outputs"]:
        table.add_row(row["output"], "model output", _db(row["sqnr_db"]), _err(row["max_abs_error"]))
    console.print(table)
    search = activations.get("max_drop")
    if search:
        steps = "; ".join(f"{len(step['kept'])} kept: {100 * step['quantized']:.2f}% ({step['drop']:+.2f} points)"
                          for step in search["history"])
        verdict = "within" if search["met"] else "NOT within"
        console.print(f"--max-drop {search['budget']:g}: {verdict} the budget with {len(search['kept'])} layers kept float "
                      f"({', '.join(search['kept']) or 'none'}); {steps}")


SHOWN_FLOAT_NODES = 12  # the float nodes of onnxruntime's optimized graph named in the table (--json has them all)


def _show_latency(console, latency: dict) -> None:
    """Float and quantized latency in onnxruntime, and what its optimized graph runs on the codes."""
    if "note" in latency:
        console.print(f"latency: not measured ({latency['note']})")
        return
    batch = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in latency["batch"].items())
    cells = "; ".join(f"{threads} thread{'s' if threads != '1' else ''}: float {t['float_ms']:.2f} ms, quantized "
                      f"{t['quantized_ms']:.2f} ms ({t['ratio']:.2f}x float, median of {t['runs']})"
                      for threads, t in latency["threads"].items())
    where = latency.get("cpu", {}).get("model") or "this CPU"
    console.print(f"latency in {latency['runtime']} on {batch}, {where}: {cells}")
    if latency.get("cpu") and not latency["cpu"]["vnni"]:
        console.print("note: this CPU has no VNNI: onnxruntime's kernels for uint8 activations and int8 weights add "
                      "pairs of products in int16 and saturate, so its int8 kernels may score below the ONNX "
                      "semantics; the session option session.x64quantprecision=1 makes them exact (and slower), "
                      "as do --dtype uint8 weights (slower still)")
    nodes = latency.get("nodes")
    if nodes:
        def counts(ops: dict) -> str:
            return ", ".join(f"{op} {count}" for op, count in ops.items()) or "none"
        names = nodes["float_nodes"]
        shown = f" ({', '.join(names)})" if 0 < len(names) <= SHOWN_FLOAT_NODES else ""
        console.print(f"onnxruntime's optimized graph: on the codes: {counts(nodes['int8'])}; in float: "
                      f"{counts(nodes['float'])}{shown}; conversions: {counts(nodes['conversions'])}")


_TASK_WORDS = {"classify": "accuracy", "ctc": "exact-match text accuracy", "threshold": "decisions equal to the labels"}


def _show_accuracy(console, model: dict) -> None:
    accuracy = model.get("accuracy")
    if accuracy is None:
        console.print(f"accuracy: not measured ({model.get('accuracy_note', 'no evaluation data')})")
        return
    task = accuracy.get("task", "classify")
    agreement = ("predictions agree" if task == "classify" else "decoded texts agree" if task == "ctc"
                 else "decisions agree")
    line = (f"{_TASK_WORDS[task]} on {accuracy['samples']} held-out samples ({accuracy['data']}, run with "
            f"{accuracy['runtime']}): float {100 * accuracy['float']:.2f}% -> quantized {100 * accuracy['quantized']:.2f}% "
            f"({100 * (accuracy['quantized'] - accuracy['float']):+.2f} points); {agreement} on "
            f"{100 * accuracy['agreement']:.2f}%")
    if "iou" in accuracy:
        line += f", intersection over union of the maps above {accuracy['threshold']:g} {accuracy['iou']:.4f}"
    console.print(line + f", max |output difference| {accuracy['max_output_difference']:.3g}")
    fused = accuracy.get("quantized_default_optimizations")
    if fused is not None and abs(fused - accuracy["quantized"]) >= 0.01:
        console.print(
            f"warning: onnxruntime with its default graph optimizations (its fused kernels: QLinearConv and "
            f"friends, or DequantizeLinear+MatMul as MatMulNBits) gets {100 * fused:.2f}% on this model, max |output "
            f"difference| {accuracy['default_optimizations_max_difference']:.3g} from the ONNX semantics measured "
            f"above (basic optimizations)")


@contextmanager
def progress(total: int, label: str, unit: str = "bytes"):
    """Yields ``advance(amount)``; shows a progress bar on a terminal for large jobs (of bytes, or of
    samples: every sample run counts)."""
    if (unit == "bytes" and total < PROGRESS_MIN_BYTES) or not sys.stderr.isatty():
        yield lambda amount: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    counter = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    with Progress(TextColumn("{task.description}"), BarColumn(), counter, TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda amount: bar.advance(task, amount)


# ----------------------------------------------------------------------------------------------------
# Plots


def _levels(qtype, scale: np.ndarray, zero_point: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The dequantized values of every code, for the group with the largest scale."""
    if qtype.bits > 8:
        return None, f"{2 ** qtype.bits} levels, not drawn"
    group = int(np.argmax(scale.reshape(-1))) if scale.size else 0
    s = float(scale.reshape(-1)[group]) if scale.size else float(scale)
    codes = np.arange(2 ** qtype.bits, dtype=np.uint8)
    if qtype.is_integer:
        values = codes.view(qtype.dtype) if qtype.bits == 8 else _sub_byte_values(codes, qtype)
        z = float(np.asarray(zero_point).reshape(-1)[group].astype(np.float64))
        levels = (values.astype(np.float64) - z) * s
    else:
        values = codes.view(qtype.dtype).astype(np.float64) if qtype.bits == 8 else _sub_byte_values(codes, qtype).astype(np.float64)
        levels = values[np.isfinite(values)] * s
    label = "levels" if scale.size <= 1 else "levels of the group with the largest scale"
    return np.unique(levels), label


def _sub_byte_values(codes: np.ndarray, qtype) -> np.ndarray:
    from ..packing import unpack

    return unpack(_pack_codes(codes, qtype.bits), qtype.dtype, (codes.size,))


def _pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    stream = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits].reshape(-1)
    return np.packbits(stream, bitorder="little")


def plot(report: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for row in report["tensors"]:
        if not row["quantized"] or row["_stats"].edges is None:  # (int32 biases: no histogram kept)
            continue
        stats, qtype = row["_stats"], row["_qtype"]
        figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
        centers = (stats.edges[:-1] + stats.edges[1:]) / 2
        left.bar(centers, stats.histogram, width=np.diff(stats.edges), color="tab:blue", alpha=0.8)
        left.set_yscale("log")
        levels, label = _levels(qtype, np.asarray(row["_scale"], np.float64), np.asarray(row["_zero_point"]))
        if levels is not None:
            shown = levels[(levels >= stats.edges[0] - 1e-12) & (levels <= stats.edges[-1] + 1e-12)]
            for level in shown:
                left.axvline(level, color="tab:red", linewidth=0.5, alpha=0.6)
            label = f"{label} ({shown.size} in range, red)"
        left.set_title(f"values of {row['name']}\n{label}", fontsize=9)
        left.set_xlabel("value")
        left.set_ylabel("count")
        rms = np.sqrt(stats.group_noise / np.maximum(stats.group_count, 1)).reshape(-1)
        if rms.size > 1:
            right.plot(np.arange(rms.size), rms, linewidth=0.8)
            right.set_xlabel("channel" if row["_gran"].kind == "axis" else "block (flattened)")
        else:
            right.bar([0], rms)
            right.set_xticks([])
        right.set_ylabel("RMS error")
        right.set_title(f"{row['from']} -> {row['to']}, {row['granularity']}: SQNR {_db(row['sqnr_db'])} dB, "
                        f"max |err| {_err(row['max_abs_error'])}", fontsize=9)
        figure.tight_layout()
        path = folder / (re.sub(r"[^A-Za-z0-9_.-]+", "_", row["name"]) + ".png")
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    layers = (report.get("activations") or {}).get("per_layer", {}).get("layers")
    if layers:
        written.append(_plot_layers(plt, report["activations"], folder))
    return written


def _plot_layers(plt, activations: dict, folder: Path) -> Path:
    """Static quantization: each quantized activation's SQNR in graph order, the worst named."""
    order = {row["name"]: index for index, row in enumerate(activations["tensors"])}
    layers = sorted(activations["per_layer"]["layers"], key=lambda row: order.get(row["tensor"], 0))
    values = [row["sqnr_db"] if row["sqnr_db"] is not None and math.isfinite(row["sqnr_db"]) else np.nan for row in layers]
    figure, axes = plt.subplots(figsize=(12, 4.5))
    axes.plot(np.arange(len(values)), values, marker=".", linewidth=0.8)
    for row in activations["per_layer"]["layers"][:8]:  # the worst, annotated
        index = next(i for i, layer in enumerate(layers) if layer["tensor"] == row["tensor"])
        axes.annotate(row["tensor"], (index, values[index]), fontsize=7, rotation=30, xytext=(3, -12),
                      textcoords="offset points")
    for output in activations["per_layer"]["outputs"]:
        if output["sqnr_db"] is not None and math.isfinite(output["sqnr_db"]):
            axes.axhline(output["sqnr_db"], color="tab:red", linewidth=0.8, linestyle="--")
            axes.annotate(f"output {output['output']}", (0, output["sqnr_db"]), fontsize=7, color="tab:red")
    axes.set_xlabel("quantized activation, in graph order")
    axes.set_ylabel("SQNR against float, dB")
    axes.set_title(f"{activations['type']} activations ({activations['method']}, {activations['calibration_samples']} "
                   f"calibration samples): SQNR of each, {activations['per_layer']['samples']} samples", fontsize=9)
    figure.tight_layout()
    path = folder / "activations-sqnr.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
