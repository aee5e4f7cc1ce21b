// Solo's CPU kernels, shared definitions: the model description passed from Python (cpu.py builds the
// same structs with ctypes), dtype helpers. See decode.cpp for the overview.
#pragma once

#include <math.h>
#include <omp.h>
#include <sched.h>

#include <atomic>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// Weights are software-prefetched this many bytes ahead of the read. The hardware prefetcher alone
// reached ~70% of the streaming bandwidth on row-by-row matrix-vector products (rows are short
// streams); prefetching 2-8 KiB ahead reached ~90% on a 2-core Sapphire Rapids (4 KiB chosen).
#ifndef SOLO_PREFETCH
#define SOLO_PREFETCH 4096
#endif
#define PREFETCH(p) _mm_prefetch((const char*)(p) + SOLO_PREFETCH, _MM_HINT_T0)

enum { DT_BF16 = 0, DT_F32 = 1 };
// W_INT4_BF16X: int4 weights whose inputs may be rounded to bf16 (a bf16 model's activations already are).
enum { W_BF16 = 0, W_F32 = 1, W_INT8 = 2, W_INT4 = 3, W_INT4_BF16X = 4 };
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };

typedef struct {
  int32_t format, rows, cols, group;
  const void* weight;  // bf16/f32 [rows, cols]; int8 [rows, cols]; int4 uint8 [rows, cols / 2]
  const void* scale;   // int8: float32 [rows]; int4: bf16 [rows, cols / group]; else NULL
  const void* bias;    // activation dtype [rows] or NULL
} Mat;

typedef struct {
  Mat qkv, o, gate_up, down;
  const void *attn_norm, *mlp_norm, *attn_out_norm, *mlp_out_norm, *q_norm, *k_norm;
  void *k_cache, *v_cache;  // activation dtype [cache_rows, kv_heads, max_seq, head_dim]
  int32_t window;           // sliding window in tokens, 0 = global attention
} Layer;

typedef struct {
  int32_t dtype, hidden, heads, kv_heads, head_dim, inter, vocab, layers, max_seq, cache_rows;
  int32_t unit_offset, sandwich, qk_norm, act;
  float eps, embed_scale, attn_scale, attn_softcap, final_softcap;  // 0 = off
  const void* embed;       // activation dtype [vocab, hidden]
  const void* final_norm;  // activation dtype [hidden]
  Mat head;
  Layer* layer;
  int32_t skip_matmuls;  // measurement only: matrix-vector products write zeros instead of reading weights
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

#if defined(__AVX512F__)
static inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif

