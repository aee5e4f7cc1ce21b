// Integer dot products for int8 and int4 weights (formats W_INT8_Q8 and W_INT4_Q8).
//
// The matrix's input vector is quantized to int8 once per matrix call, per block of 32 inputs with one
// float32 scale each (d = max|x| / 127, q = round-half-even(x * 127 / max|x|), as llama.cpp's Q8_0 blocks,
// written independently); every output row then multiplies its weight bytes with those int8s in integer
// arithmetic and scales to float once per block. The float path widened every weight to float32 and
// spent a float multiply-add per weight, which made int8 / int4 decode compute-bound on 2 cores; here one
// instruction multiplies and adds 32 byte pairs (AVX512-VNNI / AVX-VNNI vpdpbusd, AVX2 vpmaddubsw + vpmaddwd,
// ARM sdot; without the dot-product extension, NEON widening multiplies).
//
// Exactness: a block's 32 products are summed as 8 int32 lanes of 4 consecutive inputs each (lane i holds
// inputs 4i..4i+3), which every ISA's primitive below produces exactly, so the lane values do not depend on
// the ISA. Each lane is converted to float32 and multiplied-and-added (one FMA, one rounding) with the block's
// scale into one of four lane accumulators (block g into accumulator g % 4); the accumulators are summed and
// the 8 lanes reduced in simd.h's fixed vsum order. The scalar build does exactly these operations on
// emulated lanes, so a row's result is bit for bit the same at every ISA level, batch size and thread count.
//
// Input layout (one sequence's slot of 4 * K bytes, the size of its float32 input, so callers' offsets
// are the float path's), nb = ceil(K / 32) blocks:
//   int8 q[32 * nb] (zero past K) | float32 d[nb] | int32 corr[8 * nb]: the integer correction of each lane,
//   -c * (the sum of q over the lane's 4 inputs), c = 8 for int4 (stored as u = q_w + 8:
//   sum((u - 8) x) = sum(u x) - 8 sum(x)) and 128 for int8 (the VNNI kernel multiplies w + 128 as an
//   unsigned byte; other ISAs do not need it).
// It needs 68 * nb <= 4 * K bytes: K >= 17 and not 33 (cpu.py chooses these formats only where it fits).
#pragma once
#include "common.h"
#include "simd.h"

static inline int q8_input(const Mat* W) { return W->format == W_INT8_Q8 || W->format == W_INT4_Q8; }
static inline int q8_blocks(int K) { return (K + 31) / 32; }
static inline int q8_fits(int K) { return 68 * q8_blocks(K) <= 4 * K; }

static void quantize_q8_block_v(const float* v, char* q, float* d, int32_t* corr, int c);

// Quantize one sequence's input src[K] (float32) into the slot dst (layout above); c: the correction factor.
static void quantize_q8_row(const float* src, int K, char* dst, int c) {
  const int nb = q8_blocks(K);
  int g0 = 0;
#if SOLO_GVEC || SOLO_AVX512
  for (; g0 < K / 32; g0++) {  // whole blocks: the vector version (the same results)
    float d;
    int32_t corr[8];
    quantize_q8_block_v(src + 32 * g0, dst + 32 * g0, &d, corr, c);
    memcpy(dst + 32 * (size_t)nb + 4 * (size_t)g0, &d, 4);
    memcpy(dst + 36 * (size_t)nb + 32 * (size_t)g0, corr, 32);
  }
#endif
  for (int g = g0; g < nb; g++) {
    const int len = K - 32 * g < 32 ? K - 32 * g : 32;
    float v[32];
    memcpy(v, src + 32 * g, (size_t)len * sizeof(float));
    for (int i = len; i < 32; i++) v[i] = 0.f;
    float amax = 0.f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.0f, id = amax > 0.f ? 127.0f / amax : 0.f;
    int8_t q[32];
    for (int i = 0; i < 32; i++) {
      float r = nearbyintf(v[i] * id);  // round half to even (the default rounding mode)
      r = r > 127.f ? 127.f : (r < -127.f ? -127.f : r);
      q[i] = (int8_t)(int)r;
    }
    int32_t nls[8];
    for (int l = 0; l < 8; l++) nls[l] = -c * ((int32_t)q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    memcpy(dst + 32 * g, q, 32);
    memcpy(dst + 32 * (size_t)nb + 4 * (size_t)g, &d, 4);
    memcpy(dst + 36 * (size_t)nb + 32 * (size_t)g, nls, 32);
  }
}

// The inputs src [B, K] (float32, sequence b at src + b * K) of a W_*_Q8 matrix into dst (slots of 4K bytes).
static void quantize_q8(const Mat* W, const float* src, int B, void* dst) {
  const int K = W->cols;
  const int c = W->format == W_INT4_Q8 ? 8 : 128;
  for (int b = 0; b < B; b++) quantize_q8_row(src + (size_t)b * K, K, (char*)dst + (size_t)b * K * 4, c);
}

// ------------------------------------------------------------------------------- scalar reference
// One sequence, plain loops over emulated 8-lane vectors (the operations of the vector kernels below).
static float gemv_q8_row_scalar(const Mat* W, const char* x, int n) {
  const int K = W->cols, nb = q8_blocks(K);
  const int8_t* xq = (const int8_t*)x;
  float acc[4][8];
  memset(acc, 0, sizeof acc);
  for (int g = 0; g < nb; g++) {
    int32_t w[32];
    float sc;
    memcpy(&sc, x + 32 * (size_t)nb + 4 * (size_t)g, 4);
    if (W->format == W_INT8_Q8) {
      const int8_t* wr = (const int8_t*)W->weight + (size_t)n * K + 32 * g;
      for (int i = 0; i < 32; i++) w[i] = 32 * g + i < K ? wr[i] : 0;
    } else {
      const uint8_t* wr = (const uint8_t*)W->weight + (size_t)n * (K / 2) + 16 * g;
      for (int i = 0; i < 16; i++) w[i] = (wr[i] & 0xF) - 8, w[i + 16] = (wr[i] >> 4) - 8;
      sc *= bf16_to_f32(((const uint16_t*)W->scale)[(size_t)n * (K / 32) + g]);
    }
    for (int l = 0; l < 8; l++) {
      int32_t s = 0;
      for (int i = 4 * l; i < 4 * l + 4; i++) s += w[i] * xq[32 * g + i];
      acc[g & 3][l] = fmaf((float)s, sc, acc[g & 3][l]);
    }
  }
  float v[8];
  for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
  const float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  return W->format == W_INT8_Q8 ? s * ((const float*)W->scale)[n] : s;
}

// Measurement knob (solo_set_knob "qdot_ymm"): 1 = the AVX-512 build's int4 kernel uses 256-bit vectors only.
static int g_qdot_ymm = 0;
// Streams of the batch-1 integer-dot kernels (knob "q8_streams": 1, 2 or 4; the same bits at every setting;
// gemv_q8_tile, and gemv_q8_int4_zmm with 1 or 2). Two streams against one, whole decode steps in one
// process (2-core Intel Xeon with AMX; benchmarks/step_ab.py, results/intel-xeon-amx/step-ab-*-streams-*.txt):
// int8 1.24x (Qwen2.5-0.5B) and 1.21-1.30x (Llama-3.2-1B) with AVX512-VNNI, 1.20x with the AVX2 kernels on
// the same CPU, four 0.97-1.00x of two; the 512-bit int4 kernel 1.11x / 1.09x.
static int g_q8_streams = 2;

#if SOLO_GVEC || SOLO_AVX512
// ------------------------------------------------------------------- the per-ISA dot-product primitives
typedef int8_t vb32 __attribute__((vector_size(32)));
typedef uint8_t vub32 __attribute__((vector_size(32)));
typedef uint8_t vub16 __attribute__((vector_size(16)));

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SOLO_QDOT "avx512-vnni"
static inline vi dpbusd(vi acc, vub32 u, vb32 x) {
  return (vi)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)u, (__m256i)x);
}
#elif defined(__AVXVNNI__)
#define SOLO_QDOT "avx-vnni"
static inline vi dpbusd(vi acc, vub32 u, vb32 x) {
  return (vi)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)u, (__m256i)x);
}
#elif defined(__AVX2__)
#define SOLO_QDOT "avx2"
#elif defined(__ARM_FEATURE_DOTPROD)
#define SOLO_QDOT "neon-sdot"
#elif defined(__aarch64__)
#define SOLO_QDOT "neon"
#else
#define SOLO_QDOT "generic"
#endif

#if defined(__aarch64__)
// acc + lane sums of a * b over two 16-byte halves (signed bytes): SDOT, or widening multiplies.
static inline vi neon_dot(vi acc, vb32 a, vb32 b) {
  int8x16_t a0, a1, b0, b1;
  int32x4_t c0, c1;
  memcpy(&a0, &a, 16), memcpy(&a1, (const char*)&a + 16, 16);
  memcpy(&b0, &b, 16), memcpy(&b1, (const char*)&b + 16, 16);
  memcpy(&c0, &acc, 16), memcpy(&c1, (const char*)&acc + 16, 16);
#if defined(__ARM_FEATURE_DOTPROD)
  c0 = vdotq_s32(c0, a0, b0), c1 = vdotq_s32(c1, a1, b1);
#else
  // int16 products of bytes 0..7 and 8..15, pairwise-added twice: lane i = bytes 4i..4i+3.
  c0 = vaddq_s32(c0, vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(b0))),
                                vpaddlq_s16(vmull_high_s8(a0, b0))));
  c1 = vaddq_s32(c1, vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(a1), vget_low_s8(b1))),
                                vpaddlq_s16(vmull_high_s8(a1, b1))));
#endif
  vi r;
  memcpy(&r, &c0, 16), memcpy((char*)&r + 16, &c1, 16);
  return r;
}
#endif

// acc + lane sums of u * x, u in [0, 15] (int4 nibbles), x in [-127, 127].
static inline vi idot_u4(vi acc, vub32 u, vb32 x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  return dpbusd(acc, u, x);
#elif defined(__AVX2__)
  // u * x pairs fit int16 without saturation (2 * 15 * 127).
  return acc + (vi)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)u, (__m256i)x), _mm256_set1_epi16(1));
#elif defined(__aarch64__)
  return neon_dot(acc, (vb32)u, x);
#else
  for (int l = 0; l < 8; l++)
    for (int i = 4 * l; i < 4 * l + 4; i++) acc[l] += (int32_t)u[i] * x[i];
  return acc;
#endif
}

// Lane sums of w * x, both in [-127, 127]; corr = -128 * the lane sums of x (the VNNI form's correction).
static inline vi idot_i8(vb32 w, vb32 x, vi corr) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  // (w + 128) is an unsigned byte: sum((w + 128) x) - 128 sum(x).
  return dpbusd(corr, (vub32)w ^ (uint8_t)0x80, x);
#elif defined(__AVX2__)
  (void)corr;
  // |x| * (w with x's sign): an unsigned times a signed byte, pairs within int16 (2 * 127 * 127).
  const __m256i ax = _mm256_sign_epi8((__m256i)x, (__m256i)x), sw = _mm256_sign_epi8((__m256i)w, (__m256i)x);
  return (vi)_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1));
#elif defined(__aarch64__)
  (void)corr;
  return neon_dot(vi{}, w, x);
#else
  (void)corr;
  vi acc = {};
  for (int l = 0; l < 8; l++)
    for (int i = 4 * l; i < 4 * l + 4; i++) acc[l] += (int32_t)w[i] * x[i];
  return acc;
#endif
}

// round-half-even of every lane (values far below 2^22)
static inline vf vround_even(vf t) {
#if defined(__AVX__)
  return (vf)_mm256_round_ps((__m256)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__aarch64__)
  float32x4_t a, b;
  memcpy(&a, &t, 16), memcpy(&b, (const char*)&t + 16, 16);
  a = vrndnq_f32(a), b = vrndnq_f32(b);
  vf r;
  memcpy(&r, &a, 16), memcpy((char*)&r + 16, &b, 16);
  return r;
#else
  for (int i = 0; i < GVW; i++) t[i] = nearbyintf(t[i]);
  return t;
#endif
}

// One whole block of quantize_q8_row with vectors: the same max, divisions and roundings, so the same bytes.
static void quantize_q8_block_v(const float* v, char* q, float* d, int32_t* corr, int c) {
  vf x[4], m = vzero();
  for (int i = 0; i < 4; i++) x[i] = vload(v + GVW * i), m = vmax(m, (vf)((vu)x[i] & 0x7fffffffu));
  float amax = 0.f;
  for (int i = 0; i < GVW; i++) amax = fmaxf(amax, m[i]);
  const float dd = amax / 127.0f, id = amax > 0.f ? 127.0f / amax : 0.f;
  for (int i = 0; i < 4; i++) {
    const vf r = vmin(vmax(vround_even(x[i] * id), vset1(-127.f)), vset1(127.f));
    const vb8 b = __builtin_convertvector(__builtin_convertvector(r, vi), vb8);
    memcpy(q + GVW * i, &b, GVW);
  }
  vb32 qv;
  memcpy(&qv, q, 32);
  vub32 ones = {};
  ones += 1;
  const vi ls = idot_u4(vi{}, ones, qv) * -c;  // exact lane sums of q
  memcpy(corr, &ls, 32);
  *d = dd;
}

// The 32 nibbles of an int4 group (16 bytes: input i low, input i + 16 high) in input order.
static inline vub32 unpack_u4(const uint8_t* p) {
#if defined(__AVX2__)
  const __m128i b = _mm_loadu_si128((const __m128i*)p);
  return (vub32)_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0xF));
#else
  vub16 b;
  memcpy(&b, p, 16);
  const vub16 lo = b & 0xF, hi = b >> 4;
  vub32 r;
  memcpy(&r, &lo, 16), memcpy((char*)&r + 16, &hi, 16);
  return r;
#endif
}

// --------------------------------------------------------------------------------------- the kernels
// Rows row[0 .. S) x BT sequences; every (row, sequence) sums in the same order whatever S and BT are.
// x: BT slots of `xstride` bytes (layout above). The S rows share each block's input loads.
template <int FMT, int S, int BT>
static inline void q8_rows(const Mat* W, const int* row, const char* x, size_t xstride, float* y, int ldy) {
  const int K = W->cols, nb = q8_blocks(K), full = K / 32;
  float xs[S][BT][FMT == W_INT4_Q8 ? 1024 : 1];  // int4: the row's group scales times the inputs' (K <= 32768)
  if (FMT == W_INT4_Q8)
    for (int s = 0; s < S; s++) {
      const uint16_t* ws = (const uint16_t*)W->scale + (size_t)row[s] * (K / 32);
      for (int j = 0; j < BT; j++) {
        const float* xd = (const float*)(x + (size_t)j * xstride + 32 * (size_t)nb);  // 4-byte aligned
        int g = 0;
        for (; g + GVW <= nb; g += GVW) vstore(&xs[s][j][g], vload(xd + g) * vload_bf16(ws + g));
        for (; g < nb; g++) xs[s][j][g] = xd[g] * bf16_to_f32(ws[g]);
      }
    }
  vf acc[S][BT][4];
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++)
      for (int i = 0; i < 4; i++) acc[s][j][i] = vzero();
  // Block g into accumulator i = g % 4; `i` is a constant at every call (unrolled), so the accumulators
  // stay in registers.
  auto block = [&](int g, int i) __attribute__((always_inline)) {
    vb32 wv[S] = {};
    vub32 u[S] = {};
    for (int s = 0; s < S; s++) {
      if (FMT == W_INT8_Q8) {
        const int8_t* wr = (const int8_t*)W->weight + (size_t)row[s] * K + 32 * g;
        if ((g & 1) == 0) PREFETCH(wr);
        if (g < full)
          memcpy(&wv[s], wr, 32);
        else
          memcpy(&wv[s], wr, (size_t)(K - 32 * g));  // a short last block: zeros past K
      } else {
        const uint8_t* wr = (const uint8_t*)W->weight + (size_t)row[s] * (K / 2) + 16 * g;
        if ((g & 3) == 0) PREFETCH(wr);
        u[s] = unpack_u4(wr);
      }
    }
    for (int j = 0; j < BT; j++) {
      const char* xj = x + (size_t)j * xstride;
      vb32 xv;
      vi corr;
      float sc = 0.f;
      memcpy(&xv, xj + 32 * (size_t)g, 32);
      memcpy(&corr, xj + 36 * (size_t)nb + 32 * (size_t)g, 32);
      if (FMT == W_INT8_Q8) memcpy(&sc, xj + 32 * (size_t)nb + 4 * (size_t)g, 4);
      for (int s = 0; s < S; s++) {
        const vi d = FMT == W_INT8_Q8 ? idot_i8(wv[s], xv, corr) : idot_u4(corr, u[s], xv);
        acc[s][j][i] = vfma(__builtin_convertvector(d, vf), vset1(FMT == W_INT8_Q8 ? sc : xs[s][j][g]), acc[s][j][i]);
      }
    }
  };
  int g = 0;
  for (; g + 4 <= full; g += 4) {
    block(g, 0);
    block(g + 1, 1);
    block(g + 2, 2);
    block(g + 3, 3);
  }
  if (g < nb) block(g, 0);
  if (g + 1 < nb) block(g + 1, 1);
  if (g + 2 < nb) block(g + 2, 2);
  if (g + 3 < nb) block(g + 3, 3);
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++) {
      const float r = vsum((acc[s][j][0] + acc[s][j][1]) + (acc[s][j][2] + acc[s][j][3]));
      y[(size_t)j * ldy + row[s]] = FMT == W_INT8_Q8 ? r * ((const float*)W->scale)[row[s]] : r;
    }
}

// Rows [n0, n1) as S streams (common.h: for_row_streams).
template <int FMT, int S, int BT>
static void gemv_q8_tile(const Mat* W, const char* x, size_t xstride, float* y, int ldy, int n0, int n1) {
  for_row_streams<S>(n0, n1, [&](auto rows, const int* row) {
    q8_rows<FMT, decltype(rows)::value, BT>(W, row, x, xstride, y, ldy);
  });
}

#if SOLO_AVX512 && defined(__AVX512VNNI__)
// int4 with 512-bit VNNI: two groups per instruction. Lanes 0-7 of A hold accumulator 0 (groups 4m) and
// lanes 8-15 accumulator 1 (groups 4m + 1), B accumulators 2 and 3, so every lane sees the operations of
// gemv_q8_tile in the same order and the result is the same bit for bit. Unpacking two groups' 32 bytes:
// 64-bit lanes [g, g, g + 1, g + 1] (each half of a group twice), the second copy shifted by 4, masked.
// Rows row[0 .. S) x BT sequences; the S rows share each group pair's input loads.
template <int S, int BT>
static inline void q8_int4_zmm_rows(const Mat* W, const int* row, const char* x, size_t xstride, float* y,
                                    int ldy) {
  const int K = W->cols, nb = K / 32;
  float xs[S][BT][1024];
  const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
  const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  const __m512i low = _mm512_set1_epi8(0xF);
  const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const uint8_t* wr[S];
  for (int s = 0; s < S; s++) {
    const uint16_t* ws = (const uint16_t*)W->scale + (size_t)row[s] * nb;
    for (int j = 0; j < BT; j++) {
      const float* xd = (const float*)(x + (size_t)j * xstride + 32 * (size_t)nb);
      int g = 0;
      for (; g + GVW <= nb; g += GVW) vstore(&xs[s][j][g], vload(xd + g) * vload_bf16(ws + g));
      for (; g < nb; g++) xs[s][j][g] = xd[g] * bf16_to_f32(ws[g]);
    }
    wr[s] = (const uint8_t*)W->weight + (size_t)row[s] * (K / 2);
  }
  __m512 acc[S][BT][2];
  for (int s = 0; s < S; s++)
    for (int j = 0; j < BT; j++) acc[s][j][0] = acc[s][j][1] = _mm512_setzero_ps();
  auto pair = [&](int g, int i) __attribute__((always_inline)) {  // groups g, g + 1 into acc[.][.][i]
    __m512i u[S];
    for (int s = 0; s < S; s++) {
      PREFETCH(wr[s] + 16 * g);
      const __m512i t = _mm512_permutexvar_epi64(
          dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(wr[s] + 16 * g))));
      u[s] = _mm512_and_si512(_mm512_srlv_epi64(t, shift), low);
    }
    for (int j = 0; j < BT; j++) {
      const char* xj = x + (size_t)j * xstride;
      const __m512i corr = _mm512_loadu_si512(xj + 36 * (size_t)nb + 32 * (size_t)g);
      const __m512i xv = _mm512_loadu_si512(xj + 32 * (size_t)g);
      for (int s = 0; s < S; s++) {
        const __m512i d = _mm512_dpbusd_epi32(corr, u[s], xv);
        const __m512 sc = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_castsi128_ps(
                                                          _mm_loadl_epi64((const __m128i*)&xs[s][j][g]))));
        acc[s][j][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[s][j][i]);
      }
    }
  };
  int g = 0;
  for (; g + 4 <= nb; g += 4) {
    pair(g, 0);
    pair(g + 2, 1);
  }
  for (int s = 0; s < S; s++) {
    vf rest[BT][4];  // the last 1-3 groups through the 256-bit kernel's operations on the halves
    for (int j = 0; j < BT; j++) {
      memcpy(&rest[j][0], &acc[s][j][0], 32), memcpy(&rest[j][1], (const char*)&acc[s][j][0] + 32, 32);
      memcpy(&rest[j][2], &acc[s][j][1], 32), memcpy(&rest[j][3], (const char*)&acc[s][j][1] + 32, 32);
    }
    for (int i = 0; g + i < nb; i++) {
      const vub32 u = unpack_u4(wr[s] + 16 * (g + i));
      for (int j = 0; j < BT; j++) {
        const char* xj = x + (size_t)j * xstride;
        vb32 xv;
        vi corr;
        memcpy(&xv, xj + 32 * (size_t)(g + i), 32);
        memcpy(&corr, xj + 36 * (size_t)nb + 32 * (size_t)(g + i), 32);
        rest[j][i] = vfma(__builtin_convertvector(idot_u4(corr, u, xv), vf), vset1(xs[s][j][g + i]), rest[j][i]);
      }
    }
    for (int j = 0; j < BT; j++)
      y[(size_t)j * ldy + row[s]] = vsum((rest[j][0] + rest[j][1]) + (rest[j][2] + rest[j][3]));
  }
}

template <int S, int BT>
static void gemv_q8_int4_zmm(const Mat* W, const char* x, size_t xstride, float* y, int ldy, int n0, int n1) {
  for_row_streams<S>(n0, n1, [&](auto rows, const int* row) {
    q8_int4_zmm_rows<decltype(rows)::value, BT>(W, row, x, xstride, y, ldy);
  });
}
#endif

template <int BT>
static void gemv_q8(const Mat* W, const void* x, size_t xstride, float* y, int ldy, int n0, int n1) {
#if SOLO_AVX512 && defined(__AVX512VNNI__)
  if (W->format == W_INT4_Q8 && !g_qdot_ymm) {
    const char* xc = (const char*)x;
    if (BT == 1 && g_q8_streams >= 2) gemv_q8_int4_zmm<(BT == 1 ? 2 : 1), BT>(W, xc, xstride, y, ldy, n0, n1);
    else gemv_q8_int4_zmm<1, BT>(W, xc, xstride, y, ldy, n0, n1);
    return;
  }
#endif
  const char* xc = (const char*)x;
  // S x 4 accumulators within the vector registers (16 of them without AVX-512, each vf a pair on NEON).
  constexpr int S_MAX = BT > 1 ? 1 : (SOLO_AVX512 ? 4 : 2);
  const int S = g_q8_streams < S_MAX ? g_q8_streams : S_MAX;
  if (W->format == W_INT8_Q8) {
    if (S >= 4) gemv_q8_tile<W_INT8_Q8, (S_MAX >= 4 ? 4 : 1), BT>(W, xc, xstride, y, ldy, n0, n1);
    else if (S >= 2) gemv_q8_tile<W_INT8_Q8, (S_MAX >= 2 ? 2 : 1), BT>(W, xc, xstride, y, ldy, n0, n1);
    else gemv_q8_tile<W_INT8_Q8, 1, BT>(W, xc, xstride, y, ldy, n0, n1);
  } else {
    if (S >= 4) gemv_q8_tile<W_INT4_Q8, (S_MAX >= 4 ? 4 : 1), BT>(W, xc, xstride, y, ldy, n0, n1);
    else if (S >= 2) gemv_q8_tile<W_INT4_Q8, (S_MAX >= 2 ? 2 : 1), BT>(W, xc, xstride, y, ldy, n0, n1);
    else gemv_q8_tile<W_INT4_Q8, 1, BT>(W, xc, xstride, y, ldy, n0, n1);
  }
}
#else
#define SOLO_QDOT "scalar"
#endif
