// bf16 weights packed in the layout of AMX's bits (format W_BF16_AMX; solo/runtime/cpu_packing.py), and
// their kernels on AVX512-BF16 instructions: decode (1-4 tokens) and, where there are no tiles, the span
// prefill. Compiled into the "avx512-bf16" and "amx" ISA levels (cpu_build.py); included by amx.h, whose
// tiles multiply the same layout in the amx level's span.
//
// Solo's rule is that a (row, token) result has the same bits whatever else was computed with it (batch 1,
// batched decode, the span prefill, any thread count). AMX makes the span prefill's products 5-6x faster
// than AVX512-BF16, but batch-1 decode on AMX tiles ran at 0.83-0.91x of the AVX512-BF16 kernel there. So
// decode runs on AVX512-BF16 instructions that give AMX's bits, and only the span uses tiles:
//
// What one TDPBF16PS computes, per C element (row m of A, column n of B), measured on the hardware
// (bit-exact over millions of random cases at every magnitude; it is the order the SDM's pseudocode gives):
// two float32 sums from zero, E over the even elements of the 16 k pairs and O over the odd ones, each
// adding its exact bf16 x bf16 products in k order with a rounding after each; then C += (E + O), rounded
// twice; denormal inputs read as zero and denormal results flushed to zero (PackedMxcsr). VDPBF16PS adds a
// pair's odd product and then its even one into one accumulator, so with the weights of 16 rows in the lanes
// and each dword holding two consecutive EVEN (or two ODD) weights of a row, in the order [k + 2 (lo), k
// (hi)], one VDPBF16PS advances a row's E (or O) sum by two steps in the same order and rounding as the tile
// does. The packed layout (below) stores exactly those vectors: per 16-row group and k step of 32, 8 E and 8
// O vectors of 16 rows = 1 KiB contiguous, so decode streams the weights with 16 VDPBF16PS per KiB (as the
// row-major kernel does), and the amx span turns each KiB into a B tile with shifts and masks. K is
// zero-padded to a multiple of 32 and the rows to a multiple of 16 (zero products add nothing: the sums are
// never -0).
//
// Without tiles the layout pays for itself too: a (row, token) sum is a lane of a vector, so products with
// many tokens are outer products (16 rows' weights x one token's broadcast input pair), with no horizontal
// sums and each weight vector loaded once per several tokens; the row-major kernel must keep 16 partial sums
// per (row, token) and sum them across lanes, its decode tile loading 5 vectors per 4 dot products. See
// packed_span below for the measurements.
#pragma once
#include "common.h"

#if SOLO_AVX512 && defined(__AVX512BF16__)
#define SOLO_BF16_PACKED 1
#include <vector>

// The packed layout (W_BF16_AMX; solo/runtime/cpu_packing.py writes it): W[n, k] of a matrix of K columns sits
// in 16-row group n / 16 and k step k / 32 (1 KiB each, a group's ceil(K / 32) steps contiguous); within a
// step, in vector v = 2 ((k % 32) / 4) + k % 2 (E and O vectors alternate), lane n % 16, half 1 - (k / 2) % 2
// (a lane holds [k + 2, k] of a row's even, or odd, elements).

// One token's inputs in packed order: e[q] = (x[4q + 2], x[4q]) and o[q] = (x[4q + 3], x[4q + 1]) as
// (low, high) bf16, q < 8 * ceil(K / 32), zero past K. Per 32 inputs: the 64-bit lanes (x[4q] .. x[4q + 3])
// shifted and masked into both halves, then narrowed to 32 bits.
static inline void packed_token_inputs(const uint16_t* x, int K, uint32_t* e, uint32_t* o) {
  const __m512i lo16 = _mm512_set1_epi64(0xffff), hi16 = _mm512_set1_epi64(0xffff0000);
  for (int k = 0; k < K; k += 32) {
    const int n = K - k < 32 ? K - k : 32;
    const __mmask32 m = n == 32 ? ~(__mmask32)0 : (__mmask32)((1u << n) - 1);
    const __m512i y = _mm512_maskz_loadu_epi16(m, x + k);
    const __m512i ev = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(y, 32), lo16),
                                       _mm512_and_si512(_mm512_slli_epi64(y, 16), hi16));
    const __m512i ov = _mm512_or_si512(_mm512_srli_epi64(y, 48), _mm512_and_si512(y, hi16));
    _mm256_storeu_si256((__m256i*)(e + k / 4), _mm512_cvtepi64_epi32(ev));
    _mm256_storeu_si256((__m256i*)(o + k / 4), _mm512_cvtepi64_epi32(ov));
  }
}

// `count` tokens' inputs (row stride ldx) in packed order, one after another (2 Q dwords each: e then o), in a
// per-thread scratch that the next call overwrites.
static inline const uint32_t* packed_token_block(const uint16_t* x, int ldx, int count, int K) {
  static thread_local std::vector<uint32_t> in;
  const size_t Q = (size_t)8 * ((K + 31) / 32);
  if (in.size() < 2 * Q * count) in.resize(2 * Q * count);
  for (int j = 0; j < count; j++) packed_token_inputs(x + (size_t)j * ldx, K, &in[2 * Q * j], &in[2 * Q * j + Q]);
  return in.data();
}

// Decode: 16-row groups read side by side at batch 1 (knob "amx_groups": 1, 2 or 4; the same bits at any).
// Whole decode steps (Qwen2.5-0.5B, 2-core Xeon): 4 groups 1.13x over 1, 2 groups the same as 4.
static int g_amx_groups = 4;

// The tile reads denormals as zero and flushes denormal sums to a zero of their sign, with round-to-nearest-
// even, whatever MXCSR says; VDPBF16PS too, but the two adds after it follow MXCSR (measured: E + O = 2^-127
// is 0 on the tile). So the decode kernel runs with MXCSR set so (and restores the caller's).
struct PackedMxcsr {
  unsigned saved = _mm_getcsr();
  PackedMxcsr() { _mm_setcsr((saved & ~0x6000u) | 0x8040u); }  // RC = nearest, FTZ, DAZ
  ~PackedMxcsr() { _mm_setcsr(saved); }
};

// G 16-row groups x BT tokens: c[(g * BT + j) * 16 + m] = row 16 g + m . token j, in the tile's
// order (see the top of this file). gp: each group's first step; in: per token 2 Q dwords (e then o,
// Q = 8 ksteps).
template <int G, int BT>
static inline void packed_groups(const uint16_t* const* gp, int ksteps, const uint32_t* in, float* c) {
  const size_t Q = (size_t)8 * ksteps;
  __m512 C[G][BT];
  for (int g = 0; g < G; g++)
    for (int j = 0; j < BT; j++) C[g][j] = _mm512_setzero_ps();
  for (int s = 0; s < ksteps; s++) {
    __m512 E[G][BT], O[G][BT];
    for (int g = 0; g < G; g++)
      for (int j = 0; j < BT; j++) E[g][j] = O[g][j] = _mm512_setzero_ps();
    const uint16_t* p[G];
    for (int g = 0; g < G; g++) p[g] = gp[g] + (size_t)s * 512;
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) {
      __m512i we[G], wo[G];
      for (int g = 0; g < G; g++) {  // the hardware prefetcher alone falls behind (common.h, SOLO_PREFETCH)
        PREFETCH(p[g] + 64 * v);
        PREFETCH(p[g] + 64 * v + 32);
      }
      for (int g = 0; g < G; g++) {
        we[g] = _mm512_loadu_si512(p[g] + 64 * v);
        wo[g] = _mm512_loadu_si512(p[g] + 64 * v + 32);
      }
      for (int j = 0; j < BT; j++) {
        const __m512bh xe = (__m512bh)_mm512_set1_epi32((int)in[j * 2 * Q + 8 * s + v]);
        const __m512bh xo = (__m512bh)_mm512_set1_epi32((int)in[j * 2 * Q + Q + 8 * s + v]);
        for (int g = 0; g < G; g++) {
          E[g][j] = _mm512_dpbf16_ps(E[g][j], (__m512bh)we[g], xe);
          O[g][j] = _mm512_dpbf16_ps(O[g][j], (__m512bh)wo[g], xo);
        }
      }
    }
    for (int g = 0; g < G; g++)
      for (int j = 0; j < BT; j++) C[g][j] = _mm512_add_ps(C[g][j], _mm512_add_ps(E[g][j], O[g][j]));
  }
  for (int g = 0; g < G; g++)
    for (int j = 0; j < BT; j++) _mm512_storeu_ps(c + (g * BT + j) * 16, C[g][j]);
}

// c (packed_groups' order, `groups` groups from row r0, `bt` tokens) into y[j, r] for r in [n0, n1).
static inline void packed_put_rows(const float* c, int groups, int bt, int r0, float* y, int ldy, int n0, int n1) {
  for (int g = 0; g < groups; g++) {
    const int a = r0 + 16 * g, lo = a > n0 ? a : n0, hi = a + 16 < n1 ? a + 16 : n1;
    if (hi <= lo) continue;
    for (int j = 0; j < bt; j++)
      memcpy(y + (size_t)j * ldy + lo, c + (g * bt + j) * 16 + (lo - a), (size_t)(hi - lo) * sizeof(float));
  }
}

// Tokens [b0, b1) in groups of BT (b1 - b0 a multiple of BT; `in`: every token's inputs from token 0, as
// packed_token_block gives them), each group over runs of G groups of rows [n0, n1), the last groups one by one.
template <int G, int BT>
static void packed_rows_tokens(const uint16_t* P, size_t gstride, int ksteps, const uint32_t* in, int b0, int b1,
                               float* y, int ldy, int n0, int n1) {
  const size_t Q2 = (size_t)16 * ksteps;  // dwords per token
  alignas(64) float c[G * BT * 16];
  const uint16_t* gp[G];
  const int gfirst = n0 / 16, gend = (n1 + 15) / 16;
  for (int b = b0; b + BT <= b1; b += BT) {
    const uint32_t* tin = in + (size_t)b * Q2;
    float* yb = y + (size_t)b * ldy;
    int g = gfirst;
    for (; g + G <= gend; g += G) {
      for (int r = 0; r < G; r++) gp[r] = P + (size_t)(g + r) * gstride;
      packed_groups<G, BT>(gp, ksteps, tin, c);
      packed_put_rows(c, G, BT, 16 * g, yb, ldy, n0, n1);
    }
    for (; g < gend; g++) {
      gp[0] = P + (size_t)g * gstride;
      packed_groups<1, BT>(gp, ksteps, tin, c);
      packed_put_rows(c, 1, BT, 16 * g, yb, ldy, n0, n1);
    }
  }
}

template <int G, int BT>
static void packed_gemv_g(const uint16_t* P, int K, const uint32_t* in, float* y, int ldy, int n0, int n1) {
  const PackedMxcsr mxcsr;
  const int ksteps = (K + 31) / 32;
  packed_rows_tokens<G, BT>(P, (size_t)ksteps * 512, ksteps, in, 0, BT, y, ldy, n0, n1);
}

// Decode: y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and BT <= 4 tokens, packed bf16 weights, the tokens'
// inputs already in packed order (`in`: packed_token_block of the BT tokens), on AVX512-BF16 instructions with
// the tile's bits. Batch 1 takes four groups at a time (one stream of 4 KiB steps), two tokens two groups,
// more one.
template <int BT>
static void packed_gemv_in(const uint16_t* P, int K, const uint32_t* in, float* y, int ldy, int n0, int n1) {
  if (n0 >= n1) return;
  if constexpr (BT == 1) {
    if (g_amx_groups == 1) return packed_gemv_g<1, 1>(P, K, in, y, ldy, n0, n1);
    if (g_amx_groups == 2) return packed_gemv_g<2, 1>(P, K, in, y, ldy, n0, n1);
  }
  constexpr int G0 = BT == 1 ? 4 : (BT == 2 ? 2 : 1);
  packed_gemv_g<G0, BT>(P, K, in, y, ldy, n0, n1);
}

// packed_gemv_in on bf16 inputs x (row stride ldx), converted here.
template <int BT>
static void packed_gemv_bt(const uint16_t* P, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0,
                           int n1) {
  if (n0 >= n1) return;
  packed_gemv_in<BT>(P, K, packed_token_block(x, ldx, BT, K), y, ldy, n0, n1);
}

// Decode of two runs of n rows, [a0, a0 + n) and [b0, b0 + n) (a0 and b0 multiples of 16), read side by side:
// H groups of each run per packed_groups call (the G0 groups of packed_gemv_in, half from each run). The MLP's
// gate and up rows of a chunk are such runs. Read one after the other, each chunk switched streams twice, and
// the stream that restarts waits for the hardware prefetcher again (Llama-3.2-1B decode steps on Zen 4: this
// pair 1.021x the two runs one after the other, 1.04x with the input converted once per product). Each group's
// arithmetic is packed_groups' alone, so the bits are those of packed_gemv_in. `in` as packed_gemv_in's.
template <int BT>
static void packed_gemv_pair_in(const uint16_t* P, int K, const uint32_t* in, float* y, int ldy, int a0, int b0,
                                int n) {
  static_assert(BT == 1 || BT == 2, "pairs of runs at 1 or 2 tokens (packed_gemv_in's even group counts)");
  constexpr int H = BT == 1 ? 2 : 1;
  if (n <= 0) return;
  const PackedMxcsr mxcsr;
  const int ksteps = (K + 31) / 32;
  const size_t gstride = (size_t)ksteps * 512;
  alignas(64) float c[2 * H * BT * 16];
  const uint16_t* gp[2 * H];
  const int ga = a0 / 16, gb = b0 / 16, groups = (n + 15) / 16;
  int g = 0;
  for (; g + H <= groups; g += H) {
    for (int r = 0; r < H; r++) {
      gp[r] = P + (size_t)(ga + g + r) * gstride;
      gp[H + r] = P + (size_t)(gb + g + r) * gstride;
    }
    packed_groups<2 * H, BT>(gp, ksteps, in, c);
    packed_put_rows(c, H, BT, 16 * (ga + g), y, ldy, a0, a0 + n);
    packed_put_rows(c + H * BT * 16, H, BT, 16 * (gb + g), y, ldy, b0, b0 + n);
  }
  for (; g < groups; g++) {
    gp[0] = P + (size_t)(ga + g) * gstride;
    gp[1] = P + (size_t)(gb + g) * gstride;
    packed_groups<2, BT>(gp, ksteps, in, c);
    packed_put_rows(c, 1, BT, 16 * (ga + g), y, ldy, a0, a0 + n);
    packed_put_rows(c + BT * 16, 1, BT, 16 * (gb + g), y, ldy, b0, b0 + n);
  }
}

// Span prefill without tiles: y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and tokens j < B (packed bf16
// weights, bf16 inputs) on the decode kernel's arithmetic (packed_groups, so the same bits as batch 1), with
// more groups and tokens per call: G 16-row groups x BT tokens (knob "packed_tile": 10 G + BT), 2 G BT
// accumulators (E and O) plus G BT sums. Every token's inputs are put in packed order once per call (256
// tokens at a time); then tokens in groups of BT, and for each every run of G groups of [n0, n1) (a chunk of
// the rows: gemv.h, g_packed_chunk_kb, about 1 MiB, which stays in L2 while every token group reads it).
//
// Measured (2-core AMD EPYC Zen 4, same process: benchmarks/prefill_ab.py, results/amd-epyc-zen4/
// packed-bf16-2026-12-07.md): the span prefill 1.23-1.40x the row-major kernels'; 2 x 4 ahead of 3 x 4
// (0.88x), 2 x 6 (0.92-0.94x) and 4 x 3 (0.81x); chunks of 1 MiB 1.04x over 512 KiB (128 KiB: 0.94x of that);
// k in blocks outside the token loop, so that a run's weights stay in L1 for every token, 0.94-0.99x (blocks
// of 4-16 steps): the weights' reads from L2 are not the limit.
static int g_packed_tile = 24;
// KiB of packed rows per work item of a span product (knob "packed_chunk_kb"; gemv.h: chunk_rows) and per
// super-block inside one call: every token group reads them, so they should stay in L2 beside the inputs.
static int g_packed_chunk_kb = 1024;

// The last `left` < T tokens, [b0, b0 + left), with a G x left tile.
template <int G, int T>
static void packed_span_left(const uint16_t* P, size_t gstride, int ksteps, const uint32_t* in, int b0, int left,
                             float* y, int ldy, int n0, int n1) {
  if constexpr (T > 1) {
    if (left == T - 1) return packed_rows_tokens<G, T - 1>(P, gstride, ksteps, in, b0, b0 + left, y, ldy, n0, n1);
    packed_span_left<G, T - 1>(P, gstride, ksteps, in, b0, left, y, ldy, n0, n1);
  }
}

// Tokens [0, B) with a G x BT tile, the last B % BT tokens with a G x (B % BT) one.
template <int G, int BT>
static void packed_span_tile(const uint16_t* P, size_t gstride, int ksteps, const uint32_t* in, int B, float* y,
                             int ldy, int n0, int n1) {
  const int whole = B - B % BT;
  packed_rows_tokens<G, BT>(P, gstride, ksteps, in, 0, whole, y, ldy, n0, n1);
  if (whole < B) packed_span_left<G, BT>(P, gstride, ksteps, in, whole, B - whole, y, ldy, n0, n1);
}

static void packed_span(const uint16_t* P, int K, const uint16_t* x, int ldx, int B, float* y, int ldy, int n0,
                        int n1) {
  if (n0 >= n1 || B <= 0) return;
  const PackedMxcsr mxcsr;
  const int ksteps = (K + 31) / 32;
  const size_t gstride = (size_t)ksteps * 512;
  // Tokens in blocks of PACKED_SPAN_TOKENS: the per-thread scratch of their inputs stays bounded (K x 2 bytes
  // per token) when a long prompt's matmul prefill (cpu.py: _linear) multiplies thousands of tokens at once.
  constexpr int PACKED_SPAN_TOKENS = 256;
  const size_t super_bytes = (size_t)g_packed_chunk_kb << 10;
  const int super_groups = super_bytes > gstride * 2 ? (int)(super_bytes / (gstride * 2)) : 1;
  for (int t0 = 0; t0 < B; t0 += PACKED_SPAN_TOKENS) {
    const int nb = B - t0 < PACKED_SPAN_TOKENS ? B - t0 : PACKED_SPAN_TOKENS;
    const uint32_t* in = packed_token_block(x + (size_t)t0 * ldx, ldx, nb, K);
    float* yb = y + (size_t)t0 * ldy;
    // Rows in super-blocks of about g_packed_chunk_kb (the decode step's chunks are one already; a thread's
    // whole block of rows in solo_gemv is not: there every token group read the weights from memory, 0.35x).
    for (int r0 = n0, r1; r0 < n1; r0 = r1) {
      r1 = (r0 / 16 + super_groups) * 16;
      r1 = r1 < n1 ? r1 : n1;
      switch (g_packed_tile) {
        case 14: packed_span_tile<1, 4>(P, gstride, ksteps, in, nb, yb, ldy, r0, r1); break;
        case 26: packed_span_tile<2, 6>(P, gstride, ksteps, in, nb, yb, ldy, r0, r1); break;
        case 34: packed_span_tile<3, 4>(P, gstride, ksteps, in, nb, yb, ldy, r0, r1); break;
        case 43: packed_span_tile<4, 3>(P, gstride, ksteps, in, nb, yb, ldy, r0, r1); break;
        default: packed_span_tile<2, 4>(P, gstride, ksteps, in, nb, yb, ldy, r0, r1); break;
      }
    }
  }
}
#else
#define SOLO_BF16_PACKED 0
#endif
