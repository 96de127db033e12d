"""Offline exhaustive check of the microscaling kernels: every float32 bit pattern, for each element format and
scale rule, kernel == NumPy reference bit for bit, and the reference's block exponent == the rule computed
independently. Not part of CI (a format and rule take tens of minutes on 2 cores).

    uv run python benchmarks/sweep_mx.py --formats mxfp4 --rules floor [--workers 2] [--chunk-bits 24]
                                         [--chunks 0:256[:STEP]] [--log benchmarks/results/sweep_mx.jsonl]
    uv run python benchmarks/sweep_mx.py --summary

The 2^32 patterns are cut into chunks of 2^chunk_bits consecutive patterns (a chunk spans at most two binades
of one sign). Each pattern v is checked in two roles:

- **maximum**: v alone in its block (a row of one element: the other 31 of the block are the padding zeros),
  so v decides the block's scale. Kernel: `qlinear.kernels.mx` on an (n, 1) array (its short-block path).
  Reference: `qlinear.reference.mx`'s block_amax / shared_exponents / mx_elements on the same blocks (its
  quantize_mx would pad each to 32 elements). Besides kernel == reference, the reference's exponent is
  checked against the rule written out with float64 comparisons (no frexp, no log2):
  floor: 2^(e + emax) <= |v| < 2^(e + emax + 1); ceil: 2^(e - 1) < float32(|v| / max) <= 2^e; even: |v|
  rounded (halves up) to mantissa_bits + 1 significant bits lies in [2^(e + emax), 2^(e + emax + 1)); each
  unless clamped to E8M0's [-127, 127]; zero -> -127; Inf/NaN -> scale NaN (0xFF) and code +0.
- **element**: 31 patterns per block of 32 beside a block maximum M that cycles, block by block, through 0
  and max_value * 2^k for k in -150..130 (step 5, finite ones), so v is rounded at many scales (underflow,
  saturation and the subnormal range of float32 included); where |v| > M, v is the maximum. Kernel (its
  whole-block path, in groups of 16 blocks: the block count is padded to a multiple of 64) ==
  `reference.mx.quantize_mx` on the (n / 31, 32) array.

NVFP4 ("nvfp4", no rule): the maximum role as above (the tensor scale is the chunk's own) with
`reference.mx.quantize_nvfp4` on rows of one element, and the element role in blocks of 16 patterns.
"nvfp4-given" (logged as rule "given"): the same, the kernel given the reference's tensor scale.
"nvfp4-modelopt" (rule "modelopt"): Model Optimizer's NVFP4, kernel == `reference.mx.quantize_nvfp4_modelopt`
(where that rule's tensor scale is Inf, NaN or 0, which the kernel leaves to the reference, the kernel is
given it).

Each finished chunk appends one JSON line to the log (format, rule, chunk, patterns checked, mismatches and
the first few mismatching patterns); chunks already in the log are skipped, so a run can be stopped and
resumed. ``--summary`` prints the totals of a log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

F32 = np.float32


def _patterns(chunk: int, bits: int) -> np.ndarray:
    start = chunk << bits
    return np.arange(start, start + (1 << bits), dtype=np.uint64).astype(np.uint32).view(F32)


def _mismatch(a, b) -> np.ndarray:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype == np.float32:
        return a.view(np.uint32) != b.view(np.uint32)
    return a.view(np.uint8) != b.view(np.uint8)


def _rule_check(v: np.ndarray, e: np.ndarray, nan: np.ndarray, fmt, rule: str) -> np.ndarray:
    """Where the reference's exponent e (int64) breaks the rule, written out independently (float64)."""
    a = np.abs(v.astype(np.float64))
    ok = np.ones(v.shape, bool)
    finite = ~nan
    zero = finite & (a == 0)
    ok[zero] = e[zero] == -127
    live = finite & (a > 0)
    e_ = e[live].astype(np.float64)
    a_ = a[live]
    if rule == "ceil":
        q = (a_.astype(F32) / F32(fmt.max_value)).astype(np.float64)
        q = np.where(q == 0, float(np.finfo(F32).smallest_subnormal), q)
        good = (np.ldexp(1.0, (e_ - 1).astype(int)) < q) & (q <= np.ldexp(1.0, e_.astype(int)))
        good |= (e_ == -127) & (q <= np.ldexp(1.0, -127))
        good |= (e_ == 127) & (q > np.ldexp(1.0, 126))
    else:
        if rule == "even":
            # the binade of a: the largest power of two <= a, by comparison against every candidate exponent
            p = np.floor(np.log2(a_))  # a first guess, corrected below by exact comparisons
            p = p - (np.ldexp(1.0, p.astype(int)) > a_) + (np.ldexp(1.0, (p + 1).astype(int)) <= a_)
            ulp = np.ldexp(1.0, (p - fmt.mantissa_bits).astype(int))
            a_ = np.floor(a_ / ulp + 0.5) * ulp  # exact in float64: a has 24 significant bits at most
        lo = np.ldexp(1.0, (e_ + fmt.emax).astype(int))
        hi = np.ldexp(1.0, (e_ + fmt.emax + 1).astype(int))
        good = (lo <= a_) & (a_ < hi)
        good |= (e_ == -127) & (a_ < hi)
        good |= (e_ == 127) & (a_ >= lo)
    ok[live] = good
    return ~ok


def _nvfp4_both(x, rule):
    """(reference codes, scales, tensor scale, kernel codes, scales, tensor scale) of NVFP4 on x; ``rule``:
    None, "given" (the kernel given the reference's tensor scale) or "modelopt" (Model Optimizer's rule; where
    its tensor scale comes out Inf, NaN or 0 the kernel leaves x to the reference, so it is given that scale)."""
    from qlinear.kernels import mx as km
    from qlinear.reference import mx as ref

    method = "modelopt" if rule == "modelopt" else None
    rc, rs, rg = ref.quantize_nvfp4(x, None, method)
    result = km.quantize_nvfp4(x, rg if rule == "given" else None, method)
    if result is None:
        result = km.quantize_nvfp4(x, rg, method)
    return (rc, rs, rg, *result)


def check_chunk(name: str, rule: str | None, chunk: int, bits: int) -> dict:
    from qlinear.kernels import mx as km
    from qlinear.reference import mx as ref

    fmt = ref.FORMATS[name]
    v = _patterns(chunk, bits)
    bad_patterns: list[int] = []
    mismatches = 0
    rule_breaks = 0

    def note(mask, patterns):
        nonlocal mismatches
        count = int(mask.sum())
        mismatches += count
        if count and len(bad_patterns) < 16:
            bad_patterns.extend(int(p) for p in patterns[mask][:16 - len(bad_patterns)].view(np.uint32))

    with np.errstate(all="ignore"):
        # maximum role: v alone in its block
        x = v.reshape(-1, 1)
        if name == "nvfp4":
            rc, rs, rg, kc, ks, kg = _nvfp4_both(x, rule)
            note(_mismatch(kc, rc).reshape(-1) | _mismatch(ks, rs).reshape(-1)
                 | bool(np.float32(kg).view(np.uint32) != np.float32(rg).view(np.uint32)), v)
        else:
            kc, ks = km.quantize_mx(x, fmt, rule)
            b = v.reshape(-1, 1, 1)
            amax, nan = ref.block_amax(b)
            e = ref.shared_exponents(amax, fmt, rule)
            rc = ref.mx_elements(b, e, nan, fmt).reshape(-1, 1)
            rs = ref.e8m0_from_exponents(e, nan)
            note(_mismatch(kc, rc).reshape(-1) | _mismatch(ks, rs).reshape(-1), v)
            breaks = _rule_check(v, e.reshape(-1), nan.reshape(-1), fmt, rule)
            breaks |= nan.reshape(-1) & (rc.view(np.uint8).reshape(-1) != 0)
            rule_breaks += int(breaks.sum())
            if breaks.any() and len(bad_patterns) < 16:
                bad_patterns.extend(int(p) for p in v[breaks][:4].view(np.uint32))

        # element role: 31 (NVFP4: 16) patterns per block beside a cycling maximum
        if name == "nvfp4":
            x = v.reshape(-1, 16)
            rc, rs, rg, kc, ks, kg = _nvfp4_both(x, rule)
            bad = _mismatch(kc, rc) | _mismatch(ks, rs).repeat(16, axis=1)
            bad |= bool(np.float32(kg).view(np.uint32) != np.float32(rg).view(np.uint32))
            note(bad.reshape(-1), v)
        else:
            per = fmt.block_size - 1
            n = -(-v.size // per)
            n = -(-n // 64) * 64  # whole rows of 64 blocks: the kernel's groups of 16 (kernels/mx._rows)
            padded = np.zeros(n * per, F32)
            padded[:v.size] = v
            ks_ = np.arange(-150, 131, 5)
            maxima = np.concatenate([[0.0], np.ldexp(fmt.max_value, ks_)]).astype(F32)
            maxima = maxima[np.isfinite(maxima)]
            x = np.empty((n, fmt.block_size), F32)
            x[:, 0] = maxima[np.arange(n) % maxima.size]
            x[:, 1:] = padded.reshape(n, per)
            kc, ks = km.quantize_mx(x, fmt, rule)
            rc, rs = ref.quantize_mx(x, fmt, rule)
            bad = _mismatch(kc, rc)[:, 1:] | _mismatch(ks, rs)  # (n, 31) | (n, 1)
            bad |= _mismatch(kc, rc)[:, :1]
            note(bad.reshape(-1)[:v.size], v)

    return {"format": name, "rule": rule, "chunk": chunk, "chunk_bits": bits, "patterns": int(v.size),
            "mismatches": mismatches, "rule_breaks": rule_breaks, "first": bad_patterns}


def _work(job):
    return check_chunk(*job)


def _done(log: str) -> set:
    done = set()
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                r = json.loads(line)
                done.add((r["format"], r["rule"], r["chunk"], r["chunk_bits"]))
    return done


def summary(log: str) -> None:
    totals: dict = {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            t = totals.setdefault((r["format"], r["rule"]), {"chunks": set(), "patterns": 0, "mismatches": 0,
                                                            "rule_breaks": 0, "bits": r["chunk_bits"], "first": []})
            if r["chunk"] in t["chunks"]:
                continue
            t["chunks"].add(r["chunk"])
            t["patterns"] += r["patterns"]
            t["mismatches"] += r["mismatches"]
            t["rule_breaks"] += r.get("rule_breaks", 0)
            t["first"] += r["first"][:4]
    for (name, rule), t in totals.items():
        whole = len(t["chunks"]) == 1 << (32 - t["bits"])
        print(f"{name:12} {rule or '-':5} patterns {t['patterns']:>11,} ({'all 2^32' if whole else 'partial'}) "
              f"mismatches {t['mismatches']} rule breaks {t['rule_breaks']}"
              + (f" first {[hex(p) for p in t['first'][:8]]}" if t["first"] else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["mxfp4"])
    parser.add_argument("--rules", nargs="+", default=["floor", "ceil", "even"])
    parser.add_argument("--chunk-bits", type=int, default=24)
    parser.add_argument("--chunks", default=None, help="START:STOP[:STEP], chunk indices (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--log", default="benchmarks/results/sweep_mx.jsonl")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args(argv)
    if args.summary:
        summary(args.log)
        return 0
    count = 1 << (32 - args.chunk_bits)
    lo, hi, step = 0, count, 1
    if args.chunks is not None:
        parts = [int(s) for s in args.chunks.split(":")]
        lo, hi = parts[0], parts[1]
        step = parts[2] if len(parts) > 2 else 1
    done = _done(args.log)
    jobs = []
    for name in args.formats:
        if name in ("nvfp4-given", "nvfp4-modelopt"):
            name, rules = "nvfp4", [name.split("-")[1]]
        else:
            rules = [None] if name == "nvfp4" else args.rules
        for rule in rules:
            jobs += [(name, rule, c, args.chunk_bits) for c in range(lo, hi, step)
                     if (name, rule, c, args.chunk_bits) not in done]
    # each worker runs the kernels on one thread: the processes are the parallelism
    os.environ["NUMBA_NUM_THREADS"] = "1"
    print(f"{len(jobs)} chunks of 2^{args.chunk_bits} patterns to check ({len(done)} in the log already)", flush=True)
    start = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    if args.workers > 1:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(args.workers)
        results = pool.imap_unordered(_work, jobs)
    else:
        pool = None
        results = map(_work, jobs)
    total = bad = 0
    with open(args.log, "a") as log:
        for i, r in enumerate(results, 1):
            log.write(json.dumps(r) + "\n")
            log.flush()
            total += r["patterns"]
            bad += r["mismatches"] + r["rule_breaks"]
            elapsed = time.time() - start
            print(f"[{i}/{len(jobs)}] {r['format']} {r['rule']} chunk {r['chunk']}: {r['mismatches']} mismatches, "
                  f"{r['rule_breaks']} rule breaks; {total:,} patterns, {bad} bad so far, {elapsed:.0f} s, "
                  f"eta {elapsed / i * (len(jobs) - i):.0f} s", flush=True)
    if pool is not None:
        pool.close()
    summary(args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
