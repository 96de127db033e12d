"""Render the benchmark JSON files as the Markdown tables of BENCHMARKS.md.

    uv run python benchmarks/tables.py elementwise benchmarks/results/elementwise.json
    uv run python benchmarks/tables.py conv benchmarks/results/conv.json [benchmarks/results/conv_active.json]

The conv form takes an optional second file, a run with OMP_WAIT_POLICY=ACTIVE, whose 2-thread ratios get a
column of their own.
"""

from __future__ import annotations

import json
import math
import sys


def _ratio(peer, ours):
    return "n/a" if peer is None or ours is None else f"{peer / ours:.1f}x"


def elementwise(path: str) -> str:
    data = json.load(open(path))
    lines = ["| case | size | qlinear ms | bw | bwP | ORT 1t | ORT 2t | onnx ref | TF | NumPy | extra MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        q = r["qlinear_s"]
        lines.append(
            f"| {r['case']} | {r['size']} | {q * 1e3:.2f} | {r['probe_s'] / q:.2f} | {r['copy_probe_s'] / q:.2f} | "
            f"{_ratio(r.get('ort1_s'), q)} | {_ratio(r.get('ort2_s'), q)} | {_ratio(r.get('onnxref_s'), q)} | "
            f"{_ratio(r.get('tf_s'), q)} | {_ratio(r.get('numpy_s'), q)} | {r['peak_extra_bytes'] / 1e6:.2f} |")
    jit = data.get("jit")
    if jit:
        lines.append("")
        parts = []
        for cache, t in jit.items():  # "cold": empty NUMBA_CACHE_DIR, "warm": filled
            parts.append(f"{cache} cache: `import qlinear` {t['import_s']:.2f} s, first QuantizeLinear "
                         f"{t['first_quantize_s']:.2f} s, first DequantizeLinear after it {t['first_dequantize_s']:.3f} s")
        lines.append("JIT cost in fresh processes: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def _summary(ratios):
    ratios = [r for r in ratios if r is not None]
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    within = sum(r <= 2 for r in ratios)
    return f"geomean {geo:.2f}, worst {max(ratios):.2f}, best {min(ratios):.2f}, {within}/{len(ratios)} within 2x"


def conv(path: str, active_path: str | None = None) -> str:
    data = json.load(open(path))
    active = {}
    if active_path:
        active = {(r["layer"], r["weights"]): r for r in json.load(open(active_path))["rows"]}
    by_layer: dict = {}
    for r in data["rows"]:
        by_layer.setdefault(r["layer"], {})[r["weights"]] = r
    head = "| layer | GMAC | qlinear 1t ms | ORT 1t ms | ratio 1t full / 7bit | qlinear 2t ms | ORT 2t ms | ratio 2t full / 7bit |"
    sep = "|---|---|---|---|---|---|---|---|"
    if active:
        head += " ratio 2t, ACTIVE full / 7bit |"
        sep += "---|"
    lines = [head, sep]
    r1, r2, ra = [], [], []
    for layer, regimes in by_layer.items():
        full = regimes.get("full") or next(iter(regimes.values()))
        seven = regimes.get("7bit")

        def pair(key, table=None):
            vals = []
            for regime in ("full", "7bit"):
                row = regimes.get(regime) if table is None else table.get((layer, regime))
                vals.append(f"{row[key]:.2f}" if row and row.get(key) is not None else "–")
            return " / ".join(vals)

        line = (f"| {layer} | {full['gmac']:.3f} | {full['qlinear_1t_s'] * 1e3:.3f} | {full['ort_1t_s'] * 1e3:.3f} | "
                f"{pair('ratio_1t')} | {full['qlinear_2t_s'] * 1e3:.3f} | {full['ort_2t_s'] * 1e3:.3f} | {pair('ratio_2t')} |")
        if active:
            line += f" {pair('ratio_2t', active)} |"
        lines.append(line)
        for row in (full, seven):
            if row:
                r1.append(row["ratio_1t"])
                r2.append(row["ratio_2t"])
                a = active.get((layer, row["weights"]))
                if a:
                    ra.append(a["ratio_2t"])
    lines.append("")
    lines.append(f"1 thread: {_summary(r1)}. 2 threads: {_summary(r2)}."
                 + (f" 2 threads with OMP_WAIT_POLICY=ACTIVE: {_summary(ra)}." if ra else ""))
    refs = data.get("reference") or []
    if refs:
        lines.append("")
        lines.append("| layer | onnx reference ms | qlinear 1t ms | qlinear faster by |")
        lines.append("|---|---|---|---|")
        for r in refs:
            lines.append(f"| {r['layer']} | {r['reference_s'] * 1e3:.1f} | {r['qlinear_1t_s'] * 1e3:.3f} | "
                         f"{r['reference_s'] / r['qlinear_1t_s']:.0f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    kind, *files = sys.argv[1:]
    print(elementwise(*files) if kind == "elementwise" else conv(*files))
