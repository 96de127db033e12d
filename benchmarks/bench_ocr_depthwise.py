"""The depthwise convolutions of the PP-OCR classifier (MobileNetV3, 5x5 and 3x3 kernels, 8 text lines of 48 x
192): qlinear's integer core (prepacked weights, `qlinear.qlinear_conv`) against onnxruntime's QLinearConv (a
one-node model, weights as initializers), 1 and 2 threads, best of runs, in this process (each onnxruntime session
is closed before the next timing). Ratio = qlinear time / onnxruntime time.

    uv run python benchmarks/bench_ocr_depthwise.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess

from qlinear import bench_conv

# (channels, input height, input width, kernel, strides) as the classifier runs them on 8 lines
LAYERS = [(16, 24, 96, 3, (2, 1)), (32, 12, 96, 3, (1, 1)), (32, 12, 96, 5, (2, 1)), (48, 6, 96, 5, (1, 1)),
          (96, 6, 96, 5, (1, 1)), (112, 6, 96, 5, (2, 1)), (208, 3, 96, 5, (1, 1))]


def layers() -> list[dict]:
    return [dict(name=f"dw{k}x{k} {c}/{s[0]},{s[1]} @{h}x{w}", x=(8, c, h, w), w=(c, 1, k, k), group=c, stride=s,
                 pad=k // 2) for c, h, w, k, s in LAYERS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best time of all counts")
    args = parser.parse_args()
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags:")[0].strip(), "\n")
    selected, best = layers(), {}
    for _ in range(args.rounds):
        for side, timer in (("qlinear", bench_conv.time_qlinear), ("onnxruntime", bench_conv.time_onnxruntime)):
            for key, value in timer(selected, (1, 2), "7bit", 0.3).items():
                best[side, key] = min(value, best.get((side, key), value))
    print("| layer (batch 8) | onnxruntime 1t ms | qlinear 1t ms | ratio | onnxruntime 2t ms | qlinear 2t ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for layer in selected:
        cells = []
        for t in (1, 2):
            o, q = best["onnxruntime", f"{layer['name']}|{t}"], best["qlinear", f"{layer['name']}|{t}"]
            cells += [f"{o * 1e3:.3f}", f"{q * 1e3:.3f}", f"{q / o:.2f}x"]
        print(f"| {layer['name']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
