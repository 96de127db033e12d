"""numba kernels: integer GEMM and im2col (integer_gemm, im2col), element-wise kernels."""
