"""The integer GEMM on Intel AMX tiles (Sapphire Rapids and later): ``tdpbusd`` multiplies a 16 x 64 tile of
unsigned activation bytes by a 16 x 64 tile of signed weight bytes (16 K steps of 4 bytes by 16 columns) into a
16 x 16 tile of int32 sums, mod 2**32 like the VNNI kernels' ``vpdpbusd``.

The weights' VNNI panels ([panel][K step][32 columns] int32, `weight_packing.pack`) are already the B operand:
two 16-column halves at a row stride of 128 bytes. Each call copies the activations into rows padded to whole
64-byte K tiles (zeros: their products vanish, whatever the padded weights hold) and 32-row groups, the int8 ones
flipped to unsigned as the VNNI path does, with their row sums where the weights have zero points; the sums then
go through the VNNI path's epilogue (`_gemm_parts._epilogue`), so both paths give the same bits. A convolution
(`conv_tiles`) keeps the VNNI path's im2col panels of its input as the B operand (unsigned, so ``tdpbsud``) and
its weights' signed bytes as rows of whole K tiles (`conv_weights`).

Linux lets a process use the tiles' 8 KB of register state only after it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); `available` asks once. The intrinsics are module-level names (numba caches the kernels
that call them on disk), each emitting one LLVM AMX intrinsic with fixed tile numbers: tiles 0-3 hold a 32 x 32
block of sums, 4-5 the activations' two 16-row halves, 6-7 the weights' two 16-column halves.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

import numpy as np

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from qlinear.kernels._atomics import fetch_add, load_acquire, store_release  # noqa: E402
from qlinear.kernels._gemm_parts import _epilogue  # noqa: E402
from qlinear.kernels._im2col_packers import _pack_panel_strided, _pack_panel_virtual, _pad_in_parts  # noqa: E402
from qlinear.kernels._task_claims import next_in_shares, wait_for, zeros  # noqa: E402
from qlinear.kernels._vector_width import use_512_bit_vectors  # noqa: E402

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process may run AMX int8 tiles: the CPU has them, Linux granted the tile state, and the
    environment variable QLINEAR_AMX is not 0 (1, or unset: use them where measured faster)."""
    setting = os.environ.get("QLINEAR_AMX", "1")
    if setting not in ("0", "1"):
        raise ValueError(f"QLINEAR_AMX must be 0 or 1, got {setting!r}")
    if setting == "0" or platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if not (features.get("amx-tile") and features.get("amx-int8")):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def tile_config() -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, all 8 tiles of 16 rows of 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:8] = 64  # bytes per row, tiles 0-7
    cfg[48:56] = 16  # rows, tiles 0-7
    return cfg


CONFIG = tile_config()


# ---------------------------------------------------------------------------------------------- intrinsics
_I8, _I64, _VOIDP = ir.IntType(8), ir.IntType(64), ir.IntType(8).as_pointer()


def _declare(builder, name, arg_types):
    fn = builder.module.globals.get(name)
    return fn if fn is not None else ir.Function(builder.module, ir.FunctionType(ir.VoidType(), arg_types), name)


def _byte_pointer(context, builder, array_type, array, offset):
    """&array's bytes + offset (a uint8 array, offset in bytes)."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), _VOIDP)


def _uint8_array(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.uint8


def _load(tile):
    def codegen(context, builder, signature, args):
        pointer = _byte_pointer(context, builder, signature.args[0], args[0],
                                context.cast(builder, args[1], signature.args[1], types.int64))
        stride = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.call(_declare(builder, "llvm.x86.tileloadd64", [_I8, _VOIDP, _I64]),
                     [ir.Constant(_I8, tile), pointer, stride])
    return codegen


def _store(tile):
    def codegen(context, builder, signature, args):
        pointer = _byte_pointer(context, builder, signature.args[0], args[0],
                                context.cast(builder, args[1], signature.args[1], types.int64))
        stride = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.call(_declare(builder, "llvm.x86.tilestored64", [_I8, _VOIDP, _I64]),
                     [ir.Constant(_I8, tile), pointer, stride])
    return codegen


def _zero_sums(context, builder, signature, args):
    fn = _declare(builder, "llvm.x86.tilezero", [_I8])
    for tile in range(4):
        builder.call(fn, [ir.Constant(_I8, tile)])


def _dot4(context, builder, signature, args):
    fn = _declare(builder, "llvm.x86.tdpbusd", [_I8, _I8, _I8])
    for c, a, b in ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)):
        builder.call(fn, [ir.Constant(_I8, c), ir.Constant(_I8, a), ir.Constant(_I8, b)])


def _dot4_su(context, builder, signature, args):
    fn = _declare(builder, "llvm.x86.tdpbsud", [_I8, _I8, _I8])
    for c, a, b in ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)):
        builder.call(fn, [ir.Constant(_I8, c), ir.Constant(_I8, a), ir.Constant(_I8, b)])


@intrinsic
def configure(typingctx, cfg):
    """ldtilecfg from cfg (64 uint8, `tile_config`): each thread, before its first tile instruction."""
    if not _uint8_array(cfg):
        return None

    def codegen(context, builder, signature, args):
        pointer = _byte_pointer(context, builder, signature.args[0], args[0], ir.Constant(_I64, 0))
        builder.call(_declare(builder, "llvm.x86.ldtilecfg", [_VOIDP]), [pointer])
    return types.void(cfg), codegen


@intrinsic
def release(typingctx):
    """tilerelease: the thread's tile state back to its initial, unused form."""
    def codegen(context, builder, signature, args):
        builder.call(_declare(builder, "llvm.x86.tilerelease", []), [])
    return types.void(), codegen


@intrinsic
def zero_sums(typingctx):
    """Tiles 0-3 (a 32 x 32 block of int32 sums) set to 0."""
    return types.void(), _zero_sums


@intrinsic
def load_a0(typingctx, a, offset, stride):
    """Tile 4: 16 rows of 64 activation bytes from a (uint8) at byte offset, rows stride bytes apart."""
    return (types.void(a, offset, stride), _load(4)) if _uint8_array(a) else None


@intrinsic
def load_a1(typingctx, a, offset, stride):
    """Tile 5: as load_a0, the block's second 16 rows."""
    return (types.void(a, offset, stride), _load(5)) if _uint8_array(a) else None


@intrinsic
def load_b0(typingctx, b, offset, stride):
    """Tile 6: 16 K steps of 16 weight columns (4 signed bytes each) from b (uint8 view) at byte offset."""
    return (types.void(b, offset, stride), _load(6)) if _uint8_array(b) else None


@intrinsic
def load_b1(typingctx, b, offset, stride):
    """Tile 7: as load_b0, the block's second 16 columns."""
    return (types.void(b, offset, stride), _load(7)) if _uint8_array(b) else None


@intrinsic
def dot4(typingctx):
    """Tiles 0-3 += the four products of tiles 4-5 (activations) by 6-7 (weights): tdpbusd, u8 x s8."""
    return types.void(), _dot4


@intrinsic
def dot4_su(typingctx):
    """As dot4 with signed tiles 4-5 (a convolution's weights) and unsigned 6-7 (its input): tdpbsud."""
    return types.void(), _dot4_su


@intrinsic
def store_c0(typingctx, c, offset, stride):
    """Tile 0 of sums (rows 0-15, columns 0-15 of the block) to c (uint8 view) at byte offset, rows stride apart."""
    return (types.void(c, offset, stride), _store(0)) if _uint8_array(c) else None


@intrinsic
def store_c1(typingctx, c, offset, stride):
    """Tile 1 (rows 0-15, columns 16-31)."""
    return (types.void(c, offset, stride), _store(1)) if _uint8_array(c) else None


@intrinsic
def store_c2(typingctx, c, offset, stride):
    """Tile 2 (rows 16-31, columns 0-15)."""
    return (types.void(c, offset, stride), _store(2)) if _uint8_array(c) else None


@intrinsic
def store_c3(typingctx, c, offset, stride):
    """Tile 3 (rows 16-31, columns 16-31)."""
    return (types.void(c, offset, stride), _store(3)) if _uint8_array(c) else None


# ---------------------------------------------------------------------------------------------- kernels
@njit(cache=True, inline="always")
def _pack_rows(a, xor, k, kpad, A, rowsum, need_sum, r0, r1, m_total):
    """Rows r0...r1-1 of a (M x k uint8 bits, ^ xor) into A at a pitch of kpad bytes, zero past k (rows past
    m_total all zero); their sums of unsigned bytes into rowsum where need_sum."""
    for r in range(r0, r1):
        row = A[r * kpad:(r + 1) * kpad]
        total = np.int32(0)
        if r < m_total:
            src = a[r * k:(r + 1) * k]
            for i in range(k):
                v = src[i] ^ xor
                row[i] = v
                total += np.int32(v)
            for i in range(k, kpad):
                row[i] = 0
        else:
            for i in range(kpad):
                row[i] = 0
        # 0 where the weights have no zero points: the epilogue then takes its path without the rank-1 term
        rowsum[r] = total if need_sum else 0


@njit(cache=True, inline="always")
def _tile_block(A, lda, B, ldb_panel, cb, ldc, g_lo, g_hi, j_lo, j_hi, kpad, signed_a):
    """Sums of row groups g_lo...g_hi-1 (32 rows of A, lda bytes apart) by panels j_lo...j_hi-1 (B's panel jp at
    byte jp * ldb_panel, K steps 128 bytes apart) into cb (int32 bytes, rows ldc int32 apart), kpad bytes of K."""
    for jp in range(j_lo, j_hi):
        b0 = jp * ldb_panel
        for g in range(g_lo, g_hi):
            zero_sums()
            a0 = g * 32 * lda
            for s in range(0, kpad, 64):
                load_a0(A, a0 + s, lda)
                load_a1(A, a0 + 16 * lda + s, lda)
                load_b0(B, b0 + s * 32, 128)
                load_b1(B, b0 + s * 32 + 64, 128)
                if signed_a:
                    dot4_su()
                else:
                    dot4()
            c0 = ((g - g_lo) * 32 * ldc + (jp - j_lo) * 32) * 4
            store_c0(cb, c0, ldc * 4)
            store_c1(cb, c0 + 64, ldc * 4)
            store_c2(cb, c0 + 16 * ldc * 4, ldc * 4)
            store_c3(cb, c0 + 16 * ldc * 4 + 64, ldc * 4)


@njit(cache=True, inline="always")
def _tile_task(t, A, lda, B, ldb_panel, kpad, signed_a, m_total, n_total, mb, nb, rterm, cterm, u1, v1, u2, v2, mult,
               mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8):
    """GEMM task t of a region (_drivers' order: M block t % blocks along M of N block t // that): its block of
    mb 32-row groups of A by nb 32-column panels of B (`_tile_block`), then one epilogue over it, the VNNI
    path's (C = sums + rterm[i] + cterm[j] - u1[i] v1[j] - u2[i] v2[j], stored or requantized)."""
    groups = (m_total + 31) // 32
    npn = (n_total + 31) // 32
    n_mblocks = (groups + mb - 1) // mb
    g_lo = (t % n_mblocks) * mb
    g_hi = min(groups, g_lo + mb)
    j_lo = (t // n_mblocks) * nb
    j_hi = min(npn, j_lo + nb)
    ldc = (j_hi - j_lo) * 32
    cbuf = np.empty((g_hi - g_lo) * 32 * ldc, np.int32)
    _tile_block(A, lda, B, ldb_panel, cbuf.view(np.uint8), ldc, g_lo, g_hi, j_lo, j_hi, kpad, signed_a)
    i0 = g_lo * 32
    j0 = j_lo * 32
    accrow = np.empty(ldc, np.int32)
    _epilogue(cbuf, ldc, i0, j0, min((g_hi - g_lo) * 32, m_total - i0), min(ldc, n_total - j0), rterm, cterm, u1,
              v1, u2, v2, mult, mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8, accrow)


@njit(cache=True, parallel=True)
def gemm_tiles(a, xor, k, need_sum, B, ks16, m_total, n_total, mb, nb, n_workers, rterm, cterm, v1, u2, v2, mult,
               mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8, cfg):
    """C = a @ w (the VNNI path's operands and epilogue, see the module docstring) in one parallel region: the
    activations' 32-row groups copied by the first tasks, then blocks of mb row groups by nb 32-column panels,
    each worker its own share of them first. B: the weights' panels [panel][ks16][32] int32 as uint8 bytes."""
    kpad = ks16 * 4
    groups = (m_total + 31) // 32
    n_gemm = ((groups + mb - 1) // mb) * (((n_total + 31) // 32 + nb - 1) // nb)
    A = np.empty(groups * 32 * kpad, np.uint8)
    rowsum = np.empty(groups * 32, np.int32)
    # claim[0]: the next row group to copy; claim[1]: the groups copied; claim[8 + 8 w]: worker w's share
    claim = zeros(8 + 8 * n_workers)
    for _worker in prange(n_workers):
        while True:
            t = fetch_add(claim, 0, 1)
            if t >= groups:
                break
            _pack_rows(a, xor, k, kpad, A, rowsum, need_sum, t * 32, t * 32 + 32, m_total)
            fetch_add(claim, 1, 1)
        while load_acquire(claim, 1) < groups:
            pass
        configure(cfg)
        t, r = next_in_shares(claim, 8, 8, n_gemm, n_workers, _worker, 0)
        while t >= 0:
            _tile_task(t, A, kpad, B, ks16 * 128, kpad, False, m_total, n_total, mb, nb, rterm, cterm, rowsum, v1,
                       u2, v2, mult, mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8)
            t, r = next_in_shares(claim, 8, 8, n_gemm, n_workers, _worker, r)
        release()


@njit(cache=True, parallel=True)
def conv_tiles(W, ksteps, m_total, n_total, mb, nb, n_workers, xp, x, pad, koff, k, virtual, n_img, img_stride,
               chan_off, pan_per_img, od_n, oh_n, ow_n, sd, sh, sw, hpwp, wp, need_sum, rterm, cterm, u1, u2, v2,
               mult, mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8, cfg):
    """The convolution of _drivers.CONV_TEMPLATE (the same arguments, the padding and the im2col panels of 32
    columns of the VNNI packers, the same epilogue) with its GEMM on tiles: W the weights' signed bytes as rows
    of whole 64-byte K tiles (`conv_weights`), multiplied by tdpbsud, blocks of mb 32-row groups by nb panels.
    The panels keep the packers' ksteps; a K tile's rows past them read the next panel (or the slack past the
    last), which W's zero columns cancel."""
    nr = 32
    kpad = (ksteps + 15) // 16 * 64
    npn = (n_total + nr - 1) // nr
    n_mblocks = ((m_total + 31) // 32 + mb - 1) // mb
    n_gemm = n_mblocks * ((npn + nb - 1) // nb)
    Q = np.empty(npn * ksteps * nr + 16 * nr, np.int32)
    colsum = np.empty(npn * nr, np.int32)
    ready = zeros(npn)
    # claim[1], claim[2]: the padding's parts (_pad_in_parts); per worker w, claim[8 + 16 w] and claim[16 + 16 w]:
    # the next panel and the next GEMM task of w's share
    claim = zeros(8 + 16 * n_workers)
    for _worker in prange(n_workers):
        use_512_bit_vectors()
        segs = np.empty((3, nr), np.int64)
        _pad_in_parts(x, xp, pad, claim)
        jp, r = next_in_shares(claim, 8, 16, npn, n_workers, _worker, 0)
        while jp >= 0:
            if virtual:
                _pack_panel_virtual(Q, colsum, jp, xp, koff, k, 4, nr, img_stride, chan_off, pan_per_img, need_sum)
            else:
                _pack_panel_strided(Q, colsum, jp, segs, xp, koff, k, 4, nr, n_img, img_stride, chan_off, od_n,
                                    oh_n, ow_n, sd, sh, sw, hpwp, wp, need_sum)
            store_release(ready, jp, 1)
            jp, r = next_in_shares(claim, 8, 16, npn, n_workers, _worker, r)
        configure(cfg)
        B = Q.view(np.uint8)
        t, r = next_in_shares(claim, 16, 16, n_gemm, n_workers, _worker, 0)
        while t >= 0:
            jb = t // n_mblocks
            wait_for(ready, jb * nb, min(npn, jb * nb + nb))
            _tile_task(t, W, kpad, B, ksteps * nr * 4, kpad, True, m_total, n_total, mb, nb, rterm, cterm, u1,
                       colsum, u2, v2, mult, mult_rs, mult_cs, mode, yzp, qmin, qmax, row_off, col_off, out32, out8)
            t, r = next_in_shares(claim, 16, 16, n_gemm, n_workers, _worker, r)
        release()


def conv_weights(w_rows: np.ndarray) -> tuple[np.ndarray, int]:
    """``conv_tiles``' W for one group's weights (M x K rows, int8 or uint8: uint8 flipped to its signed view,
    as the packers read it): rows padded to 32, K to whole 64-byte tiles with zeros, as uint8 bytes; and the
    row pitch in bytes."""
    m, k = w_rows.shape
    kpad = -(-(-(-k // 4)) // 16) * 64
    out = np.zeros((-(-m // 32) * 32, kpad), np.uint8)
    out[:m, :k] = w_rows.view(np.uint8) ^ np.uint8(0x80 if w_rows.dtype == np.uint8 else 0)
    return out.reshape(-1), kpad
