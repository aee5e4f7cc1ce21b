// bf16 matrix products on Intel AMX tiles (AMX-BF16: Sapphire Rapids and later Xeons), over weights packed
// for them (format W_BF16_AMX; packed.h explains the layout, whose bits the AVX512-BF16 decode kernel there
// reproduces), and the split-KV attention parts of a bf16 KV cache (at the end). Compiled into the "amx" ISA
// level only (cpu_build.py); included by gemv.h.
//
// Measured (2-core Xeon with AMX; results/intel-xeon-amx/README.md): TTFT 4.5-5.5x the avx512-bf16 level's
// (then with row-major weights), decode 0.96-0.98x the row-major AVX512-BF16 kernel in the same process
// (step-ab-packed-*).
#pragma once
#include "common.h"
#include "packed.h"

#if SOLO_BF16_PACKED && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SOLO_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

// Measurement knob "amx": 0 = the span's products without tiles (packed.h: packed_span; the same bits,
// slower).
static int g_amx = 1;
// Span prefill: KiB of packed rows turned into B tiles at a time (knob "amx_span_kb"; at least 2 groups), as
// many as stay in L2 beside a token group, so each token group is read once per super-block. 1 MiB:
// Llama-3.2-1B's prompt of 512 1.52x over 32-row blocks (row-major weights then; 2 MiB at K = 8192: 0.8x).
static int g_amx_span_kb = 1024;

// Linux keeps the AMX tile data off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16);
// cpu_build.py asks too before it offers this level. Without it every tile instruction would fault, so the
// span falls back to packed_span (packed.h: the same bits).
static int amx_request_permission() {
  const long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
static const int g_amx_permitted = amx_request_permission();

static inline int amx_on() { return g_amx && g_amx_permitted; }

// GCC's <amxtileintrin.h> writes tileloadd and ldtilecfg as asm statements that name no memory they read
// (tileloadd: no memory operand at all; ldtilecfg: only the first 8 bytes), so the compiler may drop or move
// stores to a buffer that only a tile load reads (GCC 12 -O2 removed a memset of a stack buffer read only by
// a tile load). A compiler barrier that names the buffer before the load, and one after it. Likewise
// tilestored names no memory it writes: AMX_STORED fences the copy out of its buffer on both sides.
#define AMX_LOADD(t, base, stride)                          \
  do {                                                      \
    const void* amx_p_ = (const void*)(base);               \
    __asm__ volatile("" : : "r"(amx_p_) : "memory");        \
    _tile_loadd(t, amx_p_, stride);                         \
    __asm__ volatile("" : : : "memory");                    \
  } while (0)

#define AMX_STORED(t, base, stride)          \
  do {                                       \
    __asm__ volatile("" : : : "memory");     \
    _tile_stored(t, base, stride);           \
    __asm__ volatile("" : : : "memory");     \
  } while (0)

struct AmxTileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles of the span: 0-3 C (16 tokens x 16 rows), 4, 5 A (16 tokens x 32 k), 6, 7 B (16 k pairs x 16 rows).
// Loaded at every kernel call: other code on the thread (oneDNN in the caller's thread) may load its own.
static inline void amx_configure() {
  AmxTileConfig c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) c.rows[t] = 16;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64;
  __asm__ volatile("" : : "r"(&c) : "memory");  // every byte of c is read (see AMX_LOADD)
  _tile_loadconfig(&c);
}

// Per-thread scratch of the span: B tiles and zero-padded tokens.
struct AmxScratch {
  std::vector<uint16_t> tiles, tokens;
};
static inline AmxScratch& amx_scratch() {
  static thread_local AmxScratch s;
  return s;
}

// One group's k step (1 KiB packed) as a B tile: k pair 2v of the 16 rows is (high of E_v, high of O_v),
// pair 2v + 1 (low of E_v, low of O_v).
static inline void amx_packed_to_tile(uint16_t* dst, const uint16_t* src) {
  const __m512i lo16 = _mm512_set1_epi32(0xffff);
  for (int v = 0; v < 8; v++) {
    const __m512i e = _mm512_loadu_si512(src + 64 * v), o = _mm512_loadu_si512(src + 64 * v + 32);
    const __m512i even = _mm512_or_si512(_mm512_srli_epi32(e, 16), _mm512_andnot_si512(lo16, o));
    const __m512i odd = _mm512_or_si512(_mm512_and_si512(e, lo16), _mm512_slli_epi32(o, 16));
    _mm512_storeu_si512(dst + 32 * (2 * v), even);
    _mm512_storeu_si512(dst + 32 * (2 * v + 1), odd);
  }
}

// Span prefill: y[j, n] = W[n, :] . x[j, :] for rows [n0, n1) and tokens j < B (packed bf16 weights, bf16
// inputs). Row groups in super-blocks of about g_amx_span_kb KiB, each turned once into B tiles; then tokens
// in groups of 32 (A tiles 4, 5, read in place), and for each token group every pair of row groups (B tiles
// 6, 7): 2 x 2 C tiles over all of k. A token group's inputs are read once per super-block (from L2 / L3),
// the super-block's tiles (L2) once per token group.
static void amx_span(const uint16_t* P, int K, const uint16_t* x, int ldx, int B, float* y, int ldy, int n0,
                     int n1) {
  if (n0 >= n1) return;
  AmxScratch& scratch = amx_scratch();
  const int ksteps = (K + 31) / 32, kpad = 32 * ksteps;
  const size_t gstride = (size_t)ksteps * 512;
  int sb = (int)(((size_t)g_amx_span_kb << 10) / (gstride * 2)) & ~1;  // groups per super-block
  if (sb < 2) sb = 2;
  std::vector<uint16_t>& tiles = scratch.tiles;
  tiles.resize(gstride * sb);
  std::vector<uint16_t>& pad = scratch.tokens;  // tokens of a partial group or a partial k step: [32][kpad]
  pad.resize((size_t)32 * kpad);
  const bool k_partial = K % 32 != 0;
  amx_configure();
  alignas(64) float c[16 * 16];
  const int gfirst = n0 / 16, gend = (n1 + 15) / 16;
  for (int s0 = gfirst; s0 < gend; s0 += sb) {
    const int groups = gend - s0 < sb ? gend - s0 : sb;
    for (int i = 0; i < groups * ksteps; i++)
      amx_packed_to_tile(tiles.data() + (size_t)i * 512, P + (s0 * (size_t)ksteps + i) * 512);
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
        const bool two_groups = g + 1 < groups;
        const uint16_t* b0 = tiles.data() + g * gstride;
        const uint16_t* b1 = b0 + gstride;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int ks = 0; ks < ksteps; ks++) {
          AMX_LOADD(4, a + 32 * ks, lda * 2);
          AMX_LOADD(6, b0 + (size_t)ks * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (two_groups) {
            AMX_LOADD(7, b1 + (size_t)ks * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (two_tok) {
            AMX_LOADD(5, a + 16 * lda + 32 * ks, lda * 2);
            _tile_dpbf16ps(2, 5, 6);
            if (two_groups) _tile_dpbf16ps(3, 5, 7);
          }
        }
        // C tile (token group tg, row group rg): rows = tokens, columns = weight rows.
        auto put = [&](int tg, int rg) {
          const int tcount = toks - 16 * tg < 16 ? toks - 16 * tg : 16;
          const int a0 = 16 * (s0 + g + rg), lo = a0 > n0 ? a0 : n0, hi = a0 + 16 < n1 ? a0 + 16 : n1;
          for (int t = 0; t < tcount && lo < hi; t++)
            memcpy(y + (size_t)(t0 + 16 * tg + t) * ldy + lo, c + 16 * t + (lo - a0), (size_t)(hi - lo) * 4);
        };
        AMX_STORED(0, c, 64);
        put(0, 0);
        if (two_groups) {
          AMX_STORED(1, c, 64);
          put(0, 1);
        }
        if (two_tok) {
          AMX_STORED(2, c, 64);
          put(1, 0);
          if (two_groups) {
            AMX_STORED(3, c, 64);
            put(1, 1);
          }
        }
      }
    }
  }
  _tile_release();  // the tile state back to its initial one: decode after the prompt uses no tiles
}

// ------------------------------------------------------------------ split-KV attention on tiles
// At long context a decode step's attention is bound by its instructions on AVX-512 (Qwen2.5-0.5B at 32000
// positions: 14 of its 25 ms per token with the cache read from L2 instead of memory). On tiles, one split-KV
// part (elementwise.h: up to 512 positions of one KV head and its GQA group of query heads) makes q . k as
// S^T = K q^T, the key rows A tiles read in place from the cache, and p @ v as O = P V, the value rows two by
// two interleaved into B tiles. Each product then has the tile's order (two sums per 32 positions or dims,
// amx.h's header) instead of the AVX-512 kernels': a part's results depend on its positions only, so batched
// decode, the span prefill and batch 1 stay bit-identical. head_dim 64 or 128 and up to 16 query heads per KV
// head (Qwen2.5, Llama 3.x, Mistral); other shapes keep the AVX-512 kernels.
// Knob "attn_amx": 0 = those parts on AVX-512 too (measurement).
static int g_attn_amx = 1;

// Positions per split-KV part, at most (elementwise.h's SOLO_KV_BLOCK).
#define SOLO_AMX_PART 512

// c[16][16] (row-major) transposed into out[16]: out[n] = column n. Unpacks, then 4 x 4 shuffles of 32-bit
// elements and of 128-bit lanes (64 instructions; a gather per column was slower).
static inline void amx_transpose16(const float* c, __m512* out) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; i++) {
    const __m512 a = _mm512_load_ps(c + 32 * i), b = _mm512_load_ps(c + 32 * i + 16);
    t[2 * i] = _mm512_unpacklo_ps(a, b);  // per 128-bit lane L: rows 2i, 2i + 1 of columns 4L, 4L + 1
    t[2 * i + 1] = _mm512_unpackhi_ps(a, b);  // ... of columns 4L + 2, 4L + 3
  }
  for (int i = 0; i < 4; i++) {  // u[4i + k], lane L: rows 4i .. 4i + 3 of column 4L + k
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; k++) {  // column 4L + k: lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
    const __m512 d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), e = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
    out[k] = _mm512_shuffle_f32x4(a, d, 0x88);
    out[4 + k] = _mm512_shuffle_f32x4(a, d, 0xDD);
    out[8 + k] = _mm512_shuffle_f32x4(b, e, 0x88);
    out[12 + k] = _mm512_shuffle_f32x4(b, e, 0xDD);
  }
}

// q . k of the whole 16-position blocks of cached positions j .. j1 - 1 (key rows of hd = 32 * NPAIR bf16
// dims, NPAIR 2 or 4; position 0 at K, rows row_bytes apart): scores[g * stride + p] = scale * (q_g . k_p)
// with q rounded to bf16 (as the AVX512-BF16 path does), and mx[g] raised to each block's maximum. C = [16
// positions, 16 heads], transposed back to a row of 16 positions per head. Returns the first position left
// over (fewer than 16 remain).
//   q: float32 [gs, hd], gs <= 16; prefetch: blocks of 16 key rows to prefetch ahead (0 = none).
template <int NPAIR>
static int amx_part_scores(const float* q, int gs, const char* K, size_t row_bytes, int j, int j1, float scale,
                           float* scores, size_t stride, float* mx, int prefetch) {
  static_assert(NPAIR == 2 || NPAIR == 4, "head_dim 64 or 128");
  constexpr int hd = 32 * NPAIR;
  if (j + 16 > j1) return j;
  alignas(64) uint16_t qb[32 * NPAIR];
  alignas(64) uint32_t qt[NPAIR][16][16];  // B tiles: [dim pair, head] per 32 dims (heads past gs zero)
  memset(qt, 0, sizeof qt);
  for (int g = 0; g < gs; g++)
    for (int c = 0; c < NPAIR; c++) {
      const float* src = q + (size_t)g * hd + 32 * c;
      _mm512_store_si512(qb + 32 * c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)));
      for (int r = 0; r < 16; r++) qt[c][r][g] = (uint32_t)qb[32 * c + 2 * r] | (uint32_t)qb[32 * c + 2 * r + 1] << 16;
    }
  // Tiles: 0 C, 1 and 4 A (key rows), 2, 3 (and 5, 6) B (q^T of dims 0-31, 32-63 (64-95, 96-127)).
  amx_configure();
  AMX_LOADD(2, qt[0], 64);
  AMX_LOADD(3, qt[1], 64);
  if constexpr (NPAIR == 4) {
    AMX_LOADD(5, qt[2], 64);
    AMX_LOADD(6, qt[3], 64);
  }
  alignas(64) float c[16 * 16];
  const __m512 vscale = _mm512_set1_ps(scale);
  for (; j + 16 <= j1; j += 16) {
    const char* kr = K + (size_t)j * row_bytes;
    if (prefetch)
      for (size_t o = 0; o < 16 * row_bytes; o += 64) __builtin_prefetch(kr + (size_t)prefetch * 16 * row_bytes + o, 0, 3);
    _tile_zero(0);
    AMX_LOADD(1, kr, row_bytes);
    AMX_LOADD(4, kr + 64, row_bytes);
    _tile_dpbf16ps(0, 1, 2);
    _tile_dpbf16ps(0, 4, 3);
    if constexpr (NPAIR == 4) {
      AMX_LOADD(1, kr + 128, row_bytes);
      AMX_LOADD(4, kr + 192, row_bytes);
      _tile_dpbf16ps(0, 1, 5);
      _tile_dpbf16ps(0, 4, 6);
    }
    AMX_STORED(0, c, 64);
    __m512 col[16];
    amx_transpose16(c, col);
    for (int g = 0; g < gs; g++) {
      const __m512 sc = _mm512_mul_ps(col[g], vscale);
      _mm512_storeu_ps(scores + (size_t)g * stride + j, sc);
      const float tmax = _mm512_reduce_max_ps(sc);
      mx[g] = tmax > mx[g] ? tmax : mx[g];
    }
  }
  return j;
}

// p @ v over cached positions j0 .. j1 - 1 (at most SOLO_AMX_PART; value rows of hd = 32 * NPAIR bf16 dims,
// position 0 at V): acc_out[g, :] = sum_p p_gp v_p, p_gp = scores[g * stride + p] (float32 numerators that
// hold bf16 values), in `load_pair` order (elementwise.h: per 32 dims the 16 even ones, then the 16 odd
// ones) for g < gs <= 16. P = [16 heads, 32 positions] A tiles, B tiles of position pairs x 16 dims, four C
// tiles per 64 dims (one pass over the part's value rows per 64 dims; the second reads them from L2).
template <int NPAIR>
static void amx_part_pv(const float* scores, size_t stride, int gs, const char* V, size_t row_bytes, int j0, int j1,
                        float* acc_out, int prefetch) {
  static_assert(NPAIR == 2 || NPAIR == 4, "head_dim 64 or 128");
  constexpr int hd = 32 * NPAIR;
  const int n = j1 - j0, steps = (n + 31) / 32;
  // The A tiles' 16 rows: heads g < gs, then rows whose C rows are not read (zero at first, later other
  // calls' numerators: finite either way), so only gs rows are written.
  alignas(64) static thread_local uint16_t p[16][SOLO_AMX_PART];
  for (int g = 0; g < gs; g++)
    for (int i = 0; i < 32 * steps; i += 32) {
      const int left = n - i;  // >= 1
      const float* src = scores + (size_t)g * stride + j0 + i;
      _mm512_store_si512(p[g] + i, (__m512i)_mm512_cvtne2ps_pbh(
                                       _mm512_maskz_loadu_ps(tail_mask(left > 16 ? left - 16 : 0), src + 16),
                                       _mm512_maskz_loadu_ps(tail_mask(left), src)));
    }
  alignas(64) int even[16], odd[16];  // the unpacks' dim order -> `load_pair` order
  for (int i = 0; i < 16; i++) {
    const int de = 2 * i, dodd = 2 * i + 1;
    even[i] = 4 * (de / 8) + de % 4 + (de % 8 >= 4 ? 16 : 0);
    odd[i] = 4 * (dodd / 8) + dodd % 4 + (dodd % 8 >= 4 ? 16 : 0);
  }
  const __m512i ie = _mm512_load_si512(even), io = _mm512_load_si512(odd);
  alignas(64) uint32_t b[4][16][16];  // B tiles: [position pair, 16 dims], two per 32 dims of the pass
  alignas(64) float o[4][16 * 16];
  const __m512i zero = _mm512_setzero_si512();
  amx_configure();
  for (int half = 0; half < NPAIR / 2; half++) {  // dims 64 half .. 64 half + 63
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int s = 0; s < steps; s++) {
      for (int r = 0; r < 16; r++) {
        const int pa = j0 + 32 * s + 2 * r, pb = pa + 1;
        const char* ra = V + (size_t)pa * row_bytes + 128 * half;
        if (prefetch && half == 0) {
          const char* ahead = ra + (size_t)prefetch * 16 * row_bytes;
          for (int l = 0; l < NPAIR; l++) {  // the two rows' 64-byte lines
            __builtin_prefetch(ahead + 64 * l, 0, 3);
            __builtin_prefetch(ahead + row_bytes + 64 * l, 0, 3);
          }
        }
        for (int c = 0; c < 2; c++) {
          const __m512i a = pa < j1 ? _mm512_loadu_si512(ra + 64 * c) : zero;  // positions past j1 add 0 x 0
          const __m512i bb = pb < j1 ? _mm512_loadu_si512(ra + row_bytes + 64 * c) : zero;
          // dword i of 128-bit lane L: dims 8L + i (lo) and 8L + 4 + i (hi) of these 32
          _mm512_store_si512(b[2 * c][r], _mm512_unpacklo_epi16(a, bb));
          _mm512_store_si512(b[2 * c + 1][r], _mm512_unpackhi_epi16(a, bb));
        }
      }
      AMX_LOADD(1, p[0] + 32 * s, sizeof p[0]);
      AMX_LOADD(0, b[0], 64);
      _tile_dpbf16ps(4, 1, 0);
      AMX_LOADD(2, b[1], 64);
      _tile_dpbf16ps(5, 1, 2);
      AMX_LOADD(0, b[2], 64);
      _tile_dpbf16ps(6, 1, 0);
      AMX_LOADD(2, b[3], 64);
      _tile_dpbf16ps(7, 1, 2);
    }
    AMX_STORED(4, o[0], 64);
    AMX_STORED(5, o[1], 64);
    AMX_STORED(6, o[2], 64);
    AMX_STORED(7, o[3], 64);
    for (int g = 0; g < gs; g++)
      for (int c = 0; c < 2; c++) {
        float* out = acc_out + (size_t)g * hd + 64 * half + 32 * c;
        const __m512 lo = _mm512_load_ps(o[2 * c] + 16 * g), hi = _mm512_load_ps(o[2 * c + 1] + 16 * g);
        _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo, ie, hi));
        _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo, io, hi));
      }
  }
  _tile_release();
}
#else
#define SOLO_AMX 0
#endif
