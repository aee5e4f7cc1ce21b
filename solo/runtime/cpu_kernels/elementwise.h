// The per-token work between the matrix products: dtype rounding, norms, activations, RoPE, attention.
#pragma once
#include "common.h"
#include "gemv.h"
#include "simd.h"

// ------------------------------------------------------------------------------- elementwise pieces
// Vectorized with AVX-512 (16 floats, masked tails) or the portable vectors of simd.h (8 floats, scalar
// tails) where the build has them; every result is rounded like the scalar code (round-to-nearest-even
// to bf16). Each element's arithmetic depends only on its index, never on the batch size.

#if SOLO_AVX512
#define SOLO_VEC 1

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
// [k0, k1) of every row. For the integer-dot formats (qdot.h) this writes float32: a block of 32 inputs is
// quantized as a whole, so a buffer filled by column ranges on several threads is quantized afterwards,
// by `private_input` on each thread.
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

// All columns of src [B, K] as the input W expects (the integer-dot formats: quantized; src != dst).
static void prepare_input(const Mat* W, const float* src, int B, void* dst) {
  if (q8_input(W))
    quantize_q8(W, src, B, dst);
  else
    prepare_input_cols(W, src, B, dst, 0, W->cols);
}

// The input for W from a shared buffer that prepare_input_cols filled (by column ranges, then a barrier):
// the buffer itself, or for the integer-dot formats its quantization into this thread's `scratch`
// (B slots of 4 * K bytes). Every thread quantizes the whole vector for itself: a few microseconds per
// matrix, and no barrier.
static const void* private_input(const Mat* W, const void* shared, int B, void* scratch) {
  if (!q8_input(W)) return shared;
  quantize_q8(W, (const float*)shared, B, scratch);
  return scratch;
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
#elif SOLO_GVEC
    for (; n + GVW <= n1; n += GVW) {
      vf v = vload(yb + n);
      if (W->bias) v += vload_act(W->bias, n, bf);
      vstore(yb + n, vrnd(v, bf));
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
#elif SOLO_GVEC
  vf acc = vzero();
  for (; i + GVW <= dim; i += GVW) {
    const vf v = vload(src + i);
    acc = vfma(v, v, acc);
  }
  ss = vsum(acc);
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
#elif SOLO_GVEC
  const vf vinv = vset1(inv), one = vset1(1.0f);
  for (; i + GVW <= dim; i += GVW) {
    const vf normed = vload(src + i) * vinv;
    const vf wi = vload_act(w, i, bf);
    vstore(dst + i, unit_offset ? vrnd(normed * (one + wi), bf) : vrnd(wi * vrnd(normed, bf), bf));
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
#elif SOLO_GVEC
  if (act != ACT_GELU) {
    const vf one = vset1(1.0f), half = vset1(0.5f);
    for (; i + GVW <= i1; i += GVW) {
      const vf g = vload(gate + i);
      vf a;
      if (act == ACT_SILU) {
        a = g / (one + vexp(-g));
      } else {
        const vf y = vset1(0.7978845608028654f) * vfma(vset1(0.044715f), g * g * g, g);
        const vf t = one - vset1(2.0f) / (vexp(y + y) + one);  // tanh(y) = 1 - 2 / (exp(2y) + 1)
        a = half * g * (one + t);
      }
      vstore(out + i, vrnd(vrnd(a, bf) * vload(up + i), bf));
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
#elif SOLO_GVEC
  for (; i + GVW <= n; i += GVW) vstore(x + i, vrnd(vload(x + i) + vload(t + i), bf));
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
#if SOLO_GVEC
  if ((hd % GVW) == 0) {
    vf acc = vzero();
    for (int i = 0; i < hd; i += GVW) acc = vfma(vload(q + i), vload_act(k, i, bf), acc);
    return vsum(acc);
  }
#endif
#if SOLO_AVX512
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
#if SOLO_GVEC
  if ((hd % GVW) == 0) {
    const vf pv = vset1(p);
    for (int i = 0; i < hd; i += GVW) vstore(out + i, vfma(pv, vload_act(v, i, bf), vload(out + i)));
    return;
  }
#endif
#if SOLO_AVX512
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

// scores[start..pos] = exp(scores - mx) in place (softmax numerators); returns their float32 sum.
static float softmax_numerators(float* scores, int start, int pos, float mx) {
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
#elif SOLO_GVEC
  {
    const vf vmx = vset1(mx);
    vf acc = vzero();
    for (; j + GVW <= pos + 1; j += GVW) {
      const vf e = vexp(vload(scores + j) - vmx);
      vstore(scores + j, e);
      acc += e;
    }
    sum = vsum(acc);
  }
#endif
  for (; j <= pos; j++) {
    scores[j] = expf(scores[j] - mx);
    sum += scores[j];
  }
  return sum;
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
  const float sum = softmax_numerators(scores, start, pos, mx);
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


// Software prefetch of the cached key and value rows this many blocks of 16 positions ahead (knob
// "attn_prefetch", 0 = off; measurement; never changes a result). At long context attention waits on the
// KV cache's latency more than on its bandwidth: its reads come in bursts (16 key rows, then the scores of
// every head) that the hardware prefetcher does not run far enough ahead of. Measured on Zen 5 (Qwen2.5-0.5B
// at 32000 positions, 2 threads, same-process A/B): attention 1.19x with the float32 q . k, 1.36x with the
// bf16 one below; 1 block ahead 0.92x, 4 blocks 0.85x, 8 blocks 0.96x of 2 blocks'. The portable builds'
// attention (AVX2, NEON) takes none: bound by its instructions, it measured 1.03x with it (SOLO_CPU_ISA=avx2,
// 16000 positions).
static int g_attn_prefetch = 2;
// Split-KV parts of a bf16 cache on AVX512-BF16 builds: q . k with bf16 dot products on the cache rows (1)
// or on rows widened to float32 (0). Knob "attn_qk_dot" (measurement). The bf16 one measured 1.14x on Zen 5
// and 0.93x on a Xeon 6 class CPU (whose VDPBF16PS issues one per two cycles, half its FMA's multiply-adds);
// at the amx level the parts' products run on tiles instead (amx.h).
static int g_attn_qk_dot = 1;

static inline void prefetch_rows(const char* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

#if SOLO_VEC
// Largest GQA group `attend_group` takes (query heads per KV head), and its q scratch in floats.
#define SOLO_MAX_GROUP 64
#define SOLO_GROUP_Q_FLOATS 4096

// 32 cached activations from `p` as two float32 vectors, without a cross-lane shuffle: for bf16, the
// even elements (the low halves of each 32-bit word shifted up) and the odd ones (the high halves
// masked); for float32, the first 16 and the next 16. `pair_layout` puts a float32 row in the same order.
static inline void load_pair(const void* p, int bf, __m512* lo, __m512* hi) {
  if (bf) {
    const __m512i w = _mm512_loadu_si512(p);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
  } else {
    *lo = _mm512_loadu_ps((const float*)p);
    *hi = _mm512_loadu_ps((const float*)p + 16);
  }
}

static inline __m512i pair_index(int first) {
  alignas(64) int idx[16];
  for (int i = 0; i < 16; i++) idx[i] = first + 2 * i;
  return _mm512_load_si512(idx);
}

// Reorder a float32 row of `n` (a multiple of 32) values into `load_pair`'s order for `bf` (or back).
static inline void pair_layout(const float* src, float* dst, int n, int bf, int inverse) {
  if (!bf) {
    if (src != dst) memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
  const __m512i even = pair_index(0), odd = pair_index(1);
  alignas(64) int lo[16], hi[16];
  for (int i = 0; i < 16; i++) {
    lo[i] = (i & 1) ? 16 + i / 2 : i / 2;  // inverse: interleave the even and odd vectors again
    hi[i] = (i & 1) ? 24 + i / 2 : 8 + i / 2;
  }
  const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
  for (int c = 0; c < n; c += 32) {
    const __m512 a = _mm512_loadu_ps(src + c), b = _mm512_loadu_ps(src + c + 16);
    _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(a, inverse ? ilo : even, b));
    _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(a, inverse ? ihi : odd, b));
  }
}

// p @ v for NB query heads at once (their rounded softmax numerators `p`, rows of `stride` floats), each
// cached value row loaded and widened once for all of them. acc: [NB, head_dim] in `load_pair` order.
// Per output element the fused multiply-adds and their order are those of `attend`'s `axpy_act`.
template <int NPAIR, int NB>
static inline void pv_block(const float* p, size_t stride, const char* V, size_t row_bytes, int bf, int start,
                            int end, float* acc_out) {
  __m512 acc[NB][2 * NPAIR];
  for (int h = 0; h < NB; h++)
    for (int c = 0; c < 2 * NPAIR; c++) acc[h][c] = _mm512_setzero_ps();
  for (int j = start; j < end; j++) {
    const char* vr = V + (size_t)j * row_bytes;
    if (g_attn_prefetch) prefetch_rows(vr + (size_t)g_attn_prefetch * 16 * row_bytes, row_bytes);
    __m512 v[2 * NPAIR];
    for (int c = 0; c < NPAIR; c++) load_pair(vr + (size_t)c * 32 * (bf ? 2 : 4), bf, &v[2 * c], &v[2 * c + 1]);
    for (int h = 0; h < NB; h++) {
      const __m512 ph = _mm512_set1_ps(p[(size_t)h * stride + j]);
      for (int c = 0; c < 2 * NPAIR; c++) acc[h][c] = _mm512_fmadd_ps(ph, v[c], acc[h][c]);
    }
  }
  for (int h = 0; h < NB; h++)
    for (int c = 0; c < 2 * NPAIR; c++) _mm512_storeu_ps(acc_out + (size_t)h * 32 * NPAIR + 16 * c, acc[h][c]);
}

// The heads left after the blocks of NB (fewer than NB) as one more block: one pass over the value rows
// instead of one per head, and independent accumulator chains (a lone head's 2 x NPAIR chains wait on the
// multiply-add latency). Each head's arithmetic is unchanged: the same bits.
template <int NPAIR, int NB>
static void pv_rest(const float* p, size_t stride, const char* V, size_t row_bytes, int bf, int start, int end,
                    int rest, float* acc_out) {
  if constexpr (NB > 1) {
    if (rest == NB - 1) {
      pv_block<NPAIR, NB - 1>(p, stride, V, row_bytes, bf, start, end, acc_out);
      return;
    }
    pv_rest<NPAIR, NB - 1>(p, stride, V, row_bytes, bf, start, end, rest, acc_out);
  }
}

template <int NPAIR, int NB>
static void pv_heads(const float* p, size_t stride, const char* V, size_t row_bytes, int bf, int start, int end,
                     int gs, float* acc_out) {
  int h = 0;
  for (; h + NB <= gs; h += NB)
    pv_block<NPAIR, NB>(p + (size_t)h * stride, stride, V, row_bytes, bf, start, end, acc_out + (size_t)h * 32 * NPAIR);
  if (h < gs)
    pv_rest<NPAIR, NB>(p + (size_t)h * stride, stride, V, row_bytes, bf, start, end, gs - h,
                       acc_out + (size_t)h * 32 * NPAIR);
}

// out[t] = the sum of the 16 lanes of a[t], t = 0..15: a fixed tree of shuffles and adds over all 16
// vectors at once (46 instructions, where 16 separate reductions take about three times as many).
static inline __m512 reduce16(const __m512* a) {
  __m512 r[8], u[4], v[2];
  for (int i = 0; i < 8; i++)  // halves: a[2i] in the low 256 bits, a[2i + 1] in the high ones
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; i++)  // quarters: a[4i + q] in 128-bit lane q
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; i++) {  // lane q: two partial sums of a[8i + q], then two of a[8i + 4 + q]
    const __m512d x = _mm512_castps_pd(u[2 * i]), y = _mm512_castps_pd(u[2 * i + 1]);
    v[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // lane q: the sums of a[q], a[4 + q], a[8 + q], a[12 + q]; then back to a's order.
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, w);
}

// `gs` consecutive query heads sharing KV head `kvh` (GQA), head_dim = 32 * NPAIR, no soft-capping, over
// the key positions j0 .. jend (inclusive; the current position `pos` when jend == pos comes from this
// step's k_now / v_now, earlier ones from the cache): one part of a split-KV attention, or all of it.
//   q: float32 [gs, head_dim]; k_now, v_now: float32 [head_dim]; scores: float32 [gs, stride] scratch
//   (indexed by position); out: per head, the part's score maximum mx[gs], the sum of its softmax
//   numerators sum[gs] and its unnormalized output acc[gs, head_dim] = sum_j rnd(exp(s_j - mx)) v_j.
// Each cached key and value row is loaded and widened once for the whole group (or a block of it)
// instead of once per head, and outputs accumulate in registers across positions. Same math as
// `attend` (scores in float32, softmax numerators rounded to the dtype for p @ v, divided by their
// float32 sum); q . k sums its products in a different order, so scores can differ from `attend` in
// the last float32 bits; p @ v is bit-identical. Results never depend on `gs`.
// `tiled` (split-KV parts, head_dim <= 128): scores of 16 keys at a time, their lanes summed by one
// `reduce16` (same products, another order of the final additions) instead of one reduction per key; with
// a bf16 cache on AVX512-BF16 builds (any head_dim) those products come from bf16 dot products (below), and
// at the amx level (head_dim 64 or 128, gs <= 16) both q . k and p @ v run on AMX tiles (amx.h).
template <int NPAIR>
static void attend_group_part(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                              int row, int pos, int j0, int jend, int kvh, int gs, float* scores, size_t stride,
                              float* mx_out, float* sum_out, float* acc_out, int tiled) {
  constexpr int hd = NPAIR * 32;
  constexpr int HB = NPAIR >= 4 ? (NPAIR >= 8 ? 1 : 2) : (NPAIR == 3 ? 3 : 4);  // heads per p @ v block
  const int bf = m->dtype == DT_BF16;
  const size_t esz = bf ? 2 : 4, row_bytes = hd * esz;
  const size_t head_off = ((size_t)row * m->kv_heads + kvh) * m->max_seq * hd;
  const char* K = (const char*)L->k_cache + head_off * esz;
  const char* V = (const char*)L->v_cache + head_off * esz;
  const int now = jend == pos, j1 = now ? pos : jend + 1;  // cached positions j0 .. j1 - 1
  const float scale = m->attn_scale;
  alignas(64) float qp[SOLO_GROUP_Q_FLOATS];  // q in `load_pair` order, then the p @ v accumulators
  float mx[SOLO_MAX_GROUP], sum[SOLO_MAX_GROUP];
  for (int g = 0; g < gs; g++) {
    pair_layout(q + (size_t)g * hd, qp + (size_t)g * hd, hd, bf, 0);
    mx[g] = -INFINITY;
  }
  int j = j0;
  (void)tiled;
#if SOLO_AMX
  // (head_dim 64 or 128, at most 16 heads: amx.h)
  constexpr int amx_hd = NPAIR == 2 || NPAIR == 4;
  const int amx_att = amx_hd && tiled && bf && gs <= 16 && j1 - j0 <= SOLO_AMX_PART && g_attn_amx && g_amx_permitted;
  if constexpr (amx_hd)
    if (amx_att) j = amx_part_scores<NPAIR>(q, gs, K, row_bytes, j, j1, scale, scores, stride, mx, g_attn_prefetch);
#else
  const int amx_att = 0;
#endif
#if defined(__AVX512BF16__)
  if (tiled && bf && g_attn_qk_dot && !amx_att) {
    // bf16 cache: q . k of 16 keys at a time with bf16 dot products on the cache rows as they are (no
    // widening to float32): q rounded to bf16 (exact where it holds bf16 values already, as after the
    // rounded RoPE), each instruction summing the products of two adjacent dims into 16 float32 lanes,
    // `reduce16` summing the lanes. The same products as the float32 path, added in another order. The 16
    // rows are first copied to L1 in one burst of loads (heads then read them from there; reading them from
    // the cache once per head was 0.69x the float32 path). With the prefetch above, attention at 32000
    // positions 1.14x the float32 path's (Qwen2.5-0.5B on Zen 5, same-process A/B).
    alignas(64) uint16_t qb[SOLO_GROUP_Q_FLOATS];
    for (int g = 0; g < gs; g++)
      for (int c = 0; c < NPAIR; c++) {
        const float* src = q + (size_t)g * hd + 32 * c;
        _mm512_store_si512(qb + (size_t)g * hd + 32 * c,
                           (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)));
      }
    const __m512 vscale = _mm512_set1_ps(scale);
    alignas(64) uint16_t kb[16 * 256];  // 16 key rows, bf16
    for (; j + 16 <= j1; j += 16) {
      if (g_attn_prefetch) prefetch_rows(K + (size_t)(j + 16 * g_attn_prefetch) * row_bytes, 16 * row_bytes);
      for (int t = 0; t < 16 * NPAIR; t++)
        _mm512_store_si512(kb + 32 * t, _mm512_loadu_si512(K + (size_t)j * row_bytes + 64 * t));
      for (int g = 0; g < gs; g++) {
        __m512bh qv[NPAIR];
        for (int c = 0; c < NPAIR; c++) qv[c] = (__m512bh)_mm512_load_si512(qb + (size_t)g * hd + 32 * c);
        __m512 a[16];
        for (int t = 0; t < 16; t++) {
          a[t] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_load_si512(kb + t * hd));
          for (int c = 1; c < NPAIR; c++)
            a[t] = _mm512_dpbf16_ps(a[t], qv[c], (__m512bh)_mm512_load_si512(kb + t * hd + 32 * c));
        }
        const __m512 sc = _mm512_mul_ps(reduce16(a), vscale);
        _mm512_storeu_ps(scores + (size_t)g * stride + j, sc);
        const float tmax = _mm512_reduce_max_ps(sc);
        mx[g] = tmax > mx[g] ? tmax : mx[g];
      }
    }
  }
#endif
  if constexpr (NPAIR <= 4) {
    alignas(64) float kt[16 * 128];  // 16 key rows widened to float32, in `load_pair` order
    const __m512 vscale = _mm512_set1_ps(scale);
    for (; tiled && j + 16 <= j1; j += 16) {
      if (g_attn_prefetch) prefetch_rows(K + (size_t)(j + 16 * g_attn_prefetch) * row_bytes, 16 * row_bytes);
      for (int t = 0; t < 16; t++)
        for (int c = 0; c < NPAIR; c++) {
          __m512 lo, hi;
          load_pair(K + (size_t)(j + t) * row_bytes + (size_t)c * 32 * esz, bf, &lo, &hi);
          _mm512_store_ps(kt + t * hd + 32 * c, lo);
          _mm512_store_ps(kt + t * hd + 32 * c + 16, hi);
        }
      for (int g = 0; g < gs; g++) {
        const float* qg = qp + (size_t)g * hd;
        __m512 qv[2 * NPAIR], a[16];
        for (int c = 0; c < 2 * NPAIR; c++) qv[c] = _mm512_load_ps(qg + 16 * c);
        for (int t = 0; t < 16; t++) {
          a[t] = _mm512_mul_ps(qv[0], _mm512_load_ps(kt + t * hd));
          for (int c = 1; c < 2 * NPAIR; c++) a[t] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kt + t * hd + 16 * c), a[t]);
        }
        const __m512 sc = _mm512_mul_ps(reduce16(a), vscale);
        _mm512_storeu_ps(scores + (size_t)g * stride + j, sc);
        const float tmax = _mm512_reduce_max_ps(sc);
        mx[g] = tmax > mx[g] ? tmax : mx[g];
      }
    }
  }
  for (; j < j1; j++) {
    __m512 k[2 * NPAIR];
    for (int c = 0; c < NPAIR; c++)
      load_pair(K + (size_t)j * row_bytes + (size_t)c * 32 * esz, bf, &k[2 * c], &k[2 * c + 1]);
    for (int g = 0; g < gs; g++) {
      const float* qg = qp + (size_t)g * hd;
      __m512 acc = _mm512_mul_ps(_mm512_load_ps(qg), k[0]);
      for (int c = 1; c < 2 * NPAIR; c++) acc = _mm512_fmadd_ps(_mm512_load_ps(qg + 16 * c), k[c], acc);
      const float s = _mm512_reduce_add_ps(acc) * scale;
      scores[(size_t)g * stride + j] = s;
      mx[g] = s > mx[g] ? s : mx[g];
    }
  }
  if (now) {
    // The current position's key comes from this step's q/k/v copy (the cache slot may not be written yet).
    alignas(64) float kn[256];
    pair_layout(k_now, kn, hd, bf, 0);
    for (int g = 0; g < gs; g++) {
      const float* qg = qp + (size_t)g * hd;
      __m512 acc = _mm512_mul_ps(_mm512_load_ps(qg), _mm512_load_ps(kn));
      for (int c = 1; c < 2 * NPAIR; c++) acc = _mm512_fmadd_ps(_mm512_load_ps(qg + 16 * c), _mm512_load_ps(kn + 16 * c), acc);
      const float s = _mm512_reduce_add_ps(acc) * scale;
      scores[(size_t)g * stride + pos] = s;
      mx[g] = s > mx[g] ? s : mx[g];
    }
  }
  for (int g = 0; g < gs; g++) {
    // Softmax numerators, stored rounded to the dtype (for p @ v) and summed unrounded.
    float* sg = scores + (size_t)g * stride;
    const __m512 vmx = _mm512_set1_ps(mx[g]);
    __m512 acc = _mm512_setzero_ps();
    for (int i = j0; i <= jend; i += 16) {
      const __mmask16 msk = tail_mask(jend + 1 - i);
      const __m512 e = exp16(_mm512_sub_ps(load16(sg + i, msk), vmx));
      _mm512_mask_storeu_ps(sg + i, msk, rnd16(e, bf));
      acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(msk, e));
    }
    sum[g] = _mm512_reduce_add_ps(acc);
    mx_out[g] = mx[g];
    sum_out[g] = sum[g];
  }
#if SOLO_AMX
  if constexpr (amx_hd) {
    if (amx_att) amx_part_pv<NPAIR>(scores, stride, gs, V, row_bytes, j0, j1, qp, g_attn_prefetch);
  }
  if (!amx_att)
#endif
    pv_heads<NPAIR, HB>(scores, stride, V, row_bytes, bf, j0, j1, gs, qp);
  alignas(64) float vn[256];
  if (now) pair_layout(v_now, vn, hd, 0, 0);  // float32 row: `load_pair`'s float32 order is the natural one
  for (int g = 0; g < gs; g++) {
    float* acc = qp + (size_t)g * hd;
    const __m512 p = _mm512_set1_ps(now ? scores[(size_t)g * stride + pos] : 0.f);
    for (int c = 0; c < NPAIR; c++) {
      // v_now is float32 (natural order) while acc is in the cache dtype's pair order.
      __m512 a = _mm512_loadu_ps(acc + 32 * c), b = _mm512_loadu_ps(acc + 32 * c + 16);
      alignas(64) float tmp[32];
      _mm512_store_ps(tmp, a);
      _mm512_store_ps(tmp + 16, b);
      pair_layout(tmp, tmp, 32, bf, 1);  // back to natural order
      a = _mm512_load_ps(tmp);
      b = _mm512_load_ps(tmp + 16);
      if (now) {
        a = _mm512_fmadd_ps(p, _mm512_load_ps(vn + 32 * c), a);
        b = _mm512_fmadd_ps(p, _mm512_load_ps(vn + 32 * c + 16), b);
      }
      _mm512_storeu_ps(acc_out + (size_t)g * hd + 32 * c, a);
      _mm512_storeu_ps(acc_out + (size_t)g * hd + 32 * c + 16, b);
    }
  }
}

// The whole attention of `gs` query heads (positions start .. pos) into out [gs, head_dim]: one part, then
// the division by the softmax sum and the rounding to the dtype.
template <int NPAIR>
static void attend_group(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                         int row, int pos, int kvh, int gs, float* scores, size_t stride, float* out) {
  constexpr int hd = NPAIR * 32;
  const int bf = m->dtype == DT_BF16;
  const int start = (L->window > 0 && pos - L->window + 1 > 0) ? pos - L->window + 1 : 0;
  float mx[SOLO_MAX_GROUP], sum[SOLO_MAX_GROUP];
  attend_group_part<NPAIR>(m, L, q, k_now, v_now, row, pos, start, pos, kvh, gs, scores, stride, mx, sum, out, 0);
  for (int g = 0; g < gs; g++) {
    const __m512 vsum = _mm512_set1_ps(sum[g]);
    float* og = out + (size_t)g * hd;
    for (int c = 0; c < 2 * NPAIR; c++)
      _mm512_storeu_ps(og + 16 * c, rnd16(_mm512_div_ps(_mm512_loadu_ps(og + 16 * c), vsum), bf));
  }
}

// Query heads per `attend_group` call, or 0 where it does not apply (no AVX-512 build, soft-capping, a
// head_dim that is not 64, 96, 128 or 256): the GQA group, shrunk to a divisor of itself until
// batch * heads / group work items keep all `nthreads` threads busy.
static int attend_group_size(const Model* m, int batch, int nthreads) {
  const int hd = m->head_dim, g = m->heads / m->kv_heads;
  if (m->attn_softcap > 0.f || !(hd == 64 || hd == 96 || hd == 128 || hd == 256)) return 0;
  int gs = g;
  while (gs > 1 && ((long)batch * (m->heads / gs) < nthreads || gs > SOLO_MAX_GROUP ||
                    (long)gs * hd > SOLO_GROUP_Q_FLOATS)) {
    do gs--; while (g % gs != 0);
  }
  return gs;
}

static void attend_heads(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                         int row, int pos, int kvh, int gs, float* scores, size_t stride, float* out) {
  switch (m->head_dim) {
    case 64: attend_group<2>(m, L, q, k_now, v_now, row, pos, kvh, gs, scores, stride, out); break;
    case 96: attend_group<3>(m, L, q, k_now, v_now, row, pos, kvh, gs, scores, stride, out); break;
    case 128: attend_group<4>(m, L, q, k_now, v_now, row, pos, kvh, gs, scores, stride, out); break;
    default: attend_group<8>(m, L, q, k_now, v_now, row, pos, kvh, gs, scores, stride, out); break;
  }
}

// One split-KV part (see `attend_group_part`): positions j0 .. jend of `gs` query heads.
static void attend_heads_part(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                              int row, int pos, int j0, int jend, int kvh, int gs, float* scores, size_t stride,
                              float* mx, float* sum, float* acc) {
  switch (m->head_dim) {
    case 64: attend_group_part<2>(m, L, q, k_now, v_now, row, pos, j0, jend, kvh, gs, scores, stride, mx, sum, acc, 1); break;
    case 96: attend_group_part<3>(m, L, q, k_now, v_now, row, pos, j0, jend, kvh, gs, scores, stride, mx, sum, acc, 1); break;
    case 128: attend_group_part<4>(m, L, q, k_now, v_now, row, pos, j0, jend, kvh, gs, scores, stride, mx, sum, acc, 1); break;
    default: attend_group_part<8>(m, L, q, k_now, v_now, row, pos, j0, jend, kvh, gs, scores, stride, mx, sum, acc, 1); break;
  }
}
#elif SOLO_GVEC
#define SOLO_MAX_GROUP 64

// `gs` consecutive query heads sharing KV head `kvh` (GQA), no soft-capping, head_dim a multiple of 8
// and at most 256, over the key positions j0 .. jend (inclusive; the current position `pos` when
// jend == pos comes from this step's k_now / v_now): one part of a split-KV attention, or all of it.
//   q: float32 [gs, head_dim]; scores [gs, stride] scratch (indexed by position); out: per head, the
//   part's score maximum mx[gs], the sum of its softmax numerators sum[gs] and its unnormalized output
//   acc[gs, head_dim] = sum_j rnd(exp(s_j - mx)) v_j.
// Each cached key and value row is loaded and widened once for the whole group instead of once per
// head; per head, every operation and its order are those of `attend` (the same dot products, softmax
// numerators and p @ v fused multiply-adds), so the results are bit-identical to it, whatever `gs` is.
static void attend_heads_part(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                              int row, int pos, int j0, int jend, int kvh, int gs, float* scores, size_t stride,
                              float* mx, float* sum, float* acc) {
  const int hd = m->head_dim, bf = m->dtype == DT_BF16;
  const size_t esz = bf ? 2 : 4;
  const size_t head_off = ((size_t)row * m->kv_heads + kvh) * m->max_seq * hd;
  const char* K = (const char*)L->k_cache + head_off * esz;
  const char* V = (const char*)L->v_cache + head_off * esz;
  float row_f32[256];
  for (int g = 0; g < gs; g++) mx[g] = -INFINITY;
  for (int j = j0; j <= jend; j++) {
    // The current position's key comes from this step's q/k/v copy (the cache slot may not be written yet).
    const void* kr = j < pos ? (const void*)(K + (size_t)j * hd * esz) : (const void*)k_now;
    const int kbf = j < pos ? bf : 0;
    for (int i = 0; i < hd; i += GVW) vstore(row_f32 + i, vload_act(kr, i, kbf));
    for (int g = 0; g < gs; g++) {
      const float* qg = q + (size_t)g * hd;
      vf a = vzero();
      for (int i = 0; i < hd; i += GVW) a = vfma(vload(qg + i), vload(row_f32 + i), a);
      float sc = vsum(a);
      sc *= m->attn_scale;
      scores[(size_t)g * stride + j] = sc;
      mx[g] = sc > mx[g] ? sc : mx[g];
    }
  }
  for (int g = 0; g < gs; g++) {
    sum[g] = softmax_numerators(scores + (size_t)g * stride, j0, jend, mx[g]);
    float* og = acc + (size_t)g * hd;
    for (int i = 0; i < hd; i++) og[i] = 0.f;
  }
  // PyTorch's CPU flash attention casts the unnormalized exponentials to the dtype for p @ v and divides
  // by their float32 sum afterwards (as `attend`). Blocks of PV_KEYS value rows are widened once; each head
  // then keeps 32 outputs in registers across the block (one fused multiply-add per key and output, in key
  // order: the same operations as one key at a time, without a load and a store of the output per key).
  constexpr int PV_KEYS = 16;
  float vblock[PV_KEYS][256];
  for (int jb = j0; jb <= jend; jb += PV_KEYS) {
    const int nb = jend + 1 - jb < PV_KEYS ? jend + 1 - jb : PV_KEYS;
    for (int t = 0; t < nb; t++) {
      const int j = jb + t;
      const void* vr = j < pos ? (const void*)(V + (size_t)j * hd * esz) : (const void*)v_now;
      const int vbf = j < pos ? bf : 0;
      for (int i = 0; i < hd; i += GVW) vstore(vblock[t] + i, vload_act(vr, i, vbf));
    }
    for (int g = 0; g < gs; g++) {
      const float* sg = scores + (size_t)g * stride + jb;
      float* og = acc + (size_t)g * hd;
      int i = 0;
      for (; i + 4 * GVW <= hd; i += 4 * GVW) {
        vf a0 = vload(og + i), a1 = vload(og + i + GVW), a2 = vload(og + i + 2 * GVW), a3 = vload(og + i + 3 * GVW);
        for (int t = 0; t < nb; t++) {
          const vf pv = vset1(rnd(sg[t], bf));
          a0 = vfma(pv, vload(vblock[t] + i), a0);
          a1 = vfma(pv, vload(vblock[t] + i + GVW), a1);
          a2 = vfma(pv, vload(vblock[t] + i + 2 * GVW), a2);
          a3 = vfma(pv, vload(vblock[t] + i + 3 * GVW), a3);
        }
        vstore(og + i, a0), vstore(og + i + GVW, a1), vstore(og + i + 2 * GVW, a2), vstore(og + i + 3 * GVW, a3);
      }
      for (; i < hd; i += GVW) {
        vf a = vload(og + i);
        for (int t = 0; t < nb; t++) a = vfma(vset1(rnd(sg[t], bf)), vload(vblock[t] + i), a);
        vstore(og + i, a);
      }
    }
  }
}

// The whole attention of `gs` query heads (positions start .. pos) into out [gs, head_dim]: one part, then
// the division by the softmax sum and the rounding to the dtype.
static void attend_heads(const Model* m, const Layer* L, const float* q, const float* k_now, const float* v_now,
                         int row, int pos, int kvh, int gs, float* scores, size_t stride, float* out) {
  const int hd = m->head_dim, bf = m->dtype == DT_BF16;
  const int start = (L->window > 0 && pos - L->window + 1 > 0) ? pos - L->window + 1 : 0;
  float mx[SOLO_MAX_GROUP], sum[SOLO_MAX_GROUP];
  attend_heads_part(m, L, q, k_now, v_now, row, pos, start, pos, kvh, gs, scores, stride, mx, sum, out);
  for (int g = 0; g < gs; g++) {
    float* og = out + (size_t)g * hd;
    for (int i = 0; i < hd; i++) og[i] = rnd(og[i] / sum[g], bf);
  }
}

// Query heads per `attend_heads` call, or 0 where it does not apply (soft-capping, a head_dim that is not
// a multiple of 8 or is above 256): the GQA group, shrunk to a divisor of itself until batch * heads /
// group work items keep all `nthreads` threads busy.
static int attend_group_size(const Model* m, int batch, int nthreads) {
  const int hd = m->head_dim, g = m->heads / m->kv_heads;
  if (m->attn_softcap > 0.f || hd % GVW != 0 || hd > 256) return 0;
  int gs = g;
  while (gs > 1 && ((long)batch * (m->heads / gs) < nthreads || gs > SOLO_MAX_GROUP)) {
    do gs--; while (g % gs != 0);
  }
  return gs;
}
#else
static int attend_group_size(const Model*, int, int) { return 0; }
static void attend_heads(const Model*, const Layer*, const float*, const float*, const float*, int, int, int, int,
                         float*, size_t, float*) {}
static void attend_heads_part(const Model*, const Layer*, const float*, const float*, const float*, int, int, int,
                              int, int, int, float*, size_t, float*, float*, float*) {}
#endif

// ------------------------------------------------------------------------------ split-KV attention
// Flash-decoding (Dao et al., 2023): at long context one sequence's attention is split along the key
// positions into blocks that run on different threads, each giving its own maximum, softmax sum and
// unnormalized output; `merge_attention_parts` rescales them to the common maximum and divides once.
// The blocks lie on a fixed grid of SOLO_KV_BLOCK positions (0 .. 511, 512 .. 1023, ...), so how a
// sequence is split depends on its position only, never on the batch or the thread count: batched
// decode stays bit-identical to batch 1. A sequence within one block (contexts up to 512 tokens) runs
// the unsplit kernel exactly as before. Only the vector kernels split (`attend_group_size` > 0); the
// per-head kernel (soft-capping, odd head sizes, the scalar build) keeps one item per head.
#define SOLO_KV_BLOCK 512

// Blocks of the grid that key positions start .. pos touch (1: no split).
static inline int kv_blocks(int start, int pos) { return pos / SOLO_KV_BLOCK - start / SOLO_KV_BLOCK + 1; }

// Floats of one part: mx[gs], sum[gs], acc[gs, head_dim].
static inline size_t part_floats(int gs, int hd) { return (size_t)gs * (hd + 2); }

// out[g, :] = rnd(sum_k acc_k[g, :] e^(mx_k - M) / sum_k sum_k[g] e^(mx_k - M)), M = max_k mx_k, for the
// `nb` parts of `gs` query heads laid out one after another (`part_floats` each), in block order.
static void merge_attention_parts(const float* parts, int nb, int gs, int hd, int bf, float* out) {
  const size_t pf = part_floats(gs, hd);
  for (int g = 0; g < gs; g++) {
    float M = -INFINITY;
    for (int k = 0; k < nb; k++) M = fmaxf(M, parts[k * pf + g]);
    float total = 0.f;
    float* og = out + (size_t)g * hd;
    for (int i = 0; i < hd; i++) og[i] = 0.f;
    for (int k = 0; k < nb; k++) {
      const float* part = parts + k * pf;
      const float w = expf(part[g] - M);
      total = fmaf(part[gs + g], w, total);
      const float* acc = part + 2 * gs + (size_t)g * hd;
      for (int i = 0; i < hd; i++) og[i] = fmaf(acc[i], w, og[i]);
    }
    for (int i = 0; i < hd; i++) og[i] = rnd(og[i] / total, bf);
  }
}
