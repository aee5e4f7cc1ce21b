// Self-test of Solo's CPU kernels as a plain program, for builds that cannot load into this Python (a
// cross-compiled ARM64 build run under qemu-user; see test_cpu_arm.py). Checks every GEMV format against
// a double-precision reference and bit-for-bit across batch sizes (the integer-dot formats' outputs are
// printed as "QGEMV" lines, bit-identical to the scalar build's), the vectorized activation and norm
// against the scalar formulas, and runs whole decode steps of a tiny random model (float32 and bf16) at
// batch 2 and batch 1 (bitwise equal). Prints "LOGITS <dtype> v..." lines that the test compares with a
// scalar build of this file, and "FAIL ..." lines; exits 1 on any failure.
#include "decode.cpp"

#include <stdio.h>
#include <stdlib.h>

#include <vector>

static uint32_t rng = 12345;
static float frand() {  // uniform in [-1, 1)
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / 8388608.0f - 1.0f;
}
static int failures = 0;
#define CHECK(cond, ...)            \
  do {                              \
    if (!(cond)) {                  \
      printf("FAIL " __VA_ARGS__);  \
      printf("\n");                 \
      failures++;                   \
    }                               \
  } while (0)

static void test_gemv(int fmt, int K) {
  const int N = 37, BMAX = 5;
  std::vector<uint16_t> wb((size_t)N * K);
  std::vector<float> wf((size_t)N * K), dense((size_t)N * K), scale(N);
  std::vector<int8_t> w8((size_t)N * K);
  std::vector<uint8_t> w4((size_t)N * K / 2);
  std::vector<uint16_t> s4((size_t)N * (K / 32) + 1);
  for (size_t i = 0; i < wf.size(); i++) wf[i] = frand();
  Mat m;
  memset(&m, 0, sizeof m);
  m.format = fmt, m.rows = N, m.cols = K, m.group = 32;
  for (int n = 0; n < N; n++) {
    scale[n] = (float)(10 + n) / 1000.0f;  // no a * b + c: a compiler may fuse it on one build and not another
    for (int k = 0; k < K; k++) {
      const size_t i = (size_t)n * K + k;
      if (fmt == W_BF16) wb[i] = f32_to_bf16(wf[i]), dense[i] = bf16_to_f32(wb[i]);
      if (fmt == W_F32) dense[i] = wf[i];
      if (is_int8_format(fmt)) w8[i] = (int8_t)(int)(wf[i] * 127.0f), dense[i] = (float)w8[i] * scale[n];
    }
    if (fmt == W_INT4 || fmt == W_INT4_Q8)
      for (int g = 0; g < K / 32; g++) {
        s4[(size_t)n * (K / 32) + g] = f32_to_bf16((float)(20 + g) / 1000.0f);
        const float sc = bf16_to_f32(s4[(size_t)n * (K / 32) + g]);
        for (int i = 0; i < 16; i++) {
          const int lo = (int)(rng = rng * 1664525u + 1013904223u) >> 28 & 15, hi = (int)(rng >> 4) & 15;
          w4[(size_t)n * K / 2 + 16 * g + i] = (uint8_t)(lo | hi << 4);
          dense[(size_t)n * K + 32 * g + i] = (float)(lo - 8) * sc;
          dense[(size_t)n * K + 32 * g + 16 + i] = (float)(hi - 8) * sc;
        }
      }
  }
  m.weight = fmt == W_BF16 ? (const void*)wb.data() : fmt == W_F32 ? (const void*)wf.data()
             : is_int8_format(fmt) ? (const void*)w8.data() : (const void*)w4.data();
  m.scale = is_int8_format(fmt) ? (const void*)scale.data() : is_int4_format(fmt) ? (const void*)s4.data() : nullptr;
  std::vector<float> x((size_t)BMAX * K), single((size_t)BMAX * N), y((size_t)BMAX * N);
  for (auto& v : x) v = bf16_to_f32(f32_to_bf16(frand()));
  // The integer-dot formats multiply the input's int8 block quantization (qdot.h): the reference uses its values.
  std::vector<float> xr(x);
  if (q8_input(&m)) {
    std::vector<char> slot((size_t)K * 4);
    const int nb = q8_blocks(K);
    for (int b = 0; b < BMAX; b++) {
      quantize_q8_row(x.data() + (size_t)b * K, K, slot.data(), 8);
      for (int k = 0; k < K; k++) {
        float d;
        memcpy(&d, slot.data() + 32 * (size_t)nb + 4 * (size_t)(k / 32), 4);
        xr[(size_t)b * K + k] = (float)(int8_t)slot[k] * d;
      }
    }
  }
  std::vector<char> ws((size_t)BMAX * K * 4 + 64);
  for (int b = 0; b < BMAX; b++) solo_gemv(&m, x.data() + (size_t)b * K, 1, single.data() + (size_t)b * N, ws.data(), 2);
  for (int b = 0; b < BMAX; b++)
    for (int n = 0; n < N; n++) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        ref += (double)dense[(size_t)n * K + k] * xr[(size_t)b * K + k];
        mag += fabs((double)dense[(size_t)n * K + k] * xr[(size_t)b * K + k]);
      }
      const double got = single[(size_t)b * N + n];
      CHECK(fabs(got - ref) <= 1e-5 * mag + 1e-6, "gemv format %d K %d row %d: %g vs %g", fmt, K, n, got, ref);
    }
  for (int B = 2; B <= BMAX; B++) {
    solo_gemv(&m, x.data(), B, y.data(), ws.data(), 2);
    CHECK(memcmp(y.data(), single.data(), (size_t)B * N * sizeof(float)) == 0,
          "gemv format %d K %d: batch %d differs from batch 1", fmt, K, B);
  }
  if (q8_input(&m)) {  // bit for bit the same at every ISA level: the test compares with the scalar build
    printf("QGEMV %d-%d", fmt, K);
    for (float v : single) printf(" %.9g", v);
    printf("\n");
  }
}

static void test_elementwise() {
  const int n = 203;
  std::vector<float> g(n), u(n), out(n), src(n), dst(n), w(n);
  for (int i = 0; i < n; i++) g[i] = 8.0f * frand(), u[i] = frand(), src[i] = frand(), w[i] = frand();
  for (int act = ACT_SILU; act <= ACT_GELU_TANH; act++) {
    act_mul(g.data(), u.data(), out.data(), 0, n, act, 0);
    for (int i = 0; i < n; i++) {
      const float ref = activation(g[i], act) * u[i];
      CHECK(fabsf(out[i] - ref) <= 1e-5f * fabsf(g[i] * u[i]) + 1e-6f, "act %d at %d: %g vs %g", act, i, out[i], ref);
    }
  }
  rms_norm(src.data(), dst.data(), n, w.data(), 1e-6f, 0, 0);
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)src[i] * src[i];
  for (int i = 0; i < n; i++) {
    const double ref = w[i] * src[i] / sqrt(ss / n + 1e-6);
    CHECK(fabs(dst[i] - ref) <= 1e-5 * fabs(ref) + 1e-6, "rms_norm at %d: %g vs %g", i, dst[i], ref);
  }
}

// A tiny random model, decoded at batch 2 and at batch 1 (bitwise equal); prints the last logits.
static void test_decode(int bf) {
  const int h = 64, heads = 4, kvh = 2, hd = 16, f = 96, vocab = 40, layers = 2, max_seq = 16, rows = 2;
  const int nq = heads * hd, nkv = kvh * hd;
  std::vector<std::vector<float>> f32s;
  std::vector<std::vector<uint16_t>> bf16s;
  auto tensor = [&](size_t count, float amp, float offset) -> void* {
    std::vector<float> v(count);
    for (auto& e : v) e = bf16_to_f32(f32_to_bf16(offset + amp * frand()));
    if (!bf) {
      f32s.push_back(v);
      return f32s.back().data();
    }
    std::vector<uint16_t> b(count);
    for (size_t i = 0; i < count; i++) b[i] = f32_to_bf16(v[i]);
    bf16s.push_back(b);
    return bf16s.back().data();
  };
  f32s.reserve(64), bf16s.reserve(64);
  auto mat = [&](int r, int c) {
    Mat m;
    memset(&m, 0, sizeof m);
    m.format = bf ? W_BF16 : W_F32, m.rows = r, m.cols = c, m.group = 32;
    m.weight = tensor((size_t)r * c, 0.3f, 0.f);
    return m;
  };
  std::vector<Layer> L(layers);
  const size_t cache = (size_t)rows * kvh * max_seq * hd;
  for (auto& l : L) {
    memset(&l, 0, sizeof l);
    l.qkv = mat(nq + 2 * nkv, h), l.o = mat(h, nq), l.gate_up = mat(2 * f, h), l.down = mat(h, f);
    l.attn_norm = tensor(h, 0.1f, 1.f), l.mlp_norm = tensor(h, 0.1f, 1.f);
    l.k_cache = tensor(cache, 0.f, 0.f), l.v_cache = tensor(cache, 0.f, 0.f);
  }
  Model m;
  memset(&m, 0, sizeof m);
  m.dtype = bf ? DT_BF16 : DT_F32, m.hidden = h, m.heads = heads, m.kv_heads = kvh, m.head_dim = hd, m.inter = f;
  m.vocab = vocab, m.layers = layers, m.max_seq = max_seq, m.cache_rows = rows, m.act = ACT_SILU;
  m.eps = 1e-6f, m.attn_scale = 0.25f;
  m.embed = tensor((size_t)vocab * h, 1.f, 0.f), m.final_norm = tensor(h, 0.1f, 1.f);
  m.head = mat(vocab, h);
  m.layer = L.data();
  std::vector<float> cosv((size_t)max_seq * hd), sinv((size_t)max_seq * hd);
  for (int p = 0; p < max_seq; p++)
    for (int i = 0; i < hd; i++) {
      const float a = p * powf(10000.f, -(float)(2 * (i % (hd / 2))) / hd);
      cosv[(size_t)p * hd + i] = rnd(cosf(a), bf), sinv[(size_t)p * hd + i] = rnd(sinf(a), bf);
    }
  const int steps = 6;
  std::vector<float> batched((size_t)rows * vocab), single((size_t)rows * vocab);
  std::vector<char> ws(solo_workspace_bytes(&m, rows, 2));
  for (int pass = 0; pass < 2; pass++) {
    for (auto& l : L) memset(l.k_cache, 0, cache * (bf ? 2 : 4)), memset(l.v_cache, 0, cache * (bf ? 2 : 4));
    for (int t = 0; t < steps; t++) {
      int64_t tok[2] = {(3 * t + 1) % vocab, (5 * t + 2) % vocab}, pos[2] = {t, t}, row[2] = {0, 1};
      std::vector<float> cs((size_t)rows * hd), sn((size_t)rows * hd);
      for (int r = 0; r < rows; r++)
        for (int i = 0; i < hd; i++) cs[(size_t)r * hd + i] = cosv[(size_t)t * hd + i], sn[(size_t)r * hd + i] = sinv[(size_t)t * hd + i];
      if (pass == 0) {
        solo_decode(&m, 2, tok, pos, row, cs.data(), sn.data(), batched.data(), ws.data(), 2);
      } else {
        for (int r = 0; r < rows; r++)
          solo_decode(&m, 1, tok + r, pos + r, row + r, cs.data(), sn.data(), single.data() + (size_t)r * vocab, ws.data(), 2);
      }
    }
  }
  CHECK(memcmp(batched.data(), single.data(), batched.size() * sizeof(float)) == 0,
        "decode (%s): batch 2 differs from batch 1", bf ? "bf16" : "f32");
  printf("LOGITS %s", bf ? "bf16" : "f32");
  for (float v : batched) printf(" %.9g", v);
  printf("\n");
}

int main() {
  printf("ISA %s\n", solo_isa());
  // Twice: with the defaults, then with the tiles (tile.h) taken at any batch, so batches 3-5 run them.
  for (int min_b : {32, 1}) {
    solo_set_knob("pass_min_b", min_b);
    for (int fmt : {W_BF16, W_F32, W_INT8})
      for (int K : {77, 896}) test_gemv(fmt, K);
    for (int K : {96, 896}) test_gemv(W_INT4, K);
    for (int K : {77, 896}) test_gemv(W_INT8_Q8, K);
    for (int K : {96, 896}) test_gemv(W_INT4_Q8, K);
  }
  solo_set_knob("pass_min_b", 32);
  test_elementwise();
  test_decode(0);
  test_decode(1);
  printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
