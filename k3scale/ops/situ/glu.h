// GLU activations h = act(g, u) on vectors: SwiGLU (kind 0) and SiTU-GLU (kind 1,
// architecture.md section 6), their partial derivatives, and forward and backward passes over
// contiguous elements. Used by glu.cpp and by the routed experts (ops/moe/experts.cpp).

#pragma once

#include "../cpu/common.h"

constexpr int64_t kSwiglu = 0;
constexpr int64_t kSitu = 1;

struct Activation {
  int64_t kind;
  double beta;         // SiTU gate cap
  double linear_beta;  // SiTU up cap; <= 0 leaves the up branch uncapped
};

// h = act(g, u) on one vector.
template <typename T>
Vec<T> glu_value(const Activation& act, const Vec<T>& g, const Vec<T>& u) {
  using V = Vec<T>;
  const V sig = sigmoid(g);
  if (act.kind == kSwiglu) return g * sig * u;
  const V beta(T(act.beta)), linear_beta(T(act.linear_beta));
  const V situ = beta * tanh(g / beta) * sig;
  return situ * (act.linear_beta > 0 ? linear_beta * tanh(u / linear_beta) : u);
}

// h = act(g, u) and its partial derivatives dh/dg, dh/du on one vector.
template <typename T>
void glu_partials(const Activation& act, const Vec<T>& g, const Vec<T>& u, Vec<T>& h, Vec<T>& dh_dg,
                  Vec<T>& dh_du) {
  using V = Vec<T>;
  const V one(T(1)), sig = sigmoid(g);
  if (act.kind == kSwiglu) {
    const V silu = g * sig;
    h = silu * u;
    dh_dg = u * sig * (one + g * (one - sig));
    dh_du = silu;
    return;
  }
  const V beta(T(act.beta)), linear_beta(T(act.linear_beta));
  const V tg = tanh(g / beta);
  const V situ = beta * tg * sig;
  V capped = u, d_capped = one;
  if (act.linear_beta > 0) {
    const V tu = tanh(u / linear_beta);
    capped = linear_beta * tu;
    d_capped = one - tu * tu;
  }
  h = situ * capped;
  dh_dg = capped * ((one - tg * tg) * sig + situ * (one - sig));
  dh_du = situ * d_capped;
}

// h = act(g, u) on n contiguous elements (partial vectors at the tail, same math).
template <typename T>
void glu_forward(const Activation& act, const T* g, const T* u, T* h, int64_t n) {
  using V = Vec<T>;
  for (int64_t i = 0; i < n; i += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - i);
    store(glu_value(act, load(g + i, count), load(u + i, count)), h + i, count);
  }
}

// dg, du from dh for h = act(g, u) on n contiguous elements.
template <typename T>
void glu_backward(const Activation& act, const T* g, const T* u, const T* dh, T* dg, T* du,
                  int64_t n) {
  using V = Vec<T>;
  for (int64_t i = 0; i < n; i += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - i);
    V h, dh_dg, dh_du;
    glu_partials(act, load(g + i, count), load(u + i, count), h, dh_dg, dh_du);
    const V grad = load(dh + i, count);
    store(grad * dh_dg, dg + i, count);
    store(grad * dh_du, du + i, count);
  }
}
