// The AMX kernels (bf16 tiles, fp32 accumulation) of gru_kernels.cpp, compiled in their own
// translation unit, gru_amx.cpp: a compiler without AMX support (GCC before 11) cannot build
// that file, and gru_kernels.py then builds the rest with IAA_NO_AMX, where gru_kernels.cpp
// defines these functions as stubs (amx_usable() is false, so none of the others is called).
#pragma once

#include <ATen/ATen.h>
#include <cstdint>

// Whether the CPU has AMX-BF16, AMX-TILE and AVX512-BF16 and the OS granted the tile state.
bool amx_usable();

// C (n x N, fp32, row stride N; rows up to n rounded up to 32 are written) = A (n x K, row stride
// lda; fp32, rounded to bf16 into a_buf, or bf16, copied there) B, with B packed (pack_vnni) in
// bf16. a_buf holds 32-row blocks of K columns. K % 32 == 0, N % 32 == 0.
void amx_gemm(const float* A, int64_t n, int64_t K, int64_t lda, const at::BFloat16* B, int64_t N, float* C,
              at::BFloat16* a_buf);
void amx_gemm(const at::BFloat16* A, int64_t n, int64_t K, int64_t lda, const at::BFloat16* B, int64_t N,
              float* C, at::BFloat16* a_buf);

// Rows k and k + 1 of one 16-column block, interleaved: (b[k, j], b[k + 1, j]) for j < 16.
void pack_pairs(const float* row0, const float* row1, at::BFloat16* out);

// W (N, K) fp32 -> W^T packed as pack_vnni packs it: (N / 16, K / 2, 16, 2).
void pack_transposed(const float* w, int64_t N, int64_t K, at::BFloat16* out);
