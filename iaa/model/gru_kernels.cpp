#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <vector>

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

std::vector<torch::Tensor> gru_forward(torch::Tensor gi, torch::Tensor w_hh_t, torch::Tensor b_hn,
                                       std::vector<int64_t> sizes, std::vector<int64_t> offsets) {
  // gi (2, N, 3h) with b_hr, b_hz folded in; w_hh_t (2, h, 3h); b_hn (2, h).
  gi = gi.contiguous(); w_hh_t = w_hh_t.contiguous(); b_hn = b_hn.contiguous();
  const int64_t N = gi.size(1), h = gi.size(2) / 3;
  auto out = at::empty({2, N, h}, gi.options());
  auto rz = at::empty({2, N, 2 * h}, gi.options());
  auto cand = at::empty({2, N, h}, gi.options());
  auto hn = at::empty({2, N, h}, gi.options());
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

std::vector<torch::Tensor> gru_backward(torch::Tensor d_out, torch::Tensor out, torch::Tensor rz,
                                        torch::Tensor cand, torch::Tensor hn, torch::Tensor w_hh,
                                        std::vector<int64_t> sizes, std::vector<int64_t> offsets) {
  // d_out (2, N, h): gradient of the outputs; w_hh (2, 3h, h). Returns d_gh, d_gi (2, N, 3h).
  d_out = d_out.contiguous(); w_hh = w_hh.contiguous();
  const int64_t N = out.size(1), h = out.size(2);
  auto d_gh = at::empty({2, N, 3 * h}, out.options());
  auto d_gi = at::empty({2, N, 3 * h}, out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_backward", [&] {
    backward_steps<scalar_t>(d_out, out, rz, cand, hn, w_hh, d_gh, d_gi, sizes, offsets);
  });
  return {d_gh, d_gi};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gru_forward", &gru_forward, "packed bidirectional GRU recurrence (forward)");
  m.def("gru_backward", &gru_backward, "packed bidirectional GRU recurrence (backward)");
}
