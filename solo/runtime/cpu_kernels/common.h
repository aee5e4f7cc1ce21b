// Solo's CPU kernels, shared definitions: the model description passed from Python (cpu.py builds the
// same structs with ctypes), dtype helpers. See decode.cpp for the overview.
#pragma once

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <type_traits>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Code paths, one per ISA level (cpu_build.py compiles this source once per level with that level's
// target flags and passes SOLO_ISA_NAME):
//   SOLO_AVX512: hand-tuned AVX-512 intrinsics (AVX512-BF16 dot products where the level has them);
//   SOLO_GVEC:   the portable kernels, written with GCC/Clang vector extensions (simd.h) and compiled for
//                x86-64-v3 (AVX2 + FMA + F16C) or ARM64 NEON;
//   neither:     plain scalar loops (SOLO_SCALAR, or an unknown architecture).
#if defined(SOLO_SCALAR)
#define SOLO_AVX512 0
#define SOLO_GVEC 0
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SOLO_AVX512 1
#define SOLO_GVEC 0
#elif defined(__AVX2__) || defined(__aarch64__) || defined(__ARM_NEON)
#define SOLO_AVX512 0
#define SOLO_GVEC 1
#else
#define SOLO_AVX512 0
#define SOLO_GVEC 0
#endif

#ifndef SOLO_ISA_NAME
#define SOLO_ISA_NAME "unknown"
#endif

// Weights are software-prefetched this many bytes ahead of the read. The hardware prefetcher alone
// reached ~70% of the streaming bandwidth on row-by-row matrix-vector products (rows are short
// streams); prefetching 2-8 KiB ahead reached ~90% on a 2-core Sapphire Rapids (4 KiB chosen). On AMD Zen 4
// the same prefetches cost 10-25% (the hardware prefetcher keeps up there), so cpu_build.py compiles with
// SOLO_NO_SW_PREFETCH on AMD CPUs before Zen 5 but Zen 3, where 1 KiB ahead gains 1.04-1.18x (4 KiB: 0.9x);
// on Zen 5 they gain 1.01-1.38x (cpu_build.prefetch_distance_bytes; SOLO_CPU_PREFETCH overrides).
#ifndef SOLO_PREFETCH
#define SOLO_PREFETCH 4096
#endif
#ifdef SOLO_NO_SW_PREFETCH
#define PREFETCH(p) ((void)(p))
#else
#define PREFETCH(p) __builtin_prefetch((const char*)(p) + SOLO_PREFETCH, 0, 3)
#endif

// The spin-wait hint (PAUSE on x86, YIELD on ARM): frees the core's shared resources while spinning.
static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// ---------------------------------------------------------------- the workers' CPUs
// After an idle spell (a server between requests, 10 ms or more), Linux wakes an OpenMP worker on the CPU of
// the thread that wakes it (the caller, about to start its own share; on a VM the halted other vCPU does not
// count as idle), and the two then share one core: the caller runs while the worker waits, and every
// barrier spins out its budget before the worker gets the core. On a 2-vCPU Xeon VM, 41 of 60 two-thread
// regions after a 20 ms pause began on one CPU and took 6-8 ms instead of 0.1 ms, and the bundled model's
// two-thread decode calls took ~100 ms (its ~40 barriers at 2 ms each) for 10% of a lone client's requests.
// So for the length of each kernel call its workers may run on every CPU the caller may except the caller's
// current one (their affinity set before the region, from the thread ids the regions record, and given back
// after it: the pool is PyTorch's too, and its own regions must not find a worker held off a CPU). Nothing is
// pinned: the caller moves freely. Costs two sched_setaffinity calls per worker per call (microseconds).
// SOLO_CPU_PLACE_WORKERS=0 turns it off.
struct WorkerPlacement {
  std::atomic<int> tids[64] = {};  // Linux thread ids by OpenMP thread number (0: none recorded)
  cpu_set_t allowed;               // the caller's affinity, given back to the workers after the call
  int placed = 0;                  // threads of the call whose workers were placed (0: none)
  int cpu = -1;                    // the caller's CPU the workers were kept off (-1: none)
};
static thread_local WorkerPlacement t_placement;  // per calling thread: libgomp keeps a pool per caller

static inline bool place_workers_enabled() {
  static const bool on = [] {
    const char* env = getenv("SOLO_CPU_PLACE_WORKERS");
    return !(env && env[0] == '0');
  }();
  return on;
}

// For the length of a kernel call of `nthreads` threads (construct it before the parallel region, in the
// calling thread): its workers kept off the caller's CPU. `placement` is for the region's `note_worker` calls.
struct PlacedWorkers {
  WorkerPlacement* placement = &t_placement;
  explicit PlacedWorkers(int nthreads) {
    WorkerPlacement* p = placement;
    p->placed = 0;
    p->cpu = -1;
    if (nthreads < 2 || !place_workers_enabled()) return;
    const int cpu = sched_getcpu();
    if (cpu < 0 || sched_getaffinity(0, sizeof p->allowed, &p->allowed) != 0 || !CPU_ISSET(cpu, &p->allowed) ||
        CPU_COUNT(&p->allowed) < 2)
      return;
    cpu_set_t others = p->allowed;
    CPU_CLR(cpu, &others);
    for (int t = 1; t < nthreads && t < 64; t++) {
      const int tid = p->tids[t].load(std::memory_order_relaxed);
      if (tid > 0) sched_setaffinity(tid, sizeof others, &others);
    }
    p->placed = nthreads < 64 ? nthreads : 64;
    p->cpu = cpu;
  }
  ~PlacedWorkers() {
    WorkerPlacement* p = placement;
    for (int t = 1; t < p->placed; t++) {
      const int tid = p->tids[t].load(std::memory_order_relaxed);
      if (tid > 0) sched_setaffinity(tid, sizeof p->allowed, &p->allowed);
    }
    p->placed = 0;
  }
  PlacedWorkers(const PlacedWorkers&) = delete;
  PlacedWorkers& operator=(const PlacedWorkers&) = delete;
};

// Inside the region, from each thread: record its thread id (a worker not seen before is placed from the
// caller's next call on).
static inline void note_worker(WorkerPlacement* p, int tid) {
  static thread_local const int me = (int)syscall(SYS_gettid);
  if (tid > 0 && tid < 64 && p->tids[tid].load(std::memory_order_relaxed) != me)
    p->tids[tid].store(me, std::memory_order_relaxed);
}

enum { DT_BF16 = 0, DT_F32 = 1 };
// W_INT4_BF16X: int4 weights whose inputs may be rounded to bf16 (a bf16 model's activations already are).
// W_INT8_Q8 / W_INT4_Q8: the same weights as W_INT8 / W_INT4, multiplied with the input quantized to int8
// per block of 32 (qdot.h: integer dot products, one float scale per block).
// W_BF16_AMX: bf16 weights packed for the AMX level's kernels (amx.h), [ceil(rows / 16)][ceil(cols / 32)][512].
enum { W_BF16 = 0, W_F32 = 1, W_INT8 = 2, W_INT4 = 3, W_INT4_BF16X = 4, W_INT8_Q8 = 5, W_INT4_Q8 = 6, W_BF16_AMX = 7 };

static inline int is_int8_format(int f) { return f == W_INT8 || f == W_INT8_Q8; }
static inline int is_int4_format(int f) { return f == W_INT4 || f == W_INT4_BF16X || f == W_INT4_Q8; }
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };

typedef struct {
  int32_t format, rows, cols, group;
  const void* weight;  // bf16/f32 [rows, cols]; int8 [rows, cols]; int4 uint8 [rows, cols / 2]; W_BF16_AMX above
  const void* scale;   // int8: float32 [rows]; int4: bf16 [rows, cols / group]; else NULL
  const void* bias;    // activation dtype [rows] or NULL
} Mat;

typedef struct {
  Mat qkv, o, gate_up, down;
  const void *attn_norm, *mlp_norm, *attn_out_norm, *mlp_out_norm, *q_norm, *k_norm;
  void *k_cache, *v_cache;  // activation dtype [cache_rows, kv_heads, max_seq, head_dim]
  int32_t window;           // sliding window in tokens, 0 = global attention
  int32_t rope;             // the layer's RoPE table: cos / sin hold [tables][entries][head_dim]
} Layer;

typedef struct {
  int32_t dtype, hidden, heads, kv_heads, head_dim, inter, vocab, layers, max_seq, cache_rows;
  int32_t unit_offset, sandwich, qk_norm, act;  // qk_norm: 0 none, 1 per head, 2 over the whole q / k (OLMoE)
  float eps, embed_scale, attn_scale, attn_softcap, final_softcap;  // 0 = off
  const void* embed;       // activation dtype [vocab, hidden]
  const void* final_norm;  // activation dtype [hidden]
  Mat head;
  Layer* layer;
  int32_t skip_matmuls;  // measurement only: matrix-vector products write zeros instead of reading weights
  const void* moe;       // mixture of experts: MoeLayer [layers] (moe.h), NULL for a dense model
} Model;

// ------------------------------------------------------------------------------------------ scalars

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// Round a float to the activation dtype's precision (what an eager bf16 op does to its result).
static inline float rnd(float f, int bf) { return bf ? bf16_to_f32(f32_to_bf16(f)) : f; }

static inline float load_act(const void* p, size_t i, int bf) {
  return bf ? bf16_to_f32(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

static inline void store_act(void* p, size_t i, float v, int bf) {
  if (bf)
    ((uint16_t*)p)[i] = f32_to_bf16(v);
  else
    ((float*)p)[i] = v;
}

#if SOLO_AVX512
// The first `left` of 16 lanes (0 <= left; 16 or more: all).
static inline __mmask16 tail_mask(int left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

static inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// The sum of a's 16 lanes in a fixed tree: lane i plus lane i + 8, then + 4, + 2, + 1 (GCC's
// _mm512_reduce_add_ps; spelled out so that the bits do not depend on how a compiler implements that).
static inline float hsum16(__m512 a) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), hi);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, _MM_SHUFFLE(2, 3, 0, 1))));
}

// hsum16 of a[0..3] at once, r[j] = the sum of a[j] with hsum16's bits (the same additions; float addition
// is commutative): 13 instructions instead of about 28, for the products with four tokens (span prefill).
static inline __m128 hsum16x4(const __m512* a) {
  const __m512 r0 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r1 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // 128-bit lane q: a[q]'s lanes (l + (l + 8)) + ((l + 4) + (l + 12)) for l < 4
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, w));
}
#endif

// Rows [n0, n1) as S streams: S rows at once, one from each of S contiguous runs of q = (n1 - n0) / S rows
// (each run read linearly, a row after the one before it), then the last (n1 - n0) % S rows one at a time.
// f(std::integral_constant<int, R>, const int* row) computes the R rows row[0 .. R). The batch-1 decode
// kernels read their rows this way: several streams keep more memory reads in flight than one.
template <int S, class F>
static inline void for_row_streams(int n0, int n1, F&& f) {
  const int q = (n1 - n0) / S;
  for (int i = 0; i < q; i++) {
    int row[S];
    for (int s = 0; s < S; s++) row[s] = n0 + s * q + i;
    f(std::integral_constant<int, S>(), (const int*)row);
  }
  for (int n = n0 + S * q; n < n1; n++) f(std::integral_constant<int, 1>(), (const int*)&n);
}
