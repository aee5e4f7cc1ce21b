// The per-token work between the matrix products: dtype rounding, norms, activations, RoPE, attention.
#pragma once
#include "common.h"
#include "gemv.h"

// ------------------------------------------------------------------------------- elementwise pieces
// Vectorized with AVX-512 (16 floats, masked tails) where available; every result is rounded exactly
// like the scalar code (round-to-nearest-even to bf16), so both paths give the same bits.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SOLO_VEC 1
static inline __mmask16 tail_mask(int left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

static inline __m512 rnd16(__m512 v, int bf) {
  if (!bf) return v;
  __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

static inline __m512 load_act16(const void* p, size_t i, int bf, __mmask16 m) {
  if (bf) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t*)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, (const float*)p + i);
}

// exp(x): Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, degree-7 Taylor polynomial (truncation
// error < 1e-8 relative), then scale by 2^n. Within 1-2 float32 ulps of expf.
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#else
#define SOLO_VEC 0
#endif

// Write activations src [B, K] (float32 holding dtype-rounded values) as the input W expects; columns
// [k0, k1) of every row.
static void prepare_input_cols(const Mat* W, const float* src, int B, void* dst, int k0, int k1) {
  const size_t K = W->cols;
  for (int b = 0; b < B; b++) {
    const float* s = src + b * K;
    if (bf16_input(W)) {
      uint16_t* d = (uint16_t*)dst + b * K;
      int i = k0;
#if SOLO_VEC
      for (; i + 16 <= k1; i += 16) {
        __m512i u = _mm512_castps_si512(rnd16(_mm512_loadu_ps(s + i), 1));
        _mm256_storeu_si256((__m256i*)(d + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
      }
#endif
      for (; i < k1; i++) d[i] = f32_to_bf16(s[i]);
    } else {
      memcpy((float*)dst + b * K + k0, s + k0, (size_t)(k1 - k0) * sizeof(float));
    }
  }
}

static void prepare_input(const Mat* W, const float* src, int B, void* dst) {
  prepare_input_cols(W, src, B, dst, 0, W->cols);
}

// Add the bias and round each output to the activation dtype (eager's F.linear result); rows [n0, n1).
static void finish_linear_rows(const Mat* W, float* y, int B, int ldy, int bf, int n0, int n1) {
  for (int b = 0; b < B; b++) {
    float* yb = y + (size_t)b * ldy;
    int n = n0;
#if SOLO_VEC
    for (; n < n1; n += 16) {
      const __mmask16 m = tail_mask(n1 - n);
      __m512 v = load16(yb + n, m);
      if (W->bias) v = _mm512_add_ps(v, load_act16(W->bias, n, bf, m));
      _mm512_mask_storeu_ps(yb + n, m, rnd16(v, bf));
    }
#endif
    for (; n < n1; n++) {
      float v = yb[n];
      if (W->bias) v += load_act(W->bias, n, bf);
      yb[n] = rnd(v, bf);
    }
  }
}

static void finish_linear(const Mat* W, float* y, int B, int ldy, int bf) {
  finish_linear_rows(W, y, B, ldy, bf, 0, W->rows);
}

// RMSNorm as solo/model/layers.py computes it, src/dst [dim] (dst may alias src).
static void rms_norm(const float* src, float* dst, int dim, const void* w, float eps, int unit_offset, int bf) {
  float ss = 0.f;
  int i = 0;
#if SOLO_VEC
  __m512 acc = _mm512_setzero_ps();
  for (; i < dim; i += 16) {
    const __m512 v = load16(src + i, tail_mask(dim - i));
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  ss = _mm512_reduce_add_ps(acc);
#endif
  for (; i < dim; i++) ss += src[i] * src[i];
  const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
  i = 0;
#if SOLO_VEC
  const __m512 vinv = _mm512_set1_ps(inv), one = _mm512_set1_ps(1.0f);
  for (; i < dim; i += 16) {
    const __mmask16 m = tail_mask(dim - i);
    const __m512 normed = _mm512_mul_ps(load16(src + i, m), vinv);
    const __m512 wi = load_act16(w, i, bf, m);
    const __m512 out = unit_offset ? rnd16(_mm512_mul_ps(normed, _mm512_add_ps(one, wi)), bf)
                                   : rnd16(_mm512_mul_ps(wi, rnd16(normed, bf)), bf);
    _mm512_mask_storeu_ps(dst + i, m, out);
  }
#endif
  for (; i < dim; i++) {
    const float normed = src[i] * inv;
    const float wi = load_act(w, i, bf);
    dst[i] = unit_offset ? rnd(normed * (1.0f + wi), bf) : rnd(wi * rnd(normed, bf), bf);
  }
}

static inline float activation(float g, int act) {
  if (act == ACT_SILU) return g / (1.0f + expf(-g));
  if (act == ACT_GELU_TANH) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
  }
  return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

// out[i] = rnd(rnd(act(gate[i])) * up[i]) for i in [i0, i1): the gated MLP's product, rounded like eager.
static void act_mul(const float* gate, const float* up, float* out, int i0, int i1, int act, int bf) {
  int i = i0;
#if SOLO_VEC
  if (act != ACT_GELU) {
    const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
    for (; i < i1; i += 16) {
      const __mmask16 m = tail_mask(i1 - i);
      const __m512 g = load16(gate + i, m);
      __m512 a;
      if (act == ACT_SILU) {
        a = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
      } else {
        // tanh(y) = 1 - 2 / (exp(2y) + 1)
        const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
        const __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                       _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
        const __m512 e = exp16(_mm512_add_ps(y, y));
        const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
        a = _mm512_mul_ps(_mm512_mul_ps(half, g), _mm512_add_ps(one, t));
      }
      _mm512_mask_storeu_ps(out + i, m, rnd16(_mm512_mul_ps(rnd16(a, bf), load16(up + i, m)), bf));
    }
  }
#endif
  for (; i < i1; i++) out[i] = rnd(rnd(activation(gate[i], act), bf) * up[i], bf);
}

// x[i] = rnd(x[i] + t[i]): the residual add in the activation dtype.
static void residual_add(float* x, const float* t, int n, int bf) {
  int i = 0;
#if SOLO_VEC
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, rnd16(_mm512_add_ps(load16(x + i, m), load16(t + i, m)), bf));
  }
#endif
  for (; i < n; i++) x[i] = rnd(x[i] + t[i], bf);
}

// Rotate-half RoPE on one head [hd] in place: x * cos + rotate_half(x) * sin, rounded like eager.
static void rope(float* x, const float* c, const float* s, int hd, int bf) {
  const int half = hd / 2;
  float tmp[1024];
  for (int i = 0; i < hd; i++) tmp[i] = x[i];
  for (int i = 0; i < hd; i++) {
    const float rot = i < half ? -tmp[i + half] : tmp[i - half];
    x[i] = rnd(rnd(tmp[i] * c[i], bf) + rnd(rot * s[i], bf), bf);
  }
}

static inline float dot_act(const float* q, const void* k, int hd, int bf) {
#if defined(__AVX512F__)
  if (bf && (hd & 15) == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load_bf16x16((const uint16_t*)k + i), acc);
    return _mm512_reduce_add_ps(acc);
  }
  if (!bf && (hd & 15) == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps((const float*)k + i), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float s = 0.f;
  for (int i = 0; i < hd; i++) s += q[i] * load_act(k, i, bf);
  return s;
}

static inline void axpy_act(float p, const void* v, float* out, int hd, int bf) {
#if defined(__AVX512F__)
  if ((hd & 15) == 0) {
    const __m512 pv = _mm512_set1_ps(p);
    for (int i = 0; i < hd; i += 16) {
      __m512 vv = bf ? load_bf16x16((const uint16_t*)v + i) : _mm512_loadu_ps((const float*)v + i);
      _mm512_storeu_ps(out + i, _mm512_fmadd_ps(pv, vv, _mm512_loadu_ps(out + i)));
    }
    return;
  }
#endif
  for (int i = 0; i < hd; i++) out[i] += p * load_act(v, i, bf);
}

// One query head over its row's cache: softmax(q k^T * scale) v, optional tanh soft-capping and window.
static void attend(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now, int row,
                   int pos, int kvh, float* scores, float* out){
  const int hd = m->head_dim, bf = m->dtype == DT_BF16;
  const size_t esz = bf ? 2 : 4;
  const size_t head_off = ((size_t)row * m->kv_heads + kvh) * m->max_seq * hd;
  const char* K = (const char*)L->k_cache + head_off * esz;
  const char* V = (const char*)L->v_cache + head_off * esz;
  const int start = (L->window > 0 && pos - L->window + 1 > 0) ? pos - L->window + 1 : 0;
  const float cap = m->attn_softcap;
  float mx = -INFINITY;
  for (int j = start; j <= pos; j++) {
    // The current position's key comes from this step's q/k/v copy (the cache slot may not be written yet).
    float s = j < pos ? dot_act(q, K + (size_t)j * hd * esz, hd, bf) : dot_act(q, k_now, hd, 0);
    if (cap > 0.f) {
      // Eager's soft-capped path runs in the activation dtype: round after every op.
      s = rnd(rnd(s, bf) * m->attn_scale, bf);
      s = rnd(rnd(tanhf(rnd(s / cap, bf)), bf) * cap, bf);
    } else {
      s *= m->attn_scale;
    }
    scores[j] = s;
    mx = s > mx ? s : mx;
  }
  float sum = 0.f;
  int j = start;
#if SOLO_VEC
  {
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (; j <= pos; j += 16) {
      const __mmask16 msk = tail_mask(pos + 1 - j);
      const __m512 e = exp16(_mm512_sub_ps(load16(scores + j, msk), vmx));
      _mm512_mask_storeu_ps(scores + j, msk, e);
      acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(msk, e));
    }
    sum = _mm512_reduce_add_ps(acc);
  }
#endif
  for (; j <= pos; j++) {
    scores[j] = expf(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < hd; i++) out[i] = 0.f;
  if (cap > 0.f) {
    // Eager's soft-capped path casts the normalized probabilities to the dtype before p @ v.
    for (int j = start; j < pos; j++) axpy_act(rnd(scores[j] * inv, bf), V + (size_t)j * hd * esz, out, hd, bf);
    axpy_act(rnd(scores[pos] * inv, bf), v_now, out, hd, 0);
    for (int i = 0; i < hd; i++) out[i] = rnd(out[i], bf);
  } else {
    // PyTorch's CPU flash attention (used by eager SDPA) casts the unnormalized exponentials to the
    // dtype for p @ v and divides by their float32 sum afterwards.
    for (int j = start; j < pos; j++) axpy_act(rnd(scores[j], bf), V + (size_t)j * hd * esz, out, hd, bf);
    axpy_act(rnd(scores[pos], bf), v_now, out, hd, 0);
    for (int i = 0; i < hd; i++) out[i] = rnd(out[i] / sum, bf);
  }
}

