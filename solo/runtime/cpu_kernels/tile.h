// Matrix products with many input vectors (a prompt run through the decode step: span prefill, long
// decode spans): register tiles over rows AND tokens. Included by gemv.h after its decode kernels;
// gemv_rows hands its rows here (gemv_rows_tiled) when it has more sequences than one decode tile.
//
// Why: the decode kernels load every weight vector once per tile of up to SOLO_TILE sequences and one
// input vector per (sequence, k) for every row: with 4 sequences that is 1.25 vector loads per dot-product
// instruction, and the load ports, not the multipliers, bound a prompt's products. A tile of R rows x T
// tokens loads R weight vectors and T input vectors per R * T dot products (2 x 3: 0.83 loads per dot).
//
// Bits: every (row, token) keeps exactly the accumulators and the reduction of the batch-1 decode kernel
// it replaces (gemv_bf16_bt: four accumulators over k in steps of 128, the 32-wide tail into accumulator 0,
// the masked rest into accumulator 1, then (a0 + a1) + (a2 + a3) reduced by _mm512_reduce_add_ps), so a
// result is bit-identical to batch-1 decode whatever tile computed it.
#pragma once
#include "common.h"

#if SOLO_AVX512 && defined(__AVX512BF16__)
// y[j, n] = W[n, :] . x[j, :] for rows n in [n0, n0 + R) and tokens j < T, bf16 weights and inputs.
template <int R, int T>
static inline void tile_bf16_rt(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0) {
  const int k4 = K & ~127, kmain = K & ~31;
  const int rem = K - kmain;
  const __mmask32 tail = rem ? (__mmask32)((1ull << rem) - 1) : 0;
  const uint16_t* w[R];
  for (int r = 0; r < R; r++) w[r] = W + (size_t)(n0 + r) * K;
  __m512 acc[R][T][4];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < T; j++)
      for (int i = 0; i < 4; i++) acc[r][j][i] = _mm512_setzero_ps();
  int k = 0;
  for (; k < k4; k += 128) {
    for (int i = 0; i < 4; i++) {
      __m512bh wv[R];
      for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_loadu_si512(w[r] + k + 32 * i);
      for (int j = 0; j < T; j++) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + k + 32 * i);
        for (int r = 0; r < R; r++) acc[r][j][i] = _mm512_dpbf16_ps(acc[r][j][i], wv[r], xv);
      }
    }
  }
  for (; k < kmain; k += 32) {
    __m512bh wv[R];
    for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_loadu_si512(w[r] + k);
    for (int j = 0; j < T; j++) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + k);
      for (int r = 0; r < R; r++) acc[r][j][0] = _mm512_dpbf16_ps(acc[r][j][0], wv[r], xv);
    }
  }
  if (rem) {
    __m512bh wv[R];
    for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, w[r] + kmain);
    for (int j = 0; j < T; j++) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + (size_t)j * ldx + kmain);
      for (int r = 0; r < R; r++) acc[r][j][1] = _mm512_dpbf16_ps(acc[r][j][1], wv[r], xv);
    }
  }
  for (int j = 0; j < T; j++)
    for (int r = 0; r < R; r++)
      y[(size_t)j * ldy + n0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][j][0], acc[r][j][1]),
                                                                       _mm512_add_ps(acc[r][j][2], acc[r][j][3])));
}

// Rows [n0, n1) x sequences [0, B) of a bf16 matrix with R x T tiles: blocks of TILE_ROWS rows (a block of
// K = 2048 is 64 KiB, read from L2 once per group of T tokens while those tokens' inputs stay in L1),
// tokens in groups of T inside a block, rows in pairs inside a group; the last token group and an odd
// last row take narrower tiles of the same arithmetic.
enum { TILE_ROWS = 16 };
template <int T>
static void tile_bf16_tokens(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int r0, int r1) {
  int n = r0;
  for (; n + 2 <= r1; n += 2) tile_bf16_rt<2, T>(W, K, x, ldx, y, ldy, n);
  if (n < r1) tile_bf16_rt<1, T>(W, K, x, ldx, y, ldy, n);
}

static void tile_bf16_rows(const uint16_t* W, int K, const uint16_t* x, int ldx, int B, float* y, int ldy, int n0,
                           int n1) {
  for (int r0 = n0; r0 < n1; r0 += TILE_ROWS) {
    const int r1 = r0 + TILE_ROWS < n1 ? r0 + TILE_ROWS : n1;
    int b = 0;
    for (; b + 3 <= B; b += 3) tile_bf16_tokens<3>(W, K, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    if (B - b == 2) tile_bf16_tokens<2>(W, K, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    if (B - b == 1) tile_bf16_tokens<1>(W, K, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1);
  }
}
#endif

// Tile knob (solo_set_knob "span_tile", measurement): 0 = never, so every product takes the decode tiles.
static int g_span_tile = 1;

// y[b, n] = W x[b, :] for rows n in [n0, n1) and b < B with a rows x tokens tile, when this build has one
// for W's format and B is large enough to fill it (the caller checked B > SOLO_TILE). Returns 1 when it
// computed the product, 0 when the caller must (same bits either way).
static inline int gemv_rows_tiled(const Mat* W, const void* x, int ldx, int B, float* y, int ldy, int n0, int n1) {
  if (!g_span_tile) return 0;
#if SOLO_AVX512 && defined(__AVX512BF16__)
  if (W->format == W_BF16) {
    tile_bf16_rows((const uint16_t*)W->weight, W->cols, (const uint16_t*)x, ldx, B, y, ldy, n0, n1);
    return 1;
  }
#endif
  (void)W, (void)x, (void)ldx, (void)B, (void)y, (void)ldy, (void)n0, (void)n1;
  return 0;
}
