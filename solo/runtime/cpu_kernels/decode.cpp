// Solo's CPU decode step: the whole transformer step for a batch of single tokens in one call.
//
// Built at first use by solo/runtime/cpu_build.py (c++ -O3 -fopenmp plus the ISA level's flags) and called
// through ctypes with raw pointers, so a decode step costs one Python call instead of hundreds of torch ops.
//
// Layout: one OpenMP parallel region per step. Matrix-vector products split the weight rows across
// threads in chunks (each thread streams its own contiguous run of row-major rows, then takes chunks left
// in another's run: gemv.h, share_rows); attention splits (sequence, group of query heads sharing a KV
// head) pairs, so a GQA group reads its cached keys and values once; the small elementwise work between
// them (norms, RoPE, residuals) is repeated by every thread on its own copy, and the MLP activation runs
// per chunk of gate/up rows, so only five barriers per layer remain. Numerics mirror the eager reference
// (solo/model/layers.py): wherever eager PyTorch rounds an activation to the weights' dtype, this code
// rounds too (round-to-nearest-even to bf16), so greedy tokens match; accumulation is float32.
//
// Weight formats: bf16 (AVX512-BF16 dot products), f32, int8 with one float32 scale per output row, and
// int4 with one bf16 scale per group of 32 inputs (symmetric, value = (nibble - 8) * scale).
// The source is compiled once per ISA level (common.h): AVX-512 intrinsics, portable vector-extension
// kernels for AVX2 and NEON (simd.h), or plain loops.

//
// This file holds the library's exported functions (extern "C", called through ctypes from cpu.py,
// quant.py and the bench): the decode step, the prefill helpers, dequantization and the bandwidth
// probe. common.h, gemv.h and elementwise.h hold the pieces; moe.h the mixture-of-experts MLP (routing and
// the selected experts inside the step), which replaces a layer's dense MLP where the model has one.
#include "common.h"
#include "elementwise.h"
#include "gemv.h"
#include "moe.h"
#include "simd.h"

#include <linux/futex.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// ------------------------------------------------------------------------------------- the step

static inline int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

// The decode step's barrier: spin (with the CPU's spin-wait hint) for a bounded time, then sleep on a
// futex. A decode step crosses ~5 barriers per layer and the waits are usually microseconds, so a
// sleep/wake on each (what an OpenMP barrier soon falls back to) would cost a scheduler round trip; but
// spinning without bound collapses on a busy machine: a thread whose core is taken by another process
// arrives late while the others burn the remaining cores (700 -> 160-350 tok/s in an earlier user trial).
// After 2 ms of spinning (SOLO_CPU_SPIN_US overrides it) the waiters sleep, so the late thread's work
// can run on their cores. 2 ms covers the load imbalance of a large matrix split over the cores: with
// 50 us, waiters slept and paid a futex wake-up at most barriers, and Qwen2.5-0.5B decode fell from 74%
// to 50% of the roofline on an idle 2-core Sapphire Rapids VM.
static int64_t spin_budget_ns() {
  static const int64_t ns = [] {
    const char* env = getenv("SOLO_CPU_SPIN_US");
    const long us = env && *env ? atol(env) : 2000;
    return (int64_t)(us < 0 ? 0 : us > 10000000 ? 10000000 : us) * 1000;  // at most 10 s, as cpu_build checks
  }();
  return ns;
}
typedef struct {
  std::atomic<int> arrived;
  std::atomic<int> generation;  // the futex word
  std::atomic<int> sleepers;
  std::atomic<int> late;        // waits longer than g_late_wait_ns (see solo_decode)
} SpinBarrier;

static inline int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// A wait this long at a barrier means another thread of the step was off its core (preempted by other
// work): with rows shared out in chunks, the threads of an idle machine reach a barrier within
// microseconds of each other. solo_decode returns how many waits were this long; the runtime then runs
// its next steps on fewer threads (CpuRuntime's thread governor in cpu.py).
static int64_t g_late_wait_ns = 1000000;

// Read-ahead while waiting at a barrier (knob "ahead_kb", 0 = off): the bytes a thread will stream first after
// the barrier (the start of its own run of the next matrix), touched with prefetches while it spins, so the
// waiting core's share of the memory bus is not idle and its next stream starts warm.
static int g_ahead_kb = 0;
static int g_ahead_hint = 0;  // knob "ahead_hint": 0 = prefetcht0, 1 = prefetcht1, 2 = prefetcht2
static int g_spin_pause = 1;  // knob "spin_pause": 0 = spin without the PAUSE hint (measurement)
struct Ahead {
  const char* p[2] = {nullptr, nullptr};
  size_t n[2] = {0, 0};
  // Issue up to `lines` prefetches of 64 bytes from the ranges left; false when none is left.
  bool step(int lines) {
    for (int r = 0; r < 2; r++) {
      while (n[r] && lines > 0) {
        if (g_ahead_hint == 1) __builtin_prefetch(p[r], 0, 2);
        else if (g_ahead_hint == 2) __builtin_prefetch(p[r], 0, 1);
        else __builtin_prefetch(p[r], 0, 3);
        p[r] += 64;
        n[r] = n[r] > 64 ? n[r] - 64 : 0;
        lines--;
      }
    }
    return n[0] || n[1];
  }
};

static void barrier_wait(SpinBarrier* b, int nt, Ahead* ahead = nullptr) {
  if (nt == 1) return;
#if SOLO_OMP_BARRIER
  (void)b;
#pragma omp barrier
  return;
#endif
  const int gen = b->generation.load(std::memory_order_acquire);
  if (b->arrived.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    b->arrived.store(0, std::memory_order_relaxed);
    b->generation.fetch_add(1, std::memory_order_seq_cst);
    // seq_cst on both sides (Dekker): either this load sees a sleeper, or the sleeper sees the new generation.
    if (b->sleepers.load(std::memory_order_seq_cst) > 0)
      syscall(SYS_futex, (int*)&b->generation, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    return;
  }
  const int64_t start = now_ns(), deadline = start + spin_budget_ns();
  bool reading = ahead != nullptr;
  for (int spins = 1;; spins++) {
    if (b->generation.load(std::memory_order_acquire) != gen) {
      // Short waits end within 64 spins or so; only longer ones pay for a clock read.
      if (spins > 64 && now_ns() - start > g_late_wait_ns) b->late.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (reading) reading = ahead->step(8);
    else if (g_spin_pause) cpu_relax();
    if ((spins & 63) == 0 && now_ns() > deadline) break;
  }
  b->sleepers.fetch_add(1, std::memory_order_seq_cst);
  // The kernel re-checks the word before sleeping, so a release between the load and the wait is not lost.
  while (b->generation.load(std::memory_order_seq_cst) == gen)
    syscall(SYS_futex, (int*)&b->generation, FUTEX_WAIT_PRIVATE, gen, nullptr, nullptr, 0);
  b->sleepers.fetch_sub(1, std::memory_order_relaxed);
  if (now_ns() - start > g_late_wait_ns) b->late.fetch_add(1, std::memory_order_relaxed);
}

// The read-ahead for the next product over W's rows: the start of this thread's own run of chunks (share_rows'
// static split of rows [0, n), chunks of chunk_rows(W, 1, n, nt) rows); with halves = 2 (the MLP's gate/up,
// n = f) the same rows of both halves, [r, ...) and [f + r, ...). At most g_ahead_kb KiB in all.
static Ahead ahead_of(const Mat* W, int n, int halves, int tid, int nt) {
  Ahead a;
  if (!g_ahead_kb || nt == 1 || !W->weight) return a;
  const int R = chunk_rows(W, 1, n, nt), chunks = (n + R - 1) / R;
  const long c0 = (long)chunks * tid / nt, c1 = (long)chunks * (tid + 1) / nt;
  const long r0 = c0 * R, r1 = c1 * R < n ? c1 * R : n;
  if (r1 <= r0) return a;
  const size_t rb = mat_row_bytes(W), cap = ((size_t)g_ahead_kb << 10) / halves;
  for (int h = 0; h < halves; h++) {
    const size_t bytes = (size_t)(r1 - r0) * rb;
    a.p[h] = (const char*)W->weight + ((size_t)h * n + r0) * rb;
    a.n[h] = bytes < cap ? bytes : cap;
  }
  return a;
}

// Per-thread scratch floats: residual, normed / scratch, post-processed q/k/v, matrix-vector input,
// attention scores of one GQA group of query heads.
static size_t private_floats(const Model* m, int batch) {
  const size_t h = m->hidden, nq = (size_t)m->heads * m->head_dim, nkv = (size_t)m->kv_heads * m->head_dim;
  const size_t kmax = (size_t)max3(m->hidden, (int)nq, m->inter);
  const size_t group = (size_t)(m->heads / m->kv_heads);
  return ((2 * h + kmax + nq + 2 * nkv) * batch + (size_t)m->max_seq * group + 16) & ~(size_t)15;
}

// Floats of the split-KV attention parts of `batch` sequences: every block of every query head, at most.
static size_t split_kv_floats(const Model* m, int batch) {
  return (size_t)batch * m->heads * (m->head_dim + 2) * (size_t)(m->max_seq / SOLO_KV_BLOCK + 1);
}

// Bytes of workspace `solo_decode` needs for `batch` sequences and `nthreads` threads.
extern "C" size_t solo_workspace_bytes(const Model* m, int batch, int nthreads) {
  const size_t h = m->hidden, nq = (size_t)m->heads * m->head_dim, nkv = (size_t)m->kv_heads * m->head_dim;
  const size_t f = m->inter;
  size_t floats = 0;
  floats += batch * (nq + 2 * nkv);                 // q, k, v (matrix-vector output)
  floats += batch * h;                              // o / down projection output
  floats += batch * 2 * f;                          // gate, up
  floats += batch * nq;                             // attention output
  floats += 2 * batch * (size_t)max3(m->hidden, (int)nq, m->inter);  // o / down inputs (shared)
  floats += (size_t)nthreads * private_floats(m, batch);
  floats += split_kv_floats(m, batch);              // split-KV attention parts (shared)
  return floats * sizeof(float) + 256 + moe_workspace_bytes(m, batch, nthreads) + 64 * ((size_t)nthreads + 1);
}

// Bias + round the shared projection output `src` [B, h] into this thread's `dst`, apply the sandwich
// norm if any, add it to the residual `x`, and normalize the result into `normed` with `next_norm`.
static void residual_block(const Model* m, const Mat* W, const float* src, float* dst, float* x, float* normed,
                           const void* out_norm, const void* next_norm, int B) {
  const int h = m->hidden, bf = m->dtype == DT_BF16;
  memcpy(dst, src, (size_t)B * h * sizeof(float));
  finish_linear(W, dst, B, h, bf);
  for (int b = 0; b < B; b++) {
    float* tb = dst + (size_t)b * h;
    float* xb = x + (size_t)b * h;
    if (m->sandwich) rms_norm(tb, tb, h, out_norm, m->eps, m->unit_offset, bf);
    residual_add(xb, tb, h, bf);
    rms_norm(xb, normed + (size_t)b * h, h, next_norm, m->eps, m->unit_offset, bf);
  }
}

// Whether long sequences take the split-KV attention: yes unless SOLO_CPU_SPLIT_KV=0 (a measurement knob:
// the unsplit kernel's numbers for comparison).
static bool split_kv_enabled() {
  static const bool on = [] {
    const char* env = getenv("SOLO_CPU_SPLIT_KV");
    return !(env && env[0] == '0');
  }();
  return on;
}

// One layer's attention for the batch, on thread `tid` of `nt`; `att` gets the outputs and `o_in` the
// output projection's input. Work items: (sequence, group of `gs` query heads sharing a KV head), and for a
// sequence whose keys span several SOLO_KV_BLOCK blocks (vector kernels only), one item per block of it:
// its parts go to `parts`, and after a barrier each (sequence, group) is merged by one thread
// (flash-decoding; see "split-KV attention" in elementwise.h). At batch 1 and long context this keeps
// every thread streaming its share of the KV cache whatever the number of KV heads.
static void attention_layer(const Model* m, const Layer* L, int B, const float* lq, const int64_t* rows,
                            const int64_t* positions, int gs, float* scores, float* att, void* o_in, float* parts,
                            SpinBarrier* bar, int tid, int nt) {
  const int hd = m->head_dim, nq = m->heads * hd, nkv = m->kv_heads * hd, nqkv = nq + 2 * nkv;
  const int bf = m->dtype == DT_BF16;
  const int per = gs > 0 ? gs : 1, groups = m->heads / per, kv_group = m->heads / m->kv_heads;
  const size_t pf = part_floats(per, hd);
  const size_t in_bytes = input_elem_bytes(&L->o);
  auto start_of = [&](int b) {
    const int pos = (int)positions[b];
    return (L->window > 0 && pos - L->window + 1 > 0) ? pos - L->window + 1 : 0;
  };
  const bool can_split = gs > 0 && split_kv_enabled();
  auto blocks_of = [&](int b) { return can_split ? kv_blocks(start_of(b), (int)positions[b]) : 1; };
  long items = 0;
  bool split = false;
  for (int b = 0; b < B; b++) {
    const int nb = blocks_of(b);
    items += (long)groups * nb;
    split = split || nb > 1;
  }
  long i0 = items * tid / nt, i1 = items * (tid + 1) / nt;
  if (B > 1) {
    // Entries at different positions (a prompt in one span, a batch of conversations) cost in proportion
    // to the keys they read: contiguous ranges of equal cost, not of equal count (a causal span split by
    // count gave the second thread three times the first's keys). Which thread computes an item never
    // changes its bits.
    auto cost_of = [&](int b, int k, int nb) {
      const int pos = (int)positions[b], start = start_of(b);
      if (nb == 1) return (double)(pos - start + 1) + 32.0;
      const int blk = start / SOLO_KV_BLOCK + k;
      const int j0 = start > blk * SOLO_KV_BLOCK ? start : blk * SOLO_KV_BLOCK;
      const int jend = pos < blk * SOLO_KV_BLOCK + SOLO_KV_BLOCK - 1 ? pos : blk * SOLO_KV_BLOCK + SOLO_KV_BLOCK - 1;
      return (double)(jend - j0 + 1) + 32.0;
    };
    double total = 0.0;
    for (int b = 0; b < B; b++) {
      const int nb = blocks_of(b);
      for (int k = 0; k < nb; k++) total += groups * cost_of(b, k, nb);
    }
    double acc = 0.0;
    long n = 0;
    i0 = i1 = -1;
    for (int b = 0; b < B && i1 < 0; b++) {
      const int nb = blocks_of(b);
      for (int grp = 0; grp < groups && i1 < 0; grp++)
        for (int k = 0; k < nb; k++, n++) {
          const double c = cost_of(b, k, nb);
          int owner = (int)((acc + 0.5 * c) * nt / total);
          owner = owner < nt - 1 ? owner : nt - 1;
          acc += c;
          if (owner == tid && i0 < 0) i0 = n;
          if (owner > tid) {
            i1 = n;
            break;
          }
        }
    }
    if (i1 < 0) i1 = items;
    if (i0 < 0) i0 = i1;
  }
  long it = 0;
  size_t part_off = 0;
  for (int b = 0; b < B && it < i1; b++) {
    const int pos = (int)positions[b], start = start_of(b), nb = blocks_of(b);
    const float* qb = lq + (size_t)b * nqkv;
    for (int grp = 0; grp < groups; grp++) {
      const int hh = grp * per, kvh = hh / kv_group;
      const float* k_now = qb + nq + (size_t)kvh * hd;
      const float* v_now = qb + nq + nkv + (size_t)kvh * hd;
      float* out = att + (size_t)b * nq + (size_t)hh * hd;
      for (int k = 0; k < nb; k++, it++) {
        if (it < i0 || it >= i1) continue;
        if (nb == 1) {
          if (gs > 0)
            attend_heads(m, L, qb + (size_t)hh * hd, k_now, v_now, (int)rows[b], pos, kvh, gs, scores,
                         (size_t)m->max_seq, out);
          else
            attend(m, L, qb + (size_t)hh * hd, k_now, v_now, (int)rows[b], pos, kvh, scores, out);
          prepare_input_cols(&L->o, att + (size_t)b * nq, 1, (char*)o_in + (size_t)b * nq * in_bytes, hh * hd,
                             (hh + per) * hd);
          continue;
        }
        const int blk = start / SOLO_KV_BLOCK + k;
        const int j0 = start > blk * SOLO_KV_BLOCK ? start : blk * SOLO_KV_BLOCK;
        const int jend = pos < blk * SOLO_KV_BLOCK + SOLO_KV_BLOCK - 1 ? pos : blk * SOLO_KV_BLOCK + SOLO_KV_BLOCK - 1;
        float* part = parts + part_off + ((size_t)grp * nb + k) * pf;
        attend_heads_part(m, L, qb + (size_t)hh * hd, k_now, v_now, (int)rows[b], pos, j0, jend, kvh, gs, scores,
                          (size_t)m->max_seq, part, part + gs, part + 2 * gs);
      }
    }
    if (nb > 1) part_off += (size_t)groups * nb * pf;
  }
  if (!split) return;
  barrier_wait(bar, nt);  // every part written
  long merges = 0;
  for (int b = 0; b < B; b++) merges += blocks_of(b) > 1 ? groups : 0;
  const long m0 = merges * tid / nt, m1 = merges * (tid + 1) / nt;
  it = 0;
  part_off = 0;
  for (int b = 0; b < B && it < m1; b++) {
    const int nb = blocks_of(b);
    if (nb == 1) continue;
    for (int grp = 0; grp < groups; grp++, it++) {
      if (it < m0 || it >= m1) continue;
      const int hh = grp * per;
      merge_attention_parts(parts + part_off + (size_t)grp * nb * pf, nb, gs, hd, bf,
                            att + (size_t)b * nq + (size_t)hh * hd);
      prepare_input_cols(&L->o, att + (size_t)b * nq, 1, (char*)o_in + (size_t)b * nq * in_bytes, hh * hd,
                         (hh + per) * hd);
    }
    part_off += (size_t)groups * nb * pf;
  }
}

// Measurement only (solo_set_knob "profile"): nanoseconds each thread spent in each phase of the decode steps
// since the last reset, read by solo_profile (solo/bench/cpu_profile.py prints them).
enum {
  PH_EMBED, PH_QKV, PH_QKV_WAIT, PH_QKV_POST, PH_ATTN, PH_ATTN_WAIT, PH_O, PH_O_WAIT, PH_RESID, PH_MLP_UP,
  PH_MLP_WAIT, PH_DOWN, PH_DOWN_WAIT, PH_HEAD,
  // an MoE layer's three phases (moe.h: moe_mlp), each followed by its barrier wait
  PH_MOE_ROUTER, PH_MOE_ROUTER_WAIT, PH_MOE_GU, PH_MOE_GU_WAIT, PH_MOE_DOWN, PH_MOE_DOWN_WAIT, PH_COUNT
};
enum { PROF_THREADS = 64 };
static int g_profile = 0;
static double g_prof_ns[PROF_THREADS][PH_COUNT];
static int64_t g_prof_steps = 0;

// solo_decode_span flags.
enum {
  // Entries may share a cache row at consecutive positions (a prompt's tail, a speculative verify): a
  // barrier after each layer's cache writes lets every entry attend over the keys the others just wrote.
  SPAN_SHARED_ROWS = 1,
  // Logits of the last entry only ([1, vocab]): a prompt's tail needs nothing else, and the LM head is
  // the largest matrix of a small model. Only with SPAN_SHARED_ROWS: its barrier is what makes every
  // entry's last-layer cache writes visible before the others are dropped (cpu.py refuses it alone).
  SPAN_LAST_LOGITS = 2,
};

// One decode step for `batch` sequences (see CpuRuntime.decode in cpu.py).
//   tokens, positions, rows: int64 [batch]; cos, sin: float32 [tables, batch, head_dim] (dtype-rounded
//   values; Layer.rope picks the table);
//   logits: float32 [batch, vocab] out ([1, vocab] with SPAN_LAST_LOGITS); workspace:
//   solo_workspace_bytes(m, batch, nthreads) bytes.
// Synchronization: the small per-token work (norms, residuals, q/k/v post-processing) is done by every
// thread on its own copy, so the only barriers are where a matrix product's output or the attention
// output must be complete: five per layer (six with SPAN_SHARED_ROWS). Returns the number of barrier waits
// longer than g_late_wait_ns (a thread was off its core: cpu_threads.py reads it).
// A row's arithmetic does not depend on the thread count, the batch or the flags: an entry's logits are
// bit for bit those of a batch-1 step at its position.
//
// Stages [l0, l1) only (solo_decode_span_layers), stage l < layers being layer l and stage `layers` the LM
// head (a whole step: [0, layers + 1)): l0 > 0 resumes a step whose stages before l0 ran in earlier calls on
// the same workspace, batch and thread count (each thread's residual stream and the next stage's input stay
// in its private workspace slice between calls); l1 <= layers stops before stage l1 (no logits). The same
// arithmetic in the same order as one whole call.
static int decode_step(const Model* m, int batch, const int64_t* tokens, const int64_t* positions,
                        const int64_t* rows, const float* cos, const float* sin, float* logits, void* workspace,
                        int nthreads, int flags, int l0, int l1) {
  const int B = batch, h = m->hidden, hd = m->head_dim, bf = m->dtype == DT_BF16;
  const int nq = m->heads * hd, nkv = m->kv_heads * hd, nqkv = nq + 2 * nkv, f = m->inter;
  const int kmax = max3(h, nq, f);
  float* qkv = (float*)workspace;
  float* proj = qkv + (size_t)B * nqkv;
  float* gu = proj + (size_t)B * h;
  float* att = gu + (size_t)B * 2 * f;
  void* o_in = att + (size_t)B * nq;
  void* down_in = (float*)o_in + (size_t)B * kmax;
  float* private_base = (float*)down_in + (size_t)B * kmax;
  float* parts = private_base + (size_t)nthreads * private_floats(m, B);  // split-KV attention parts
  void* moe_base = parts + split_kv_floats(m, B);                         // moe.h's workspace
  SpinBarrier bar;
  bar.arrived.store(0);
  bar.generation.store(0);
  bar.sleepers.store(0);
  bar.late.store(0);
  // One row queue per thread (gemv.h: share_rows), fresh for this step.
  RowQueue* queues = (RowQueue*)(((uintptr_t)moe_base + moe_workspace_bytes(m, B, nthreads) + 63) & ~(uintptr_t)63);
  for (int i = 0; i < nthreads; i++) queues[i].word.store(rowq_pack(ROWQ_FRESH, 0, 0), std::memory_order_relaxed);
  PlacedWorkers placed(nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    note_worker(placed.placement, tid);
    const int skip = m->skip_matmuls;
    unsigned calls = 0;  // share_rows generations: every thread makes the same calls in the same order
    auto no_epilogue = [](int, int) {};
    const bool prof = g_profile && tid < PROF_THREADS;
    int64_t prof_t = prof ? now_ns() : 0;
    auto mark = [&](int phase) {  // the time since the previous mark goes to `phase`
      if (!prof) return;
      const int64_t now = now_ns();
      g_prof_ns[tid][phase] += (double)(now - prof_t);
      prof_t = now;
    };
    if (prof && tid == 0) g_prof_steps++;
    int gs = attend_group_size(m, B, nt);  // query heads per attention work item (0: per-head kernel)
    // Entries still computed: all B, then with SPAN_LAST_LOGITS the last one alone once the last layer's
    // keys and values are written (below); positions_n / rows_n are the computed entries'.
    int nb = B;
    const int64_t* positions_n = positions;
    const int64_t* rows_n = rows;
    float* x = private_base + (size_t)tid * private_floats(m, B);  // residual stream [B, h]
    float* t = x + (size_t)B * h;                                    // scratch / normed [B, h]
    float* lq = t + (size_t)B * h;                                   // post-processed q, k, v [B, nqkv]
    void* xin = lq + (size_t)B * nqkv;                               // matrix-vector input [B, kmax]
    float* scores = (float*)xin + (size_t)B * kmax;                  // attention scores [group, max_seq]
    if (l0 == 0) {
      for (int b = 0; b < B; b++) {
        for (int i = 0; i < h; i++) {
          float v = load_act(m->embed, (size_t)tokens[b] * h + i, bf);
          if (m->embed_scale != 0.f) v = rnd(v * rnd(m->embed_scale, bf), bf);
          x[(size_t)b * h + i] = v;
        }
        rms_norm(x + (size_t)b * h, t + (size_t)b * h, h, m->layer[0].attn_norm, m->eps, m->unit_offset, bf);
      }
      prepare_input(&m->layer[0].qkv, t, B, xin);
    }
    mark(PH_EMBED);
    for (int l = l0; l < l1 && l < m->layers; l++) {
      const Layer* L = &m->layer[l];
      // --- q, k, v projections, then bias, q/k norms and RoPE on this thread's own copy
      const Layer* Ln = l + 1 < m->layers ? &m->layer[l + 1] : nullptr;
      const MoeLayer* MLc = moe_layer(m, l);
      gemv_shared(&L->qkv, xin, B, qkv, nqkv, queues, calls++, tid, nt, skip, no_epilogue);
      mark(PH_QKV);
      Ahead ah = ahead_of(&L->o, L->o.rows, 1, tid, nt);
      barrier_wait(&bar, nt, &ah);
      mark(PH_QKV_WAIT);
      memcpy(lq, qkv, (size_t)B * nqkv * sizeof(float));
      finish_linear(&L->qkv, lq, B, nqkv, bf);
      for (int b = 0; b < B; b++) {
        float* qb = lq + (size_t)b * nqkv;
        if (m->qk_norm == 2) {  // OLMoE: one norm over the whole q and one over the whole k
          rms_norm(qb, qb, nq, L->q_norm, m->eps, m->unit_offset, bf);
          rms_norm(qb + nq, qb + nq, nkv, L->k_norm, m->eps, m->unit_offset, bf);
        }
        for (int hh = 0; hh < m->heads + m->kv_heads; hh++) {
          float* v = qb + (size_t)hh * hd;
          if (m->qk_norm == 1)
            rms_norm(v, v, hd, hh < m->heads ? L->q_norm : L->k_norm, m->eps, m->unit_offset, bf);
          const size_t t = ((size_t)L->rope * B + b) * hd;
          rope(v, cos + t, sin + t, hd, bf);
        }
        if (tid == 0) {
          // The cache slot is read by attention only in later steps (this step's keys and values come
          // from each thread's copy), so one writer and no barrier.
          const size_t pos = (size_t)positions[b];
          for (int kh = 0; kh < m->kv_heads; kh++) {
            const size_t off = (((size_t)rows[b] * m->kv_heads + kh) * m->max_seq + pos) * hd;
            for (int i = 0; i < hd; i++) {
              store_act(L->k_cache, off + i, qb[nq + kh * hd + i], bf);
              store_act(L->v_cache, off + i, qb[nq + nkv + kh * hd + i], bf);
            }
          }
        }
      }
      if (flags & SPAN_SHARED_ROWS) barrier_wait(&bar, nt);  // entries read each other's cache slots
      if ((flags & SPAN_LAST_LOGITS) && l + 1 == m->layers && nb > 1) {
        // Only the last entry's logits are wanted, and every entry's keys and values are written: the rest
        // of the last layer (attention, o, the MLP: 1/layers of a prompt's products) runs for it alone, on
        // each thread's own copy moved to slot 0. The same bits: an entry's arithmetic never depends on the
        // others (llama.cpp skips the same rows of its last layer).
        memmove(lq, lq + (size_t)(nb - 1) * nqkv, (size_t)nqkv * sizeof(float));
        memmove(x, x + (size_t)(nb - 1) * h, (size_t)h * sizeof(float));
        positions_n += nb - 1, rows_n += nb - 1, nb = 1;
        gs = attend_group_size(m, nb, nt);
      }
      // --- attention: (sequence, group of query heads sharing a KV head[, key block]) split across threads
      mark(PH_QKV_POST);
      attention_layer(m, L, nb, lq, rows_n, positions_n, gs, scores, att, o_in, parts, &bar, tid, nt);
      mark(PH_ATTN);
      ah = ahead_of(&L->o, L->o.rows, 1, tid, nt);
      barrier_wait(&bar, nt, &ah);
      mark(PH_ATTN_WAIT);
      // --- output projection and residual
      gemv_shared(&L->o, private_input(&L->o, o_in, nb, xin), nb, proj, h, queues, calls++, tid, nt, skip,
                  no_epilogue);
      mark(PH_O);
      ah = MLc ? Ahead() : ahead_of(&L->gate_up, f, 2, tid, nt);
      barrier_wait(&bar, nt, &ah);
      mark(PH_O_WAIT);
      residual_block(m, &L->o, proj, t, x, t, L->attn_out_norm, L->mlp_norm, nb);
      mark(PH_RESID);
      const float* mlp_out = proj;  // the MLP's output [nb, h] (an MoE layer may leave it in its own buffer)
      if (const MoeLayer* ML = MLc) {
        // --- mixture-of-experts MLP (moe.h): routing and the selected experts; output in proj, barrier included
        mlp_out = moe_mlp(m, ML, t, nb, proj, moe_base, tid, nt, skip, [&](int phase) {
          mark(PH_MOE_ROUTER + 2 * phase);
          barrier_wait(&bar, nt);
          mark(PH_MOE_ROUTER + 2 * phase + 1);
        });
        mark(PH_MLP_UP);
      } else {
        prepare_input(&L->gate_up, t, nb, xin);
        // --- MLP: gate and up rows i together (both halves of gate_up), then the activation of those i on the
        // same thread, into the down projection's input (no barrier between them); then down
        // rows of each half per chunk (two linear runs of a chunk's size)
        const int R = chunk_rows(&L->gate_up, nb, f, nt);
        const size_t down_esz = input_elem_bytes(&L->down);
        const ProductInput gu_in = product_input(&L->gate_up, xin, h, nb, skip);
        share_rows(queues, calls++, (f + R - 1) / R, tid, nt, claim_chunks(nb), [&](int c0, int c1) {
          const int i0 = c0 * R, i1 = c1 * R < f ? c1 * R : f;
          gemv_rows_pair(&L->gate_up, gu_in, nb, gu, 2 * f, i0, i1, f + i0, skip);
          finish_linear_rows(&L->gate_up, gu, nb, 2 * f, bf, i0, i1);
          finish_linear_rows(&L->gate_up, gu, nb, 2 * f, bf, f + i0, f + i1);
          for (int b = 0; b < nb; b++) {
            float* g = gu + (size_t)b * 2 * f;
            act_mul(g, g + f, g, i0, i1, m->act, bf);  // in place: the gate half holds the product
            prepare_input_cols(&L->down, g, 1, (char*)down_in + (size_t)b * f * down_esz, i0, i1);
          }
        });
        mark(PH_MLP_UP);
        ah = ahead_of(&L->down, L->down.rows, 1, tid, nt);
        barrier_wait(&bar, nt, &ah);
        mark(PH_MLP_WAIT);
        gemv_shared(&L->down, private_input(&L->down, down_in, nb, xin), nb, proj, h, queues, calls++, tid, nt,
                    skip, no_epilogue);
        mark(PH_DOWN);
        const Mat* next = Ln ? &Ln->qkv : &m->head;
        ah = ahead_of(next, next->rows, 1, tid, nt);
        barrier_wait(&bar, nt, &ah);
        mark(PH_DOWN_WAIT);
      }
      const bool last = l + 1 == m->layers;
      residual_block(m, &L->down, mlp_out, t, x, t, L->mlp_out_norm, last ? m->final_norm : m->layer[l + 1].attn_norm,
                     nb);
      prepare_input(last ? &m->head : &m->layer[l + 1].qkv, t, nb, xin);
      mark(PH_RESID);
    }
    // --- LM head; each thread finishes the logits it computed (same row split as gemv)
    if (l1 > m->layers) {  // else a step paused before stage l1 (solo_decode_span_layers)
      const int HB = (flags & SPAN_LAST_LOGITS) ? 1 : nb;  // entries that get logits: the last HB
      const char* head_in = (const char*)xin + (size_t)(nb - HB) * m->head.cols * input_elem_bytes(&m->head);
      const float cap = m->final_softcap;
      gemv_shared(&m->head, head_in, HB, logits, m->vocab, queues, calls++, tid, nt, skip, [&](int n0, int n1) {
        finish_linear_rows(&m->head, logits, HB, m->vocab, bf, n0, n1);
        if (cap > 0.f) {
          for (int b = 0; b < HB; b++)
            for (int n = n0; n < n1; n++) {
              float* v = logits + (size_t)b * m->vocab + n;
              *v = rnd(rnd(tanhf(rnd(*v / cap, bf)), bf) * cap, bf);
            }
        }
      });
      mark(PH_HEAD);
    }
  }
  return bar.late.load();
}

extern "C" int solo_decode(const Model* m, int batch, const int64_t* tokens, const int64_t* positions,
                           const int64_t* rows, const float* cos, const float* sin, float* logits, void* workspace,
                           int nthreads) {
  return decode_step(m, batch, tokens, positions, rows, cos, sin, logits, workspace, nthreads, 0, 0, m->layers + 1);
}

// Several tokens through the decode step at once, with `flags` (SPAN_*): a speculative verify (every
// position's logits) or a short prompt tail after a cached prefix (the last position's logits), where
// streaming the weights once for all tokens costs less than batched matmuls' fixed costs.
extern "C" int solo_decode_span(const Model* m, int batch, const int64_t* tokens, const int64_t* positions,
                                const int64_t* rows, const float* cos, const float* sin, float* logits,
                                void* workspace, int nthreads, int flags) {
  return decode_step(m, batch, tokens, positions, rows, cos, sin, logits, workspace, nthreads, flags, 0,
                     m->layers + 1);
}

// solo_decode_span over stages [l0, l1) only (layers, then the LM head as stage `layers`), so a caller can
// pause a step between layers (a server serving a new request's first token before the rest of a long
// batched step) and resume it: see decode_step. Returns -1 for a range outside 0 <= l0 <= l1 <= layers + 1,
// or SPAN_LAST_LOGITS on a call that does not run the last layer and the head.
extern "C" int solo_decode_span_layers(const Model* m, int batch, const int64_t* tokens, const int64_t* positions,
                                       const int64_t* rows, const float* cos, const float* sin, float* logits,
                                       void* workspace, int nthreads, int flags, int l0, int l1) {
  // SPAN_LAST_LOGITS moves the last entry to slot 0 in the last layer: that layer and the head in one call.
  if (l0 < 0 || l1 < l0 || l1 > m->layers + 1 || ((flags & SPAN_LAST_LOGITS) && (l1 <= m->layers || l0 >= m->layers)))
    return -1;
  return decode_step(m, batch, tokens, positions, rows, cos, sin, logits, workspace, nthreads, flags, l0, l1);
}

// ------------------------------------------------------------------------------ prefill pieces
// Prefill runs its matrix products as batched PyTorch matmuls (oneDNN, AMX where present); these
// functions do everything between them for S tokens at once, row-parallel, with the decode step's
// rounding (so the cache they fill matches what decode would have written).

static void store_row(void* out, size_t off, const float* v, int n, int bf) {
  for (int i = 0; i < n; i++) store_act(out, off + i, v[i], bf);
}

// normed[s] = rms_norm(x[s]) for S rows of x (float32 [S, h]); normed in the activation dtype.
extern "C" void solo_prefill_norm(const Model* m, const float* x, int S, const void* w, void* normed, int nthreads) {
  const int h = m->hidden, bf = m->dtype == DT_BF16;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int s = 0; s < S; s++) {
    float tmp[16384];
    float* t = h <= 16384 ? tmp : nullptr;
    if (!t) continue;
    rms_norm(x + (size_t)s * h, t, h, w, m->eps, m->unit_offset, bf);
    store_row(normed, (size_t)s * h, t, h, bf);
  }
}

// q/k norms and RoPE on qkv (activation dtype [S, nq + 2 nkv], biases already added), keys and values
// written to cache row `row` at positions start..start+S-1, queries to q_out [heads, S, head_dim];
// cos, sin: float32 [tables, S, head_dim].
extern "C" void solo_prefill_qkv(const Model* m, int layer, const void* qkv, int S, int start, int row,
                                 const float* cos, const float* sin, void* q_out, int nthreads) {
  const Layer* L = &m->layer[layer];
  const int hd = m->head_dim, bf = m->dtype == DT_BF16;
  const int nq = m->heads * hd, nkv = m->kv_heads * hd, nqkv = nq + 2 * nkv;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int s = 0; s < S; s++) {
    float v[1024];
    const size_t pos = (size_t)start + s;
    for (int hh = 0; hh < m->heads + 2 * m->kv_heads; hh++) {
      for (int i = 0; i < hd; i++) v[i] = load_act(qkv, (size_t)s * nqkv + (size_t)hh * hd + i, bf);
      if (hh < m->heads + m->kv_heads) {
        if (m->qk_norm == 1)
          rms_norm(v, v, hd, hh < m->heads ? L->q_norm : L->k_norm, m->eps, m->unit_offset, bf);
        const size_t t = ((size_t)L->rope * S + s) * hd;
        rope(v, cos + t, sin + t, hd, bf);
      }
      if (hh < m->heads) {
        store_row(q_out, ((size_t)hh * S + s) * hd, v, hd, bf);
      } else {
        const int kh = hh < m->heads + m->kv_heads ? hh - m->heads : hh - m->heads - m->kv_heads;
        void* cache = hh < m->heads + m->kv_heads ? L->k_cache : L->v_cache;
        store_row(cache, (((size_t)row * m->kv_heads + kh) * m->max_seq + pos) * hd, v, hd, bf);
      }
    }
  }
}

// x[s] += (sandwich-normed) proj[s] (activation dtype [S, h], biases already added), then
// normed[s] = rms_norm(x[s]) with next_norm; x float32 [S, h].
extern "C" void solo_prefill_residual(const Model* m, float* x, const void* proj, int S, const void* out_norm,
                                      const void* next_norm, void* normed, int nthreads) {
  const int h = m->hidden, bf = m->dtype == DT_BF16;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int s = 0; s < S; s++) {
    float tmp[16384];
    if (h > 16384) continue;
    for (int i = 0; i < h; i++) tmp[i] = load_act(proj, (size_t)s * h + i, bf);
    if (m->sandwich) rms_norm(tmp, tmp, h, out_norm, m->eps, m->unit_offset, bf);
    float* xs = x + (size_t)s * h;
    residual_add(xs, tmp, h, bf);
    rms_norm(xs, tmp, h, next_norm, m->eps, m->unit_offset, bf);
    store_row(normed, (size_t)s * h, tmp, h, bf);
  }
}

// out[s] = act(gate[s]) * up[s] from gu (activation dtype [S, 2f]: gate then up); out [S, f].
extern "C" void solo_prefill_act(const Model* m, const void* gu, int S, void* out, int nthreads) {
  const int f = m->inter, bf = m->dtype == DT_BF16;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int s = 0; s < S; s++) {
    for (int i0 = 0; i0 < f; i0 += 1024) {
      const int n = f - i0 < 1024 ? f - i0 : 1024;
      float g[1024], u[1024];
      for (int i = 0; i < n; i++) {
        g[i] = load_act(gu, (size_t)s * 2 * f + i0 + i, bf);
        u[i] = load_act(gu, (size_t)s * 2 * f + f + i0 + i, bf);
      }
      act_mul(g, u, g, 0, n, m->act, bf);
      store_row(out, (size_t)s * f + i0, g, n, bf);
    }
  }
}

// One matrix-vector product over all threads (tests and the kernel benchmark): y [B, rows] = x [B, cols] W^T.
extern "C" void solo_gemv(const Mat* W, const float* x, int batch, float* y, void* workspace, int nthreads) {
  PlacedWorkers placed(nthreads);
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp single
    prepare_input(W, x, batch, workspace);
    gemv(W, workspace, batch, y, W->rows, omp_get_thread_num(), omp_get_num_threads());
  }
}

// Dequantize an int8/int4 matrix into a dense [rows, cols] bf16 (out_bf16 = 1) or float32 matrix, with
// the same rounding as the PyTorch reference (solo/runtime/quant.py: dequantize). Used by prefill.
// bf16 w [rows, cols] into the amx level's packed layout (amx.h; solo/runtime/cpu_packing.py's reference
// pack_bf16_amx): out [ceil(rows / 16)][ceil(cols / 32)][512], zero-padded; 16-row groups shared among threads.
extern "C" void solo_pack_bf16_amx(const uint16_t* w, int rows, int cols, uint16_t* out, int nthreads) {
  const int groups = (rows + 15) / 16, steps = (cols + 31) / 32;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int g = 0; g < groups; g++)
    for (int s = 0; s < steps; s++) {
      uint16_t* d = out + ((size_t)g * steps + s) * 512;
      for (int n = 0; n < 16; n++) {
        const int r = 16 * g + n;
        uint16_t src[32];
        for (int i = 0; i < 32; i++) src[i] = r < rows && 32 * s + i < cols ? w[(size_t)r * cols + 32 * s + i] : 0;
        for (int v = 0; v < 16; v++)  // lane n of vector v: [k + 2, k] of the row's even (v even) or odd elements
          for (int h = 0; h < 2; h++) d[(v * 16 + n) * 2 + h] = src[4 * (v / 2) + 2 * (1 - h) + v % 2];
      }
    }
}

extern "C" void solo_dequantize(const Mat* W, void* out, int out_bf16, int nthreads) {
  const int K = W->cols;
  PlacedWorkers placed(nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int n = 0; n < W->rows; n++) {
    float row[32];
    for (int k0 = 0; k0 < K; k0 += 32) {
      const int len = K - k0 < 32 ? K - k0 : 32;
      if (is_int8_format(W->format)) {
        const int8_t* q = (const int8_t*)W->weight + (size_t)n * K + k0;
        const float sc = ((const float*)W->scale)[n];
        for (int i = 0; i < len; i++) row[i] = (float)q[i] * sc;
      } else {  // int4 (either flavour): one group of 32 = 16 bytes
        const uint8_t* q = (const uint8_t*)W->weight + (size_t)n * (K / 2) + k0 / 2;
        const float sc = bf16_to_f32(((const uint16_t*)W->scale)[(size_t)n * (K / 32) + k0 / 32]);
        for (int i = 0; i < 16; i++) {
          row[i] = (float)((int)(q[i] & 0xF) - 8) * sc;
          row[i + 16] = (float)((int)(q[i] >> 4) - 8) * sc;
        }
      }
      if (out_bf16) {
        uint16_t* o = (uint16_t*)out + (size_t)n * K + k0;
        for (int i = 0; i < len; i++) o[i] = f32_to_bf16(row[i]);
      } else {
        memcpy((float*)out + (size_t)n * K + k0, row, (size_t)len * sizeof(float));
      }
    }
  }
}

// Streaming-read bandwidth probe: every thread sums its contiguous share of `buf` (`nbytes` bytes,
// a multiple of 64) `passes` times with the widest integer vectors of this build; with `streams` > 1
// (2 or 4) it splits its share into that many contiguous runs and reads one vector of each in turn, as the
// portable builds' dense decode kernel reads its rows (gemv.h): on a Zen 3 four streams per thread read
// faster than one. Returns the sum so the reads cannot be optimized away.
template <int S>
static double stream_read(const void* buf, size_t nbytes, int passes, int nthreads) {
#if SOLO_AVX512
  typedef uint64_t vq __attribute__((vector_size(64)));
#elif SOLO_GVEC
  typedef uint64_t vq __attribute__((vector_size(32)));
#else
  typedef uint64_t vq __attribute__((vector_size(8)));
#endif
  constexpr size_t lanes = sizeof(vq) / 8;
  constexpr int A = S > 1 ? S : 2;  // accumulators (two for one stream: two loads in flight)
  double total = 0.0;
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t n = nbytes / sizeof(vq);
    const size_t a = n * tid / nt, b = n * (tid + 1) / nt;
    const size_t run = S > 1 ? (b - a) / S : 2, steps = S > 1 ? run : (b - a) / 2;
    const vq* v = (const vq*)buf;
    for (int p = 0; p < passes; p++) {
      vq acc[A] = {};
      for (size_t i = 0; i < steps; i++)
        for (int s = 0; s < A; s++) acc[s] += S > 1 ? v[a + s * run + i] : v[a + 2 * i + s];
      for (size_t i = a + (S > 1 ? S * run : 2 * steps); i < b; i++) acc[0] += v[i];
      for (int s = 1; s < A; s++) acc[0] += acc[s];
      uint64_t sum = 0;
      for (size_t l = 0; l < lanes; l++) sum += acc[0][l];
      total += (double)sum;
    }
  }
  return total;
}

extern "C" double solo_stream_read(const void* buf, size_t nbytes, int passes, int nthreads, int streams) {
  if (streams >= 4) return stream_read<4>(buf, nbytes, passes, nthreads);
  if (streams >= 2) return stream_read<2>(buf, nbytes, passes, nthreads);
  return stream_read<1>(buf, nbytes, passes, nthreads);
}

// The workers' placement (common.h, PlacedWorkers) as a kernel call sees it, for tests: runs an empty region of
// `nthreads` threads placed as the kernels' are and returns how many of its workers' affinity masks, read
// inside the region, leave out the CPU they were kept off (the caller's when the call began; 0 where placement
// is off, impossible, or the workers were not recorded yet: the first call records them).
extern "C" int solo_placement_probe(int nthreads) {
  PlacedWorkers placed(nthreads);
  const int caller_cpu = placed.placement->cpu;  // (not read again: the caller may have moved since)
  int excluded = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : excluded)
  {
    const int tid = omp_get_thread_num();
    note_worker(placed.placement, tid);
    cpu_set_t mine;
    if (tid > 0 && sched_getaffinity(0, sizeof mine, &mine) == 0 && caller_cpu >= 0 && !CPU_ISSET(caller_cpu, &mine))
      excluded++;
  }
  return excluded;
}

// Measurement knobs, set between steps (never during one): "static_rows" 1 = each thread computes only its
// static block of every matrix (no chunk stealing), "chunk_kb" = KiB of weights per chunk, "claim_chunks" = the
// most chunks a thread takes at once from the front of its own run in a decode product (gemv.h), "late_us" = the
// barrier wait counted as late, "ahead_kb" = KiB of the next matrix a thread prefetches while it waits at a
// barrier (0 = none, the default), "ahead_hint" 0/1/2 = prefetcht0/t1/t2 for it, "spin_pause" 0 = spin at
// barriers without the PAUSE hint (default 1), "qdot_ymm" 1 = the AVX-512 int4 integer-dot kernel on 256-bit
// vectors (the same bits), "moe_gu_rows" / "moe_down_rows" = rows per MoE work item (rounded to a multiple
// of 32; defaults 128 / 256), "moe_fused" 0 = the MoE layer's phased schedule (moe.h; default 1), "span_tile"
// 0 = no rows x tokens tiles for many tokens, 2 = such tiles at every K (tile.h; the same bits), "gvec_rt" =
// the portable builds' bf16 tile shape (10 x rows + tokens; tile.h), "row_streams" = rows their dense decode
// kernel runs side by side (1, 2 or 4; gemv.h), "bf16_streams" / "q8_streams" = the same for the AVX512-BF16
// and the integer-dot decode kernels, "q8_rt" / "q8_pass_kb" = the integer-dot pass tile's shape and k block
// (q8_rt 0 = none, -1 = default), "bf16_pass_kb" = the AVX512-BF16 pass tile's k block (tile.h), "qz_rt" /
// "qz_pass_kb" = the 512-bit integer-dot pass tile's shape (0 = none) and k block, "pass_min_b" = the fewest
// sequences that take those tiles (default 32), "span_chunk_kb" = KiB of weights per work item of a span
// product on AMX builds (gemv.h), "packed_chunk_kb" = the same for packed bf16 weights without tiles,
// "amx_groups" = 16-row groups the packed decode kernel reads side by side, "packed_tile" = the packed span's
// tile without AMX (10 x groups + tokens; packed.h), "amx" 0 = the span's packed products without tiles,
// "amx_span_kb" = KiB of packed rows turned into tiles at a time (amx.h; the amx level only),
// "attn_prefetch" = blocks of 16 cached positions attention prefetches ahead (0 = off; elementwise.h),
// "attn_qk_dot" 0 = split-KV q . k of a bf16 cache on widened rows instead of bf16 dot products,
// "attn_amx" 0 = split-KV attention of a bf16 cache without tiles (amx.h; the amx level only),
// "profile" 1 = time the phases of each step (0 = off; either resets the totals).
// Returns 0, or -1 for an unknown name.
extern "C" int solo_set_knob(const char* name, int value) {
  if (!strcmp(name, "static_rows")) g_static_rows = value;
  else if (!strcmp(name, "chunk_kb")) g_chunk_bytes = (value < 1 ? 1 : value) << 10;
  else if (!strcmp(name, "claim_chunks")) g_claim_chunks = value < 1 ? 1 : value;
  else if (!strcmp(name, "late_us")) g_late_wait_ns = (int64_t)value * 1000;
  else if (!strcmp(name, "ahead_kb")) g_ahead_kb = value < 0 ? 0 : value;
  else if (!strcmp(name, "ahead_hint")) g_ahead_hint = value;
  else if (!strcmp(name, "spin_pause")) g_spin_pause = value;
  else if (!strcmp(name, "qdot_ymm")) g_qdot_ymm = value;
  else if (!strcmp(name, "moe_gu_rows")) g_moe_gu_rows = value < 32 ? 32 : value & ~31;
  else if (!strcmp(name, "moe_down_rows")) g_moe_down_rows = value < 32 ? 32 : value & ~31;
  else if (!strcmp(name, "moe_fused")) g_moe_fused = value;
  else if (!strcmp(name, "span_tile")) g_span_tile = value;
  else if (!strcmp(name, "gvec_rt")) g_gvec_rt = value;
  else if (!strcmp(name, "row_streams")) g_row_streams = value < 1 ? 1 : value;
  else if (!strcmp(name, "bf16_streams")) g_bf16_streams = value < 1 ? 1 : value;
#if SOLO_BF16_PACKED
  else if (!strcmp(name, "amx_groups")) g_amx_groups = value;
  else if (!strcmp(name, "packed_tile")) g_packed_tile = value;
  else if (!strcmp(name, "packed_chunk_kb")) g_packed_chunk_kb = value < 1 ? 1 : value;
#endif
#if SOLO_AMX
  else if (!strcmp(name, "amx")) g_amx = value;
  else if (!strcmp(name, "amx_span_kb")) g_amx_span_kb = value < 1 ? 1 : value;
  else if (!strcmp(name, "attn_amx")) g_attn_amx = value;
#endif
  else if (!strcmp(name, "span_chunk_kb")) g_span_chunk_kb = value < 0 ? 0 : value;
  else if (!strcmp(name, "q8_streams")) g_q8_streams = value < 1 ? 1 : value;
  else if (!strcmp(name, "q8_rt")) g_q8_rt = value;
  else if (!strcmp(name, "pass_min_b")) g_pass_min_b = value;
  else if (!strcmp(name, "q8_pass_kb")) g_q8_pass_kb = value < 128 ? 128 : value & ~127;
  else if (!strcmp(name, "bf16_pass_kb")) g_bf16_pass_kb = value < 128 ? 128 : value & ~127;
  else if (!strcmp(name, "attn_prefetch")) g_attn_prefetch = value < 0 ? 0 : value;
  else if (!strcmp(name, "attn_qk_dot")) g_attn_qk_dot = value;
  else if (!strcmp(name, "qz_rt")) g_qz_rt = value;
  else if (!strcmp(name, "qz_pass_kb")) g_qz_pass_kb = value < 128 ? 128 : value & ~127;
  else if (!strcmp(name, "profile")) {
    g_profile = value;
    memset(g_prof_ns, 0, sizeof g_prof_ns);
    g_prof_steps = 0;
  }
  else return -1;
  return 0;
}

// The phase totals of the profiled steps (knob "profile"): out[t * PH_COUNT + p] = nanoseconds thread t spent
// in phase p (PH_* order) over the steps since the reset, for t < threads (at most 64). Returns the step count.
extern "C" int64_t solo_profile(double* out, int threads) {
  for (int t = 0; t < threads && t < PROF_THREADS; t++)
    for (int p = 0; p < PH_COUNT; p++) out[t * PH_COUNT + p] = g_prof_ns[t][p];
  return g_prof_steps;
}

// The ISA level this library was compiled for (cpu_build.py checks it against the one it asked for).
extern "C" const char* solo_isa(void) { return SOLO_ISA_NAME; }

// The integer dot-product primitive of the int8 / int4 kernels (qdot.h): "avx512-vnni", "avx2", "neon-sdot",
// "neon", "scalar", ...
extern "C" const char* solo_qdot(void) { return SOLO_QDOT; }

// Prefill's side of the integer-dot path: x [S, K] (activation dtype: bf16 if bf, else float32) replaced in
// place by the values q * d of qdot.h's int8 block quantization, rounded to the activation dtype (what
// solo.runtime.quant.fake_quantize_activations_q8 computes), rows in parallel.
extern "C" void solo_fake_quantize_q8(void* x, int K, int S, int bf, int nthreads) {
  const int nb = q8_blocks(K);
  PlacedWorkers placed(nthreads);
#pragma omp parallel num_threads(nthreads)
  {
    float* row = (float*)malloc((size_t)K * sizeof(float) + (size_t)K * 4 + 256);
    char* slot = (char*)(row + K);
#pragma omp for schedule(static)
    for (int s = 0; s < S; s++) {
      for (int k = 0; k < K; k++) row[k] = load_act(x, (size_t)s * K + k, bf);
      quantize_q8_row(row, K, slot, 8);
      for (int k = 0; k < K; k++) {
        float d;
        memcpy(&d, slot + 32 * (size_t)nb + 4 * (size_t)(k / 32), 4);
        store_act(x, (size_t)s * K + k, (float)(int8_t)slot[k] * d, bf);
      }
    }
    free(row);
  }
}

// qdot.h's input quantization of x [B, K] (float32) into out (B slots of 4 * K bytes) for a matrix of
// `format` (W_INT8_Q8 or W_INT4_Q8: the lane corrections differ); tests and tools.
extern "C" void solo_quantize_q8(const float* x, int K, int B, void* out, int format) {
  Mat m;
  memset(&m, 0, sizeof m);
  m.format = format, m.cols = K;
  quantize_q8(&m, x, B, out);
}

// 1 when a matrix of this format takes its input rounded to bf16 (AVX512-BF16 kernels), else 0 (float32).
extern "C" int solo_input_bf16(int format) {
  Mat m;
  memset(&m, 0, sizeof m);
  m.format = format;
  return bf16_input(&m);
}

// The struct layout the kernels were compiled with: sizeof and every field's offset of Mat, Layer and
// Model, in declaration order. cpu.py compares it with its ctypes mirrors at load. Returns the count.
#define SOLO_OFF(T, f) (int64_t) offsetof(T, f)
extern "C" int solo_struct_layout(int64_t* out, int capacity) {
  const int64_t v[] = {
      (int64_t)sizeof(Mat), SOLO_OFF(Mat, format), SOLO_OFF(Mat, rows), SOLO_OFF(Mat, cols), SOLO_OFF(Mat, group),
      SOLO_OFF(Mat, weight), SOLO_OFF(Mat, scale), SOLO_OFF(Mat, bias),
      (int64_t)sizeof(Layer), SOLO_OFF(Layer, qkv), SOLO_OFF(Layer, o), SOLO_OFF(Layer, gate_up),
      SOLO_OFF(Layer, down), SOLO_OFF(Layer, attn_norm), SOLO_OFF(Layer, mlp_norm), SOLO_OFF(Layer, attn_out_norm),
      SOLO_OFF(Layer, mlp_out_norm), SOLO_OFF(Layer, q_norm), SOLO_OFF(Layer, k_norm), SOLO_OFF(Layer, k_cache),
      SOLO_OFF(Layer, v_cache), SOLO_OFF(Layer, window), SOLO_OFF(Layer, rope),
      (int64_t)sizeof(Model), SOLO_OFF(Model, dtype), SOLO_OFF(Model, hidden), SOLO_OFF(Model, heads),
      SOLO_OFF(Model, kv_heads), SOLO_OFF(Model, head_dim), SOLO_OFF(Model, inter), SOLO_OFF(Model, vocab),
      SOLO_OFF(Model, layers), SOLO_OFF(Model, max_seq), SOLO_OFF(Model, cache_rows), SOLO_OFF(Model, unit_offset),
      SOLO_OFF(Model, sandwich), SOLO_OFF(Model, qk_norm), SOLO_OFF(Model, act), SOLO_OFF(Model, eps),
      SOLO_OFF(Model, embed_scale), SOLO_OFF(Model, attn_scale), SOLO_OFF(Model, attn_softcap),
      SOLO_OFF(Model, final_softcap), SOLO_OFF(Model, embed), SOLO_OFF(Model, final_norm), SOLO_OFF(Model, head),
      SOLO_OFF(Model, layer), SOLO_OFF(Model, skip_matmuls), SOLO_OFF(Model, moe),
  };
  const int n = (int)(sizeof v / sizeof v[0]);
  for (int i = 0; i < n && i < capacity; i++) out[i] = v[i];
  return n;
}

// ------------------------------------------------------------------- lane models (Laneformer)
// Their decode step lives in lanes.h (it uses the barrier and the kernels above).
#include "lanes.h"
