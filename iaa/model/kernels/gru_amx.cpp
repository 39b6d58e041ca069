// AMX kernels of gru_kernels.cpp (see gru_amx.h): bf16 tiles with fp32 accumulation, for
// precision bf16 on CPUs that have AMX. Compiled on its own, so that only this file needs a
// compiler that knows the AMX instructions.
#include "gru_amx.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstring>
#include <vector>

#define IAA_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16,amx-tile,amx-bf16")))

static bool avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool amx_usable() {
  // CPUID leaf 7: AMX-BF16 (EDX 22), AMX-TILE (EDX 24); sub-leaf 1: AVX512-BF16 (EAX 5). Linux
  // then grants the tile data state to the process on request (arch_prctl ARCH_REQ_XCOMP_PERM).
  static const bool yes = [] {
    unsigned a, b, c, d, a1, b1, c1, d1;
    if (!avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
      return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24)) || !(a1 & (1u << 5))) return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }();
  return yes;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

IAA_AMX static inline void to_bf16_row(const float* src, at::BFloat16* dst, int64_t K) {
  for (int64_t k = 0; k < K; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + k)));
}
IAA_AMX static inline void to_bf16_row(const at::BFloat16* src, at::BFloat16* dst, int64_t K) {
  std::memcpy(dst, src, K * sizeof(at::BFloat16));
}

template <typename A_t>
IAA_AMX static void gemm(const A_t* A, int64_t n, int64_t K, int64_t lda, const at::BFloat16* B,
                         int64_t N, float* C, at::BFloat16* a_buf) {
  const int64_t rows = (n + 31) / 32 * 32;
  for (int64_t i = 0; i < n; ++i) to_bf16_row(A + i * lda, a_buf + i * K, K);
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  const auto* b = reinterpret_cast<const char*>(B);
  const auto* a = reinterpret_cast<const char*>(a_buf);
  const int64_t b_block = K / 2 * 64;                    // bytes of one 16-column block of B
  for (int64_t r0 = 0; r0 < rows; r0 += 32) {
    for (int64_t c0 = 0; c0 < N / 16; c0 += 2) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t k0 = 0; k0 < K; k0 += 32) {
        _tile_loadd(4, a + (r0 * K + k0) * 2, K * 2);
        _tile_loadd(5, a + ((r0 + 16) * K + k0) * 2, K * 2);
        _tile_loadd(6, b + c0 * b_block + k0 * 32, 64);
        _tile_loadd(7, b + (c0 + 1) * b_block + k0 * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, C + r0 * N + c0 * 16, N * 4);
      _tile_stored(1, C + r0 * N + (c0 + 1) * 16, N * 4);
      _tile_stored(2, C + (r0 + 16) * N + c0 * 16, N * 4);
      _tile_stored(3, C + (r0 + 16) * N + (c0 + 1) * 16, N * 4);
    }
  }
  _tile_release();
}

void amx_gemm(const float* A, int64_t n, int64_t K, int64_t lda, const at::BFloat16* B, int64_t N, float* C,
              at::BFloat16* a_buf) {
  gemm(A, n, K, lda, B, N, C, a_buf);
}

void amx_gemm(const at::BFloat16* A, int64_t n, int64_t K, int64_t lda, const at::BFloat16* B, int64_t N,
              float* C, at::BFloat16* a_buf) {
  gemm(A, n, K, lda, B, N, C, a_buf);
}

IAA_AMX void pack_pairs(const float* row0, const float* row1, at::BFloat16* out) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row1), _mm512_loadu_ps(row0));
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(order, both));
}

// W (N, K) fp32 -> W^T packed as pack_vnni packs it: (N / 16, K / 2, 16, 2). In the VNNI layout a
// column pair of W^T is a pair of adjacent elements of one row of W, so each 16-row block of W is
// rounded to bf16 row by row and its 32-bit pairs transposed: no transposed copy of W.
IAA_AMX void pack_transposed(const float* w, int64_t N, int64_t K, at::BFloat16* out) {
  std::vector<uint32_t> rows(16 * K / 2);
  auto* dst = reinterpret_cast<uint32_t*>(out);
  for (int64_t c = 0; c < N / 16; ++c) {
    for (int64_t j = 0; j < 16; ++j)
      for (int64_t k = 0; k < K; k += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.data() + j * K / 2 + k / 2),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(w + (c * 16 + j) * K + k)));
    for (int64_t kp = 0; kp < K / 2; ++kp)
      for (int64_t j = 0; j < 16; ++j) dst[(c * (K / 2) + kp) * 16 + j] = rows[j * K / 2 + kp];
  }
}
#endif
