"""The speed goals that depend on the CPU, measured on this one in one run: issue 32's (prepacked QLinearConv
against onnxruntime, 1 and 2 threads, `qlinear bench --conv`) and issue 30's (the static int8 OCR models against
their float ones in onnxruntime, as `qlinear quantize` writes them by default). Prints lscpu's head, each figure
with its goal, and met / not met. The CPU behind this project's machines changes between sessions (Intel Emerald
Rapids, AMD EPYC Zen 3 and Zen 4 so far): run it on each.

    uv run python benchmarks/cpu_goals.py [--rounds 3] [--repeats 20] [--skip-models] [--isa avx512vnni|avx2]

``--isa`` (Linux, a C compiler): on an Intel CPU with AMX, both onnxruntime and qlinear run the kernels of a CPU
with less, through the preloaded shim benchmarks/isa_shim.c. ``avx512vnni`` refuses them AMX: an AMD Zen 4's
instructions. ``avx2`` also hides AVX-512 and VNNI from CPUID (it needs the CPU's cpuid_fault): a Zen 3's. This
copies instruction sets, not caches or clocks.

About 2 minutes for the convolutions and 3 for the models on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def verdict(value: float, goal: float) -> str:
    return f"{value:.2f} (goal <= {goal:g}): {'met' if value <= goal else 'NOT met'}"


def conv_goals(rounds: int) -> list[str]:
    from qlinear import bench_conv

    result = bench_conv.run(rounds=rounds)
    rows, summary = result["rows"], result["summary"]
    lines = [f"qlinear path {result['qlinear_path']}, AMX {'used where faster' if result['amx'] else 'none'}, "
             f"onnxruntime {result['onnxruntime']}"]
    if "ratio_2t" not in summary:
        return lines + ["onnxruntime not measured: no goals"]
    lines.append("2 threads, geomean vs onnxruntime: " + verdict(summary["ratio_2t"]["geomean"], 1.2))
    worst = max(rows, key=lambda r: r["ratio_2t"])
    lines.append(f"2 threads, worst layer ({worst['layer']}): " + verdict(worst["ratio_2t"], 1.6))
    lines.append("1 thread, geomean vs onnxruntime: " + verdict(summary["ratio_1t"]["geomean"], 1.1))
    big = [r for r in rows if r["qlinear_1t_ms"] >= 0.2]
    if big:
        scaling = max(big, key=lambda r: r["qlinear_2t_over_1t"])
        lines.append(f"own 2t/1t, layers >= 0.2 ms (worst {scaling['layer']}): "
                     + verdict(scaling["qlinear_2t_over_1t"], 0.7))
    anywhere = max(rows, key=lambda r: r["qlinear_2t_over_1t"])
    lines.append(f"own 2t/1t, any layer (worst {anywhere['layer']}): " + verdict(anywhere["qlinear_2t_over_1t"], 1.0))
    return lines


def model_goals(repeats: int) -> list[str]:
    import placement_rules as rules
    from corpus.models import path

    goals = {"ocr_cls": 0.8, "ocr_rec": 0.6, "ocr_det": 0.6}
    lines = []
    with tempfile.TemporaryDirectory(prefix="cpu_goals_") as scratch:
        folder = Path(scratch)
        for name, goal in goals.items():
            output = folder / f"{name}.onnx"
            rules.quantize(name, rules.calibration(folder, name), output, "default")
            float_ms, int8_ms = zip(*(rules.latencies([path(name), output], rules.feeds(name), threads, repeats)
                                      for threads in (1, 2)))
            for threads, (f, q) in enumerate(zip(float_ms, int8_ms), start=1):
                lines.append(f"{name}, {threads} thread{'s' * (threads > 1)}: int8 {q:.1f} ms / float {f:.1f} ms = "
                             + verdict(q / f, goal))
    return lines


def under_shim(isa: str) -> int:
    """Run this script again under isa_shim.c in mode ``isa`` (built into a temporary folder); its exit status."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("cpu_goals: --isa needs a C compiler (cc) to build benchmarks/isa_shim.c", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="isa_shim_") as folder:
        shim = Path(folder) / "isa_shim.so"
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(shim), str(ROOT / "benchmarks" / "isa_shim.c"),
                        "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=str(shim), ISA_SHIM=isa)
        argv = [a for a in sys.argv[1:] if a != "--isa" and a != isa and not a.startswith("--isa=")]
        return subprocess.run([sys.executable, __file__, *argv], env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the convolution timings")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per model and thread count")
    parser.add_argument("--skip-models", action="store_true", help="the convolutions only")
    parser.add_argument("--isa", choices=("avx512vnni", "avx2"),
                        help="on an Intel CPU with AMX, run both libraries without AMX (a Zen 4's instructions) or "
                             "also without AVX-512 and VNNI (a Zen 3's)")
    args = parser.parse_args()
    if args.isa and os.environ.get("ISA_SHIM") != args.isa:
        return under_shim(args.isa)
    if os.environ.get("ISA_SHIM"):
        print(f"benchmarks/isa_shim.c in mode {os.environ['ISA_SHIM']}: both libraries see "
              + ("no AMX" if os.environ["ISA_SHIM"] == "avx512vnni" else "no AVX-512, VNNI or AMX"))
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags:")[0].strip(), "\n")
    print("Issue 32: prepacked QLinearConv against onnxruntime (qlinear bench --conv)")
    for line in conv_goals(args.rounds):
        print("  " + line, flush=True)
    if not args.skip_models:
        print("Issue 30: static int8 OCR models (the defaults) against float in onnxruntime")
        for line in model_goals(args.repeats):
            print("  " + line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
