"""The GRU recurrence of ``fused_gru`` as a small C++ loop (CPU), built on first use.

Why: at batch 32 each recurrent step is a (32 x 128) x (128 x 384) matmul plus element-wise gate
arithmetic on ~8,000 numbers. From Python that is ~7 operator calls per step forward and ~15
backward, each costing more in dispatch than in arithmetic (~130 µs and ~200 µs per step). Here
the gate arithmetic of a step is one plain loop (sigmoid and tanh stay ATen's vectorised
kernels), and the loop over steps runs in C++: ~35 µs per step. Same formulas as the Python loop
in ``fused_gru``, which stays as the fallback and the reference in the tests.

Built with ``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler and ninja), cached in
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) by source hash: the first call
on a machine takes ~30 s. Set ``IAA_GRU_CPP=0`` to skip it; a failed build warns once and the
Python loop is used.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

_SOURCE = r"""
#include <torch/extension.h>
#include <vector>

// Packed layout of fused_gru.py: tensors (2, N, k), rows [off, off + n) hold step t, and the rows
// of step t - 1 for the same sequences are [prev, prev + n). h = hidden size.

template <typename T>
static void gate_preacts(const T* gi, const T* gh, T* rz, int64_t N, int64_t n, int64_t off,
                         int64_t h) {
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t i = 0; i < n; ++i) {
      const T* a = gi + ((d * N) + off + i) * 3 * h;
      const T* b = gh + (d * n + i) * 3 * h;
      T* o = rz + ((d * N) + off + i) * 2 * h;
      for (int64_t j = 0; j < 2 * h; ++j) o[j] = a[j] + b[j];
    }
}

template <typename T>
static void cand_preacts(const T* gi, const T* gh, const T* b_hn, const T* rz, T* hn, T* cand,
                         int64_t N, int64_t n, int64_t off, int64_t h) {
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = d * N + off + i;
      const T* a = gi + row * 3 * h + 2 * h;
      const T* b = gh + (d * n + i) * 3 * h + 2 * h;
      const T* bias = b_hn + d * h;
      const T* r = rz + row * 2 * h;
      T* x = hn + row * h;
      T* c = cand + row * h;
      for (int64_t j = 0; j < h; ++j) {
        x[j] = b[j] + bias[j];
        c[j] = a[j] + r[j] * x[j];
      }
    }
}

template <typename T>
static void new_state(const T* rz, const T* cand, const T* hprev, int64_t hprev_rows, T* out,
                      int64_t N, int64_t n, int64_t off, int64_t h) {
  // hprev == nullptr: h_{t-1} = 0, so h_t = (1 - z) n.
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = d * N + off + i;
      const T* __restrict__ z = rz + row * 2 * h + h;
      const T* __restrict__ c = cand + row * h;
      T* __restrict__ o = out + row * h;
      if (hprev) {
        const T* __restrict__ p = hprev + (d * hprev_rows + i) * h;
        for (int64_t j = 0; j < h; ++j) o[j] = c[j] + z[j] * (p[j] - c[j]);
      } else {
        for (int64_t j = 0; j < h; ++j) o[j] = c[j] - z[j] * c[j];
      }
    }
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
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t], off = offsets[t];
    torch::Tensor gh;
    if (t == 0) gh = at::zeros({2, n, 3 * h}, gi.options());
    else gh = at::bmm(out.narrow(1, offsets[t - 1], n), w_hh_t);  // (2, n, 3h)
    AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
      gate_preacts<scalar_t>(gi.data_ptr<scalar_t>(), gh.data_ptr<scalar_t>(),
                             rz.data_ptr<scalar_t>(), N, n, off, h);
    });
    rz.narrow(1, off, n).sigmoid_();
    AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
      cand_preacts<scalar_t>(gi.data_ptr<scalar_t>(), gh.data_ptr<scalar_t>(),
                             b_hn.data_ptr<scalar_t>(), rz.data_ptr<scalar_t>(),
                             hn.data_ptr<scalar_t>(), cand.data_ptr<scalar_t>(), N, n, off, h);
    });
    cand.narrow(1, off, n).tanh_();
    AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
      const scalar_t* prev = t == 0 ? nullptr : out.data_ptr<scalar_t>() + offsets[t - 1] * h;
      new_state<scalar_t>(rz.data_ptr<scalar_t>(), cand.data_ptr<scalar_t>(), prev, N,
                          out.data_ptr<scalar_t>(), N, n, off, h);
    });
  }
  return {out, rz, cand, hn};
}

template <typename T>
static void step_grads(const T* d_out, const T* carry, int64_t carry_n, const T* out,
                       const T* rz, const T* cand, const T* hn, T* d_gh, T* d_gi, T* d_hz,
                       const T* zeros, int64_t N, int64_t n, int64_t off, int64_t prev,
                       bool first, int64_t h) {
  // dh = d_out + carry (carry = d h_t from step t + 1, rows < carry_n); zeros: h zeros.
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = d * N + off + i;
      const T* __restrict__ g = d_out + row * h;
      const T* __restrict__ cr = (carry && i < carry_n) ? carry + (d * carry_n + i) * h : zeros;
      const T* __restrict__ r = rz + row * 2 * h;
      const T* __restrict__ z = r + h;
      const T* __restrict__ c = cand + row * h;
      const T* __restrict__ x = hn + row * h;
      const T* __restrict__ p = first ? zeros : out + (d * N + prev + i) * h;
      T* __restrict__ gh = d_gh + row * 3 * h;
      T* __restrict__ gx = d_gi + row * 3 * h;
      T* __restrict__ hz = d_hz + (d * n + i) * h;
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

std::vector<torch::Tensor> gru_backward(torch::Tensor d_out, torch::Tensor out, torch::Tensor rz,
                                        torch::Tensor cand, torch::Tensor hn, torch::Tensor w_hh,
                                        std::vector<int64_t> sizes, std::vector<int64_t> offsets) {
  // d_out (2, N, h): gradient of the outputs; w_hh (2, 3h, h).
  d_out = d_out.contiguous(); w_hh = w_hh.contiguous();
  const int64_t N = out.size(1), h = out.size(2);
  auto d_gh = at::empty({2, N, 3 * h}, out.options());
  auto d_gi = at::empty({2, N, 3 * h}, out.options());
  torch::Tensor carry;  // d h_{t-1} from step t: (2, n_t, h)
  auto zeros = at::zeros({h}, out.options());
  for (int64_t t = (int64_t)sizes.size() - 1; t >= 0; --t) {
    const int64_t n = sizes[t], off = offsets[t];
    auto d_hz = at::empty({2, n, h}, out.options());
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_backward", [&] {
      step_grads<scalar_t>(d_out.data_ptr<scalar_t>(),
                           carry.defined() ? carry.data_ptr<scalar_t>() : nullptr,
                           carry.defined() ? carry.size(1) : 0, out.data_ptr<scalar_t>(),
                           rz.data_ptr<scalar_t>(), cand.data_ptr<scalar_t>(),
                           hn.data_ptr<scalar_t>(), d_gh.data_ptr<scalar_t>(),
                           d_gi.data_ptr<scalar_t>(), d_hz.data_ptr<scalar_t>(),
                           zeros.data_ptr<scalar_t>(), N, n, off,
                           t > 0 ? offsets[t - 1] : 0, t == 0, h);
    });
    if (t > 0) carry = at::baddbmm(d_hz, d_gh.narrow(1, off, n), w_hh);  // (2, n, h)
  }
  return {d_gh, d_gi};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gru_forward", &gru_forward, "packed bidirectional GRU recurrence (forward)");
  m.def("gru_backward", &gru_backward, "packed bidirectional GRU recurrence (backward)");
}
"""

_STATE: dict[str, ModuleType | None] = {}


def load() -> ModuleType | None:
    """The compiled kernels, or None when disabled (``IAA_GRU_CPP=0``) or the build failed."""
    if "module" in _STATE:
        return _STATE["module"]
    module = None
    if os.environ.get("IAA_GRU_CPP", "1") != "0":
        try:
            from torch.utils.cpp_extension import load_inline

            module = load_inline(name="iaa_gru_kernels", cpp_sources=[_SOURCE],
                                 extra_cflags=["-O3", "-march=native"], verbose=False)
        except Exception as error:  # no compiler or ninja: the Python loop computes the same
            warnings.warn(f"iaa: C++ GRU kernels unavailable, using the Python loop ({error})")
    _STATE["module"] = module
    return module
