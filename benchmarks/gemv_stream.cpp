// Streaming microbenchmark: how fast do the bf16 GEMV kernels read their weights, next to a plain read?
//
// Streams ~256 MB of bf16 rows (K columns) once per pass, with 1 and 2 OpenMP threads, through:
//   sum          a plain AVX-512 read (4 integer accumulators), the bandwidth reference
//   gemv         gemv_bf16_bt<1> from solo/runtime/cpu_kernels/gemv.h, exactly as the runtime builds it
//   pf w D H     the same arithmetic with a software prefetch of the weights D bytes ahead, hint H (t0 / nta)
//   pf x D       ... with a prefetch of the input x D bytes ahead
//   rows2        two rows' k-loops interleaved (each row keeps its own 4 accumulators and order)
//   kblock RxKB  R rows at a time, k in blocks of KB (x block reused by R rows; R short streams)
//   kslice S     every row's k range in S passes over the rows, accumulators kept in memory
//   movntdqa     weights through non-temporal loads; clflushopt: consumed weight lines evicted
//   blocked      the weights copied to a blocked layout (tiles of 4 rows x 2048 columns, each contiguous):
//                one linear stream feeds 4 rows from a 4 KiB block of x (the fix section 2 of
//                results/amd-epyc-zen4/gemv-stream.md proposes); "sum blocked copy" = a plain read of it
//   tiles 32x2K  the weights in tiles of 32 rows x 2048 columns (each 128 KiB tile contiguous, a row group's
//                tiles in column order): 32 rows reuse each 4 KiB x block; accumulators in memory
//   colblocked   the weights copied column-block-major (for each 2048 columns, all rows): one linear stream
//                per column block with its 4 KiB of x in L1, the accumulators kept in memory between blocks
//   xsmall       TEST ONLY, wrong results: x indexed modulo 2048, i.e. a 4 KiB input whatever K is
//   pieces P     one thread, the rows in pieces of P bytes in a shuffled order (the MoE step's access)
//   chunked      2 threads taking 128 KiB chunks alternately (t, t + 2, ...) instead of contiguous halves
// Every variant except sum / xsmall keeps gemv_bf16_bt<1>'s dpbf16 sequence per accumulator, and its outputs
// are checked bit-identical to gemv.h's. All variants are interleaved in every round (the VM's bandwidth
// drifts); printed: GB/s by wall time and by the slowest thread's CPU time (immune to waiting for a core on
// a shared machine), median [best], and the median same-round ratio to the plain read on as many threads.
//
// Build (the avx512-bf16 level's flags from solo/runtime/cpu_build.py, AMD: no software prefetch):
//   g++ -O3 -fopenmp -std=c++17 -fno-math-errno -mavx -mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt -mmovbe
//   -mavx512f -mavx512bw -mavx512cd -mavx512dq -mavx512vl -mavx512bf16 -mavx512vnni -mclflushopt
//   -DSOLO_NO_SW_PREFETCH -Isolo/runtime/cpu_kernels benchmarks/gemv_stream.cpp -o /tmp/gemv_stream
// Run: OMP_WAIT_POLICY=passive /tmp/gemv_stream [K=2048] [MB=256] [rounds=10] [hugepages=1]
//  or: OMP_WAIT_POLICY=passive /tmp/gemv_stream int8 [K=2048] [MB=256] [rounds=12]   (qdot.h's int8 path)
//  or: /tmp/gemv_stream step [rounds=8] [hugepages=1] [threads=2]
//  or: OMP_WAIT_POLICY=passive /tmp/gemv_stream placement [buffers=8] [MB=256] [rounds=8] [hugepages=1]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gemv.h"

#if !(SOLO_AVX512 && defined(__AVX512BF16__))
#error "build with the avx512-bf16 flags"
#endif

static double thread_cpu() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A plain read: integer adds, so it is bound by loads only.
static uint64_t sum_rows(const uint16_t* W, int K, int n0, int n1) {
  const char* p = (const char*)(W + (size_t)n0 * K);
  const char* e = (const char*)(W + (size_t)n1 * K);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (; p < e; p += 256) {
    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p));
    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + 64));
    a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + 128));
    a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + 192));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

// gemv_bf16_bt<1>'s arithmetic (K a multiple of 128 here) with a software prefetch PF bytes ahead.
template <int PF, int HINT>
static void gemv_pf(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128) {
      if (PF) {
        for (int i = 0; i < 4; i++) _mm_prefetch((const char*)(w + k + 32 * i) + PF, (_mm_hint)HINT);
      }
      for (int i = 0; i < 4; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                  (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// Two rows' k-loops interleaved: two streams, each row's accumulators and order unchanged.
static void gemv_rows2(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  int n = n0;
  for (; n + 2 <= n1; n += 2) {
    const uint16_t* w0 = W + (size_t)n * K;
    const uint16_t* w1 = w0 + K;
    __m512 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128) {
      for (int i = 0; i < 4; i++) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k + 32 * i);
        a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)_mm512_loadu_si512(w0 + k + 32 * i), xv);
        b[i] = _mm512_dpbf16_ps(b[i], (__m512bh)_mm512_loadu_si512(w1 + k + 32 * i), xv);
      }
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
    y[n + 1] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(b[0], b[1]), _mm512_add_ps(b[2], b[3])));
  }
  if (n < n1) gemv_pf<0, 0>(W, K, x, y, n, n1);
}

// R rows at a time, k in blocks of KB elements: every row's 4 accumulators see the same dpbf16 sequence as in
// gemv_bf16_bt<1> (bit-identical), but the block of x (KB * 2 bytes) is reused by R rows while in L1.
template <int R, int KB>
static void gemv_kblock(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  int n = n0;
  for (; n + R <= n1; n += R) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[R][4];
    for (int r = 0; r < R; r++)
      for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int kb = 0; kb < K; kb += KB) {
      const int ke = kb + KB < K ? kb + KB : K;
      for (int r = 0; r < R; r++)
        for (int k = kb; k < ke; k += 128)
          for (int i = 0; i < 4; i++)
            acc[r][i] = _mm512_dpbf16_ps(acc[r][i], (__m512bh)_mm512_loadu_si512(w + (size_t)r * K + k + 32 * i),
                                         (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
    }
    for (int r = 0; r < R; r++)
      y[n + r] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
  }
  if (n < n1) gemv_pf<0, 0>(W, K, x, y, n, n1);
}

// gemv_bf16_bt<1>'s arithmetic with prefetches of x (T0, PX bytes ahead) and/or of w (hint HW, PW bytes ahead).
template <int PX, int PW, int HW>
static void gemv_pfx(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128) {
      if (PX)
        for (int i = 0; i < 4; i++) _mm_prefetch((const char*)(x + k + 32 * i) + PX, _MM_HINT_T0);
      if (PW)
        for (int i = 0; i < 4; i++) _mm_prefetch((const char*)(w + k + 32 * i) + PW, (_mm_hint)HW);
      for (int i = 0; i < 4; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                  (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// K in S slices: the thread's rows [n0, n1) are swept S times, slice s of every row in pass s, the
// accumulators kept in memory between passes (same dpbf16 sequence per accumulator: bit-identical). The
// x slice (K / S * 2 bytes) stays in L1; the weights are read as a forward stream with gaps.
template <int S>
static void gemv_kslice(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  static thread_local std::vector<__m512> accs;
  const int rows = n1 - n0, ks = K / S;
  accs.assign((size_t)rows * 4, _mm512_setzero_ps());
  for (int s = 0; s < S; s++) {
    for (int n = n0; n < n1; n++) {
      const uint16_t* w = W + (size_t)n * K;
      __m512* a = &accs[(size_t)(n - n0) * 4];
      __m512 acc[4] = {a[0], a[1], a[2], a[3]};
      for (int k = s * ks; k < (s + 1) * ks; k += 128)
        for (int i = 0; i < 4; i++)
          acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                    (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
      for (int i = 0; i < 4; i++) a[i] = acc[i];
    }
  }
  for (int n = n0; n < n1; n++) {
    const __m512* a = &accs[(size_t)(n - n0) * 4];
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
}

// gemv_bf16_bt<1>'s arithmetic; MODE 1: weights through MOVNTDQA (non-temporal loads, 64-byte aligned rows),
// MODE 2: each consumed 256 bytes of weights evicted with CLFLUSHOPT (frees L1 ways for x).
template <int MODE>
static void gemv_nt(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128) {
      for (int i = 0; i < 4; i++) {
        const __m512i wv = MODE == 1 ? _mm512_stream_load_si512((void*)(w + k + 32 * i))
                                     : _mm512_loadu_si512(w + k + 32 * i);
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)wv, (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
      }
      if (MODE == 2)
        for (int i = 0; i < 4; i++) _mm_clflushopt((void*)(w + k + 32 * i));
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// gemv_bf16_bt<1>'s arithmetic plus, per 128 inputs, T dummy loads of x half a row further on (mod K): every x
// line is used twice per row, so fewer weight lines pass through its L1 set between two uses.
template <int T>
static void gemv_touch(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  const int half = K / 2;
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128) {
      const int kt = k < half ? k + half : k - half;
      for (int i = 0; i < T; i++) {
        __m512i t = _mm512_loadu_si512(x + kt + 32 * i);
        __asm__ volatile("" : : "v"(t));
      }
      for (int i = 0; i < 4; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                  (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// What a blocked weight layout would give: Wb holds tiles of R rows x KB columns, each tile contiguous
// (row-major inside), tiles in (row block, column block) order, so R rows are read as ONE linear stream
// while the KB-column block of x is reused from L1 by the R rows. Each accumulator sees gemv_bf16_bt<1>'s
// dpbf16 sequence (bit-identical; checked). K a multiple of KB, rows a multiple of R here.
template <int R, int KB>
static void to_blocked(const uint16_t* W, int N, int K, uint16_t* Wb) {
  size_t o = 0;
  for (int n = 0; n < N; n += R)
    for (int kb = 0; kb < K; kb += KB)
      for (int r = 0; r < R; r++, o += KB) memcpy(Wb + o, W + (size_t)(n + r) * K + kb, KB * 2);
}
template <int R, int KB>
static void gemv_blocked(const uint16_t* Wb, int K, const uint16_t* x, float* y, int n0, int n1) {
  for (int n = n0; n < n1; n += R) {
    const uint16_t* w = Wb + (size_t)n * K;  // the row block's tiles
    __m512 acc[R][4];
    for (int r = 0; r < R; r++)
      for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int kb = 0; kb < K; kb += KB)
      for (int r = 0; r < R; r++, w += KB)
        for (int k = 0; k < KB; k += 128)
          for (int i = 0; i < 4; i++)
            acc[r][i] = _mm512_dpbf16_ps(acc[r][i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                         (__m512bh)_mm512_loadu_si512(x + kb + k + 32 * i));
    for (int r = 0; r < R; r++)
      y[n + r] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
  }
}

// Tiles of R rows x KB columns, each contiguous, tiles of a row group in column order (to_blocked<R, KB>),
// the R rows' accumulators in memory (R * 256 bytes): R rows' worth of weights per x block.
template <int R, int KB>
static void gemv_tiles_mem(const uint16_t* Wb, int K, const uint16_t* x, float* y, int n0, int n1) {
  alignas(64) __m512 accs[R][4];
  for (int n = n0; n < n1; n += R) {
    const uint16_t* w = Wb + (size_t)n * K;
    for (int r = 0; r < R; r++)
      for (int i = 0; i < 4; i++) accs[r][i] = _mm512_setzero_ps();
    for (int kb = 0; kb < K; kb += KB)
      for (int r = 0; r < R; r++, w += KB) {
        __m512 acc[4] = {accs[r][0], accs[r][1], accs[r][2], accs[r][3]};
        for (int k = 0; k < KB; k += 128)
          for (int i = 0; i < 4; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                      (__m512bh)_mm512_loadu_si512(x + kb + k + 32 * i));
        for (int i = 0; i < 4; i++) accs[r][i] = acc[i];
      }
    for (int r = 0; r < R; r++)
      y[n + r] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(accs[r][0], accs[r][1]), _mm512_add_ps(accs[r][2], accs[r][3])));
  }
}

// Column-block-major layout: Wc holds, for each block of KB columns, every row's KB weights (rows in order),
// so one pass per column block reads one linear stream while the 4 KiB x block stays in L1 for the whole
// pass; the rows' accumulators wait in memory between passes (same dpbf16 sequence: bit-identical).
template <int KB>
static void to_colblocked(const uint16_t* W, int N, int K, uint16_t* Wc) {
  size_t o = 0;
  for (int kb = 0; kb < K; kb += KB)
    for (int n = 0; n < N; n++, o += KB) memcpy(Wc + o, W + (size_t)n * K + kb, KB * 2);
}
template <int KB>
static void gemv_colblocked(const uint16_t* Wc, int N, int K, const uint16_t* x, float* y, int n0, int n1) {
  static thread_local std::vector<__m512> accs;
  accs.assign((size_t)(n1 - n0) * 4, _mm512_setzero_ps());
  for (int kb = 0; kb < K; kb += KB) {
    const uint16_t* w = Wc + (size_t)kb * N + (size_t)n0 * KB;
    for (int n = n0; n < n1; n++, w += KB) {
      __m512* a = &accs[(size_t)(n - n0) * 4];
      __m512 acc[4] = {a[0], a[1], a[2], a[3]};
      for (int k = 0; k < KB; k += 128)
        for (int i = 0; i < 4; i++)
          acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                    (__m512bh)_mm512_loadu_si512(x + kb + k + 32 * i));
      for (int i = 0; i < 4; i++) a[i] = acc[i];
    }
  }
  for (int n = n0; n < n1; n++) {
    const __m512* a = &accs[(size_t)(n - n0) * 4];
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
}

// Test only (wrong results): x indexed modulo 2048 elements, i.e. a 4 KiB input whatever K is.
static void gemv_xsmall(const uint16_t* W, int K, const uint16_t* x, float* y, int n0, int n1) {
  for (int n = n0; n < n1; n++) {
    const uint16_t* w = W + (size_t)n * K;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 128)
      for (int i = 0; i < 4; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                  (__m512bh)_mm512_loadu_si512(x + ((k + 32 * i) & 2047)));
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

// int8 mode: the int8 integer-dot path (qdot.h, W_INT8_Q8: input quantized per block of 32, VNNI dot products)
// against a plain read of the same 256 MiB of int8 weights, 1 and 2 threads, interleaved.
static int int8_mode(int K, size_t mb, int rounds) {
  const int N = (int)((mb << 20) / (size_t)K) & ~15;
  const size_t bytes = (size_t)N * K, align = 2 << 20;
  char* raw = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int8_t* W = (int8_t*)(raw + ((align - (uintptr_t)raw % align) % align));
  madvise(W, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; i++) W[i] = (int8_t)(((uint32_t)i * 2654435761u) >> 24);
  std::vector<float> scale(N, 0.01f), xf(K), y(N);
  for (int k = 0; k < K; k++) xf[k] = (float)((k * 40503u) % 1000) / 500.f - 1.f;
  const Mat mat{W_INT8_Q8, N, K, 32, W, scale.data(), nullptr};
  std::vector<char> xq((size_t)K * 4);
  quantize_q8(&mat, xf.data(), 1, xq.data());
  volatile uint64_t sink = 0;
  const char* names[] = {"sum 1t", "int8 qdot 1t", "sum 2t", "int8 qdot 2t"};
  std::vector<double> cpu_res[4];
  for (int r = 0; r < rounds; r++)
    for (int v = 0; v < 4; v++) {
      double cpu = 0;
#pragma omp parallel num_threads(v < 2 ? 1 : 2) reduction(max : cpu)
      {
        int n0, n1;
        row_range(N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
        const double c0 = thread_cpu();
        if (v % 2 == 0) sink += sum_rows((const uint16_t*)W, K / 2, n0, n1);
        else gemv_q8<1>(&mat, xq.data(), (size_t)K * 4, y.data(), N, n0, n1);
        cpu = thread_cpu() - c0;
      }
      cpu_res[v].push_back(bytes / cpu / 1e9);  // the slowest thread's CPU time
    }
  printf("int8 mode: K=%d rows=%d bytes=%.0f MB, %d rounds (GB/s by CPU time: median [best], median same-round "
         "ratio to the plain read)\n", K, N, bytes / 1e6, rounds);
  for (int v = 0; v < 4; v++) {
    std::vector<double> c = cpu_res[v], ratio;
    for (int r = 0; r < rounds; r++) ratio.push_back(cpu_res[v][r] / cpu_res[v & ~1][r]);
    std::sort(c.begin(), c.end());
    std::sort(ratio.begin(), ratio.end());
    printf("  %-14s %6.1f [%6.1f]  x%.3f\n", names[v], c[rounds / 2], c.back(), ratio[rounds / 2]);
  }
  return (int)(sink & 0);
}

struct Variant {
  std::string name;
  int threads;
  bool chunked;  // 128 KiB chunks dealt alternately instead of contiguous halves
  std::function<void(int n0, int n1)> run;
  std::vector<double> gbps, cpu_gbps;  // wall; CPU time of the slowest thread (immune to waiting for a core)
};

// Placement mode: does the read rate depend on the buffer (where its memory landed) or on the moment?
// `count` buffers of `mb` MB each, allocated and touched one after another; every round reads each once
// with 2 threads (plain read and gemv_bf16_bt<1>), in a rotating order.
static int placement(int count, size_t mb, int rounds, int huge) {
  const int K = 2048, N = (int)((mb << 20) / (K * 2)) & ~15;
  const size_t bytes = (size_t)N * K * 2, align = 2 << 20;
  std::vector<uint16_t*> bufs;
  for (int b = 0; b < count; b++) {
    char* raw = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint16_t* W = (uint16_t*)(raw + ((align - (uintptr_t)raw % align) % align));
    madvise(W, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = 0x3c00 + (uint16_t)(((uint32_t)i * 2654435761u) >> 25);
    bufs.push_back(W);
  }
  std::vector<uint16_t> x(K, 0x3f80);
  std::vector<float> y(N);
  std::vector<std::vector<double>> sum(count), gemv(count);
  volatile uint64_t sink = 0;
  for (int r = 0; r < rounds; r++) {
    printf("round %2d:", r);
    for (int i = 0; i < count; i++) {
      const int b = (i + r) % count;
      for (int kind = 0; kind < 2; kind++) {
        const double t0 = now();
#pragma omp parallel num_threads(2)
        {
          int n0, n1;
          row_range(N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
          if (kind == 0) sink += sum_rows(bufs[b], K, n0, n1);
          else gemv_bf16_bt<1>(bufs[b], K, x.data(), K, y.data(), N, n0, n1);
        }
        (kind ? gemv : sum)[b].push_back(bytes / (now() - t0) / 1e9);
      }
    }
    for (int b = 0; b < count; b++) printf(" %5.1f/%5.1f", sum[b].back(), gemv[b].back());
    printf("   (buffer: sum/gemv GB/s)\n");
  }
  for (int b = 0; b < count; b++) {
    std::sort(sum[b].begin(), sum[b].end());
    std::sort(gemv[b].begin(), gemv[b].end());
    printf("buffer %d: sum median %5.1f best %5.1f | gemv median %5.1f best %5.1f\n", b, sum[b][rounds / 2],
           sum[b].back(), gemv[b][rounds / 2], gemv[b].back());
  }
  return (int)(sink & 0);
}

// Step mode: one batch-1 decode step's matrix sequence (Llama-3.2-1B: 16 x [qkv 3072x2048, o 2048x2048,
// gate/up 16384x2048, down 2048x8192] + head 128256x2048, 2.47 GB) back to back in one huge-page arena,
// 2 threads, a barrier after every matrix as in the decode step. Variants: a plain read of the whole arena
// without barriers (the ideal), the plain read per matrix with barriers, gemv_bf16_bt<1> per matrix on
// static halves, and gemv.h's gemv_shared (128 KiB chunks, share_rows) as the decode step runs it.
static int step_mode(int rounds, int huge, int threads) {
  struct M { int rows, cols; size_t off; };
  std::vector<M> mats;
  size_t off = 0;
  auto add = [&](int r, int c) { mats.push_back({r, c, off}); off += ((size_t)r * c * 2 + 4095) & ~(size_t)4095; };
  for (int l = 0; l < 16; l++) { add(3072, 2048); add(2048, 2048); add(16384, 2048); add(2048, 8192); }
  add(128256, 2048);
  const size_t bytes = off, align = 2 << 20;
  char* raw = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char* A = raw + ((align - (uintptr_t)raw % align) % align);
  madvise(A, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  uint16_t* W16 = (uint16_t*)A;
  for (size_t i = 0; i < bytes / 2; i++) W16[i] = 0x3c00 + (uint16_t)(((uint32_t)i * 2654435761u) >> 25);
  std::vector<uint16_t> x(8192, 0x3f80);
  std::vector<float> y(128256);
  RowQueue q[2];
  q[0].word = q[1].word = rowq_pack(ROWQ_FRESH, 0, 0);
  unsigned gen = 0;
  volatile uint64_t sink = 0;
  const char* names[] = {"sum whole arena, no barriers", "sum per matrix + barrier", "gemv static halves + barrier",
                         "gemv_shared 128K chunks + barrier", "gemv_shared 512K chunks + barrier",
                         "gemv_shared 32K chunks + barrier"};
  const int NV = 6;
  std::vector<double> res[NV], cpu_res[NV];
  for (int r = 0; r < rounds; r++) {
    for (int v = 0; v < NV; v++) {
      g_chunk_bytes = v == 4 ? 512 << 10 : v == 5 ? 32 << 10 : 128 << 10;
      const unsigned g0 = gen;
      gen += (unsigned)mats.size();
      const double t0 = now();
      double cpu = 0;
#pragma omp parallel num_threads(threads) reduction(max : cpu)
      {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        const double c0 = thread_cpu();
        if (v == 0) {
          const size_t part = bytes / nt / 256 * 256;
          sink += sum_rows((const uint16_t*)(A + tid * part), 128, 0,
                           (int)((tid == nt - 1 ? bytes - tid * part : part) / 256));
        } else {
          for (size_t m = 0; m < mats.size(); m++) {
            const M& mm = mats[m];
            const uint16_t* W = (const uint16_t*)(A + mm.off);
            if (v == 1) {
              int n0, n1;
              row_range(mm.rows, tid, nt, &n0, &n1);
              sink += sum_rows(W, mm.cols, n0, n1);
            } else if (v == 2) {
              int n0, n1;
              row_range(mm.rows, tid, nt, &n0, &n1);
              gemv_bf16_bt<1>(W, mm.cols, x.data(), mm.cols, y.data(), mm.rows, n0, n1);
            } else {
              Mat mat{W_BF16, mm.rows, mm.cols, 32, W, nullptr, nullptr};
              gemv_shared(&mat, x.data(), 1, y.data(), mm.rows, q, g0 + (unsigned)m, tid, nt, 0, [](int, int) {});
            }
#pragma omp barrier
          }
        }
        cpu = thread_cpu() - c0;
      }
      res[v].push_back(bytes / (now() - t0) / 1e9);
      cpu_res[v].push_back(bytes / cpu / 1e9 / threads);
    }
    printf("round %2d:", r);
    for (int v = 0; v < NV; v++) printf(" %5.1f", res[v].back());
    printf("\n");
  }
  printf("step mode: %zu matrices, %.0f MB, %d threads, hugepages=%d, %d rounds (GB/s: median [best], median ratio "
         "to the first in the same round; wall, then per thread by CPU time)\n", mats.size(), bytes / 1e6, threads,
         huge, rounds);
  for (int v = 0; v < NV; v++) {
    std::vector<double> g = res[v], c = cpu_res[v], ratio, cratio;
    for (int r = 0; r < rounds; r++) {
      ratio.push_back(res[v][r] / res[0][r]);
      cratio.push_back(cpu_res[v][r] / cpu_res[0][r]);
    }
    std::sort(g.begin(), g.end());
    std::sort(c.begin(), c.end());
    std::sort(ratio.begin(), ratio.end());
    std::sort(cratio.begin(), cratio.end());
    printf("  %-36s %6.1f [%6.1f]  x%.3f | CPU %6.1f [%6.1f]  x%.3f\n", names[v], g[g.size() / 2], g.back(),
           ratio[rounds / 2], c[c.size() / 2], c.back(), cratio[rounds / 2]);
  }
  return (int)(sink & 0);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "int8")
    return int8_mode(argc > 2 ? atoi(argv[2]) : 2048, argc > 3 ? atoi(argv[3]) : 256, argc > 4 ? atoi(argv[4]) : 12);
  if (argc > 1 && std::string(argv[1]) == "step") return step_mode(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atoi(argv[3]) : 1, argc > 4 ? atoi(argv[4]) : 2);
  if (argc > 1 && std::string(argv[1]) == "placement")
    return placement(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atoi(argv[3]) : 256, argc > 4 ? atoi(argv[4]) : 8,
                     argc > 5 ? atoi(argv[5]) : 1);
  const int K = argc > 1 ? atoi(argv[1]) : 2048;
  const size_t mb = argc > 2 ? atoi(argv[2]) : 256;
  const int rounds = argc > 3 ? atoi(argv[3]) : 10;
  const int huge = argc > 4 ? atoi(argv[4]) : 1;
  const int N = (int)((mb << 20) / ((size_t)K * 2)) & ~15;
  const size_t bytes = (size_t)N * K * 2, align = 2 << 20;
  char* raw = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint16_t* W = (uint16_t*)(raw + ((align - (uintptr_t)raw % align) % align));
  madvise(W, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  for (size_t i = 0; i < (size_t)N * K; i++) W[i] = 0x3c00 + (uint16_t)(((uint32_t)i * 2654435761u) >> 25);  // ~[0.008, 0.03]
  std::vector<uint16_t> x(K);
  for (int k = 0; k < K; k++) x[k] = 0x3f80 + (uint16_t)((k * 40503u) & 0x7f);
  std::vector<float> yref(N), y(N);
  volatile uint64_t sink = 0;
  const uint16_t* xp = x.data();

  // The same weights in the blocked layout (tiles of 4 rows x 2048 columns), when K allows.
  uint16_t* Wb = nullptr;
  if (K % 2048 == 0) {
    char* rawb = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    Wb = (uint16_t*)(rawb + ((align - (uintptr_t)rawb % align) % align));
    madvise(Wb, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    to_blocked<4, 2048>(W, N, K, Wb);
  }
  uint16_t* Wt = nullptr;  // tiles of 32 rows x 2048 columns
  if (K % 2048 == 0) {
    char* rawt = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    Wt = (uint16_t*)(rawt + ((align - (uintptr_t)rawt % align) % align));
    madvise(Wt, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    to_blocked<32, 2048>(W, N, K, Wt);
  }
  uint16_t* Wc = nullptr;
  if (K % 2048 == 0 && K > 2048) {
    char* rawc = (char*)mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    Wc = (uint16_t*)(rawc + ((align - (uintptr_t)rawc % align) % align));
    madvise(Wc, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    to_colblocked<2048>(W, N, K, Wc);
  }
  std::vector<Variant> vs;
  for (int t : {1, 2}) {
    const std::string s = t == 1 ? " 1t" : " 2t";
    vs.push_back({"sum" + s, t, false, [&](int a, int b) { sink += sum_rows(W, K, a, b); }, {}});
    vs.push_back({"gemv (gemv.h)" + s, t, false,
                  [&](int a, int b) { gemv_bf16_bt<1>(W, K, xp, K, y.data(), N, a, b); }, {}});
    vs.push_back({"pf w 512 t0" + s, t, false, [&](int a, int b) { gemv_pf<512, _MM_HINT_T0>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"pf w 2K t0" + s, t, false, [&](int a, int b) { gemv_pf<2048, _MM_HINT_T0>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"pf w 4K t0" + s, t, false, [&](int a, int b) { gemv_pf<4096, _MM_HINT_T0>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"pf w 256 nta" + s, t, false, [&](int a, int b) { gemv_pfx<0, 256, _MM_HINT_NTA>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"pf w 2K nta" + s, t, false, [&](int a, int b) { gemv_pfx<0, 2048, _MM_HINT_NTA>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"pf x 512 t0" + s, t, false, [&](int a, int b) { gemv_pfx<512, 0, 0>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"rows2" + s, t, false, [&](int a, int b) { gemv_rows2(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"kblock 4x1K" + s, t, false, [&](int a, int b) { gemv_kblock<4, 1024>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"kslice 2" + s, t, false, [&](int a, int b) { gemv_kslice<2>(W, K, xp, y.data(), a, b); }, {}});
    if (Wb) {
      vs.push_back({"blocked 4x2K" + s, t, false, [&](int a, int b) { gemv_blocked<4, 2048>(Wb, K, xp, y.data(), a, b); }, {}});
      vs.push_back({"sum blocked copy" + s, t, false, [&](int a, int b) { sink += sum_rows(Wb, K, a, b); }, {}});
    }
    if (Wt)
      vs.push_back({"tiles 32x2K" + s, t, false,
                    [&](int a, int b) { gemv_tiles_mem<32, 2048>(Wt, K, xp, y.data(), a, b); }, {}});
    if (Wc)
      vs.push_back({"colblocked 2K" + s, t, false,
                    [&](int a, int b) { gemv_colblocked<2048>(Wc, N, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"touch x 4" + s, t, false, [&](int a, int b) { gemv_touch<4>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"touch x 1" + s, t, false, [&](int a, int b) { gemv_touch<1>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"movntdqa" + s, t, false, [&](int a, int b) { gemv_nt<1>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"clflushopt" + s, t, false, [&](int a, int b) { gemv_nt<2>(W, K, xp, y.data(), a, b); }, {}});
    vs.push_back({"xsmall (test only)" + s, t, false, [&](int a, int b) { gemv_xsmall(W, K, xp, y.data(), a, b); }, {}});
  }
  // Pieces of P bytes in a shuffled order (one thread): the MoE step streams each expert's rows in items of
  // 128 gate + 128 up rows (2 x 512 KiB at K = 2048), scattered over the experts' memory.
  static std::vector<int> order[3];
  for (int pi = 0; pi < 3; pi++) {
    const size_t piece = (size_t)(128 << 10) << (2 * pi);  // 128 KiB, 512 KiB, 2 MiB
    const int rows = (int)(piece / ((size_t)K * 2)), count = N / rows;
    for (int c = 0; c < count; c++) order[pi].push_back(c);
    for (int c = count - 1; c > 0; c--) std::swap(order[pi][c], order[pi][(c * 7919 + 13) % (c + 1)]);
    const char* names[] = {"pieces 128K 1t", "pieces 512K 1t", "pieces 2M 1t"};
    vs.push_back({names[pi], 1, false, [&, pi, rows](int, int) {
                    for (int c : order[pi]) gemv_bf16_bt<1>(W, K, xp, K, y.data(), N, c * rows, (c + 1) * rows);
                  }, {}});
  }
  vs.push_back({"sum chunked 2t", 2, true, [&](int a, int b) { sink += sum_rows(W, K, a, b); }, {}});
  vs.push_back({"gemv chunked 2t", 2, true, [&](int a, int b) { gemv_bf16_bt<1>(W, K, xp, K, y.data(), N, a, b); }, {}});

  gemv_bf16_bt<1>(W, K, xp, K, yref.data(), N, 0, N);
  const int chunk = std::max(16, (int)((128 << 10) / (K * 2)) & ~15);
  for (int r = 0; r < rounds; r++) {
    for (auto& v : vs) {
      std::fill(y.begin(), y.end(), 0.f);
      const double t0 = now();
      double cpu = 0;
#pragma omp parallel num_threads(v.threads) reduction(max : cpu)
      {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        const double c0 = thread_cpu();
        if (v.chunked) {
          for (int c = tid; c * chunk < N; c += nt) v.run(c * chunk, std::min(N, (c + 1) * chunk));
        } else {
          int n0, n1;
          row_range(N, tid, nt, &n0, &n1);
          v.run(n0, n1);
        }
        cpu = thread_cpu() - c0;
      }
      const double dt = now() - t0;
      v.gbps.push_back(bytes / dt / 1e9);
      v.cpu_gbps.push_back(bytes / cpu / 1e9);
      if (v.name.rfind("sum", 0) != 0 && v.name.rfind("xsmall", 0) != 0 && memcmp(y.data(), yref.data(), N * sizeof(float)) != 0) {
        int i = 0;
        while (y[i] == yref[i]) i++;
        printf("MISMATCH in %s at row %d: %g vs %g\n", v.name.c_str(), i, y[i], yref[i]);
        return 1;
      }
    }
  }
  printf("K=%d rows=%d bytes=%.0f MB hugepages=%d rounds=%d\n", K, N, bytes / 1e6, huge, rounds);
  printf("  %-18s %21s  %21s  %s\n", "variant", "wall GB/s: med [best]", "by CPU time: med [best]",
         "median same-round ratio to sum (wall, CPU)");
  for (auto& v : vs) {
    std::vector<double> g = v.gbps, c = v.cpu_gbps, rw, rc;
    const Variant* ref = &vs[0];  // the plain read with the same thread count
    for (auto& u : vs)
      if (u.name == (v.threads == 1 ? "sum 1t" : "sum 2t")) ref = &u;
    for (int r = 0; r < rounds; r++) {
      rw.push_back(v.gbps[r] / ref->gbps[r]);
      rc.push_back(v.cpu_gbps[r] / ref->cpu_gbps[r]);
    }
    std::sort(g.begin(), g.end());
    std::sort(c.begin(), c.end());
    std::sort(rw.begin(), rw.end());
    std::sort(rc.begin(), rc.end());
    printf("  %-18s %11.1f [%6.1f]  %13.1f [%6.1f]  x%.3f  x%.3f\n", v.name.c_str(), g[g.size() / 2], g.back(),
           c[c.size() / 2], c.back(), rw[rounds / 2], rc[rounds / 2]);
  }
  return (int)(sink & 0);
}
