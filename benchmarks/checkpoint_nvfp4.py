"""`qlinear quantize` / `qlinear dequantize` of a bfloat16 safetensors checkpoint to and from NVFP4, whole commands.

    uv run python benchmarks/checkpoint_nvfp4.py [--layers 16] [--repeat 3] [--dir /tmp/qlinear-ckpt]

The checkpoint: `--layers` decoder layers of a 2048-wide model (q/k/v/o projections 2048x2048, 512x2048,
512x2048, 2048x2048; gate/up/down 5632x2048, 5632x2048, 2048x5632; weights N(0, 0.02) in bfloat16: 16 layers
are 721M weights, 1.44 GB). Each command runs `--repeat` times as a subprocess (start-up included); the best
and the median wall time are printed, with lscpu's model name. The NVFP4 files written under both rules are
read back by `qlinear dequantize`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

SHAPES = {"self_attn": {"q_proj": (2048, 2048), "k_proj": (512, 2048), "v_proj": (512, 2048), "o_proj": (2048, 2048)},
          "mlp": {"gate_proj": (5632, 2048), "up_proj": (5632, 2048), "down_proj": (2048, 5632)}}


def write_checkpoint(path: Path, layers: int) -> int:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(layers):
        for module, leaves in SHAPES.items():
            for leaf, shape in leaves.items():
                w = rng.standard_normal(shape, np.float32) * np.float32(0.02)
                tensors[f"model.layers.{i}.{module}.{leaf}.weight"] = w.astype(ml_dtypes.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sum(t.size for t in tensors.values())


def timed(args: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/qlinear-ckpt")
    args = parser.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "model.safetensors"
    weights = write_checkpoint(source, args.layers)
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if line.startswith("Model name")), "?")
    print(f"lscpu model name: {cpu}; {weights / 1e6:.0f}M weights, {source.stat().st_size / 1e9:.2f} GB")
    qlinear = [sys.executable, "-m", "qlinear"]
    for rule in (None, "modelopt"):
        out = folder / f"nvfp4-{rule or 'exact'}.safetensors"
        command = qlinear + ["quantize", str(source), "--dtype", "nvfp4", "-o", str(out), "--force"]
        command += ["--scale-rule", rule] if rule else []
        t = timed(command, args.repeat)
        print(f"quantize --dtype nvfp4{' --scale-rule ' + rule if rule else ''}: best {min(t):.2f} s, "
              f"median {statistics.median(t):.2f} s")
        back = folder / "restored.safetensors"
        t = timed(qlinear + ["dequantize", str(out), "-o", str(back), "--force"], args.repeat)
        print(f"dequantize ({rule or 'exact'} file) to bfloat16: best {min(t):.2f} s, median {statistics.median(t):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
