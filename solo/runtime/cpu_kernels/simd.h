// The portable vector layer (SOLO_GVEC builds, and the AVX-512 builds' integer-dot kernels in qdot.h): 8-float
// vectors written with GCC/Clang vector extensions, so one source compiles to AVX2 + FMA (x86-64-v3, or
// 256-bit AVX-512VL code) or to pairs of NEON registers (ARM64). Only the
// fused multiply-add needs the target's intrinsic (whether a * b + c is contracted into one FMA is the
// compiler's choice, copy by copy; the intrinsic makes it fixed), and two widening loads use AVX2's single
// instruction where GCC's generic lowering takes three.
#pragma once
#include "common.h"

#if SOLO_GVEC || SOLO_AVX512
#if defined(__aarch64__) || defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#define GVW 8  // floats per vector
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(32)));
typedef uint16_t vh8 __attribute__((vector_size(16)));
typedef int8_t vb8 __attribute__((vector_size(8)));
typedef uint8_t vub8 __attribute__((vector_size(8)));

static inline vf vzero() { return vf{}; }
static inline vf vset1(float a) { return vf{} + a; }
static inline vf vload(const float* p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void vstore(float* p, vf v) { memcpy(p, &v, sizeof v); }
// 8 bf16 values widened to float32 (exact: a bf16 is the top half of a float32).
static inline vf vload_bf16(const uint16_t* p) {
#if defined(__AVX2__)
  // GCC 12 lowers the generic widening below to two half-width zero-extensions and an insert.
  return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16);
#endif
  vh8 h;
  memcpy(&h, p, sizeof h);
  return (vf)(__builtin_convertvector(h, vu) << 16);
}
static inline vf vload_i8(const int8_t* p) {
#if defined(__AVX2__)
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#endif
  vb8 b;
  memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, vf);
}
static inline vf vload_act(const void* p, size_t i, int bf) {
  return bf ? vload_bf16((const uint16_t*)p + i) : vload((const float*)p + i);
}

// a * b + c with one rounding.
static inline vf vfma(vf a, vf b, vf c) {
#if defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__aarch64__)
  float32x4_t a0, a1, b0, b1, c0, c1;
  memcpy(&a0, &a, 16), memcpy(&a1, (const char*)&a + 16, 16);
  memcpy(&b0, &b, 16), memcpy(&b1, (const char*)&b + 16, 16);
  memcpy(&c0, &c, 16), memcpy(&c1, (const char*)&c + 16, 16);
  c0 = vfmaq_f32(c0, a0, b0), c1 = vfmaq_f32(c1, a1, b1);
  vf r;
  memcpy(&r, &c0, 16), memcpy((char*)&r + 16, &c1, 16);
  return r;
#else
  return a * b + c;
#endif
}

static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline vf vmin(vf a, vf b) { return a < b ? a : b; }

// Horizontal sum in one fixed order (results never depend on how the caller batched its work).
static inline float vsum(vf v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

// Round every lane to bf16 precision (round-to-nearest-even), as `rnd` does; identity for float32.
static inline vf vrnd(vf v, int bf) {
  if (!bf) return v;
  vu u = (vu)v;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (vf)(u & 0xffff0000u);
}

// exp(x) as the AVX-512 build's exp16: Cody-Waite reduction x = n ln2 + r, degree-7 Taylor polynomial,
// then 2^n applied in two halves so every partial power stays a normal float. Within 1-2 ulps of expf.
static inline vf vexp(vf x) {
  x = vmin(vmax(x, vset1(-103.0f)), vset1(88.7f));
  const vf magic = vset1(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  const vf n = (x * vset1(1.4426950408889634f) + magic) - magic;
  vf r = vfma(n, vset1(-0.693145751953125f), x);
  r = vfma(n, vset1(-1.428606765330187e-06f), r);
  vf p = vset1(1.0f / 5040.0f);
  p = vfma(p, r, vset1(1.0f / 720.0f));
  p = vfma(p, r, vset1(1.0f / 120.0f));
  p = vfma(p, r, vset1(1.0f / 24.0f));
  p = vfma(p, r, vset1(1.0f / 6.0f));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  const vi ni = __builtin_convertvector(n, vi);
  const vi n1 = ni >> 1, n2 = ni - n1;
  return p * (vf)((n1 + 127) << 23) * (vf)((n2 + 127) << 23);
}
#endif
