// Matrix products with many input vectors (a prompt run through the decode step: span prefill, long
// decode spans) when each input vector is long: register tiles over rows AND tokens. Included by gemv.h
// after its decode kernels; gemv_rows hands its rows here (gemv_rows_tiled) when it has more sequences than
// one decode tile (SOLO_TILE).
//
// Why: the decode kernel's tile (one row x 4 tokens, gemv_bf16_bt<4>) reads its 4 tokens' inputs again for
// every row of a block. While they fit in L1 (K = 2048: 16 KiB) that is cheap and the decode tile is the
// fastest measured; at K = 8192 (Llama-3.2-1B's down projection: 64 KiB) or 4864 (Qwen2.5-0.5B's) they come
// from L2 for every row, and the product ran at ~60% of the K = 2048 rate. On AVX512-BF16 those products
// take a pass tile of 4 rows x 6 tokens with k in blocks outside the row loop (tile_bf16_pass below: each
// block's inputs stay in L1 for every row); at K <= TILE_MIN_K every tile tried was slower than the decode
// tile, so those keep it (Zen 4: 2x2, 2x3, 3x2, 2x4, 1x5, 1x6 5-25% slower; Zen 5: below).
//
// Bits: every (row, token) keeps exactly the accumulators and the reduction of the batch-1 decode kernel
// it replaces (gemv_bf16_bt: four accumulators over k in steps of 128, the 32-wide steps after the last 128
// into accumulator 0, the masked rest into accumulator 1, then (a0 + a1) + (a2 + a3) reduced by
// hsum16, common.h), so a result is bit-identical to batch-1 decode whatever tile computed it.
//
// AVX-512 without BF16 (bf16 weights widened to float32, one accumulator per token) gets a 4 x 4 tile at
// every K (below). The portable builds (AVX2, NEON without BF16: SOLO_TILE 2) compute a dense row with one
// accumulator (gemv.h), so their bf16 tile (3 rows x 4 tokens at every K, below) holds each (row, token)'s
// whole dot product in one register. int8 with integer-dot products (qdot.h) gets a pass tile at every ISA
// level (512-bit with AVX512-VNNI), int4 a 256-bit one on the portable builds and a 512-bit one with
// AVX512-VNNI.
#pragma once
#include "common.h"

// Elements of k per block of the int8 pass tile's four passes (knob "q8_pass_kb", a multiple of 128).
static int g_q8_pass_kb = 1024;
// Elements of k per block of the AVX512-BF16 pass tile (knob "bf16_pass_kb", a multiple of 128; measurement);
// the default per CPU (cpu_build.bf16_pass_k_block: SOLO_BF16_PASS_KB): 2048, 8192 on Zen 4.
#ifndef SOLO_BF16_PASS_KB
#define SOLO_BF16_PASS_KB 2048
#endif
static int g_bf16_pass_kb = SOLO_BF16_PASS_KB;
// The 512-bit integer-dot pass tile (int8 and int4 with AVX512-VNNI; knob "qz_rt": 10 x rows + tokens, 0 =
// none: int8 takes the 256-bit pass tile, int4 the decode kernel; default 4 x 4; "qz_pass_kb": its k block, a
// multiple of 128; measurement).
static int g_qz_rt = 44;
static int g_qz_pass_kb = 2048;

// Rows [n0, n1) x sequences [0, B) of matrix W with Tile<R, T> tiles (Tile<R, T>::run computes rows
// [n, n + R) x T tokens): blocks of BR rows, tokens in groups of T inside a block (a block stays in L2 while
// every group reads it; a group's inputs stay in L1), rows in groups of R inside a token group; the last
// token group and the last rows take narrower tiles of the same arithmetic. X: the input's element type,
// ldx in X elements.
template <template <int, int> class Tile, int R, int T, typename X>
static void tile_block(const Mat* W, const X* x, int ldx, float* y, int ldy, int r0, int r1) {
  int n = r0;
  for (; n + R <= r1; n += R) Tile<R, T>::run(W, x, ldx, y, ldy, n);
  for (; n < r1; n++) Tile<1, T>::run(W, x, ldx, y, ldy, n);
}

// The last token group, `left` < T tokens: a tile of exactly that many.
template <template <int, int> class Tile, int R, int T, typename X>
static void tile_block_left(const Mat* W, const X* x, int ldx, float* y, int ldy, int r0, int r1, int left) {
  if constexpr (T > 1) {
    if (left == T - 1) {
      tile_block<Tile, R, T - 1>(W, x, ldx, y, ldy, r0, r1);
      return;
    }
    tile_block_left<Tile, R, T - 1>(W, x, ldx, y, ldy, r0, r1, left);
  }
}

template <template <int, int> class Tile, int R, int T, int BR, typename X>
static void tile_rows(const Mat* W, const X* x, int ldx, int B, float* y, int ldy, int n0, int n1) {
  for (int r0 = n0; r0 < n1; r0 += BR) {
    const int r1 = r0 + BR < n1 ? r0 + BR : n1;
    int b = 0;
    for (; b + T <= B; b += T) tile_block<Tile, R, T>(W, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1);
    if (b < B) tile_block_left<Tile, R, T>(W, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1, B - b);
  }
}

// Rows [n0, n1) x sequences [0, B) of matrix W like tile_rows, with k in blocks of kb OUTSIDE the row loop,
// for tiles whose accumulators wait in memory between k blocks (Tile<R, T>::run(W, x, ldx, y, ldy, n, k0, k1,
// acc): rows [n, n + R) x T tokens over k in [k0, k1), the result written when k1 == K): a token group's
// inputs for one k block stay in L1 while every row tile of a block reads them, however long K is. acc:
// R x T x 64 floats per row of a block (alignas 64).
template <template <int, int> class Tile, int R, int T, int BR, typename X>
static void tile_block_kb(const Mat* W, const X* x, int ldx, float* y, int ldy, int r0, int r1, int kb, float* acc) {
  const int K = W->cols;
  for (int k0 = 0; k0 < K; k0 += kb) {
    const int k1 = k0 + kb < K ? k0 + kb : K;
    int n = r0;
    for (; n + R <= r1; n += R) Tile<R, T>::run(W, x, ldx, y, ldy, n, k0, k1, acc + (size_t)(n - r0) * T * 64);
    for (; n < r1; n++) Tile<1, T>::run(W, x, ldx, y, ldy, n, k0, k1, acc + (size_t)(n - r0) * T * 64);
  }
}

template <template <int, int> class Tile, int R, int T, int BR, typename X>
static void tile_block_kb_left(const Mat* W, const X* x, int ldx, float* y, int ldy, int r0, int r1, int kb,
                               float* acc, int left) {
  if constexpr (T > 1) {
    if (left == T - 1) {
      tile_block_kb<Tile, R, T - 1, BR>(W, x, ldx, y, ldy, r0, r1, kb, acc);
      return;
    }
    tile_block_kb_left<Tile, R, T - 1, BR>(W, x, ldx, y, ldy, r0, r1, kb, acc, left);
  }
}

template <template <int, int> class Tile, int R, int T, int BR, typename X>
static void tile_rows_kb(const Mat* W, const X* x, int ldx, int B, float* y, int ldy, int n0, int n1, int kb) {
  alignas(64) float acc[BR * T * 64];  // every row tile's accumulators of a block (BR = 16, T = 6: 24 KiB)
  for (int r0 = n0; r0 < n1; r0 += BR) {
    const int r1 = r0 + BR < n1 ? r0 + BR : n1;
    int b = 0;
    for (; b + T <= B; b += T)
      tile_block_kb<Tile, R, T, BR>(W, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1, kb, acc);
    if (b < B)
      tile_block_kb_left<Tile, R, T, BR>(W, x + (size_t)b * ldx, ldx, y + (size_t)b * ldy, ldy, r0, r1, kb, acc,
                                         B - b);
  }
}

#if SOLO_AVX512 && defined(__AVX512BF16__)
// The AVX512-BF16 pass tile: y[j, n] = W[n, :] . x[j, :] for rows n in [n0, n0 + R) and tokens j < T over k
// in [k0, k1), bf16 weights and inputs, with the decode kernel's bits (gemv_bf16_bt: four accumulators, i
// taking the 32-wide chunk i of every 128-wide step of k, accumulator 0 the 32-wide steps after the last
// 128, accumulator 1 the masked rest, then (a0 + a1) + (a2 + a3) reduced by hsum16). The four
// are independent until that sum, so pass i computes accumulator i of every (row, token) of the tile: R x T
// registers per pass instead of 4 x R x T, so a 4 x 6 tile (24 accumulators, 4 weight and 1 input
// registers) makes 10 loads per 24 dot products where the decode tile (1 row x 4 tokens) makes 20 per 16.
// The four passes read disjoint 64-byte lines (chunk i of each step), so together they read every line once.
// The accumulators wait in acc ([4][R][T] x 16 floats) between passes and k blocks: k0 == 0 starts from
// zero, k1 == K adds the tails and writes y; every other k0 and k1 is a multiple of 128, so each
// accumulator adds the same terms in the same order as batch 1. The empty asm statements pin each loaded
// vector in a register: without them GCC hoisted the next chunk's weight loads and re-loaded the inputs
// once per dot product (more loads than the decode tile).
//
// Measured (Zen 5, 2 threads, same-process A/B: benchmarks/prefill_ab.py): the down projections 1.53x
// (Llama-3.2-1B, K = 8192) and 1.57x (Qwen2.5-0.5B, K = 4864), the whole span prefill 1.14x on both; k blocks
// of 2048 (1024: 0.85x of that, 4096: 0.82x, none: 0.81x at K = 8192); 4 x 5 and 3 x 7 within 5%; the old 2 x
// 4 tile with four accumulators, 1.35x. At K <= TILE_MIN_K the decode tile stays ahead (K = 2048: this tile
// 0.87x, 0.9-0.94x with padded inputs; 2 x 3 and 2 x 4 tiles with four accumulators 0.85-0.88x).
template <int R, int T>
__attribute__((noinline)) static void tile_bf16_pass(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y,
                                                     int ldy, int n0, int k0, int k1, float* accbuf) {
  const int k4 = K & ~127, kmain = K & ~31;
  const int rem = K - kmain;
  const __mmask32 tail = rem ? (__mmask32)((1ull << rem) - 1) : 0;
  const int kend = k1 < k4 ? k1 : k4;
  const uint16_t* w[R];
  for (int r = 0; r < R; r++) w[r] = W + (size_t)(n0 + r) * K;
  for (int i = 0; i < 4; i++) {
    float* part = accbuf + (size_t)i * R * T * 16;
    __m512 acc[R][T];
    for (int r = 0; r < R; r++)
      for (int j = 0; j < T; j++) acc[r][j] = k0 ? _mm512_load_ps(part + (r * T + j) * 16) : _mm512_setzero_ps();
    for (int k = k0 + 32 * i; k < kend; k += 128) {
      // The loads pinned as loads (asm on the integer vectors: clang 16 allocates no register for a bf16 one).
      __m512bh wv[R];
      for (int r = 0; r < R; r++) {
        __m512i wi = _mm512_loadu_si512(w[r] + k);
        asm("" : "+v"(wi));
        wv[r] = (__m512bh)wi;
      }
      for (int j = 0; j < T; j++) {
        __m512i xi = _mm512_loadu_si512(x + (size_t)j * ldx + k);
        asm("" : "+v"(xi));
        const __m512bh xv = (__m512bh)xi;
        for (int r = 0; r < R; r++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
      }
    }
    if (k1 == K && i == 0) {
      for (int k = k4; k < kmain; k += 32) {
        __m512bh wv[R];
        for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_loadu_si512(w[r] + k);
        for (int j = 0; j < T; j++) {
          const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)j * ldx + k);
          for (int r = 0; r < R; r++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
        }
      }
    }
    if (k1 == K && i == 1 && rem) {
      __m512bh wv[R];
      for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, w[r] + kmain);
      for (int j = 0; j < T; j++) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + (size_t)j * ldx + kmain);
        for (int r = 0; r < R; r++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
      }
    }
    for (int r = 0; r < R; r++)
      for (int j = 0; j < T; j++) _mm512_store_ps(part + (r * T + j) * 16, acc[r][j]);
  }
  if (k1 < K) return;
  const size_t P = (size_t)R * T * 16;  // floats per pass
  for (int j = 0; j < T; j++)
    for (int r = 0; r < R; r++) {
      const float* a = accbuf + (r * T + j) * 16;
      y[(size_t)j * ldy + n0 + r] = hsum16(
          _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(a), _mm512_load_ps(a + P)),
                        _mm512_add_ps(_mm512_load_ps(a + 2 * P), _mm512_load_ps(a + 3 * P))));
    }
}

template <int R, int T>
struct TileBf16Pass512 {
  static void run(const Mat* W, const uint16_t* x, int ldx, float* y, int ldy, int n0, int k0, int k1, float* acc) {
    tile_bf16_pass<R, T>((const uint16_t*)W->weight, W->cols, x, ldx, y, ldy, n0, k0, k1, acc);
  }
};
#endif

#if SOLO_AVX512 && !defined(__AVX512BF16__)
// A 4 rows x 4 tokens tile for bf16 weights without AVX512-BF16 (gemv_bf16w_f32_bt: weights widened to
// float32, ONE accumulator per token over k in steps of 16, then _mm512_reduce_add_ps and the scalar tail),
// float32 inputs. There the decode tile is short of independent FMA chains (4 per row) as well as of L1 for
// its float32 inputs; 16 accumulators fix both. Measured (span prefill, one thread, noisy, SOLO_CPU_ISA=
// avx512 on the Zen 4): Llama-3.2-1B at 128 tokens 1.75x (K = 2048 products 1.5x, down 2.25x),
// Qwen2.5-0.5B at 512 tokens 1.49x (K = 896 products 1.17-1.32x).
template <int R, int T>
__attribute__((noinline)) static void tile_bf16w_f32_rt(const uint16_t* W, int K, const float* x, int ldx, float* y,
                                                        int ldy, int n0) {
  const int kmain = K & ~15;
  const uint16_t* w[R];
  for (int r = 0; r < R; r++) w[r] = W + (size_t)(n0 + r) * K;
  __m512 acc[R][T];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < T; j++) acc[r][j] = _mm512_setzero_ps();
  for (int k = 0; k < kmain; k += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; r++) wv[r] = load_bf16x16(w[r] + k);
    for (int j = 0; j < T; j++) {
      const __m512 xv = _mm512_loadu_ps(x + (size_t)j * ldx + k);
      for (int r = 0; r < R; r++) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  for (int j = 0; j < T; j++)
    for (int r = 0; r < R; r++) {
      float s = _mm512_reduce_add_ps(acc[r][j]);
      for (int k = kmain; k < K; k++) s += bf16_to_f32(w[r][k]) * x[(size_t)j * ldx + k];
      y[(size_t)j * ldy + n0 + r] = s;
    }
}

template <int R, int T>
struct TileBf16W {
  static void run(const Mat* W, const float* x, int ldx, float* y, int ldy, int n0) {
    tile_bf16w_f32_rt<R, T>((const uint16_t*)W->weight, W->cols, x, ldx, y, ldy, n0);
  }
};
#endif

#if SOLO_GVEC && !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
// The portable builds (AVX2, NEON without BF16): bf16 weights widened to float32, float32 inputs, each
// (row, token) in the decode kernel's order (gemv.h, dense_rows_g: one accumulator over k in 8-wide chunks,
// then dense_row_finish), so every (row, token) keeps the batch-1 bits. A tile of R rows x T tokens holds
// R x T accumulators and R weight vectors, the inputs loaded one token at a time: R x T + R + 1 of the 16
// vector registers, 3 x 4 making 7 loads per 12 multiply-adds over the whole of k in one loop. Measured
// (Zen 3, one thread, a standalone loop over 2048 x 2048, 896 x 896 and 896 x 4864 bf16 matrices, 126
// tokens): 62-76 GFLOPS (68-80% of the core's multiply-add peak) where the tile of the four-accumulator
// order before (four passes over k blocks of 256, each accumulator in its own pass) made 41-56: its passes
// ran 8 iterations before their 12 accumulators went back to memory. 2 x 5 and 4 x 3 (spilling) were
// 0.6-0.8x of 3 x 4.
template <int R, int T>
__attribute__((noinline)) static void tile_bf16g_rt(const Mat* W, const float* x, int ldx, float* y, int ldy,
                                                    int n0) {
  const int K = W->cols, k1 = K - K % GVW;
  const uint16_t* w[R];
  for (int r = 0; r < R; r++) w[r] = (const uint16_t*)W->weight + (size_t)(n0 + r) * K;
  vf acc[R][T];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < T; j++) acc[r][j] = vzero();
  for (int k = 0; k < k1; k += GVW) {
    vf wv[R];
    for (int r = 0; r < R; r++) wv[r] = vload_bf16(w[r] + k);
    for (int j = 0; j < T; j++) {
      const vf xv = vload(x + (size_t)j * ldx + k);
      for (int r = 0; r < R; r++) acc[r][j] = vfma(wv[r], xv, acc[r][j]);
    }
  }
  for (int j = 0; j < T; j++)
    for (int r = 0; r < R; r++)
      y[(size_t)j * ldy + n0 + r] = dense_row_finish<W_BF16>(W, w[r], n0 + r, acc[r][j], x + (size_t)j * ldx, k1);
}

template <int R, int T>
struct TileBf16G {
  static void run(const Mat* W, const float* x, int ldx, float* y, int ldy, int n0) {
    tile_bf16g_rt<R, T>(W, x, ldx, y, ldy, n0);
  }
};
#endif

#if SOLO_GVEC || SOLO_AVX512
// Rows n0 .. n0 + R - 1 of a W_*_Q8 matrix, for the integer-dot tiles below: int8 bytes, or int4 nibbles and
// their bf16 group scales.
template <int R>
struct Q8Rows {
  const int8_t* w8[R];
  const uint8_t* w4[R];
  const uint16_t* ws[R];
  Q8Rows(const Mat* W, int n0) {
    const int K = W->cols;
    for (int r = 0; r < R; r++) {
      w8[r] = (const int8_t*)W->weight + (size_t)(n0 + r) * K;
      w4[r] = (const uint8_t*)W->weight + (size_t)(n0 + r) * (K / 2);
      ws[r] = (const uint16_t*)W->scale + (size_t)(n0 + r) * (K / 32);
    }
  }
};

// int8 and int4 weights with integer-dot products (W_INT8_Q8, W_INT4_Q8: qdot.h's gemv_q8_tile, which the
// 512-bit int4 kernel matches bit for bit): block g of 32 inputs goes to accumulator g % 4 (the main loop
// over groups of four full blocks, then the last blocks into accumulators 0, 1, ...), then
// vsum((a0 + a1) + (a2 + a3)) (times the row scale for int8; int4's block scale is the token's times the
// row group's, the same float product). As the AVX512-BF16 pass tile above: each accumulator in its own pass over
// blocks of k, the same blocks in the same order, so every (row, token) keeps the batch-1 bits, and a tile of
// R rows x T tokens loads each token's quantized input, correction and scale once for R rows (the decode
// tile, 1 row x 4 tokens, loads them for every row). x: T slots of ldx bytes each (qdot.h's layout).
template <int FMT, int R, int T>
__attribute__((noinline)) static void tile_q8_pass_rt(const Mat* W, const char* x, int ldx, float* y, int ldy,
                                                      int n0) {
  const int K = W->cols, nb = q8_blocks(K), full = K / 32, g4 = full & ~3;
  const float* rscale = (const float*)W->scale;
  const Q8Rows<R> rows(W, n0);
  const auto& w8 = rows.w8;  // (one declaration each: their types differ)
  const auto& w4 = rows.w4;
  const auto& ws = rows.ws;
  const int kbb = g_q8_pass_kb / 32;  // blocks per k block, a multiple of 4
  vf part[4][R][T];
  for (int i = 0; i < 4; i++)
    for (int r = 0; r < R; r++)
      for (int j = 0; j < T; j++) part[i][r][j] = vzero();
  auto block = [&](vf (&acc)[R][T], int g) __attribute__((always_inline)) {
    vb32 wv[R];
    vub32 u[R];
    for (int r = 0; r < R; r++) {
      if (FMT == W_INT8_Q8) {
        wv[r] = vb32{};
        if (g < full)
          memcpy(&wv[r], w8[r] + 32 * (size_t)g, 32);
        else
          memcpy(&wv[r], w8[r] + 32 * (size_t)g, (size_t)(K - 32 * g));  // a short last block: zeros past K
      } else {
        u[r] = unpack_u4(w4[r] + 16 * (size_t)g);
      }
    }
    for (int j = 0; j < T; j++) {
      const char* xj = x + (size_t)j * ldx;
      vb32 xv;
      vi corr;
      float sc;
      memcpy(&xv, xj + 32 * (size_t)g, 32);
      memcpy(&corr, xj + 36 * (size_t)nb + 32 * (size_t)g, 32);
      memcpy(&sc, xj + 32 * (size_t)nb + 4 * (size_t)g, 4);
      if (FMT == W_INT8_Q8) {
        const vf scv = vset1(sc);
        for (int r = 0; r < R; r++)
          acc[r][j] = vfma(__builtin_convertvector(idot_i8(wv[r], xv, corr), vf), scv, acc[r][j]);
      } else {
        for (int r = 0; r < R; r++)
          acc[r][j] = vfma(__builtin_convertvector(idot_u4(corr, u[r], xv), vf), vset1(sc * bf16_to_f32(ws[r][g])),
                           acc[r][j]);
      }
    }
  };
  for (int gb = 0; gb < g4; gb += kbb) {
    const int ge = gb + kbb < g4 ? gb + kbb : g4;
    for (int i = 0; i < 4; i++) {
      vf acc[R][T];
      for (int r = 0; r < R; r++)
        for (int j = 0; j < T; j++) acc[r][j] = part[i][r][j];
      for (int g = gb + i; g < ge; g += 4) block(acc, g);
      for (int r = 0; r < R; r++)
        for (int j = 0; j < T; j++) part[i][r][j] = acc[r][j];
    }
  }
  for (int i = 0; i < 4 && g4 + i < nb; i++) block(part[i], g4 + i);
  for (int j = 0; j < T; j++)
    for (int r = 0; r < R; r++) {
      const float s = vsum((part[0][r][j] + part[1][r][j]) + (part[2][r][j] + part[3][r][j]));
      y[(size_t)j * ldy + n0 + r] = FMT == W_INT8_Q8 ? s * rscale[n0 + r] : s;
    }
}

template <int R, int T>
struct TileQ8Pass {
  static void run(const Mat* W, const char* x, int ldx, float* y, int ldy, int n0) {
    if (W->format == W_INT8_Q8)
      tile_q8_pass_rt<W_INT8_Q8, R, T>(W, x, ldx, y, ldy, n0);
    else
      tile_q8_pass_rt<W_INT4_Q8, R, T>(W, x, ldx, y, ldy, n0);
  }
};
#endif

#if SOLO_AVX512 && defined(__AVX512VNNI__)
// int8 and int4 with 512-bit VNNI (W_INT8_Q8, W_INT4_Q8; qdot.h's layouts): a pass tile with the decode
// kernels' bits. Those keep four 8-lane accumulators per (row, token), group g into accumulator g % 4 (int8:
// gemv_q8_tile; int4: gemv_q8_int4_zmm holds them as two 16-lane halves, A = groups 4m | 4m + 1, B = 4m + 2 |
// 4m + 3), each group through one dot product from the token's lane corrections, a conversion and one FMA
// with the group's scale (int8: the token's; int4: the float product of the token's and the row's), the
// 1-4 groups after the last whole 4 on 256-bit vectors, then (a0 + a1) + (a2 + a3) summed in vsum's order
// (int8: times the row's scale). This tile takes two groups per 512-bit instruction, as A in pass 0 and B in
// pass 1, for R rows x T tokens over the groups of k in [k0, k1) (multiples of 128 but the last): a token's
// inputs, corrections and scales are read once for R rows and a row's weights (unpacked nibbles and scales)
// once for T tokens, where the decode kernels re-read every token's for each row. acc: [2][R][T] x 16 floats
// between passes and k blocks. The int4 scale product is the decode kernel's xd[g] * ws[g] (the same two
// floats, the same rounding). Measured (Zen 5, 2 threads, benchmarks/prefill_ab.py, logits identical): int4
// (4 x 4) span prefill of Qwen2.5-0.5B at 128 tokens 1.49x the decode kernel (4 x 6 1.52x, 3 x 4 1.36x),
// Llama-3.2-1B 1.53x; k blocks of 1024 and 4096 0.97x and 0.90x of 2048's; a 32-row batched int4 decode step
// 1.43x; int8 1.28x (Qwen2.5-0.5B) and 1.66x (Llama-3.2-1B; fastest rounds) the 256-bit pass tile's.
template <int FMT, int R, int T>
__attribute__((noinline)) static void tile_q8_zmm_pass(const Mat* W, const char* x, int ldx, float* y, int ldy,
                                                       int n0, int k0, int k1, float* accbuf) {
  const int K = W->cols, nb = q8_blocks(K), full = K / 32, g4 = full & ~3;
  const int gend = k1 / 32 < g4 ? k1 / 32 : g4;
  const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
  const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  const __m512i low = _mm512_set1_epi8(0xF);
  const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const Q8Rows<R> rows(W, n0);
  const auto& w8 = rows.w8;  // (one declaration each: their types differ)
  const auto& w4 = rows.w4;
  const auto& ws = rows.ws;
  for (int p = 0; p < 2; p++) {
    float* part = accbuf + (size_t)p * R * T * 16;
    __m512 acc[R][T];
    for (int r = 0; r < R; r++)
      for (int j = 0; j < T; j++) acc[r][j] = k0 ? _mm512_load_ps(part + (r * T + j) * 16) : _mm512_setzero_ps();
    for (int g = k0 / 32 + 2 * p; g < gend; g += 4) {
      __m512i u[R];   // groups g and g + 1: int4 nibbles, or int8 + 128 (VNNI multiplies unsigned bytes)
      __m512 wsc[R];  // int4: [ws[g] x 8, ws[g + 1] x 8] as float32
      for (int r = 0; r < R; r++) {
        if (FMT == W_INT8_Q8) {
          u[r] = _mm512_xor_si512(_mm512_loadu_si512(w8[r] + 32 * (size_t)g), _mm512_set1_epi8((char)0x80));
          asm("" : "+v"(u[r]));
        } else {
          const __m512i t = _mm512_permutexvar_epi64(
              dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(w4[r] + 16 * (size_t)g))));
          u[r] = _mm512_and_si512(_mm512_srlv_epi64(t, shift), low);
          uint32_t two;
          memcpy(&two, ws[r] + g, 4);
          const __m512i v = _mm512_set1_epi32((int)two);
          wsc[r] = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
              0xff00, _mm512_slli_epi32(v, 16), _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))));
          asm("" : "+v"(u[r]), "+v"(wsc[r]));
        }
      }
      for (int j = 0; j < T; j++) {
        const char* xj = x + (size_t)j * ldx;
        const __m512i xv = _mm512_loadu_si512(xj + 32 * (size_t)g);
        const __m512i corr = _mm512_loadu_si512(xj + 36 * (size_t)nb + 32 * (size_t)g);
        const __m512 xd = _mm512_permutexvar_ps(
            pick, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)(xj + 32 * (size_t)nb + 4 * (size_t)g)))));
        for (int r = 0; r < R; r++) {
          const __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, u[r], xv));
          acc[r][j] = _mm512_fmadd_ps(d, FMT == W_INT8_Q8 ? xd : _mm512_mul_ps(xd, wsc[r]), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; r++)
      for (int j = 0; j < T; j++) _mm512_store_ps(part + (r * T + j) * 16, acc[r][j]);
  }
  if (k1 < K) return;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < T; j++) {
      const char* xj = x + (size_t)j * ldx;
      const float* xdj = (const float*)(xj + 32 * (size_t)nb);
      const float* a = accbuf + (r * T + j) * 16;
      vf rest[4];  // accumulators 0-3: the halves of A and B
      memcpy(&rest[0], a, 32), memcpy(&rest[1], a + 8, 32);
      memcpy(&rest[2], a + R * T * 16, 32), memcpy(&rest[3], a + R * T * 16 + 8, 32);
      for (int i = 0; g4 + i < nb; i++) {
        const int g = g4 + i;
        vb32 xv;
        vi corr;
        memcpy(&xv, xj + 32 * (size_t)g, 32);
        memcpy(&corr, xj + 36 * (size_t)nb + 32 * (size_t)g, 32);
        vi d;
        float sc = xdj[g];
        if (FMT == W_INT8_Q8) {
          vb32 wv = {};
          memcpy(&wv, w8[r] + 32 * (size_t)g, g < full ? 32 : (size_t)(K - 32 * g));  // a short last block
          d = idot_i8(wv, xv, corr);
        } else {
          d = idot_u4(corr, unpack_u4(w4[r] + 16 * (size_t)g), xv);
          sc *= bf16_to_f32(ws[r][g]);
        }
        rest[i] = vfma(__builtin_convertvector(d, vf), vset1(sc), rest[i]);
      }
      const float s = vsum((rest[0] + rest[1]) + (rest[2] + rest[3]));
      y[(size_t)j * ldy + n0 + r] = FMT == W_INT8_Q8 ? s * ((const float*)W->scale)[n0 + r] : s;
    }
}

template <int R, int T>
struct TileQ8Zmm {
  static void run(const Mat* W, const char* x, int ldx, float* y, int ldy, int n0, int k0, int k1, float* acc) {
    if (W->format == W_INT8_Q8)
      tile_q8_zmm_pass<W_INT8_Q8, R, T>(W, x, ldx, y, ldy, n0, k0, k1, acc);
    else
      tile_q8_zmm_pass<W_INT4_Q8, R, T>(W, x, ldx, y, ldy, n0, k0, k1, acc);
  }
};
#endif

// AVX512-BF16: the pass tile only for inputs longer than this (the decode tile's 4 tokens' bf16 inputs,
// 6 KiB and more, no longer fit in a 32 KiB L1 beside the weight stream; Zen 5's 48 KiB L1: the decode
// tile ahead at K = 2048, the pass tile at 4864). AVX-512 without BF16 takes its tile at every K.
enum { TILE_MIN_K = 3072 };

// Tile knob (solo_set_knob "span_tile", measurement; the same bits at every setting): 1 = the tiles above
// where they are faster (default), 0 = never (every product takes the decode tiles), 2 = at every K
// (AVX512-BF16's pass tile at K <= TILE_MIN_K too; the other builds as 1).
static int g_span_tile = 1;
// The portable builds' bf16 tile shape (knob "gvec_rt": 10 x rows + tokens; measurement; default 3 x 4).
static int g_gvec_rt = 34;
// The integer-dot pass tile's shape (knob "q8_rt": 10 x rows + tokens, 0 = none, -1 = this build's default;
// measurement). Default 3 x 4 where 32 vector registers hold it (AVX-512 builds: 1.3-1.4x the span prefill
// of int8 Qwen2.5-0.5B and Llama-3.2-1B on Zen 5), 2 x 3 in 16 (AVX2: int8 1.1x, int4 1.1x; 3 x 4 spilled
// there, 0.6x).
static int g_q8_rt = -1;
// Fewest sequences that take the tiles below (knob "pass_min_b"; measurement). With fewer, as in a server's
// batched decode of 8-16 rows, the weights stream from DRAM and the decode tiles were faster (Qwen2.5-0.5B
// decode steps on Zen 5: batch 8 int8 1.3x, bf16 on AVX2 1.45x; equal near 16-32 rows, the tiles ahead from
// 32-64); a span prefill of a prompt has its prompt's length.
static int g_pass_min_b = 32;
enum { Q8_RT_DEFAULT = SOLO_AVX512 ? 34 : 23 };

// y[b, n] = W x[b, :] for rows n in [n0, n1) and b < B with a rows x tokens tile, when this build has one
// for W's format and B is large enough to fill it (the caller checked B > SOLO_TILE). Returns 1 when it
// computed the product, 0 when the caller must (same bits either way).
static inline int gemv_rows_tiled(const Mat* W, const void* x, int ldx, int B, float* y, int ldy, int n0, int n1) {
  if (!g_span_tile) return 0;
#if SOLO_BF16_PACKED
  if (W->format == W_BF16_AMX) {
#if SOLO_AMX
    if (amx_on()) {
      amx_span((const uint16_t*)W->weight, W->cols, (const uint16_t*)x, ldx, B, y, ldy, n0, n1);
      return 1;
    }
#endif
    packed_span((const uint16_t*)W->weight, W->cols, (const uint16_t*)x, ldx, B, y, ldy, n0, n1);
    return 1;
  }
#endif
#if SOLO_AVX512 && defined(__AVX512BF16__)
  if (W->format == W_BF16) {
    if (W->cols <= TILE_MIN_K && g_span_tile != 2) return 0;
    tile_rows_kb<TileBf16Pass512, 4, 6, 16>(W, (const uint16_t*)x, ldx, B, y, ldy, n0, n1, g_bf16_pass_kb);
    return 1;
  }
#endif
#if SOLO_AVX512 && !defined(__AVX512BF16__)
  if (W->format == W_BF16) {
    tile_rows<TileBf16W, 4, 4, 16>(W, (const float*)x, ldx, B, y, ldy, n0, n1);
    return 1;
  }
#endif
#if SOLO_GVEC || SOLO_AVX512
  if (B < g_pass_min_b) return 0;  // the tiles below: only with many tokens
#endif
#if SOLO_GVEC && !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
  if (W->format == W_BF16) {
    const float* xf = (const float*)x;
    switch (g_gvec_rt) {
      case 22: tile_rows<TileBf16G, 2, 2, 16>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
      case 24: tile_rows<TileBf16G, 2, 4, 16>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
      case 25: tile_rows<TileBf16G, 2, 5, 16>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
      case 33: tile_rows<TileBf16G, 3, 3, 18>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
      case 43: tile_rows<TileBf16G, 4, 3, 16>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
      default: tile_rows<TileBf16G, 3, 4, 18>(W, xf, ldx, B, y, ldy, n0, n1); return 1;
    }
  }
#endif
#if SOLO_AVX512 && defined(__AVX512VNNI__)
  if (g_qz_rt && ((W->format == W_INT4_Q8 && !g_qdot_ymm) || W->format == W_INT8_Q8)) {  // the 512-bit tile
    const char* xq = (const char*)x;  // ldx: the slot's bytes / 4 (gemv_rows' convention for q8 inputs)
    switch (g_qz_rt) {
      case 34: tile_rows_kb<TileQ8Zmm, 3, 4, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1, g_qz_pass_kb); return 1;
      case 36: tile_rows_kb<TileQ8Zmm, 3, 6, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1, g_qz_pass_kb); return 1;
      case 46: tile_rows_kb<TileQ8Zmm, 4, 6, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1, g_qz_pass_kb); return 1;
      default: tile_rows_kb<TileQ8Zmm, 4, 4, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1, g_qz_pass_kb); return 1;
    }
  }
#endif
#if SOLO_GVEC || SOLO_AVX512
  // int4 on AVX-512 without VNNI keeps its decode kernel: the 256-bit tile measured 0.9-1.1x the 512-bit
  // kernel on Zen 5.
  if (W->format == W_INT8_Q8 || (W->format == W_INT4_Q8 && !SOLO_AVX512)) {
    const char* xq = (const char*)x;  // ldx: the slot's bytes / 4 (gemv_rows' convention for q8 inputs)
    switch (g_q8_rt < 0 ? (int)Q8_RT_DEFAULT : g_q8_rt) {
      case 0: return 0;
      case 22: tile_rows<TileQ8Pass, 2, 2, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
      case 23: tile_rows<TileQ8Pass, 2, 3, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
      case 24: tile_rows<TileQ8Pass, 2, 4, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
      case 33: tile_rows<TileQ8Pass, 3, 3, 18>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
      case 44: tile_rows<TileQ8Pass, 4, 4, 16>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
      default: tile_rows<TileQ8Pass, 3, 4, 18>(W, xq, ldx * 4, B, y, ldy, n0, n1); return 1;
    }
  }
#endif
  (void)W, (void)x, (void)ldx, (void)B, (void)y, (void)ldy, (void)n0, (void)n1;
  return 0;
}
