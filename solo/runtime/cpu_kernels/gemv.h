// Matrix-vector products (and products with a few vectors) over row-major weights, split by rows.
#pragma once
#include "common.h"
#include "simd.h"
#include "qdot.h"
#include "amx.h"  // packed bf16 weights (packed.h) and their products on AMX tiles (the "amx" level only)

// -------------------------------------------------------------------- matrix-vector products (GEMV)
// y[b, n] = sum_k W[n, k] * x[b, k] for rows n in [n0, n1). x is bf16 for bf16 weights, else float32.

// Streams of the AVX512-BF16 decode kernel (knob "bf16_streams": 1, 2 or 4; the same bits at every setting).
// S rows at once, one from each of S contiguous runs of the thread's rows, each run read linearly (a row
// follows the one before it), as the portable kernel below: S streams keep more memory reads in flight
// than one. (Rows side by side from ONE run, i.e. many short row streams, defeat the hardware prefetcher:
// measured 2-3x slower.) Measured (2-core Intel Xeon with AMX, 480 MiB L3; benchmarks/step_ab.py, whole
// decode steps, same process; results/intel-xeon-amx/step-ab-bf16-streams-*.txt): four streams against one
// 1.50x (Qwen2.5-0.5B) and 1.39x (Llama-3.2-1B), 90-92% of the round's bandwidth probe against 61-67%; two
// streams the same (in an earlier run, at higher bandwidth: 1.28x / 1.17x, two 1.23x / 1.12x). On a 2-core
// AMD EPYC Zen 4 two streams against four 1.02-1.08x, one 1.00-1.10x, so the build sets two there
// (cpu_build.bf16_stream_count: SOLO_BF16_STREAMS); Zen 5 is not measured with streams.
#ifndef SOLO_BF16_STREAMS
#define SOLO_BF16_STREAMS 4
#endif
static int g_bf16_streams = SOLO_BF16_STREAMS;

#if SOLO_AVX512 && defined(__AVX512BF16__)
// Rows of S streams x BT sequences (knob "bf16_streams" below). Each row: four accumulators per sequence
// over k hide the dot-product latency, and every (row, sequence) sums in the same order whatever S and BT
// are, so a row's result is bit-identical at batch 1, batched, and in any stream.
template <int S, int BT>
static inline void bf16_rows_bt(const uint16_t* W, const int* row, int K, const uint16_t* x, int ldx, float* y,
                                int ldy) {
  const uint16_t* w[S];
  for (int s = 0; s < S; s++) w[s] = W + (size_t)row[s] * K;
  const int k4 = K & ~127, kmain = K & ~31;
  const int rem = K - kmain;
  const __mmask32 tail = rem ? (__mmask32)((1ull << rem) - 1) : 0;
  __m512 acc[S][BT][4];
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++)
      for (int i = 0; i < 4; i++) acc[s][j][i] = _mm512_setzero_ps();
  int k = 0;
  for (; k < k4; k += 128) {
    for (int s = 0; s < S; s++) {
      PREFETCH(w[s] + k);
      PREFETCH(w[s] + k + 32);
      PREFETCH(w[s] + k + 64);
      PREFETCH(w[s] + k + 96);
    }
    for (int s = 0; s < S; s++)
      for (int i = 0; i < 4; i++) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w[s] + k + 32 * i);
        for (int j = 0; j < BT; j++)
          acc[s][j][i] = _mm512_dpbf16_ps(acc[s][j][i], wv,
                                          (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + k + 32 * i));
      }
  }
  for (; k < kmain; k += 32)
    for (int s = 0; s < S; s++) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w[s] + k);
      for (int j = 0; j < BT; j++)
        acc[s][j][0] = _mm512_dpbf16_ps(acc[s][j][0], wv, (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + k));
    }
  if (rem)
    for (int s = 0; s < S; s++) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, w[s] + kmain);
      for (int j = 0; j < BT; j++)
        acc[s][j][1] = _mm512_dpbf16_ps(acc[s][j][1], wv,
                                        (__m512bh)_mm512_maskz_loadu_epi16(tail, x + (size_t)j * ldx + kmain));
    }
  for (int s = 0; s < S; s++) {
    __m512 a[BT];
    for (int j = 0; j < BT; j++)
      a[j] = _mm512_add_ps(_mm512_add_ps(acc[s][j][0], acc[s][j][1]), _mm512_add_ps(acc[s][j][2], acc[s][j][3]));
    if constexpr (BT == 4) {  // the four tokens' sums at once (span prefill: 1.02-1.04x its products at K <= 2048)
      alignas(16) float r[4];
      _mm_store_ps(r, hsum16x4(a));
      for (int j = 0; j < 4; j++) y[(size_t)j * ldy + row[s]] = r[j];
    } else {
      for (int j = 0; j < BT; j++) y[(size_t)j * ldy + row[s]] = hsum16(a[j]);
    }
  }
}

template <int S, int BT>
static void bf16_streams_bt(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0,
                            int n1) {
  for_row_streams<S>(n0, n1, [&](auto rows, const int* row) {
    bf16_rows_bt<decltype(rows)::value, BT>(W, row, K, x, ldx, y, ldy);
  });
}

// y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and BT sequences j (bf16 inputs).
template <int BT>
static void gemv_bf16_bt(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0,
                         int n1) {
  // S x BT x 4 accumulators within 32 registers, with room for the weights and inputs.
  if constexpr (BT == 1) {
    if (g_bf16_streams >= 4) return bf16_streams_bt<4, 1>(W, K, x, ldx, y, ldy, n0, n1);
  }
  if constexpr (BT <= 2) {
    if (g_bf16_streams >= 2) return bf16_streams_bt<2, BT>(W, K, x, ldx, y, ldy, n0, n1);
  }
  bf16_streams_bt<1, BT>(W, K, x, ldx, y, ldy, n0, n1);
}
#endif

#if SOLO_AVX512
template <int BT>
static void gemv_f32_bt(const float* W, int K, const float* x, int ldx, float* y, int ldy, int n0, int n1) {
  const int kmain = K & ~15;
  for (int n = n0; n < n1; n++) {
    const float* w = W + (size_t)n * K;
    __m512 acc[BT];
    for (int j = 0; j < BT; j++) acc[j] = _mm512_setzero_ps();
    for (int k = 0; k < kmain; k += 16) {
      PREFETCH(w + k);
      __m512 wv = _mm512_loadu_ps(w + k);
      for (int j = 0; j < BT; j++) acc[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)j * ldx + k), acc[j]);
    }
    for (int j = 0; j < BT; j++) {
      float s = _mm512_reduce_add_ps(acc[j]);
      for (int k = kmain; k < K; k++) s += w[k] * x[(size_t)j * ldx + k];
      y[(size_t)j * ldy + n] = s;
    }
  }
}

// bf16 weights without AVX512-BF16: widen to float32 and use FMA.
template <int BT>
static void gemv_bf16w_f32_bt(const uint16_t* W, int K, const float* x, int ldx, float* y, int ldy, int n0,
                              int n1) {
  const int kmain = K & ~15;
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[BT];
    for (int j = 0; j < BT; j++) acc[j] = _mm512_setzero_ps();
    for (int k = 0; k < kmain; k += 16) {
      PREFETCH(w + k);
      __m512 wv = load_bf16x16(w + k);
      for (int j = 0; j < BT; j++) acc[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)j * ldx + k), acc[j]);
    }
    for (int j = 0; j < BT; j++) {
      float s = _mm512_reduce_add_ps(acc[j]);
      for (int k = kmain; k < K; k++) s += bf16_to_f32(w[k]) * x[(size_t)j * ldx + k];
      y[(size_t)j * ldy + n] = s;
    }
  }
}

// int8 rows with a per-row scale. Two accumulator sets alternate so one sequence still has two chains.
template <int BT>
static void gemv_int8_bt(const int8_t* W, const float* scale, int K, const float* x, int ldx, float* y, int ldy,
                         int n0, int n1) {
  const int kmain = K & ~31;
  for (int n = n0; n < n1; n++) {
    const int8_t* w = W + (size_t)n * K;
    __m512 acc0[BT], acc1[BT];
    for (int j = 0; j < BT; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int k = 0; k < kmain; k += 32) {
      PREFETCH(w + k);
      __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + k))));
      __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + k + 16))));
      for (int j = 0; j < BT; j++) {
        const float* xj = x + (size_t)j * ldx + k;
        acc0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xj), acc0[j]);
        acc1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xj + 16), acc1[j]);
      }
    }
    for (int j = 0; j < BT; j++) {
      float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
      for (int k = kmain; k < K; k++) s += (float)w[k] * x[(size_t)j * ldx + k];
      y[(size_t)j * ldy + n] = s * scale[n];
    }
  }
}

// int4 rows: per group of 32 inputs, 16 bytes hold inputs i (low nibble) and i + 16 (high nibble).
template <int BT>
static void gemv_int4_bt(const uint8_t* W, const uint16_t* scale, int K, const float* x, int ldx, float* y,
                         int ldy, int n0, int n1) {
  const int groups = K / 32;
  const __m512i low = _mm512_set1_epi32(0xF);
  const __m512i eight = _mm512_set1_epi32(8);
  for (int n = n0; n < n1; n++) {
    const uint8_t* w = W + (size_t)n * (K / 2);
    const uint16_t* s = scale + (size_t)n * groups;
    __m512 acc[BT];
    for (int j = 0; j < BT; j++) acc[j] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
      if ((g & 3) == 0) PREFETCH(w + 16 * g);
      __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(w + 16 * g)));
      __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(v, low), eight));
      __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(v, 4), eight));
      __m512 sg = _mm512_set1_ps(bf16_to_f32(s[g]));
      for (int j = 0; j < BT; j++) {
        const float* xj = x + (size_t)j * ldx + 32 * g;
        __m512 t = _mm512_mul_ps(lo, _mm512_loadu_ps(xj));
        t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xj + 16), t);
        acc[j] = _mm512_fmadd_ps(t, sg, acc[j]);
      }
    }
    for (int j = 0; j < BT; j++) y[(size_t)j * ldy + n] = _mm512_reduce_add_ps(acc[j]);
  }
}
#endif

#if SOLO_AVX512 && defined(__AVX512BF16__)
// int4 through bf16 dot products: the nibble u (0..15) OR'ed into the bf16 bits of 128.0 (0x4300) is
// exactly the bf16 number 128 + u, so one dpbf16 multiplies 32 weights at once without int->float
// conversions; sum((u - 8) x) = sum((128 + u) x) - 136 sum(x), with sum(x) per group computed once per
// call (products of bf16 values are exact in float32; the cancellation costs ~7 bits of the 24).
template <int BT>
static void gemv_int4_bf16_bt(const uint8_t* W, const uint16_t* scale, int K, const uint16_t* x, int ldx, float* y,
                              int ldy, int n0, int n1) {
  const int groups = K / 32;
  float xsum[BT][1024];  // per-group input sums; K <= 32768 (checked when the runtime is built)
  for (int j = 0; j < BT; j++)
    for (int g = 0; g < groups; g++) {
      float t = 0.f;
      for (int i = 0; i < 32; i++) t += bf16_to_f32(x[(size_t)j * ldx + 32 * g + i]);
      xsum[j][g] = t;
    }
  const __m256i low = _mm256_set1_epi16(0xF);
  const __m512i base = _mm512_set1_epi16(0x4300);
  for (int n = n0; n < n1; n++) {
    const uint8_t* w = W + (size_t)n * (K / 2);
    const uint16_t* s = scale + (size_t)n * groups;
    // Two accumulator sets alternate between groups: the scale multiply-add chain is the bottleneck.
    __m512 acc[2][BT];
    for (int j = 0; j < BT; j++) acc[0][j] = acc[1][j] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
      if ((g & 3) == 0) PREFETCH(w + 16 * g);
      const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(w + 16 * g)));
      const __m512i wv = _mm512_or_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low)), _mm256_srli_epi16(v, 4), 1), base);
      const __m512 sg = _mm512_set1_ps(bf16_to_f32(s[g]));
      __m512* a = acc[g & 1];
      for (int j = 0; j < BT; j++) {
        const __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv,
                                          (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + 32 * g));
        a[j] = _mm512_fmadd_ps(t, sg, a[j]);
      }
    }
    __m512 acc_sum[BT];
    for (int j = 0; j < BT; j++) acc_sum[j] = _mm512_add_ps(acc[0][j], acc[1][j]);
    for (int j = 0; j < BT; j++) {
      // Correction: 136 * sum_g scale_g * sum(x in group g), vectorized over groups.
      __m512 c = _mm512_setzero_ps();
      int g = 0;
      for (; g + 16 <= groups; g += 16)
        c = _mm512_fmadd_ps(load_bf16x16(s + g), _mm512_loadu_ps(&xsum[j][g]), c);
      float corr = _mm512_reduce_add_ps(c);
      for (; g < groups; g++) corr += bf16_to_f32(s[g]) * xsum[j][g];
      y[(size_t)j * ldy + n] = _mm512_reduce_add_ps(acc_sum[j]) - 136.0f * corr;
    }
  }
}
#endif

// Streams of the portable builds' dense decode kernel (knob "row_streams": 1, 2 or 4; measurement, the same
// bits at every setting; below).
static int g_row_streams = 4;

#if SOLO_GVEC
// ----------------------------------------------------------- portable kernels (vector extensions)
// Dense rows (bf16, float32 or int8 with a row scale): widen GVW weights at a time to float32 and FMA
// with the float32 input. The order of every (row, sequence), whatever computed it: ONE accumulator over k
// in GVW-wide chunks, vsum, then the scalar rest (dense_row_finish), so batch-1 decode, batched decode and
// the rows x tokens tiles of tile.h (span prefill) give the same bits. One accumulator per row is a single
// chain of dependent FMAs, so the decode kernel runs several rows at once: S rows, one from each of S
// contiguous runs of the caller's rows ("streams"): each run streams linearly through memory (a row
// follows the one before it), and S streams keep more memory reads in flight than one. Measured (Zen 3,
// 2 threads, benchmarks/step_ab.py: whole decode steps against the four-accumulator kernel of one row at a
// time, the order before, built beside it; results/amd-epyc-zen3/step-ab-row-streams-*.txt): Qwen2.5-0.5B
// 1.19x, Llama-3.2-1B 1.19x (1.21x / 1.30x in earlier runs); two streams 1.16x / 1.17x; one 0.89x / 0.88x (a
// row's single FMA chain then bounds it). Rows side by side from ONE run (rows n, n + 1, ...), tried in a
// standalone loop, were slower than one row at a time at K = 896: a row is 1.8 KiB, and the stream breaks
// at every row.
// One accumulator also lets the span prefill's tile keep a whole (row, token) dot product in one register
// (tile.h: the span prefill 1.35x / 1.37x).
template <int FMT>
static inline vf wload(const void* w, size_t k) {
  if (FMT == W_BF16) return vload_bf16((const uint16_t*)w + k);
  if (FMT == W_F32) return vload((const float*)w + k);
  return vload_i8((const int8_t*)w + k);
}
template <int FMT>
static inline float wscalar(const void* w, size_t k) {
  if (FMT == W_BF16) return bf16_to_f32(((const uint16_t*)w)[k]);
  if (FMT == W_F32) return ((const float*)w)[k];
  return (float)((const int8_t*)w)[k];
}
template <int FMT>
static constexpr size_t wbytes() {
  return FMT == W_BF16 ? 2 : (FMT == W_F32 ? 4 : 1);
}

// A row's result from its accumulator: vsum, then the k1 .. K - 1 rest one at a time, then the int8 row
// scale. Every kernel that computes a dense row ends here (the order above). The rest takes explicit fused
// multiply-adds: `s += w * x` would leave contraction (and, for float32 rows, partial vectorization) to
// each inlined copy's optimizer (g++ contracts C++ by default), so two kernels could differ in the bits.
template <int FMT>
static inline float dense_row_finish(const Mat* W, const void* w, int n, vf acc, const float* x, int k1) {
  float s = vsum(acc);
  for (int kk = k1; kk < W->cols; kk++) s = __builtin_fmaf(wscalar<FMT>(w, kk), x[kk], s);
  return FMT == W_INT8 ? s * ((const float*)W->scale)[n] : s;
}

// Rows row[0 .. S) x BT sequences: one accumulator each, k in GVW-wide chunks.
template <int FMT, int S, int BT>
static inline void dense_rows_g(const Mat* W, const int* row, const float* x, int ldx, float* y, int ldy) {
  const void* w[S];
  for (int s = 0; s < S; s++) w[s] = (const char*)W->weight + (size_t)row[s] * W->cols * wbytes<FMT>();
  const int K = W->cols, k1 = K - K % GVW;
  constexpr int KL = (int)(64 / wbytes<FMT>());  // elements per 64-byte line (a multiple of GVW)
  const int kl = K - K % KL;
  vf acc[S][BT];
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++) acc[s][j] = vzero();
  int k = 0;
  for (; k < kl; k += KL) {
    for (int s = 0; s < S; s++) PREFETCH((const char*)w[s] + k * wbytes<FMT>());
    for (int c = 0; c < KL; c += GVW) {
      vf xv[BT];
      for (int j = 0; j < BT; j++) xv[j] = vload(x + (size_t)j * ldx + k + c);
      for (int s = 0; s < S; s++) {
        const vf wv = wload<FMT>(w[s], k + c);
        for (int j = 0; j < BT; j++) acc[s][j] = vfma(wv, xv[j], acc[s][j]);
      }
    }
  }
  for (; k < k1; k += GVW) {
    vf xv[BT];
    for (int j = 0; j < BT; j++) xv[j] = vload(x + (size_t)j * ldx + k);
    for (int s = 0; s < S; s++) {
      const vf wv = wload<FMT>(w[s], k);
      for (int j = 0; j < BT; j++) acc[s][j] = vfma(wv, xv[j], acc[s][j]);
    }
  }
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++)
      y[(size_t)j * ldy + row[s]] = dense_row_finish<FMT>(W, w[s], row[s], acc[s][j], x + (size_t)j * ldx, k1);
}

template <int FMT, int S, int BT>
static void dense_streams_g(const Mat* W, const float* x, int ldx, float* y, int ldy, int n0, int n1) {
  for_row_streams<S>(n0, n1, [&](auto rows, const int* row) {
    dense_rows_g<FMT, decltype(rows)::value, BT>(W, row, x, ldx, y, ldy);
  });
}

// y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and sequences j < BT.
template <int FMT, int BT>
static void gemv_dense_g(const Mat* W, const float* x, int ldx, float* y, int ldy, int n0, int n1) {
  // S x BT accumulators + BT inputs + 1 weight vector within 16 registers.
  constexpr int S_MAX = BT <= 2 ? 4 : 2;
  const int S = g_row_streams < S_MAX ? g_row_streams : S_MAX;
  if (S >= 4) dense_streams_g<FMT, (S_MAX >= 4 ? 4 : 1), BT>(W, x, ldx, y, ldy, n0, n1);
  else if (S >= 2) dense_streams_g<FMT, 2, BT>(W, x, ldx, y, ldy, n0, n1);
  else dense_streams_g<FMT, 1, BT>(W, x, ldx, y, ldy, n0, n1);
}

// int4 rows: per group of 32 inputs, 16 bytes hold inputs i (low nibble) and i + 16 (high nibble), one
// bf16 scale per group. Two accumulator sets alternate between groups (the scale FMA chain is the
// bottleneck); the order is the same for every BT.
template <int BT>
static void gemv_int4_g(const Mat* W, const float* x, int ldx, float* y, int ldy, int n0, int n1) {
  const int K = W->cols, groups = K / 32;
  const vf eight = vset1(8.0f);
  for (int n = n0; n < n1; n++) {
    const uint8_t* w = (const uint8_t*)W->weight + (size_t)n * (K / 2);
    const uint16_t* s = (const uint16_t*)W->scale + (size_t)n * groups;
    vf acc[2][BT];
    for (int j = 0; j < BT; j++) acc[0][j] = acc[1][j] = vzero();
    for (int g = 0; g < groups; g++) {
      if ((g & 3) == 0) PREFETCH(w + 16 * g);
      vub8 a, b;
      memcpy(&a, w + 16 * g, 8);
      memcpy(&b, w + 16 * g + 8, 8);
      const vf q0 = __builtin_convertvector(a & 0xF, vf) - eight;  // inputs 0..7
      const vf q1 = __builtin_convertvector(b & 0xF, vf) - eight;  // 8..15
      const vf q2 = __builtin_convertvector(a >> 4, vf) - eight;   // 16..23
      const vf q3 = __builtin_convertvector(b >> 4, vf) - eight;   // 24..31
      const vf sg = vset1(bf16_to_f32(s[g]));
      for (int j = 0; j < BT; j++) {
        const float* xj = x + (size_t)j * ldx + 32 * g;
        vf t = q0 * vload(xj);
        t = vfma(q1, vload(xj + 8), t);
        t = vfma(q2, vload(xj + 16), t);
        t = vfma(q3, vload(xj + 24), t);
        acc[g & 1][j] = vfma(t, sg, acc[g & 1][j]);
      }
    }
    for (int j = 0; j < BT; j++) y[(size_t)j * ldy + n] = vsum(acc[0][j] + acc[1][j]);
  }
}

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
// ARM64 with the BF16 extension (Armv8.6-A, optional from 8.2: Neoverse V1/V2/N2, Apple M2 and later): bf16
// rows against a bf16 input with BFDOT (each lane adds two products per instruction), as the AVX512-BF16
// kernel does on x86. Four accumulators per sequence over k, the same order whatever BT is.
template <int BT>
static void gemv_bf16_bfdot(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0,
                            int n1) {
  const int k32 = K & ~31, k8 = K & ~7;
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    float32x4_t acc[BT][4];
    for (int j = 0; j < BT; j++)
      for (int i = 0; i < 4; i++) acc[j][i] = vdupq_n_f32(0.f);
    int k = 0;
    for (; k < k32; k += 32) {
      bfloat16x8_t wv[4];
      for (int i = 0; i < 4; i++) wv[i] = vreinterpretq_bf16_u16(vld1q_u16(w + k + 8 * i));
      for (int j = 0; j < BT; j++)
        for (int i = 0; i < 4; i++)
          acc[j][i] = vbfdotq_f32(acc[j][i], wv[i], vreinterpretq_bf16_u16(vld1q_u16(x + (size_t)j * ldx + k + 8 * i)));
    }
    for (; k < k8; k += 8) {
      const bfloat16x8_t wv = vreinterpretq_bf16_u16(vld1q_u16(w + k));
      for (int j = 0; j < BT; j++)
        acc[j][0] = vbfdotq_f32(acc[j][0], wv, vreinterpretq_bf16_u16(vld1q_u16(x + (size_t)j * ldx + k)));
    }
    for (int j = 0; j < BT; j++) {
      float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[j][0], acc[j][1]), vaddq_f32(acc[j][2], acc[j][3])));
      for (int kk = k8; kk < K; kk++) s += bf16_to_f32(w[kk]) * bf16_to_f32(x[(size_t)j * ldx + kk]);
      y[(size_t)j * ldy + n] = s;
    }
  }
}
#endif

template <int BT>
static void gemv_tile(const Mat* W, const void* x, int ldx, float* y, int ldy, int n0, int n1) {
  const float* xf = (const float*)x;
  switch (W->format) {
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
    case W_BF16:
      gemv_bf16_bfdot<BT>((const uint16_t*)W->weight, W->cols, (const uint16_t*)x, ldx, y, ldy, n0, n1);
      break;
#else
    case W_BF16: gemv_dense_g<W_BF16, BT>(W, xf, ldx, y, ldy, n0, n1); break;
#endif
    case W_F32: gemv_dense_g<W_F32, BT>(W, xf, ldx, y, ldy, n0, n1); break;
    case W_INT8: gemv_dense_g<W_INT8, BT>(W, xf, ldx, y, ldy, n0, n1); break;
    case W_INT8_Q8:
    case W_INT4_Q8: gemv_q8<BT>(W, x, (size_t)ldx * 4, y, ldy, n0, n1); break;
    default: gemv_int4_g<BT>(W, xf, ldx, y, ldy, n0, n1); break;  // W_INT4, W_INT4_BF16X
  }
}
#define SOLO_TILE 2  // sequences per weight pass (measured on the four-accumulator kernel; the same bits at any)
#endif

// Portable fallback (scalar builds): one sequence at a time, float32 inputs.
[[maybe_unused]] static void gemv_scalar(const Mat* W, const void* x, int ldx, int B, float* y, int ldy, int n0,
                                         int n1) {
  const int K = W->cols;
  for (int b = 0; b < B; b++) {
    const float* xb = (const float*)x + (size_t)b * ldx;
    for (int n = n0; n < n1; n++) {
      if (q8_input(W)) {  // qdot.h's reference: ldx floats = the slot's bytes / 4
        y[(size_t)b * ldy + n] = gemv_q8_row_scalar(W, (const char*)xb, n);
        continue;
      }
      float s = 0.f;
      if (W->format == W_BF16) {
        const uint16_t* w = (const uint16_t*)W->weight + (size_t)n * K;
        for (int k = 0; k < K; k++) s += bf16_to_f32(w[k]) * xb[k];
      } else if (W->format == W_F32) {
        const float* w = (const float*)W->weight + (size_t)n * K;
        for (int k = 0; k < K; k++) s += w[k] * xb[k];
      } else if (W->format == W_INT8) {
        const int8_t* w = (const int8_t*)W->weight + (size_t)n * K;
        for (int k = 0; k < K; k++) s += (float)w[k] * xb[k];
        s *= ((const float*)W->scale)[n];
      } else {
        const uint8_t* w = (const uint8_t*)W->weight + (size_t)n * (K / 2);
        const uint16_t* sc = (const uint16_t*)W->scale + (size_t)n * (K / 32);
        for (int g = 0; g < K / 32; g++) {
          float t = 0.f;
          for (int i = 0; i < 16; i++) {
            uint8_t byte = w[16 * g + i];
            t += (float)((int)(byte & 0xF) - 8) * xb[32 * g + i];
            t += (float)((int)(byte >> 4) - 8) * xb[32 * g + 16 + i];
          }
          s += t * bf16_to_f32(sc[g]);
        }
      }
      y[(size_t)b * ldy + n] = s;
    }
  }
}

#if SOLO_AVX512
template <int BT>
static void gemv_tile(const Mat* W, const void* x, int ldx, float* y, int ldy, int n0, int n1) {
  const int K = W->cols;
  switch (W->format) {
#if defined(__AVX512BF16__)
    case W_BF16:
      gemv_bf16_bt<BT>((const uint16_t*)W->weight, K, (const uint16_t*)x, ldx, y, ldy, n0, n1);
      break;
#else
    case W_BF16:
      gemv_bf16w_f32_bt<BT>((const uint16_t*)W->weight, K, (const float*)x, ldx, y, ldy, n0, n1);
      break;
#endif
#if SOLO_BF16_PACKED
    case W_BF16_AMX:
      packed_gemv_bt<BT>((const uint16_t*)W->weight, K, (const uint16_t*)x, ldx, y, ldy, n0, n1);
      break;
#endif
    case W_F32:
      gemv_f32_bt<BT>((const float*)W->weight, K, (const float*)x, ldx, y, ldy, n0, n1);
      break;
    case W_INT8:
      gemv_int8_bt<BT>((const int8_t*)W->weight, (const float*)W->scale, K, (const float*)x, ldx, y, ldy, n0, n1);
      break;
    case W_INT4_BF16X:
#if defined(__AVX512BF16__)
      gemv_int4_bf16_bt<BT>((const uint8_t*)W->weight, (const uint16_t*)W->scale, K, (const uint16_t*)x, ldx, y, ldy,
                            n0, n1);
      break;
#endif
    case W_INT4:
      gemv_int4_bt<BT>((const uint8_t*)W->weight, (const uint16_t*)W->scale, K, (const float*)x, ldx, y, ldy, n0,
                       n1);
      break;
    case W_INT8_Q8:
    case W_INT4_Q8:
      gemv_q8<BT>(W, x, (size_t)ldx * 4, y, ldy, n0, n1);
      break;
  }
}
#define SOLO_TILE 4
#endif

#ifndef SOLO_TILE
#define SOLO_TILE 1  // scalar builds: one sequence at a time
#endif

#include "tile.h"  // rows x tokens tiles for many sequences (span prefill)

// Does this matrix take its input as bf16 (else float32)? Only the AVX512-BF16 kernels (bf16 weights and
// int4 "bf16x") and the ARM BF16 kernel (bf16 weights) do: they round a float32 input to bf16 first,
// which changes nothing for a bf16 model.
static inline int bf16_input(const Mat* W) {
#if SOLO_AVX512 && defined(__AVX512BF16__)
  return W->format == W_BF16 || W->format == W_INT4_BF16X || W->format == W_BF16_AMX;
#elif SOLO_GVEC && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
  return W->format == W_BF16;
#else
  (void)W;
  return 0;
#endif
}

static inline size_t input_elem_bytes(const Mat* W) { return bf16_input(W) ? 2 : 4; }

// This thread's share of the rows: contiguous blocks, multiples of 16 rows.
static inline void row_range(int N, int tid, int nt, int* n0, int* n1) {
  int per = ((N + nt - 1) / nt + 15) & ~15;
  int a = tid * per, b = a + per;
  *n0 = a < N ? a : N;
  *n1 = b < N ? b : N;
}

// y[b, n] = W x[b, :] for rows n in [n0, n1) and every b < B, sequence b's input starting b * ldx elements
// (of W's input dtype) into x (skip: write zeros instead, measurement only).
static void gemv_rows(const Mat* W, const void* x, int ldx, int B, float* y, int ldy, int n0, int n1, int skip) {
  if (n0 >= n1) return;
  if (skip) {
    for (int b = 0; b < B; b++) memset(y + (size_t)b * ldy + n0, 0, (size_t)(n1 - n0) * sizeof(float));
    return;
  }
#if SOLO_AVX512 || SOLO_GVEC
  if (B > SOLO_TILE && gemv_rows_tiled(W, x, ldx, B, y, ldy, n0, n1)) return;
  const size_t esz = input_elem_bytes(W);
  // More sequences than one tile: walk the rows in blocks of 32 and run every tile over a block while it
  // is in L2, so the weights still come from DRAM once. The tiling never changes a row's arithmetic.
  constexpr int T = SOLO_TILE;
  const int block = B > T ? 32 : n1 - n0;
  for (int r0 = n0; r0 < n1; r0 += block) {
    const int r1 = r0 + block < n1 ? r0 + block : n1;
    int b = 0;
    for (; b + T <= B; b += T)
      gemv_tile<T>(W, (const char*)x + b * ldx * esz, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    const int left = B - b;  // fewer than T
    const char* xl = (const char*)x + b * ldx * esz;
    if (left == 1) gemv_tile<1>(W, xl, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    if (left == 2) gemv_tile<2>(W, xl, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    if (left == 3) gemv_tile<3>(W, xl, ldx, y + (size_t)b * ldy, ldy, r0, r1);
  }
#else
  gemv_scalar(W, x, ldx, B, y, ldy, n0, n1);
#endif
}

// A decode product's input, prepared once for every range of rows a thread computes (gemv_shared, the MLP's
// gate and up rows): packed bf16 weights at up to SOLO_TILE tokens take the tokens' inputs in packed order
// (packed_token_block, this thread's scratch until its next conversion), which every chunk's call converted
// anew before, with no weight reads in flight meanwhile. Other formats read x as gemv_rows does.
struct ProductInput {
  const void* x;
  int ldx;
  const uint32_t* packed;  // null: gemv_rows on x
};

static inline ProductInput product_input(const Mat* W, const void* x, int ldx, int B, int skip) {
  ProductInput p{x, ldx, nullptr};
#if SOLO_BF16_PACKED
  if (W->format == W_BF16_AMX && !skip && B >= 1 && B <= SOLO_TILE)
    p.packed = packed_token_block((const uint16_t*)x, ldx, B, W->cols);
#else
  (void)W, (void)B, (void)skip;
#endif
  return p;
}

// gemv_rows on a prepared input (the same bits).
static void gemv_rows_in(const Mat* W, const ProductInput& in, int B, float* y, int ldy, int n0, int n1, int skip) {
#if SOLO_BF16_PACKED
  if (in.packed) {
    const uint16_t* P = (const uint16_t*)W->weight;
    switch (B) {
      case 1: return packed_gemv_in<1>(P, W->cols, in.packed, y, ldy, n0, n1);
      case 2: return packed_gemv_in<2>(P, W->cols, in.packed, y, ldy, n0, n1);
      case 3: return packed_gemv_in<3>(P, W->cols, in.packed, y, ldy, n0, n1);
      default: return packed_gemv_in<4>(P, W->cols, in.packed, y, ldy, n0, n1);
    }
  }
#endif
  gemv_rows(W, in.x, in.ldx, B, y, ldy, n0, n1, skip);
}

// gemv_rows_in over rows [a0, a1) and then [b0, b0 + a1 - a0) of W (the MLP's gate and up rows of a chunk),
// the two runs read side by side where the kernel can (packed bf16 weights at 1 or 2 tokens, 16-row aligned
// runs: packed_gemv_pair_in); the same bits either way.
static void gemv_rows_pair(const Mat* W, const ProductInput& in, int B, float* y, int ldy, int a0, int a1, int b0,
                           int skip) {
#if SOLO_BF16_PACKED
  if (in.packed && (B == 1 || B == 2) && a0 % 16 == 0 && b0 % 16 == 0 && a1 > a0) {
    const uint16_t* P = (const uint16_t*)W->weight;
    if (B == 1) packed_gemv_pair_in<1>(P, W->cols, in.packed, y, ldy, a0, b0, a1 - a0);
    else packed_gemv_pair_in<2>(P, W->cols, in.packed, y, ldy, a0, b0, a1 - a0);
    return;
  }
#endif
  gemv_rows_in(W, in, B, y, ldy, a0, a1, skip);
  gemv_rows_in(W, in, B, y, ldy, b0, b0 + (a1 - a0), skip);
}

// y[b, :] = W x[b, :] for every b < B, this thread's rows only (the caller adds a barrier).
static void gemv(const Mat* W, const void* x, int B, float* y, int ldy, int tid, int nt, int skip = 0) {
  int n0, n1;
  row_range(W->rows, tid, nt, &n0, &n1);
  gemv_rows(W, x, W->cols, B, y, ldy, n0, n1, skip);
}

// ------------------------------------------------------------- rows shared out at run time (decode step)
// The decode step hands out a matrix product's rows in chunks instead of one fixed block per thread: a
// thread whose core is shared with other work (or that starts late) would otherwise hold every barrier
// for its whole block. Each thread owns a contiguous run of chunks (the static split) and takes them
// from the front, so on an idle machine it streams one linear block as before; a thread that has
// finished its own run takes chunks from the back of another's. Which thread computes a row never
// changes the row's arithmetic (batch and thread-count invariance hold).
//
// A queue word packs (generation 16 bits, front 24, back 24) chunk indices: the first thread to touch a
// queue in a new share_rows call (a new generation) initializes it to its owner's static run, so no reset
// pass or barrier is needed between calls. Callers must separate two share_rows calls on the same queues
// by a barrier (the decode step has one after every product) and pass consecutive generations.
struct alignas(64) RowQueue {
  std::atomic<uint64_t> word;
};
enum : unsigned { ROWQ_FRESH = 0xffff };  // a generation share_rows never uses: the state of a new queue array

static inline uint64_t rowq_pack(unsigned gen, unsigned front, unsigned back) {
  return ((uint64_t)gen << 48) | ((uint64_t)front << 24) | back;
}

// Measurement knobs (solo_set_knob in decode.cpp): 1 = static split (every thread only its own run).
static int g_static_rows = 0;
// Bytes of weights per chunk (a multiple of 16 rows, at least 16 rows): large enough that the atomic
// per chunk costs nothing next to the stream (~128 KiB = 3-5 us of one core's bandwidth), small enough
// that a late thread leaves little behind.
static int g_chunk_bytes = 128 << 10;

// Products with more tokens than one decode tile on AMX (span prefill) take larger chunks, about this many
// KiB of weights (knob "span_chunk_kb"; 0 = the decode chunks): a chunk's tokens are read once per chunk and
// its per-token epilogue (the MLP's activation) runs once per chunk, and at 128 KiB both cost more than the
// AMX products (measured with the first AMX kernels: results/intel-xeon-amx/README.md, "The AMX level"); at
// least 4 chunks per thread for balance.
static int g_span_chunk_kb = SOLO_AMX ? 1024 : 0;
// The same for packed bf16 weights without tiles: g_packed_chunk_kb (packed.h).

// Bytes of weights per row of W (packed bf16: per row of a 16-row group, columns padded to 32), so row r of
// a 16-row-aligned range starts r * mat_row_bytes(W) into W->weight.
static inline size_t mat_row_bytes(const Mat* W) {
  const size_t cols = (size_t)W->cols;
  return is_int4_format(W->format)    ? cols / 2
         : W->format == W_F32        ? cols * 4
         : W->format == W_BF16       ? cols * 2
         : W->format == W_BF16_AMX   ? (cols + 31) / 32 * 64
                                     : cols;
}

// Rows per chunk of W's product with B tokens, n rows shared by nt threads.
static inline int chunk_rows(const Mat* W, int B, int n, int nt) {
  const size_t row_bytes = mat_row_bytes(W);
  // The packed kernel reads four 16-row groups at a time: whole runs of them, in chunks twice as large
  // (Qwen2.5-0.5B decode steps on a 2-core Xeon with AMX: 0.95x of the row-major kernel at 128 KiB and
  // four-group runs, 0.97-0.98x at 256 KiB; results/intel-xeon-amx/step-ab-packed-*.txt). Decode claims
  // several chunks at once besides (claim_chunks).
  const size_t chunk_bytes = (size_t)g_chunk_bytes * (W->format == W_BF16_AMX ? 2 : 1);
  size_t r = (chunk_bytes / (row_bytes ? row_bytes : 1)) & ~(size_t)15;
#if SOLO_BF16_PACKED && !SOLO_AMX
  const int span_kb = W->format == W_BF16_AMX ? g_packed_chunk_kb : g_span_chunk_kb;
#else
  const int span_kb = g_span_chunk_kb;
#endif
  if (B > SOLO_TILE && span_kb) {
    const size_t span = ((size_t)span_kb << 10) / (row_bytes ? row_bytes : 1);
    const size_t balanced = (size_t)n / (4 * (size_t)(nt > 0 ? nt : 1));
    r = (span < balanced ? span : balanced) & ~(size_t)31;
    if (r < 32) r = 32;
  } else if (W->format == W_BF16_AMX) {
    r = r < 64 ? 64 : r & ~(size_t)63;
  }
  return r < 16 ? 16 : (r > (1 << 20) ? (1 << 20) : (int)r);
}

// Chunks a thread takes at once from the front of its own run in a decode product (knob "claim_chunks"; at
// most half of what is left there, so the run's last chunks still go one at a time to whichever thread is
// free): each claim is a locked instruction, which waits for the reads in flight, and each call of a row-
// streaming kernel starts its streams anew, so fewer and longer calls read faster (Zen 4, whole decode steps:
// chunks of 256-512 KiB instead of 128 KiB ran 1.025-1.035x at the avx2 level, 1.03-1.04x with packed bf16
// weights), while a thread that is done early still takes 128 KiB chunks from the back of another's run.
static int g_claim_chunks = 4;

// Chunks a decode product of B tokens claims at once: g_claim_chunks, or 1 for products of more tokens than
// one decode tile, whose chunks are sized to stay in L2 while every token reads them.
static inline int claim_chunks(int B) { return B <= SOLO_TILE ? g_claim_chunks : 1; }

// Run work(c0, c1) over ranges of chunks [c0, c1) covering [0, chunks) on the nt threads (this is thread
// tid), each chunk exactly once, at most `most` chunks per range (claim_chunks).
template <class F>
static void share_rows(RowQueue* q, unsigned gen, int chunks, int tid, int nt, int most, F&& work) {
  if (most < 1) most = 1;
  if (nt == 1) {
    for (int c = 0; c < chunks; c += most) work(c, c + most < chunks ? c + most : chunks);
    return;
  }
  gen %= ROWQ_FRESH;
  // The first chunk of a claim from the front (up to `most`, at most half of what is left) or the back (one) of
  // thread t's run; -1 when it is empty.
  auto claim = [&](int t, bool front, int* count) -> int {
    uint64_t w = q[t].word.load(std::memory_order_acquire);
    for (;;) {
      if ((unsigned)(w >> 48) != gen) {  // first touch in this call: the owner's static run
        const uint64_t fresh = rowq_pack(gen, (unsigned)((long)chunks * t / nt), (unsigned)((long)chunks * (t + 1) / nt));
        if (q[t].word.compare_exchange_weak(w, fresh, std::memory_order_acq_rel, std::memory_order_acquire)) w = fresh;
        continue;
      }
      const unsigned f = (unsigned)(w >> 24) & 0xffffff, b = (unsigned)w & 0xffffff;
      if (f >= b) return -1;
      unsigned n = 1;
      if (front) {
        n = (b - f) / 2;
        n = n > (unsigned)most ? (unsigned)most : (n < 1 ? 1 : n);
      }
      const uint64_t next = front ? rowq_pack(gen, f + n, b) : rowq_pack(gen, f, b - 1);
      if (q[t].word.compare_exchange_weak(w, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        *count = (int)n;
        return front ? (int)f : (int)b - 1;
      }
    }
  };
  int n = 0;
  for (int c; (c = claim(tid, true, &n)) >= 0;) work(c, c + n);
  if (g_static_rows) return;
  for (int k = 1; k < nt; k++) {
    const int v = (tid + k) % nt;
    for (int c; (c = claim(v, false, &n)) >= 0;) work(c, c + 1);
  }
}

// gemv() with the rows shared out at run time (share_rows): y[b, :] = W x[b, :] for every b < B; after
// each range of rows [r0, r1) (whole chunks), epilogue(r0, r1) runs on the thread that computed it.
template <class F>
static void gemv_shared(const Mat* W, const void* x, int B, float* y, int ldy, RowQueue* q, unsigned gen, int tid,
                        int nt, int skip, F&& epilogue) {
  const int N = W->rows, R = chunk_rows(W, B, N, nt);
  const ProductInput in = product_input(W, x, W->cols, B, skip);
  share_rows(q, gen, (N + R - 1) / R, tid, nt, claim_chunks(B), [&](int c0, int c1) {
    const int r0 = c0 * R, r1 = c1 * R < N ? c1 * R : N;
    gemv_rows_in(W, in, B, y, ldy, r0, r1, skip);
    epilogue(r0, r1);
  });
}
