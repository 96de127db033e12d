"""Offline comparison of qlinear's NVFP4 rules with TensorRT Model Optimizer's quantizer, on larger and more
varied tensors than the tests (tests/mx/test_mx_modelopt.py) use.

    uv run python benchmarks/nvfp4_modelopt.py [--rows 1024] [--repeats 2] [--seed 2026]

For each of seven weight distributions (float32, bfloat16-, float16- and float8-valued, heavy-tailed, rows
spanning 2^-40..2^40, quarter-integers), tensors of (rows, 4096): ``scale_rule="modelopt"`` must give Model
Optimizer's codes, block scales and tensor scale bit for bit (any difference is printed and fails the run);
then how many codes and block scales qlinear's exact rule (the default) gives differently from Model Optimizer.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "mx"))


def distributions(rng, rows: int) -> dict:
    shape = (rows, 4096)
    return {
        "normal, float32": lambda: rng.standard_normal(shape).astype(np.float32),
        "normal, bfloat16 values": lambda: rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float32),
        "Laplace, float16 values": lambda: rng.laplace(size=shape).astype(np.float16).astype(np.float32),
        "Cauchy, bfloat16 values": lambda: rng.standard_cauchy(shape).astype(ml_dtypes.bfloat16).astype(np.float32),
        "rows at 2^-40..2^40": lambda: (rng.standard_normal(shape)
                                        * np.exp2(rng.integers(-40, 41, (rows, 1)))).astype(np.float32),
        "quarter-integers -3..3": lambda: rng.integers(-12, 13, shape).astype(np.float32) / np.float32(4),
        "float8_e4m3fn values": lambda: rng.standard_normal(shape).astype(ml_dtypes.float8_e4m3fn).astype(np.float32),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from test_mx_modelopt import modelopt, ours  # Model Optimizer's quantizer and qlinear's, as the tests run them

    rng = np.random.default_rng(args.seed)
    failures = 0
    print(f"{'distribution':26} {'elements':>10} {'modelopt rule':>14} {'exact rule: codes':>18} {'block scales':>13}")
    for name, make in distributions(rng, args.rows).items():
        for _ in range(args.repeats):
            x = make()
            want_codes, want_scales, want_g = modelopt(x)
            codes, scales, g = ours(x)
            differ = (np.count_nonzero(codes != want_codes) + np.count_nonzero(scales != want_scales)
                      + int(g.view(np.uint32) != want_g.view(np.uint32)))
            failures += differ
            exact_codes, exact_scales, _ = ours(x, rule=None)
            print(f"{name:26} {x.size:>10} {differ:>14} {np.count_nonzero(exact_codes != want_codes):>18} "
                  f"{np.count_nonzero(exact_scales != want_scales):>13}", flush=True)
    print("modelopt rule == Model Optimizer everywhere" if not failures else f"{failures} DIFFERENCES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
