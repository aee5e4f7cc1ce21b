// Diagnostic (not part of Solo's kernels): could AMX tiles run the bf16 products of BOTH decode and span
// prefill, keeping the rule that a (row, token) result has the same bits whatever else was computed with it?
//
// Solo's span prefill runs a prompt's products through the decode kernel's arithmetic (AVX512-BF16 dot
// products on Intel), which reaches ~190 GFLOPS on 2 cores, while oneDNN's AMX bf16 matmul reaches 1400-1700
// on the same machine. AMX could take both paths only if (1) a token's result does not depend on the other
// tokens of the tile and (2) batch-1 decode on AMX streams the weights as fast as the AVX-512 kernel. This
// program measures both on row-major bf16 weights [N, K] (the layout Solo keeps): the weights are the A
// tiles (16 rows x 32 k), the tokens the B tile (k pairs x T tokens, "VNNI" order), C = 16 rows x T tokens.
//
//   g++ -O3 -march=native -mamx-tile -mamx-bf16 -fopenmp benchmarks/amx_gemv_probe.cpp -o amx_gemv_probe
//   ./amx_gemv_probe 2048 262144   # K, N: 1 GiB of weights (more than the last-level cache)
//
// Prints: mismatches between each token computed alone (T = 1) and inside a 16-token tile; the largest
// difference from a float64 reference; decode GB/s (2 threads, T = 1) for A tiles of 16 adjacent rows and
// for A tiles whose 16 rows come from 16 contiguous runs (stride q rows), next to an AVX512-BF16 kernel of
// four row streams (Solo's decode kernel's read pattern); and 16-token products in GFLOPS.
// Needs Linux >= 5.16 (arch_prctl permission for the tile data) and a CPU with AMX-BF16.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {
constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0, 3: C (16 rows x T floats); 1, 4: A (16 rows x 32 bf16); 2: B (16 k pairs x T tokens).
void configure(int tokens) {
  TileConfig c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t : {0, 2, 3}) c.rows[t] = 16, c.colsb[t] = (uint16_t)(4 * tokens);
  for (int t : {1, 4}) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// y[t, n] for rows [n0, n1) (a multiple of 32). xv: T tokens in k-pair order [K / 2][T][2]. runs false:
// tiles of 16 adjacent rows; true: tile row r of step i is row n0 + i + r * q (32 runs of q rows).
template <int T>
void amx_rows(const uint16_t* w, int k_dim, const uint16_t* xv, float* y, int ldy, int n0, int n1, bool runs) {
  alignas(64) float c[16 * 16];
  const int q = (n1 - n0) / 32;  // blocks of 32 adjacent rows, or rows per run
  for (int i = 0; i < q; i++) {
    const int first = runs ? n0 + i : n0 + 32 * i, gap = runs ? q : 1;
    _tile_zero(0);
    _tile_zero(3);
    const uint16_t* a = w + (size_t)first * k_dim;
    const uint16_t* a2 = w + (size_t)(first + 16 * gap) * k_dim;
    const size_t stride = (size_t)gap * k_dim * 2;
    for (int k = 0; k < k_dim; k += 32) {
      _tile_loadd(1, a + k, stride);
      _tile_loadd(4, a2 + k, stride);
      _tile_loadd(2, xv + (size_t)k * T, 4 * T);
      _tile_dpbf16ps(0, 1, 2);
      _tile_dpbf16ps(3, 4, 2);
    }
    _tile_stored(0, c, 4 * T);
    for (int m = 0; m < 16; m++)
      for (int t = 0; t < T; t++) y[(size_t)t * ldy + first + m * gap] = c[m * T + t];
    _tile_stored(3, c, 4 * T);
    for (int m = 0; m < 16; m++)
      for (int t = 0; t < T; t++) y[(size_t)t * ldy + first + (16 + m) * gap] = c[m * T + t];
  }
}

// Four rows at once, one from each of four contiguous runs, four accumulators each (the read pattern of
// Solo's AVX512-BF16 decode kernel; K a multiple of 128).
void avx512_rows4(const uint16_t* w, int k_dim, const uint16_t* x, float* y, int n0, int n1) {
  const int q = (n1 - n0) / 4;
  for (int i = 0; i < q; i++) {
    const uint16_t* r[4];
    for (int s = 0; s < 4; s++) r[s] = w + (size_t)(n0 + s * q + i) * k_dim;
    __m512 acc[4][4];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_ps();
    for (int k = 0; k < k_dim; k += 128)
      for (int s = 0; s < 4; s++)
        for (int j = 0; j < 4; j++) {
          __builtin_prefetch((const char*)(r[s] + k + 32 * j) + 4096);
          acc[s][j] = _mm512_dpbf16_ps(acc[s][j], (__m512bh)_mm512_loadu_si512(r[s] + k + 32 * j),
                                       (__m512bh)_mm512_loadu_si512(x + k + 32 * j));
        }
    for (int s = 0; s < 4; s++)
      y[n0 + s * q + i] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[s][0], acc[s][1]), _mm512_add_ps(acc[s][2], acc[s][3])));
  }
}

template <class F>
double seconds_per_call(int iters, F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; it++) body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s K N  (K a multiple of 128, N of 64)\n", argv[0]);
    return 2;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata)) {
    fprintf(stderr, "the kernel refused AMX tile data (arch_prctl)\n");
    return 1;
  }
  const int k_dim = atoi(argv[1]), n = atoi(argv[2]);
  srand(1);
  std::vector<uint16_t> w((size_t)n * k_dim), x((size_t)16 * k_dim);
  for (auto& v : w) v = to_bf16(rand() / (float)RAND_MAX - 0.5f);
  for (auto& v : x) v = to_bf16(rand() / (float)RAND_MAX - 0.5f);
  auto pack = [&](int tokens, int t0) {  // tokens t0 .. t0 + tokens - 1 in k-pair order
    std::vector<uint16_t> xv((size_t)k_dim * tokens);
    for (int kp = 0; kp < k_dim / 2; kp++)
      for (int t = 0; t < tokens; t++)
        for (int p = 0; p < 2; p++) xv[((size_t)kp * tokens + t) * 2 + p] = x[(size_t)(t0 + t) * k_dim + 2 * kp + p];
    return xv;
  };
  const std::vector<uint16_t> x16 = pack(16, 0);
  std::vector<float> y16((size_t)16 * n), y1(n);
  configure(16);
  amx_rows<16>(w.data(), k_dim, x16.data(), y16.data(), n, 0, n, false);
  long mismatches = 0;
  for (int t = 0; t < 16; t++) {
    const std::vector<uint16_t> x1 = pack(1, t);
    configure(1);
    amx_rows<1>(w.data(), k_dim, x1.data(), y1.data(), n, 0, n, false);
    for (int r = 0; r < n; r++) mismatches += memcmp(&y1[r], &y16[(size_t)t * n + r], 4) != 0;
  }
  double max_err = 0;
  for (int r = 0; r < 64; r++) {
    double s = 0;
    for (int k = 0; k < k_dim; k++) s += (double)from_bf16(w[(size_t)r * k_dim + k]) * from_bf16(x[k]);
    max_err = std::max(max_err, std::fabs(s - y16[r]));
  }
  printf("K=%d N=%d: T=1 vs T=16 mismatches %ld of %ld, max |error| vs float64 %.3g\n", k_dim, n, mismatches,
         16L * n, max_err);
  const std::vector<uint16_t> x1 = pack(1, 0);
  const double bytes = (double)n * k_dim * 2;
  for (int rep = 0; rep < 3; rep++) {
    const double adjacent = seconds_per_call(10, [&] {
#pragma omp parallel num_threads(2)
      {
        configure(1);
        const int per = n / 2, tid = omp_get_thread_num();
        amx_rows<1>(w.data(), k_dim, x1.data(), y1.data(), n, tid * per, tid * per + per, false);
      }
    });
    const double runs = seconds_per_call(10, [&] {
#pragma omp parallel num_threads(2)
      {
        configure(1);
        const int per = n / 2, tid = omp_get_thread_num();
        amx_rows<1>(w.data(), k_dim, x1.data(), y1.data(), n, tid * per, tid * per + per, true);
      }
    });
    const double avx = seconds_per_call(10, [&] {
#pragma omp parallel num_threads(2)
      {
        const int per = n / 2, tid = omp_get_thread_num();
        avx512_rows4(w.data(), k_dim, x.data(), y1.data(), tid * per, tid * per + per);
      }
    });
    printf("decode GB/s: AMX adjacent rows %.1f | AMX 32 runs %.1f | AVX512-BF16 4 streams %.1f\n",
           bytes / adjacent / 1e9, bytes / runs / 1e9, bytes / avx / 1e9);
  }
  const double prefill = seconds_per_call(3, [&] {
#pragma omp parallel num_threads(2)
    {
      configure(16);
      const int per = n / 2, tid = omp_get_thread_num();
      amx_rows<16>(w.data(), k_dim, x16.data(), y16.data(), n, tid * per, tid * per + per, false);
    }
  });
  printf("16-token products: %.0f GFLOPS\n", 2.0 * n * k_dim * 16 / prefill / 1e9);
  return mismatches != 0;
}
