"""QuantizeLinear / DequantizeLinear speed: qlinear's kernels vs onnxruntime (1 and 2 threads), the onnx
reference, TensorFlow, plain NumPy and a multithreaded copy of the same bytes (the bandwidth bound).

    uv run python benchmarks/bench_elementwise.py [--sizes 16M] [--case float8] [--json benchmarks/results/elementwise.json]

The same suite as `qlinear bench` (it lives in qlinear.bench so the installed command can run it); this
script is the repository entry point. See BENCHMARKS.md for the latest table. The rows whose case ends in
"out=" (QuantizeLinear f32->uint8 per tensor and f32->int8 blocked, DequantizeLinear uint8->f32 per tensor) time
qlinear writing into a preallocated array, beside the same peers; ``--case out=`` runs only those.
"""

import sys

from qlinear.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
