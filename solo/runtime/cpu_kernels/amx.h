// bf16 matrix products on Intel AMX tiles (AMX-BF16: Sapphire Rapids and later Xeons), for decode and span
// prefill alike. Compiled into the "amx" ISA level only (cpu_build.py); included by gemv.h.
//
// One TDPBF16PS adds A x B into C: A 16 rows x 32 bf16, B 16 k-pair rows x 16 columns of bf16 pairs ("VNNI"
// order), C 16 x 16 float32. Solo's rule is that a (row, token) result has the same bits whatever else was
// computed with it (batch 1, batched decode, the span prefill, any thread count). Measured on the AMX
// hardware (benchmarks/amx_gemv_probe.cpp; tests/runtime/test_amx.py checks it through the kernels): an
// element of C depends only on its row of A and its column of B (a token alone or in a 16-token tile, 3 or
// 16 rows of A), and swapping the operands' roles (weights as A or as B) gives the same bits. So:
//  - decode (1 to SOLO_TILE tokens: amx_gemv_bt): the weights are the A tiles, read in place (16 rows of 64
//    bytes, row stride K * 2); the tokens the B tile: at batch 1 the input itself (one token's k pairs, 4
//    bytes per tile row), with more tokens their k pairs interleaved first (amx_interleave_rows).
//  - span prefill (more tokens: amx_span): the tokens are the A tiles, read in place, and ~1 MiB of weight
//    rows at a time is interleaved into k-pair order (B tiles, amx_interleave_rows) for every token group.
// Every (row, token) sums k in steps of 32 from k = 0, C starting at zero; the last, partial step is
// zero-padded on both sides (zero products add nothing), so every path gives the same bits. The bits differ
// from the AVX512-BF16 kernels' (a different summation order), within the same bf16-input tolerance.
//
// Why: on a 2-core Xeon with AMX the AVX512-BF16 span products ran at ~190 GFLOPS, oneDNN's AMX matmul at
// 1400-1700; these reach 1.1-1.8 TFLOPS (the span prefill 5.4-6.2x, results/intel-xeon-amx/prefill-ab-amx-*),
// but decode is 0.83-0.91x the AVX512-BF16 kernel (below), so the level is chosen only on request.
#pragma once
#include "common.h"

#if SOLO_AVX512 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SOLO_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

// Measurement knob "amx": 0 = the AVX512-BF16 kernels instead (set before any product; switching between
// steps breaks the span-vs-decode identity, as every kernel knob would).
static int g_amx = 1;
// Decode: groups of 16 rows at once, one from each of this many contiguous runs of groups (knob
// "amx_streams" 1 or 2), and a software prefetch of the next group's rows (knob "amx_prefetch" 0/1).
// Measured (2-core Xeon with AMX, 480 MiB L3; benchmarks/step_ab.py, whole decode steps, same process against
// knob amx=0): 0.83x (Qwen2.5-0.5B) and 0.91x (Llama-3.2-1B) of the AVX512-BF16 kernel, 76-85% of the round's
// probe against 91-94% (results/intel-xeon-amx/step-ab-amx-*.txt, with the prefetch); two k steps per turn
// through two tile pairs (below) with no prefetch 0.90x, with it 0.84x; two runs no better; releasing the
// tile state after every product (_tile_release) 0.895x against 0.903x. Every product phase ran ~20% slower
// and the attention (no AMX) ~12% slower too (python -m solo.bench.cpu_profile under each level), as if the
// cores ran slower. `solo bench` in one window, these kernels: 23.5-25.4 tok/s against 28.3 (0.83-0.90x). A
// standalone loop of the same reads ran at 0.93-1.0x of an AVX512-BF16 loop. That decode cost is why
// cpu_build.py never picks this level by itself (SOLO_CPU_ISA=amx).
static int g_amx_streams = 1;
static int g_amx_prefetch = 0;
// Span prefill: KiB of weight rows interleaved at a time (knob "amx_span_kb"; at least 32 rows): as many as
// stay in L2 beside a token group, so each token group is read once per super-block. 1 MiB: Llama-3.2-1B's
// prompt of 512 1.52x over 32-row blocks (2 MiB rows at K = 8192: the down projection 0.8x).
static int g_amx_span_kb = 1024;

// Linux keeps the AMX tile data off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16);
// cpu_build.py asks too before it offers this level. Without it every tile instruction would fault, so the
// kernels fall back to AVX512-BF16.
static int amx_request_permission() {
  const long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
static const int g_amx_permitted = amx_request_permission();

static inline int amx_on() { return g_amx && g_amx_permitted; }

// GCC's <amxtileintrin.h> writes tileloadd and ldtilecfg as asm statements that name no memory they read
// (tileloadd: no memory operand at all; ldtilecfg: only the first 8 bytes), so the compiler may drop or move
// stores to a buffer that only a tile load reads (GCC 12 -O2 removed amx_pad_block's memset of a stack
// buffer). A compiler barrier that names the buffer before the load, and one after it.
#define AMX_LOADD(t, base, stride)                          \
  do {                                                      \
    const void* amx_p_ = (const void*)(base);               \
    __asm__ volatile("" : : "r"(amx_p_) : "memory");        \
    _tile_loadd(t, amx_p_, stride);                         \
    __asm__ volatile("" : : : "memory");                    \
  } while (0)

struct AmxTileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles of decode: 0, 1 C (16 rows x bt tokens), 4, 5 A (16 weight rows x 32 k), 6, 7 B (16 k pairs x bt).
// Tiles of the span: 0-3 C (16 tokens x 16 rows), 4, 5 A (16 tokens x 32 k), 6, 7 B (16 k pairs x 16 rows).
// Loaded at every kernel call: other code on the thread (oneDNN in the caller's thread) may load its own.
static inline void amx_configure(int bt) {
  AmxTileConfig c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) c.rows[t] = 16;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64;
  if (bt) c.colsb[0] = c.colsb[1] = c.colsb[6] = c.colsb[7] = (uint16_t)(4 * bt);
  __asm__ volatile("" : : "r"(&c) : "memory");  // every byte of c is read (see AMX_LOADD)
  _tile_loadconfig(&c);
}

// Per-thread scratch: interleaved inputs or weights, zero-padded tails.
struct AmxScratch {
  std::vector<uint16_t> pairs, rows;
};
static inline AmxScratch& amx_scratch() {
  static thread_local AmxScratch s;
  return s;
}

// rows x 32 of src (row stride lds elements, the first `cols` <= 32 of each row) into dst [16][32],
// zero-padded.
static inline void amx_pad_block(uint16_t* dst, const uint16_t* src, size_t lds, int rows, int cols) {
  memset(dst, 0, 16 * 32 * sizeof(uint16_t));
  for (int r = 0; r < rows; r++) memcpy(dst + 32 * r, src + (size_t)r * lds, (size_t)cols * sizeof(uint16_t));
}

// 16 x 16 32-bit elements transposed in registers (unpacks within 128-bit lanes, then lane shuffles).
static inline void amx_transpose16(__m512i r[16]) {
  __m512i t[16], u[16], v[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; j++) {
    v[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    v[4 + j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    v[8 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    v[12 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
  }
  for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0xdd);
  }
}

// `rows` <= 16 vectors of K bf16 (weight rows or tokens, stride lds) into B tiles [K / 32 rounded up][16 k
// pairs][16 columns][2] (64-byte tile rows): a k step of 16 vectors is 16 x 16 pairs transposed; columns
// past `rows` and k >= K are zero.
static inline void amx_interleave_rows(uint16_t* dst, const uint16_t* w, size_t lds, int K, int rows) {
  for (int k = 0; k < K; k += 32) {
    const int n = K - k < 32 ? K - k : 32;
    const __mmask32 m = n == 32 ? ~(__mmask32)0 : (__mmask32)((1u << n) - 1);
    __m512i r[16];
    for (int i = 0; i < 16; i++)
      r[i] = i < rows ? _mm512_maskz_loadu_epi16(m, w + i * lds + k) : _mm512_setzero_si512();
    amx_transpose16(r);
    for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + (size_t)k * 16 + 32 * i, r[i]);
  }
}

// Decode: y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and BT <= 16 tokens (bf16 weights and inputs).
// S groups of 16 rows at once (one C and one A tile each), from S contiguous runs of the range's groups.
// W: rows of lda elements, K of them used; first[s]: group s's first row; xb: the tokens' k pairs, B-tile
// rows of ldb bytes (4: one token in place; 64: amx_interleave_rows); xt: the last, partial k step's pairs
// (amx_interleave_rows, zero-padded).
template <int S, int BT>
static inline void amx_groups(const uint16_t* W, size_t lda, int K, const int* first, const uint16_t* xb,
                              int ldb, const uint16_t* xt, float* y, int ldy) {
  const size_t xstep = (size_t)ldb / 4;  // elements of xb per k (16 k pairs of ldb bytes per 32 k)
  const int kmain = K & ~31, rem = K - kmain;
  _tile_zero(0);
  if constexpr (S > 1) _tile_zero(1);
  int k0 = 0;
  if constexpr (S == 1) {
    // Two k steps per turn through two A and two B tiles, so a step's tile loads need not wait for the
    // previous step's product to release its tiles (tiles are not renamed); C adds the steps in order.
    for (; k0 + 64 <= kmain; k0 += 64) {
      if (g_amx_prefetch)
        for (int r = 0; r < 16; r++) {
          __builtin_prefetch(W + (first[0] + 16 + r) * lda + k0, 0, 3);
          __builtin_prefetch(W + (first[0] + 16 + r) * lda + k0 + 32, 0, 3);
        }
      AMX_LOADD(7, xb + k0 * xstep, ldb);
      AMX_LOADD(4, W + first[0] * lda + k0, lda * 2);
      AMX_LOADD(6, xb + (k0 + 32) * xstep, ldb);
      AMX_LOADD(5, W + first[0] * lda + k0 + 32, lda * 2);
      _tile_dpbf16ps(0, 4, 7);
      _tile_dpbf16ps(0, 5, 6);
    }
  }
  for (int k = k0; k < kmain; k += 32) {
    if (g_amx_prefetch)  // the next group's rows at this k (a row is often shorter than a 4 KiB page)
      for (int s = 0; s < S; s++)
        for (int r = 0; r < 16; r++) __builtin_prefetch(W + (first[s] + 16 + r) * lda + k, 0, 3);
    AMX_LOADD(7, xb + k * xstep, ldb);
    AMX_LOADD(4, W + first[0] * lda + k, lda * 2);
    _tile_dpbf16ps(0, 4, 7);
    if constexpr (S > 1) {
      AMX_LOADD(5, W + first[S - 1] * lda + k, lda * 2);
      _tile_dpbf16ps(1, 5, 7);
    }
  }
  if (rem) {
    alignas(64) uint16_t a[16 * 32];
    AMX_LOADD(7, xt, 64);
    amx_pad_block(a, W + first[0] * lda + kmain, lda, 16, rem);
    AMX_LOADD(4, a, 64);
    _tile_dpbf16ps(0, 4, 7);
    if constexpr (S > 1) {
      amx_pad_block(a, W + first[S - 1] * lda + kmain, lda, 16, rem);
      AMX_LOADD(5, a, 64);
      _tile_dpbf16ps(1, 5, 7);
    }
  }
  alignas(64) float c[16 * BT];
  for (int s = 0; s < S; s++) {
    if (s == 0)
      _tile_stored(0, c, 4 * BT);
    else
      _tile_stored(1, c, 4 * BT);
    for (int m = 0; m < 16; m++)
      for (int j = 0; j < BT; j++) y[(size_t)j * ldy + first[s] + m] = c[m * BT + j];
  }
}

template <int BT>
static void amx_gemv_bt(const uint16_t* W, int K, const uint16_t* x, int ldx, float* y, int ldy, int n0, int n1) {
  static_assert(BT >= 1 && BT <= 16, "a B tile holds 16 tokens");
  AmxScratch& scratch = amx_scratch();
  const int kmain = K & ~31, rem = K - kmain;
  const uint16_t* xb = x;  // one token: its k pairs are already B-tile rows (4 bytes each)
  int ldb = 4;
  if (BT > 1) {
    scratch.pairs.resize((size_t)kmain * 16);
    amx_interleave_rows(scratch.pairs.data(), x, ldx, kmain, BT);
    xb = scratch.pairs.data(), ldb = 64;
  }
  alignas(64) uint16_t xt[16 * 32];  // the last, partial k step's pairs
  if (rem) amx_interleave_rows(xt, x + kmain, ldx, rem, BT);
  amx_configure(BT);
  const int groups = (n1 - n0) / 16;
  auto run = [&](auto streams, const int* group) {
    constexpr int R = decltype(streams)::value;
    int first[R];
    for (int s = 0; s < R; s++) first[s] = n0 + 16 * group[s];
    amx_groups<R, BT>(W, (size_t)K, K, first, xb, ldb, xt, y, ldy);
  };
  if (g_amx_streams >= 2)
    for_row_streams<2>(0, groups, run);
  else
    for_row_streams<1>(0, groups, run);
  const int left = n1 - (n0 + 16 * groups);
  if (left) {  // the last rows, fewer than 16: copied into 16 zero-padded rows
    std::vector<uint16_t>& rows = scratch.rows;
    const int kpad = kmain + (rem ? 32 : 0);
    rows.assign((size_t)16 * kpad, 0);
    for (int r = 0; r < left; r++)
      memcpy(rows.data() + (size_t)r * kpad, W + (size_t)(n1 - left + r) * K, (size_t)K * 2);
    int first = 0;
    float ybuf[16 * BT];
    amx_groups<1, BT>(rows.data(), (size_t)kpad, K, &first, xb, ldb, xt, ybuf, 16);
    for (int r = 0; r < left; r++)
      for (int j = 0; j < BT; j++) y[(size_t)j * ldy + n1 - left + r] = ybuf[j * 16 + r];
  }
}

// Span prefill: y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and tokens j < B (bf16 weights and inputs).
// Rows in super-blocks of about g_amx_span_kb KiB, each interleaved once into B tiles (16-row groups); then tokens in
// groups of 32 (A tiles 4, 5), and for each token group every pair of row groups (B tiles 6, 7): 2 x 2 C
// tiles over all of k. A token group's inputs are read once per super-block (from L2 / L3), the interleaved
// rows (L2) once per token group.
static void amx_span(const uint16_t* W, int K, const uint16_t* x, int ldx, int B, float* y, int ldy, int n0,
                     int n1) {
  AmxScratch& scratch = amx_scratch();
  const int ksteps = (K + 31) / 32, kpad = 32 * ksteps;
  const size_t group_elems = (size_t)kpad * 16;  // one 16-row group: [ksteps][16 k pairs][16 rows][2]
  int sb_rows = (int)(((size_t)g_amx_span_kb << 10) / ((size_t)kpad * 2)) & ~31;
  if (sb_rows < 32) sb_rows = 32;
  std::vector<uint16_t>& wv = scratch.pairs;
  wv.resize(group_elems * (sb_rows / 16));
  std::vector<uint16_t>& pad = scratch.rows;  // tokens of a partial group or a partial k step: [32][kpad]
  pad.resize((size_t)32 * kpad);
  const bool k_partial = K % 32 != 0;
  amx_configure(0);
  alignas(64) float c[16 * 16];
  for (int s0 = n0; s0 < n1; s0 += sb_rows) {
    const int s1 = s0 + sb_rows < n1 ? s0 + sb_rows : n1;
    const int groups = (s1 - s0 + 15) / 16;
    for (int g = 0; g < groups; g++) {
      const int r0 = s0 + 16 * g;
      const int rows = s1 - r0 < 16 ? s1 - r0 : 16;
      amx_interleave_rows(wv.data() + g * group_elems, W + (size_t)r0 * K, (size_t)K, K, rows);
    }
    for (int t0 = 0; t0 < B; t0 += 32) {
      const int toks = B - t0 < 32 ? B - t0 : 32;
      const uint16_t* a = x + (size_t)t0 * ldx;
      size_t lda = (size_t)ldx;
      if (toks < 32 || k_partial) {  // zero-padded copies: never read past a token's K or the last token
        memset(pad.data(), 0, pad.size() * sizeof(uint16_t));
        for (int t = 0; t < toks; t++) memcpy(pad.data() + (size_t)t * kpad, a + (size_t)t * ldx, (size_t)K * 2);
        a = pad.data(), lda = (size_t)kpad;
      }
      const bool two_tok = toks > 16;
      for (int g = 0; g < groups; g += 2) {
        const int r0 = s0 + 16 * g;
        const int rows0 = s1 - r0 < 16 ? s1 - r0 : 16;
        const int rows1 = g + 1 < groups ? (s1 - r0 - 16 < 16 ? s1 - r0 - 16 : 16) : 0;
        const uint16_t* wv0 = wv.data() + g * group_elems;
        const uint16_t* wv1 = wv0 + group_elems;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int ks = 0; ks < ksteps; ks++) {
          const int k = 32 * ks;
          AMX_LOADD(4, a + k, lda * 2);
          AMX_LOADD(6, wv0 + (size_t)k * 16, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (rows1) {
            AMX_LOADD(7, wv1 + (size_t)k * 16, 64);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (two_tok) {
            AMX_LOADD(5, a + 16 * lda + k, lda * 2);
            _tile_dpbf16ps(2, 5, 6);
            if (rows1) _tile_dpbf16ps(3, 5, 7);
          }
        }
        // C tile (token group tg, row group rg): rows = tokens, columns = weight rows.
        auto put = [&](int tg, int rg, int nrows) {
          const int tcount = toks - 16 * tg < 16 ? toks - 16 * tg : 16;
          for (int t = 0; t < tcount; t++)
            memcpy(y + (size_t)(t0 + 16 * tg + t) * ldy + r0 + 16 * rg, c + 16 * t, (size_t)nrows * 4);
        };
        _tile_stored(0, c, 64);
        put(0, 0, rows0);
        if (rows1) {
          _tile_stored(1, c, 64);
          put(0, 1, rows1);
        }
        if (two_tok) {
          _tile_stored(2, c, 64);
          put(1, 0, rows0);
          if (rows1) {
            _tile_stored(3, c, 64);
            put(1, 1, rows1);
          }
        }
      }
    }
  }
}
#else
#define SOLO_AMX 0
#endif
