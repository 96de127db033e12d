"""Write a large float32 zarr array of random normal data, one row band at a time (never whole in memory).

Used for the README's "Larger than memory" run of ``qlinear quantize --chunks``:

    uv run python benchmarks/make_big_zarr.py /work/bigdata/big.zarr --rows 100000 --cols 100000

The store is uncompressed (random floats do not compress) so that the run measures qlinear, not zstd.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import zarr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--cols", type=int, default=100_000)
    parser.add_argument("--chunk-rows", type=int, default=1000)
    parser.add_argument("--chunk-cols", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    array = zarr.create_array(
        args.path, shape=(args.rows, args.cols), chunks=(args.chunk_rows, args.chunk_cols),
        dtype="float32", compressors=None, fill_value=0.0,
    )
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for row in range(0, args.rows, args.chunk_rows):
        band = rng.standard_normal((min(args.chunk_rows, args.rows - row), args.cols), dtype=np.float32)
        array[row:row + band.shape[0]] = band
    seconds = time.perf_counter() - start
    gigabytes = args.rows * args.cols * 4 / 1e9
    print(f"wrote {args.path}: shape {array.shape} float32, {gigabytes:.1f} GB in {seconds:.0f} s")


if __name__ == "__main__":
    main()
