#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <cmath>
#include <cstring>
#include <vector>

#include "gru_amx.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define IAA_X86 1
#endif

#if !defined(IAA_X86) || defined(IAA_NO_AMX)
// Built without gru_amx.cpp (another architecture, or a compiler without AMX): no AMX, and the
// AMX functions are never called.
bool amx_usable() { return false; }
void amx_gemm(const float*, int64_t, int64_t, int64_t, const at::BFloat16*, int64_t, float*, at::BFloat16*) {
  TORCH_CHECK(false, "built without AMX");
}
void amx_gemm(const at::BFloat16*, int64_t, int64_t, int64_t, const at::BFloat16*, int64_t, float*, at::BFloat16*) {
  TORCH_CHECK(false, "built without AMX");
}
void pack_pairs(const float*, const float*, at::BFloat16*) { TORCH_CHECK(false, "built without AMX"); }
void pack_transposed(const float*, int64_t, int64_t, at::BFloat16*) { TORCH_CHECK(false, "built without AMX"); }
#endif

// Packed layout of fused_gru.py: tensors (2, N, k) for the two directions d; rows [off, off + n)
// hold step t, rows [prev, prev + n) the same sequences at step t - 1. h = hidden size. The two
// directions are independent, so each runs its whole loop in one at::parallel_for task (one
// direction per thread when torch has two threads, else one after the other).

// body(d) for both directions d, in one parallel region: one direction per thread when torch
// has two threads. The workers get the caller's thread-local state (grad / inference mode). Under
// a Python dispatch mode (e.g. FlopCounterMode) every op calls into Python, which only the thread
// holding the GIL may do, so both directions then run here, one after the other.
template <typename F>
static void for_each_direction(const F& body) {
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) {
    body(0);
    body(1);
    return;
  }
  const at::ThreadLocalState tls;
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(tls);
    for (int64_t d = begin; d < end; ++d) body(d);
  });
}

#ifdef IAA_X86
// ---- x86 fast paths, chosen at run time (the build itself targets generic x86-64) -------------
// AVX-512: one fused loop per step for the gate arithmetic, with the same vectorised exp and
// tanh (Sleef, exported by libtorch) as ATen's sigmoid_ and tanh_ kernels; it reads the input
// projections in fp32 or bf16. AMX (gru_amx.cpp): the recurrent matmuls with bf16 operands and
// fp32 accumulation, for precision bf16 only.
#define IAA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

extern "C" __m512 Sleef_expf16_u10(__m512);
extern "C" __m512 Sleef_tanhf16_u10(__m512);

static bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return yes;
}

IAA_AVX512 static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
IAA_AVX512 static inline __m512 load16(const at::BFloat16* p) {     // bf16 -> fp32 is exact
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
IAA_AVX512 static inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// Round to bf16, nearest even (as torch's conversion, for finite values), with AVX-512F only.
IAA_AVX512 static inline void store_bf16(at::BFloat16* p, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}
IAA_AVX512 static inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
IAA_AVX512 static inline void store16(at::BFloat16* p, __m512 v) { store_bf16(p, v); }

// One step of one direction, n rows: [r, z] = sigmoid(gi_rz + b_rz + gh_rz), hn = gh_n + b_hn,
// cand = tanh(gi_n + b_n + r * hn), h_t = cand + z (h_{t-1} - cand). Row i's gi is gi + i * 3h,
// or gi + gi_rows[i] * 3h when gi_rows is given (a per-word table). b_in may be null (already in
// gi); hprev null means h_{t-1} = 0; rz, cand, hn null: not kept (inference). h_t also goes to
// y + y_rows[i] when y_rows is given. h % 16 == 0.
template <typename In>
IAA_AVX512 static void step_avx512(const In* gi, const int64_t* gi_rows, const float* b_in, const float* gh,
                                   const float* b_hn, const float* hprev, float* out, float* rz, float* cand,
                                   float* hn, float* y, const int64_t* y_rows, int64_t n, int64_t h) {
  for (int64_t i = 0; i < n; ++i) {
    const In* a = gi + (gi_rows ? gi_rows[i] : i) * 3 * h;
    const float* g = gh + i * 3 * h;
    for (int64_t j = 0; j < h; j += 16) {
      __m512 pr = _mm512_add_ps(load16(a + j), _mm512_loadu_ps(g + j));
      __m512 pz = _mm512_add_ps(load16(a + h + j), _mm512_loadu_ps(g + h + j));
      __m512 pn = load16(a + 2 * h + j);
      if (b_in) {
        pr = _mm512_add_ps(pr, _mm512_loadu_ps(b_in + j));
        pz = _mm512_add_ps(pz, _mm512_loadu_ps(b_in + h + j));
        pn = _mm512_add_ps(pn, _mm512_loadu_ps(b_in + 2 * h + j));
      }
      const __m512 r = sigmoid16(pr), z = sigmoid16(pz);
      const __m512 x = _mm512_add_ps(_mm512_loadu_ps(g + 2 * h + j), _mm512_loadu_ps(b_hn + j));
      const __m512 c = Sleef_tanhf16_u10(_mm512_fmadd_ps(r, x, pn));
      const __m512 p = hprev ? _mm512_loadu_ps(hprev + i * h + j) : _mm512_setzero_ps();
      const __m512 h_t = _mm512_fmadd_ps(z, _mm512_sub_ps(p, c), c);
      _mm512_storeu_ps(out + i * h + j, h_t);
      if (y_rows) _mm512_storeu_ps(y + y_rows[i] + j, h_t);
      if (rz) {
        _mm512_storeu_ps(rz + i * 2 * h + j, r);
        _mm512_storeu_ps(rz + i * 2 * h + h + j, z);
        _mm512_storeu_ps(cand + i * h + j, c);
        _mm512_storeu_ps(hn + i * h + j, x);
      }
    }
  }
}

// The gradients of one step (as step_grads below), vectorised; d_gh and d_gi in fp32 or bf16,
// with fp32 sums over the rows: d_gh's into bh_sum (b_hh's gradient) and the candidate
// pre-activations' into bn_sum (the n part of b_ih's gradient). h % 16 == 0.
template <typename Out>
IAA_AVX512 static void step_grads_avx512(const float* d_out, float* carry, int64_t carry_n, const float* hprev,
                                         const float* rz, const float* cand, const float* hn, Out* d_gh,
                                         Out* d_gi, float* bh_sum, float* bn_sum, int64_t n, int64_t h) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < h; j += 16) {
      __m512 dh = _mm512_loadu_ps(d_out + i * h + j);
      if (i < carry_n) dh = _mm512_add_ps(dh, _mm512_loadu_ps(carry + i * h + j));
      const __m512 r = _mm512_loadu_ps(rz + i * 2 * h + j), z = _mm512_loadu_ps(rz + i * 2 * h + h + j);
      const __m512 c = _mm512_loadu_ps(cand + i * h + j), x = _mm512_loadu_ps(hn + i * h + j);
      const __m512 p = hprev ? _mm512_loadu_ps(hprev + i * h + j) : _mm512_setzero_ps();
      const __m512 d_cpre = _mm512_mul_ps(_mm512_mul_ps(dh, _mm512_sub_ps(one, z)), _mm512_fnmadd_ps(c, c, one));
      const __m512 d_r = _mm512_mul_ps(_mm512_mul_ps(d_cpre, x), _mm512_mul_ps(r, _mm512_sub_ps(one, r)));
      const __m512 d_z = _mm512_mul_ps(_mm512_mul_ps(dh, _mm512_sub_ps(p, c)), _mm512_mul_ps(z, _mm512_sub_ps(one, z)));
      Out* gh = d_gh + i * 3 * h;
      Out* gx = d_gi + i * 3 * h;
      const __m512 d_hn = _mm512_mul_ps(d_cpre, r);
      store16(gh + j, d_r);
      store16(gh + h + j, d_z);
      store16(gh + 2 * h + j, d_hn);
      _mm512_storeu_ps(bh_sum + j, _mm512_add_ps(_mm512_loadu_ps(bh_sum + j), d_r));
      _mm512_storeu_ps(bh_sum + h + j, _mm512_add_ps(_mm512_loadu_ps(bh_sum + h + j), d_z));
      _mm512_storeu_ps(bh_sum + 2 * h + j, _mm512_add_ps(_mm512_loadu_ps(bh_sum + 2 * h + j), d_hn));
      store16(gx + j, d_r);
      store16(gx + h + j, d_z);
      store16(gx + 2 * h + j, d_cpre);
      _mm512_storeu_ps(bn_sum + j, _mm512_add_ps(_mm512_loadu_ps(bn_sum + j), d_cpre));
      _mm512_storeu_ps(carry + i * h + j, _mm512_mul_ps(dh, z));
    }
  }
}

// d_x (positions, d) fp32 = zeros, then row pos[0][k] = src[0][k] and row pos[1][k] += src[1][k]:
// the two directions' input gradients (2, rows, d), fp32 or bf16, of which the first N rows of
// each direction are read, back in the padded layout. d % 16 == 0.
template <typename In>
IAA_AVX512 static void scatter_rows_avx512(const In* src, int64_t rows, const int64_t* pos, int64_t N, int64_t d,
                                           float* dst) {
  for (int64_t k = 0; k < N; ++k)
    for (int64_t j = 0; j < d; j += 16) _mm512_storeu_ps(dst + pos[k] * d + j, load16(src + k * d + j));
  for (int64_t k = 0; k < N; ++k) {
    float* row = dst + pos[N + k] * d;
    for (int64_t j = 0; j < d; j += 16)
      _mm512_storeu_ps(row + j, _mm512_add_ps(_mm512_loadu_ps(row + j), load16(src + (rows + k) * d + j)));
  }
}

#endif

// B (d, K, N) fp32 -> (d, N / 16, K / 2, 16, 2) bf16: per 16-column block, K / 2 rows of 16
// column pairs (b[2k, j], b[2k + 1, j]), the layout amx_gemm's tile loads read. Rounded to
// nearest even, as torch's conversion (vectorised where the CPU has AVX512-BF16).
static torch::Tensor pack_vnni(const torch::Tensor& b) {
  const auto src = b.to(at::kFloat).contiguous();
  const int64_t D = src.size(0), K = src.size(1), N = src.size(2);
  auto out = at::empty({D, N / 16, K / 2, 16, 2}, src.options().dtype(at::kBFloat16));
  const float* s = src.data_ptr<float>();
  at::BFloat16* o = out.data_ptr<at::BFloat16>();
#ifdef IAA_X86
  if (amx_usable()) {
    for (int64_t d = 0; d < D; ++d)                  // reads row pairs in order: each is contiguous
      for (int64_t k = 0; k < K; k += 2)
        for (int64_t c = 0; c < N / 16; ++c)
          pack_pairs(s + (d * K + k) * N + c * 16, s + (d * K + k + 1) * N + c * 16,
                     o + ((d * (N / 16) + c) * (K / 2) + k / 2) * 32);
    return out;
  }
#endif
  for (int64_t d = 0; d < D; ++d)
    for (int64_t c = 0; c < N / 16; ++c)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < 16; ++j)
          o[(((d * (N / 16) + c) * (K / 2) + k / 2) * 16 + j) * 2 + k % 2] = at::BFloat16(s[(d * K + k) * N + c * 16 + j]);
  return out;
}

#ifndef IAA_X86
static bool has_avx512() { return false; }
#endif

bool fast_paths(int64_t h) { return has_avx512() && h % 16 == 0; }
bool amx_paths(int64_t h) { return amx_usable() && h % 32 == 0; }

torch::Tensor amx_matmul(torch::Tensor a, torch::Tensor b, int64_t repeats) {
  // a (n, K) times b (K, N), fp32, with bf16-rounded operands: what the recurrence's AMX path
  // computes. b is packed once, then the product is computed `repeats` times (for timing).
  const int64_t n_cols = b.size(1);
  TORCH_CHECK(amx_paths(a.size(1)) && n_cols % 32 == 0, "AMX is not usable here");
  a = a.contiguous();
  const auto b_packed = pack_vnni(b.unsqueeze(0));
  const int64_t n = a.size(0), K = a.size(1), rows = (n + 31) / 32 * 32;
  auto c = at::empty({rows, n_cols}, a.options());
  auto buf = at::zeros({rows, K}, a.options().dtype(at::kBFloat16));
#ifdef IAA_X86
  for (int64_t i = 0; i < repeats; ++i)
    amx_gemm(a.data_ptr<float>(), n, K, K, b_packed.data_ptr<at::BFloat16>(), n_cols, c.data_ptr<float>(),
             buf.data_ptr<at::BFloat16>());
#endif
  return c.narrow(0, 0, n);
}

template <typename T>
static void gate_preacts(const T* gi, const T* gh, T* rz, int64_t n, int64_t h) {
  // gi, rz: this direction's rows of step t; gh: (n, 3h). rz <- [r, z] pre-activations.
  for (int64_t i = 0; i < n; ++i) {
    const T* __restrict__ a = gi + i * 3 * h;
    const T* __restrict__ b = gh + i * 3 * h;
    T* __restrict__ o = rz + i * 2 * h;
    for (int64_t j = 0; j < 2 * h; ++j) o[j] = a[j] + b[j];
  }
}

template <typename T>
static void cand_preacts(const T* gi, const T* gh, const T* b_hn, const T* rz, T* hn, T* cand,
                         int64_t n, int64_t h) {
  // hn <- W_hn h_{t-1} + b_hn; cand <- its pre-activation W_in x + b_in + r * hn.
  for (int64_t i = 0; i < n; ++i) {
    const T* __restrict__ a = gi + i * 3 * h + 2 * h;
    const T* __restrict__ b = gh + i * 3 * h + 2 * h;
    const T* __restrict__ r = rz + i * 2 * h;
    T* __restrict__ x = hn + i * h;
    T* __restrict__ c = cand + i * h;
    for (int64_t j = 0; j < h; ++j) {
      x[j] = b[j] + b_hn[j];
      c[j] = a[j] + r[j] * x[j];
    }
  }
}

template <typename T>
static void new_state(const T* rz, const T* cand, const T* hprev, T* out, int64_t n, int64_t h) {
  // h_t = n + z (h_{t-1} - n); hprev == nullptr means h_{t-1} = 0.
  for (int64_t i = 0; i < n; ++i) {
    const T* __restrict__ z = rz + i * 2 * h + h;
    const T* __restrict__ c = cand + i * h;
    T* __restrict__ o = out + i * h;
    if (hprev) {
      const T* __restrict__ p = hprev + i * h;
      for (int64_t j = 0; j < h; ++j) o[j] = c[j] + z[j] * (p[j] - c[j]);
    } else {
      for (int64_t j = 0; j < h; ++j) o[j] = c[j] - z[j] * c[j];
    }
  }
}

template <typename T>
static void forward_steps(const torch::Tensor& gi, const torch::Tensor& w_hh_t, const T* b_hn,
                          torch::Tensor& out, torch::Tensor& rz, torch::Tensor& cand, T* hn,
                          const std::vector<int64_t>& sizes, const std::vector<int64_t>& offsets) {
  const int64_t N = gi.size(1), h = gi.size(2) / 3;
  const T* gi_p = gi.data_ptr<T>();
  T *out_p = out.data_ptr<T>(), *rz_p = rz.data_ptr<T>(), *cand_p = cand.data_ptr<T>();
  const torch::Tensor out_d[2] = {out[0], out[1]}, w_d[2] = {w_hh_t[0], w_hh_t[1]};
  const torch::Tensor rz_d[2] = {rz[0], rz[1]}, cand_d[2] = {cand[0], cand[1]};
  const auto gh_buf = at::zeros({2, sizes.empty() ? 0 : sizes[0], 3 * h}, gi.options());  // h_{t-1} W_hh^T
  const torch::Tensor gh_d[2] = {gh_buf[0], gh_buf[1]};
  // Each direction's whole loop is one task: the threads never wait for each other between steps.
  for_each_direction([&](int64_t d) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      const int64_t n = sizes[t], off = offsets[t], prev = t ? offsets[t - 1] : 0;
      auto gh = gh_d[d].narrow(0, 0, n);                                      // (n, 3h); 0 at t = 0
      if (t) at::mm_out(gh, out_d[d].narrow(0, prev, n), w_d[d]);
      const T* g = gh.data_ptr<T>();
      const T* x = gi_p + (d * N + off) * 3 * h;
      T* gates = rz_p + (d * N + off) * 2 * h;
      T* c = cand_p + (d * N + off) * h;
      gate_preacts<T>(x, g, gates, n, h);
      rz_d[d].narrow(0, off, n).sigmoid_();
      cand_preacts<T>(x, g, b_hn + d * h, gates, hn + (d * N + off) * h, c, n, h);
      cand_d[d].narrow(0, off, n).tanh_();
      new_state<T>(gates, c, t ? out_p + (d * N + prev) * h : nullptr,
                   out_p + (d * N + off) * h, n, h);
    }
  });
}

#ifdef IAA_X86
// The recurrence with the fused AVX-512 step, gh = h_{t-1} W_hh^T by AMX (w_packed) or ATen.
// Direction d's input projections start at gi + d * gi_rows * 3h: packed rows of gi (2, N, 3h)
// (gi_rows = N), or rows of a per-word table (2, V, 3h) (gi_rows = V) at words (2, N). b_in: added
// when not null; rz, cand, hn: kept when not null; y, y_rows (2, N): states also written there.
template <typename In>
static void recurrence_fast(const In* gi, int64_t gi_rows, const int64_t* words, const float* b_in,
                            const torch::Tensor& w_hh_t, const at::BFloat16* w_packed, const float* b_hn,
                            torch::Tensor& out, float* rz, float* cand, float* hn, float* y,
                            const int64_t* y_rows, const std::vector<int64_t>& sizes,
                            const std::vector<int64_t>& offsets) {
  const int64_t N = out.size(1), h = out.size(2), rows = sizes.empty() ? 0 : (sizes[0] + 31) / 32 * 32;
  float* out_p = out.data_ptr<float>();
  const torch::Tensor out_d[2] = {out[0], out[1]}, w_d[2] = {w_hh_t[0], w_hh_t[1]};
  const auto gh_buf = at::zeros({2, rows, 3 * h}, out.options());           // 0 at t = 0
  const auto a_buf = at::zeros({2, rows, h}, out.options().dtype(at::kBFloat16));
  const torch::Tensor gh_d[2] = {gh_buf[0], gh_buf[1]};
  for_each_direction([&](int64_t d) {
    float* g = gh_buf.data_ptr<float>() + d * rows * 3 * h;
    const In* gi_d = gi + d * gi_rows * 3 * h;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const int64_t n = sizes[t], off = offsets[t], prev = t ? offsets[t - 1] : 0, row = d * N + off;
      const float* hprev = t ? out_p + (d * N + prev) * h : nullptr;
      if (t && w_packed)
        amx_gemm(hprev, n, h, h, w_packed + d * h * 3 * h, 3 * h, g, a_buf.data_ptr<at::BFloat16>() + d * rows * h);
      else if (t) {
        auto gh = gh_d[d].narrow(0, 0, n);
        at::mm_out(gh, out_d[d].narrow(0, prev, n), w_d[d]);
      }
      step_avx512<In>(words ? gi_d : gi_d + off * 3 * h, words ? words + row : nullptr,
                      b_in ? b_in + d * 3 * h : nullptr, g, b_hn + d * h, hprev, out_p + row * h,
                      rz ? rz + row * 2 * h : nullptr, rz ? cand + row * h : nullptr,
                      rz ? hn + row * h : nullptr, y ? y + d * h : nullptr, y ? y_rows + row : nullptr, n, h);
    }
  });
}
#endif

torch::Tensor gru_infer(torch::Tensor table, torch::Tensor words, torch::Tensor pos, torch::Tensor w_hh_t,
                        bool amx, torch::Tensor b_hn, std::vector<int64_t> sizes,
                        std::vector<int64_t> offsets, int64_t positions) {
  // The recurrence for inference, reading the input projections from the per-word table (2, V, 3h)
  // (fp32 or bf16) at words (2, N), and writing h_t straight to its place pos (2, N) in the
  // (positions, 2h) fp32 result, zero elsewhere. Needs fast_paths(h).
  const int64_t N = words.size(1), h = w_hh_t.size(1);
  TORCH_CHECK(fast_paths(h) && table.dim() == 3 && table.size(0) == 2, "gru_infer needs the AVX-512 path");
  table = table.contiguous(); w_hh_t = w_hh_t.to(at::kFloat).contiguous(); b_hn = b_hn.to(at::kFloat).contiguous();
  words = words.contiguous(); pos = pos.contiguous();
  const auto y_rows = (pos * (2 * h)).contiguous();                             // element offsets
  auto out = at::empty({2, N, h}, w_hh_t.options());
  auto y = at::empty({positions, 2 * h}, w_hh_t.options());
  {                                                    // zero the padding rows only: the rest is written
    std::vector<uint8_t> real(positions, 0);
    const int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t k = 0; k < N; ++k) real[p[k]] = 1;
    float* rows = y.data_ptr<float>();
    for (int64_t r = 0; r < positions; ++r)
      if (!real[r]) std::memset(rows + r * 2 * h, 0, 2 * h * sizeof(float));
  }
#ifdef IAA_X86
  const auto w_packed = amx && amx_paths(h) ? pack_vnni(w_hh_t) : torch::Tensor();
  const at::BFloat16* packed = w_packed.defined() ? w_packed.data_ptr<at::BFloat16>() : nullptr;
  const int64_t V = table.size(1);
  if (table.scalar_type() == at::kBFloat16)
    recurrence_fast<at::BFloat16>(table.data_ptr<at::BFloat16>(), V, words.data_ptr<int64_t>(), nullptr, w_hh_t,
                                  packed, b_hn.data_ptr<float>(), out, nullptr, nullptr, nullptr,
                                  y.data_ptr<float>(), y_rows.data_ptr<int64_t>(), sizes, offsets);
  else
    recurrence_fast<float>(table.to(at::kFloat).data_ptr<float>(), V, words.data_ptr<int64_t>(), nullptr, w_hh_t,
                           packed, b_hn.data_ptr<float>(), out, nullptr, nullptr, nullptr,
                           y.data_ptr<float>(), y_rows.data_ptr<int64_t>(), sizes, offsets);
#endif
  return y;
}

std::vector<torch::Tensor> gru_forward(torch::Tensor gi, torch::Tensor b_in, torch::Tensor w_hh_t,
                                       bool amx, torch::Tensor b_hn,
                                       std::vector<int64_t> sizes, std::vector<int64_t> offsets, bool keep) {
  // gi (2, N, 3h) in fp32, fp64 or bf16, with b_hr, b_hz folded in, and b_in (2, 3h) still to add
  // (empty when gi holds it); w_hh_t (2, h, 3h); amx: the recurrent matmuls with bf16 operands on
  // AMX where amx_paths(h); b_hn (2, h). keep: also return the gates, candidates and hn (for backward); else those
  // three are empty. The state and the outputs are fp32 for bf16 inputs.
  gi = gi.contiguous(); w_hh_t = w_hh_t.contiguous(); b_hn = b_hn.contiguous();
  const int64_t N = gi.size(1), h = gi.size(2) / 3;
  const auto state = gi.scalar_type() == at::kBFloat16 ? gi.options().dtype(at::kFloat) : gi.options();
  const bool has_bias = b_in.numel() > 0;
#ifdef IAA_X86
  if (state.dtype() == at::kFloat && fast_paths(h)) {
    b_in = has_bias ? b_in.to(at::kFloat).contiguous() : b_in;
    auto out = at::empty({2, N, h}, state);
    auto rz = keep ? at::empty({2, N, 2 * h}, state) : at::empty({0}, state);
    auto cand = keep ? at::empty({2, N, h}, state) : at::empty({0}, state);
    auto hn = keep ? at::empty({2, N, h}, state) : at::empty({0}, state);
    const float* bias = has_bias ? b_in.data_ptr<float>() : nullptr;
    const auto w_packed = amx && amx_paths(h) ? pack_vnni(w_hh_t) : torch::Tensor();
    const at::BFloat16* packed = w_packed.defined() ? w_packed.data_ptr<at::BFloat16>() : nullptr;
    float *rz_p = keep ? rz.data_ptr<float>() : nullptr, *cand_p = keep ? cand.data_ptr<float>() : nullptr;
    float* hn_p = keep ? hn.data_ptr<float>() : nullptr;
    auto w = w_hh_t.to(at::kFloat);
    if (gi.scalar_type() == at::kBFloat16)
      recurrence_fast<at::BFloat16>(gi.data_ptr<at::BFloat16>(), N, nullptr, bias, w, packed, b_hn.data_ptr<float>(),
                                    out, rz_p, cand_p, hn_p, nullptr, nullptr, sizes, offsets);
    else
      recurrence_fast<float>(gi.data_ptr<float>(), N, nullptr, bias, w, packed, b_hn.data_ptr<float>(),
                             out, rz_p, cand_p, hn_p, nullptr, nullptr, sizes, offsets);
    return {out, rz, cand, hn};
  }
#endif
  gi = gi.to(state.dtype());
  if (has_bias) gi = gi + b_in.to(state.dtype()).unsqueeze(1);
  auto out = at::empty({2, N, h}, state);
  auto rz = at::empty({2, N, 2 * h}, state);
  auto cand = at::empty({2, N, h}, state);
  auto hn = at::empty({2, N, h}, state);
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
    forward_steps<scalar_t>(gi, w_hh_t, b_hn.data_ptr<scalar_t>(), out, rz, cand,
                            hn.data_ptr<scalar_t>(), sizes, offsets);
  });
  return {out, rz, cand, hn};
}

template <typename T>
static void step_grads(const T* d_out, T* carry, int64_t carry_n, const T* hprev,
                       const T* rz, const T* cand, const T* hn, T* d_gh, T* d_gi,
                       const T* zeros, int64_t n, int64_t h) {
  // dh = d_out + carry (d h_t from step t + 1, rows < carry_n). hprev == nullptr: h_{t-1} = 0.
  // carry is then overwritten, in place, with dh * z: the first term of d h_{t-1}.
  for (int64_t i = 0; i < n; ++i) {
    const T* __restrict__ g = d_out + i * h;
    const T* __restrict__ cr = i < carry_n ? carry + i * h : zeros;
    const T* __restrict__ r = rz + i * 2 * h;
    const T* __restrict__ z = r + h;
    const T* __restrict__ c = cand + i * h;
    const T* __restrict__ x = hn + i * h;
    const T* __restrict__ p = hprev ? hprev + i * h : zeros;
    T* __restrict__ gh = d_gh + i * 3 * h;
    T* __restrict__ gx = d_gi + i * 3 * h;
    T* hz = carry + i * h;                      // may alias cr: each element is read, then written
    for (int64_t j = 0; j < h; ++j) {
      const T dh = g[j] + cr[j];
      const T d_cpre = dh * (T(1) - z[j]) * (T(1) - c[j] * c[j]);
      const T d_r = d_cpre * x[j] * r[j] * (T(1) - r[j]);
      const T d_z = dh * (p[j] - c[j]) * z[j] * (T(1) - z[j]);
      gh[j] = d_r;
      gh[h + j] = d_z;
      gh[2 * h + j] = d_cpre * r[j];
      gx[j] = d_r;
      gx[h + j] = d_z;
      gx[2 * h + j] = d_cpre;
      hz[j] = dh * z[j];
    }
  }
}

template <typename T>
static void backward_steps(const torch::Tensor& d_out, const torch::Tensor& out,
                           const torch::Tensor& rz, const torch::Tensor& cand,
                           const torch::Tensor& hn, const torch::Tensor& w_hh,
                           torch::Tensor& d_gh, torch::Tensor& d_gi,
                           const std::vector<int64_t>& sizes, const std::vector<int64_t>& offsets) {
  const int64_t N = out.size(1), h = out.size(2);
  const T *g_p = d_out.data_ptr<T>(), *out_p = out.data_ptr<T>(), *rz_p = rz.data_ptr<T>();
  const T *cand_p = cand.data_ptr<T>(), *hn_p = hn.data_ptr<T>();
  T *dgh_p = d_gh.data_ptr<T>(), *dgi_p = d_gi.data_ptr<T>();
  const torch::Tensor dgh_d[2] = {d_gh[0], d_gh[1]}, w_d[2] = {w_hh[0], w_hh[1]};
  auto zeros = at::zeros({h}, out.options());
  const T* zero_p = zeros.data_ptr<T>();
  // d h_{t-1} from step t, per direction, rows [0, n_t): dh_t * z_t + d_gh_t W_hh, built in place.
  const auto carry = at::empty({2, sizes.empty() ? 0 : sizes[0], h}, out.options());
  const torch::Tensor carry_d[2] = {carry[0], carry[1]};
  for_each_direction([&](int64_t d) {
    int64_t carry_n = 0;
    for (int64_t t = (int64_t)sizes.size() - 1; t >= 0; --t) {
      const int64_t n = sizes[t], off = offsets[t], prev = t ? offsets[t - 1] : 0;
      const int64_t row = d * N + off;
      step_grads<T>(g_p + row * h, carry_d[d].data_ptr<T>(), carry_n,
                    t ? out_p + (d * N + prev) * h : nullptr, rz_p + row * 2 * h,
                    cand_p + row * h, hn_p + row * h, dgh_p + row * 3 * h, dgi_p + row * 3 * h,
                    zero_p, n, h);
      if (t > 0) {
        auto c = carry_d[d].narrow(0, 0, n);
        c.addmm_(dgh_d[d].narrow(0, off, n), w_d[d]);                          // (n, h)
      }
      carry_n = n;
    }
  });
}

#ifdef IAA_X86
template <typename Out>
static void backward_fast(const torch::Tensor& d_out, const torch::Tensor& out, const torch::Tensor& rz,
                          const torch::Tensor& cand, const torch::Tensor& hn, const torch::Tensor& w_hh,
                          const at::BFloat16* w_packed, torch::Tensor& d_gh, torch::Tensor& d_gi,
                          torch::Tensor& d_bh, torch::Tensor& d_bn, const std::vector<int64_t>& sizes,
                          const std::vector<int64_t>& offsets) {
  const int64_t N = out.size(1), h = out.size(2), rows = sizes.empty() ? 0 : (sizes[0] + 31) / 32 * 32;
  const float *g_p = d_out.data_ptr<float>(), *out_p = out.data_ptr<float>(), *rz_p = rz.data_ptr<float>();
  const float *cand_p = cand.data_ptr<float>(), *hn_p = hn.data_ptr<float>();
  Out* dgh_p = d_gh.data_ptr<Out>();
  Out* dgi_p = d_gi.data_ptr<Out>();
  const torch::Tensor dgh_d[2] = {d_gh[0], d_gh[1]}, w_d[2] = {w_hh[0], w_hh[1]};
  const auto carry = at::empty({2, rows, h}, out.options());                 // d h_{t-1}, built in place
  const auto product = at::empty({2, rows, h}, out.options());               // d_gh W_hh (AMX)
  const auto a_buf = at::zeros({2, rows, 3 * h}, out.options().dtype(at::kBFloat16));
  const torch::Tensor carry_d[2] = {carry[0], carry[1]};
  for_each_direction([&](int64_t d) {
    float* cr = carry.data_ptr<float>() + d * rows * h;
    float* prod = product.data_ptr<float>() + d * rows * h;
    int64_t carry_n = 0;
    for (int64_t t = (int64_t)sizes.size() - 1; t >= 0; --t) {
      const int64_t n = sizes[t], off = offsets[t], prev = t ? offsets[t - 1] : 0, row = d * N + off;
      step_grads_avx512<Out>(g_p + row * h, cr, carry_n, t ? out_p + (d * N + prev) * h : nullptr,
                             rz_p + row * 2 * h, cand_p + row * h, hn_p + row * h, dgh_p + row * 3 * h,
                             dgi_p + row * 3 * h, d_bh.data_ptr<float>() + d * 3 * h,
                             d_bn.data_ptr<float>() + d * h, n, h);
      if (t > 0 && w_packed) {
        amx_gemm(dgh_p + row * 3 * h, n, 3 * h, 3 * h, w_packed + d * 3 * h * h, h, prod,
                 a_buf.data_ptr<at::BFloat16>() + d * rows * 3 * h);
        for (int64_t k = 0; k < n * h; ++k) cr[k] += prod[k];
      } else if (t > 0) {
        carry_d[d].narrow(0, 0, n).addmm_(dgh_d[d].narrow(0, off, n).to(at::kFloat), w_d[d]);   // (n, h)
      }
      carry_n = n;
    }
  });
}
#endif

std::vector<torch::Tensor> gru_backward(torch::Tensor d_out, torch::Tensor out, torch::Tensor rz,
                                        torch::Tensor cand, torch::Tensor hn, torch::Tensor w_hh,
                                        bool amx, std::vector<int64_t> sizes,
                                        std::vector<int64_t> offsets, bool bf16_gi) {
  // d_out (2, N, h): gradient of the outputs; w_hh (2, 3h, h); amx: as gru_forward. Returns d_gh
  // and d_gi (2, N, 3h; both bf16 when bf16_gi and the fast path runs, for the bf16 GEMMs that
  // consume them), d_bh (2, 3h), the sum of d_gh over rows (b_hh's gradient), and d_bn (2, h),
  // the sum over rows of d_gi's n part (b_in's gradient there), both summed in the state's dtype
  // from the unrounded values. Rows past the packed steps (padding of each direction) are 0 in
  // d_gh and d_gi.
  d_out = d_out.contiguous(); w_hh = w_hh.contiguous();
  const int64_t N = out.size(1), h = out.size(2);
  auto d_gh = at::empty({2, N, 3 * h}, out.options());
#ifdef IAA_X86
  if (out.scalar_type() == at::kFloat && fast_paths(h)) {
    const auto w_packed = amx && amx_paths(h) ? pack_vnni(w_hh) : torch::Tensor();
    const at::BFloat16* packed = w_packed.defined() ? w_packed.data_ptr<at::BFloat16>() : nullptr;
    const auto grads = out.options().dtype(bf16_gi ? at::kBFloat16 : at::kFloat);
    auto d_gi = at::empty({2, N, 3 * h}, grads);
    d_gh = at::empty({2, N, 3 * h}, grads);
    auto d_bh = at::zeros({2, 3 * h}, out.options()), d_bn = at::zeros({2, h}, out.options());
    if (bf16_gi)
      backward_fast<at::BFloat16>(d_out, out, rz, cand, hn, w_hh, packed, d_gh, d_gi, d_bh, d_bn, sizes, offsets);
    else
      backward_fast<float>(d_out, out, rz, cand, hn, w_hh, packed, d_gh, d_gi, d_bh, d_bn, sizes, offsets);
    const int64_t real = sizes.empty() ? 0 : offsets.back() + sizes.back();
    d_gh.narrow(1, real, N - real).zero_();
    d_gi.narrow(1, real, N - real).zero_();
    return {d_gh, d_gi, d_bh, d_bn};
  }
#endif
  auto d_gi = at::empty({2, N, 3 * h}, out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_backward", [&] {
    backward_steps<scalar_t>(d_out, out, rz, cand, hn, w_hh, d_gh, d_gi, sizes, offsets);
  });
  const int64_t real = sizes.empty() ? 0 : offsets.back() + sizes.back();
  d_gh.narrow(1, real, N - real).zero_();
  d_gi.narrow(1, real, N - real).zero_();
  return {d_gh, d_gi, d_gh.sum(1), d_gi.narrow(2, 2 * h, h).sum(1)};
}

torch::Tensor scatter_rows(torch::Tensor src, torch::Tensor pos, int64_t positions) {
  // (positions, d) fp32: zero, except row pos[0][k] = src[0][k] + (src[1][j] where pos[1][j] is
  // that row); src (2, N', d) fp32 or bf16, its first N = pos.size(1) rows per direction read.
  // Needs fast_paths(d).
  const int64_t N = pos.size(1), rows = src.size(1), d = src.size(2);
  TORCH_CHECK(fast_paths(d), "scatter_rows needs the AVX-512 path");
  src = src.contiguous(); pos = pos.contiguous();
  auto dst = at::zeros({positions, d}, src.options().dtype(at::kFloat));
#ifdef IAA_X86
  if (src.scalar_type() == at::kBFloat16)
    scatter_rows_avx512(src.data_ptr<at::BFloat16>(), rows, pos.data_ptr<int64_t>(), N, d, dst.data_ptr<float>());
  else
    scatter_rows_avx512(src.to(at::kFloat).data_ptr<float>(), rows, pos.data_ptr<int64_t>(), N, d, dst.data_ptr<float>());
#endif
  return dst;
}

// ---- The IAA reader's T attention steps for inference (paper section 3), one call per batch ----
// What the IAA reader's fixed T steps (iaa/model/reader.py) compute without dropout or gradient,
// with each step's matmuls on 32 rows and its reads of the encodings fused: for each example, the
// logits of a read, their masked softmax and the glimpse run back to back while that example's
// encodings are still in cache.

#ifdef IAA_X86
// out[i] = m_i . key for the L rows of one example; m (L, k) fp32 or bf16, k % 16 == 0.
template <typename M>
IAA_AVX512 static void row_dots(const M* m, int64_t L, int64_t k, const float* key, float* out) {
  for (int64_t i = 0; i < L; ++i) {
    const M* row = m + i * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
      a0 = _mm512_fmadd_ps(load16(row + j), _mm512_loadu_ps(key + j), a0);
      a1 = _mm512_fmadd_ps(load16(row + j + 16), _mm512_loadu_ps(key + j + 16), a1);
    }
    if (j < k) a0 = _mm512_fmadd_ps(load16(row + j), _mm512_loadu_ps(key + j), a0);
    out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

// glimpse = sum_i p_i m_i, where p = softmax(logits) over the rows where mask holds (all zero when
// none does: masking.masked_softmax). logits (L) is overwritten with p.
template <typename M>
IAA_AVX512 static void softmax_glimpse(const M* m, int64_t L, int64_t k, float* logits, const bool* mask,
                                       float* glimpse) {
  float top = -INFINITY;
  for (int64_t i = 0; i < L; ++i)
    if (mask[i] && logits[i] > top) top = logits[i];
  for (int64_t j = 0; j < k; ++j) glimpse[j] = 0.f;
  if (top == -INFINITY) return;
  __m512 total = _mm512_setzero_ps();
  const __m512 shift = _mm512_set1_ps(top);
  for (int64_t i = 0; i < L; i += 16) {
    const __mmask16 tail = i + 16 <= L ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - i)) - 1);
    const __mmask16 real = _mm_mask_test_epi8_mask(tail, _mm_maskz_loadu_epi8(tail, mask + i), _mm_set1_epi8(1));
    const __m512 e = _mm512_maskz_mov_ps(real, Sleef_expf16_u10(_mm512_sub_ps(_mm512_maskz_loadu_ps(real, logits + i), shift)));
    _mm512_mask_storeu_ps(logits + i, tail, e);
    total = _mm512_add_ps(total, e);
  }
  const float scale = 1.f / _mm512_reduce_add_ps(total);
  for (int64_t i = 0; i < L; ++i) {
    if (!mask[i]) continue;
    const __m512 p = _mm512_set1_ps(logits[i] * scale);
    const M* row = m + i * k;
    for (int64_t j = 0; j < k; j += 16)
      _mm512_storeu_ps(glimpse + j, _mm512_fmadd_ps(p, load16(row + j), _mm512_loadu_ps(glimpse + j)));
  }
}

// One read of each example's encodings memory (B, L, k): the logits m_i . key_b (B, L) when
// glimpse is null, else the glimpse of their masked softmax (B, k).
template <typename M>
static void attend(const torch::Tensor& memory, const torch::Tensor& key, const torch::Tensor& mask,
                   float* logits, float* glimpse) {
  const int64_t B = memory.size(0), L = memory.size(1), k = memory.size(2);
  const M* m = memory.data_ptr<M>();
  const float* q = key.data_ptr<float>();
  const bool* real = mask.data_ptr<bool>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      row_dots<M>(m + b * L * k, L, k, q + b * k, logits + b * L);
      if (glimpse) softmax_glimpse<M>(m + b * L * k, L, k, logits + b * L, real + b * L, glimpse + b * k);
    }
  });
}

// y (n, N) = act(y + bias) in place; act 0: none, 1: tanh, 2: sigmoid. N % 16 == 0.
IAA_AVX512 static void bias_act(float* y, int64_t n, int64_t N, const float* bias, int act) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < N; j += 16) {
      __m512 v = _mm512_add_ps(_mm512_loadu_ps(y + i * N + j), _mm512_loadu_ps(bias + j));
      if (act == 1) v = Sleef_tanhf16_u10(v);
      else if (act == 2) v = sigmoid16(v);
      _mm512_storeu_ps(y + i * N + j, v);
    }
}

// s_t (n, S) from the GRU cell's gi = x W_ih^T + b_ih and gh = s W_hh^T + b_hh (n, 3S), gates in
// PyTorch's order r, z, n: r, z = sigmoid(gi + gh), c = tanh(gi_n + r gh_n), s_t = c + z (s - c).
IAA_AVX512 static void gru_cell_update(const float* gi, const float* gh, const float* s, float* out,
                                       int64_t n, int64_t S) {
  for (int64_t i = 0; i < n; ++i) {
    const float *a = gi + i * 3 * S, *g = gh + i * 3 * S;
    for (int64_t j = 0; j < S; j += 16) {
      const __m512 r = sigmoid16(_mm512_add_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(g + j)));
      const __m512 z = sigmoid16(_mm512_add_ps(_mm512_loadu_ps(a + S + j), _mm512_loadu_ps(g + S + j)));
      const __m512 c = Sleef_tanhf16_u10(_mm512_fmadd_ps(r, _mm512_loadu_ps(g + 2 * S + j), _mm512_loadu_ps(a + 2 * S + j)));
      const __m512 p = _mm512_loadu_ps(s + i * S + j);
      _mm512_storeu_ps(out + i * S + j, _mm512_fmadd_ps(z, _mm512_sub_ps(p, c), c));
    }
  }
}

#endif

// ---- The steps' generic build: the same reads and gate arithmetic as plain loops, on any CPU.
// Never chosen by `select` (the AVX-512 loops are faster where they run); it holds the step loop
// of iaa_steps to the reference on machines without AVX-512 (tests/test_kernel_equations.py).

static inline float sigmoid1(float x) { return 1.f / (1.f + std::exp(-x)); }

template <typename M>
static void row_dots_generic(const M* m, int64_t L, int64_t k, const float* key, float* out) {
  for (int64_t i = 0; i < L; ++i) {
    float total = 0.f;
    for (int64_t j = 0; j < k; ++j) total += static_cast<float>(m[i * k + j]) * key[j];
    out[i] = total;
  }
}

template <typename M>
static void softmax_glimpse_generic(const M* m, int64_t L, int64_t k, float* logits, const bool* mask,
                                    float* glimpse) {
  float top = -INFINITY;
  for (int64_t i = 0; i < L; ++i)
    if (mask[i] && logits[i] > top) top = logits[i];
  for (int64_t j = 0; j < k; ++j) glimpse[j] = 0.f;
  if (top == -INFINITY) return;
  float total = 0.f;
  for (int64_t i = 0; i < L; ++i) {
    logits[i] = mask[i] ? std::exp(logits[i] - top) : 0.f;
    total += logits[i];
  }
  const float scale = 1.f / total;
  for (int64_t i = 0; i < L; ++i) {
    if (!mask[i]) continue;
    const float p = logits[i] * scale;
    for (int64_t j = 0; j < k; ++j) glimpse[j] += p * static_cast<float>(m[i * k + j]);
  }
}

template <typename M>
static void attend_generic(const torch::Tensor& memory, const torch::Tensor& key, const torch::Tensor& mask,
                           float* logits, float* glimpse) {
  const int64_t B = memory.size(0), L = memory.size(1), k = memory.size(2);
  const M* m = memory.data_ptr<M>();
  const float* q = key.data_ptr<float>();
  const bool* real = mask.data_ptr<bool>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      row_dots_generic<M>(m + b * L * k, L, k, q + b * k, logits + b * L);
      if (glimpse) softmax_glimpse_generic<M>(m + b * L * k, L, k, logits + b * L, real + b * L, glimpse + b * k);
    }
  });
}

static void bias_act_generic(float* y, int64_t n, int64_t N, const float* bias, int act) {
  for (int64_t i = 0; i < n * N; ++i) {
    const float v = y[i] + bias[i % N];
    y[i] = act == 1 ? std::tanh(v) : act == 2 ? sigmoid1(v) : v;
  }
}

static void gru_cell_update_generic(const float* gi, const float* gh, const float* s, float* out, int64_t n,
                                    int64_t S) {
  for (int64_t i = 0; i < n; ++i) {
    const float *a = gi + i * 3 * S, *g = gh + i * 3 * S;
    for (int64_t j = 0; j < S; ++j) {
      const float r = sigmoid1(a[j] + g[j]), z = sigmoid1(a[S + j] + g[S + j]);
      const float c = std::tanh(a[2 * S + j] + r * g[2 * S + j]);
      out[i * S + j] = c + z * (s[i * S + j] - c);
    }
  }
}

// One read of the encodings (`attend`), by the AVX-512 loops or, with `generic`, the plain ones.
template <typename M>
static void read_memory(bool generic, const torch::Tensor& memory, const torch::Tensor& key,
                        const torch::Tensor& mask, float* logits, float* glimpse) {
#ifdef IAA_X86
  if (!generic) return attend<M>(memory, key, mask, logits, glimpse);
#endif
  attend_generic<M>(memory, key, mask, logits, glimpse);
}

// One layer of a step: act(x W^T + b), x (n, K) fp32. With `packed` (pack_linear(W)) the product
// takes bf16 operands on AMX, else fp32 (ATen). `generic`: the bias and activation as plain loops.
struct Dense {
  torch::Tensor weight, packed, bias;
  bool generic;
  torch::Tensor operator()(const torch::Tensor& x, int act, at::BFloat16* a_buf) const {
    const int64_t n = x.size(0), K = x.size(1), N = weight.size(0);
    torch::Tensor y;
    if (packed.defined()) {
      y = at::empty({(n + 31) / 32 * 32, N}, x.options());
      amx_gemm(x.data_ptr<float>(), n, K, K, packed.data_ptr<at::BFloat16>(), N, y.data_ptr<float>(), a_buf);
      y = y.narrow(0, 0, n);
    } else {
      y = at::mm(x, weight.t());
    }
#ifdef IAA_X86
    if (!generic) {
      bias_act(y.data_ptr<float>(), n, N, bias.data_ptr<float>(), act);
      return y;
    }
#endif
    bias_act_generic(y.data_ptr<float>(), n, N, bias.data_ptr<float>(), act);
    return y;
  }
};

bool steps_paths(int64_t enc_dim, int64_t state_dim, int64_t gate_dim) {
  return has_avx512() && enc_dim % 16 == 0 && state_dim % 16 == 0 && gate_dim % 16 == 0;
}

bool steps_amx(int64_t enc_dim, int64_t state_dim, int64_t gate_dim) {
  return amx_usable() && enc_dim % 32 == 0 && state_dim % 32 == 0 && gate_dim % 32 == 0;
}

torch::Tensor pack_linear(torch::Tensor weight, bool transpose) {
  // nn.Linear's weight W (N, K) as the packed bf16 operand of amx_gemm: W^T (for x W^T) in VNNI
  // layout, or W itself (for dy W) when transpose is false.
  const auto w = weight.detach().to(at::kFloat).contiguous();
#ifdef IAA_X86
  if (transpose && amx_usable() && w.size(1) % 16 == 0) {
    const int64_t N = w.size(0), K = w.size(1);
    auto out = at::empty({N / 16, K / 2, 16, 2}, w.options().dtype(at::kBFloat16));
    pack_transposed(w.data_ptr<float>(), N, K, out.data_ptr<at::BFloat16>());
    return out;
  }
#endif
  return pack_vnni((transpose ? w.t() : w).unsqueeze(0)).squeeze(0);
}

torch::Tensor amx_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor bias) {
  // x (n, K) fp32 times the packed (N / 16, K / 2, 16, 2) bf16 operand, plus bias (N) when not
  // empty: (n, N) fp32, with bf16-rounded operands and fp32 sums (AMX).
  const int64_t n = x.size(0), K = x.size(1), N = packed.size(0) * 16, rows = (n + 31) / 32 * 32;
  TORCH_CHECK(amx_paths(K) && N % 32 == 0 && packed.size(1) * 2 == K, "amx_linear: AMX is not usable here");
  x = x.to(at::kFloat).contiguous();
  auto y = at::empty({rows, N}, x.options());
  auto a_buf = at::empty({rows, K}, x.options().dtype(at::kBFloat16));
#ifdef IAA_X86
  amx_gemm(x.data_ptr<float>(), n, K, K, packed.data_ptr<at::BFloat16>(), N, y.data_ptr<float>(),
           a_buf.data_ptr<at::BFloat16>());
  if (bias.numel()) {
    bias = bias.to(at::kFloat).contiguous();
    bias_act(y.data_ptr<float>(), n, N, bias.data_ptr<float>(), 0);
  }
#endif
  return y.narrow(0, 0, n);
}

torch::Tensor iaa_steps(torch::Tensor q_enc, torch::Tensor q_mask, torch::Tensor d_enc, torch::Tensor d_mask,
                        std::vector<torch::Tensor> weights, std::vector<torch::Tensor> packed, int64_t steps,
                        bool generic) {
  // The T steps of IAAReader for inference: returns the last step's document logits (B, Ld).
  // q_enc (B, Lq, 2h) fp32, d_enc (B, Ld, 2h) fp32 or bf16 (the reads then take it as is, with
  // fp32 keys and fp32 sums), masks bool. weights: (weight, bias) of A_q, A_d, the two layers of
  // gate_q then of gate_d, then the search GRU's W_ih, W_hh, b_ih, b_hh, all fp32; packed: the
  // same 8 weights' pack_linear (AMX, bf16 operands), or empty (fp32 products). generic: the
  // plain loops of the generic build for the reads and the gate arithmetic, on any CPU and size.
  TORCH_CHECK(weights.size() == 16 && (packed.empty() || packed.size() == 8), "iaa_steps: 16 weights, 0 or 8 packed");
  const int64_t B = q_enc.size(0), two_h = q_enc.size(2), S = weights[14].size(0) / 3, G = weights[4].size(0);
  TORCH_CHECK((generic || steps_paths(two_h, S, G)) && steps >= 1, "iaa_steps needs the AVX-512 path");
  TORCH_CHECK(packed.empty() || steps_amx(two_h, S, G), "iaa_steps: AMX is not usable here");
  q_enc = q_enc.contiguous(); d_enc = d_enc.contiguous(); q_mask = q_mask.contiguous(); d_mask = d_mask.contiguous();
  auto layer = [&](int i) {
    return Dense{weights[2 * i].contiguous(), packed.empty() ? torch::Tensor() : packed[i], weights[2 * i + 1].contiguous(),
                 generic};
  };
  const Dense read_q = layer(0), read_d = layer(1), gq1 = layer(2), gq2 = layer(3), gd1 = layer(4), gd2 = layer(5);
  const Dense gru_i{weights[12].contiguous(), packed.empty() ? torch::Tensor() : packed[6], weights[14].contiguous(), generic};
  const Dense gru_h{weights[13].contiguous(), packed.empty() ? torch::Tensor() : packed[7], weights[15].contiguous(), generic};
  const auto f32 = q_enc.options();
  const int64_t Lq = q_enc.size(1), Ld = d_enc.size(1), rows = (B + 31) / 32 * 32;
  const auto a_buf = at::zeros({rows, S + 6 * two_h}, f32.dtype(at::kBFloat16));   // AMX rows, widest K
  at::BFloat16* buf = a_buf.data_ptr<at::BFloat16>();
  auto q_logits = at::empty({B, Lq}, f32), d_logits = at::empty({B, Ld}, f32);
  auto q_t = at::empty({B, two_h}, f32), d_t = at::empty({B, two_h}, f32);
  auto s = at::zeros({B, S}, f32);                                                  // s_0 = 0
  const bool bf16 = d_enc.scalar_type() == at::kBFloat16;
  for (int64_t t = 0; t < steps; ++t) {
    read_memory<float>(generic, q_enc, read_q(s, 0, buf), q_mask, q_logits.data_ptr<float>(), q_t.data_ptr<float>());
    const auto key = read_d(at::cat({s, q_t}, 1), 0, buf);
    const bool last = t == steps - 1;
    float* glimpse = last ? nullptr : d_t.data_ptr<float>();
    if (bf16) read_memory<at::BFloat16>(generic, d_enc, key, d_mask, d_logits.data_ptr<float>(), glimpse);
    else read_memory<float>(generic, d_enc, key, d_mask, d_logits.data_ptr<float>(), glimpse);
    if (last) break;
    const auto features = at::cat({s, q_t, d_t, q_t * d_t}, 1);                     // (B, S + 6h)
    const auto r_q = gq2(gq1(features, 1, buf), 2, buf), r_d = gd2(gd1(features, 1, buf), 2, buf);
    const auto gi = gru_i(at::cat({r_q * q_t, r_d * d_t}, 1), 0, buf), gh = gru_h(s, 0, buf);
    auto next = at::empty({B, S}, f32);
    if (generic) {
      gru_cell_update_generic(gi.data_ptr<float>(), gh.data_ptr<float>(), s.data_ptr<float>(), next.data_ptr<float>(), B, S);
    } else {
#ifdef IAA_X86
      gru_cell_update(gi.data_ptr<float>(), gh.data_ptr<float>(), s.data_ptr<float>(), next.data_ptr<float>(), B, S);
#endif
    }
    s = next;
  }
  return d_logits;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gru_forward", &gru_forward, "packed bidirectional GRU recurrence (forward)");
  m.def("gru_backward", &gru_backward, "packed bidirectional GRU recurrence (backward)");
  m.def("gru_infer", &gru_infer, "packed bidirectional GRU recurrence for inference, from a per-word table");
  m.def("scatter_rows", &scatter_rows, "both directions' input gradients back in the padded layout");
  m.def("fast_paths", &fast_paths, "whether the AVX-512 step runs for hidden size h");
  m.def("amx_paths", &amx_paths, "whether the AMX recurrent matmuls run for hidden size h");
  m.def("amx_matmul", &amx_matmul, "a (n, K) times b (K, N) with bf16 operands on AMX, fp32 result",
        py::arg("a"), py::arg("b"), py::arg("repeats") = 1);
  m.def("iaa_steps", &iaa_steps, "the IAA reader's T attention steps for inference; the last document logits");
  m.def("pack_linear", &pack_linear, "a linear layer's weight packed for AMX products (amx_linear, iaa_steps)",
        py::arg("weight"), py::arg("transpose") = true);
  m.def("amx_linear", &amx_linear, "x times a packed weight, plus a bias, with bf16 operands on AMX");
  m.def("steps_paths", &steps_paths, "whether iaa_steps runs for these sizes (2h, s, gate)");
  m.def("steps_amx", &steps_amx, "whether iaa_steps' products can take bf16 operands on AMX here");
}
