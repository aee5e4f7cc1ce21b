// The mixture-of-experts (MoE) MLP of the decode step: routing and the selected experts, inside the step.
//
// One MoE layer of solo/model/moe.py for a batch of B tokens, with no host round trip: the router's logits
// (a matrix-vector product split by rows like any other), then on every thread the same routing (float32
// softmax, top-k in torch.topk's order, ties included, optional renormalization, rounding
// of the weights to the dtype unless the family keeps them in float32), then only the selected experts'
// weights are streamed. Each expert's rows are split across the threads, so one token's k experts keep
// every core busy: gate/up work items are (expert, block of gate rows and the same block of up rows), so
// the activation needs no barrier; down work items are (expert, block of its down projection's output
// rows), one stream with the gate/up items (see g_moe_fused), and after the layer's last barrier every
// thread sums the k outputs of every row itself. Threads claim items from a shared counter (a thread that
// loses its core leaves its remaining items to the others) or, with SOLO_MOE_SCHEDULE=static, each takes
// its fixed contiguous rows as the dense GEMV does (and the phased layout below).
//
// Batches (server rows): the experts of all tokens are taken as a union; an expert's tokens share one
// pass over its weights (the GEMV's multi-sequence tiles). The (token, slot) pairs are grouped by expert
// (ascending, tokens in order within), which is the eager reference's grouping; every product uses the
// same per-sequence arithmetic whatever the grouping, and each token sums its k outputs in top-k order,
// so a row's result is bit-identical at any batch size.
//
// Numerics follow solo/model/moe.py (transformers 5's grouped experts path): expert outputs rounded to
// the dtype, multiplied by the routing weight (rounded again unless the weights are float32), summed in
// float32 and rounded once; a shared expert (Qwen2-MoE) is a gated MLP whose rounded output is scaled
// by the rounded sigmoid of its gate and added.
//
// Barriers: two per MoE layer (router; every expert's gate/up + activation + down), one fewer than a dense
// MLP (gate/up; activation; down); three with the phased or static schedules (router; gate/up +
// activation; down + sum).
#pragma once
#include "common.h"
#include "elementwise.h"
#include "gemv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <sched.h>

// One layer's MoE description (cpu_moe.py builds the same struct with ctypes). `experts == 0` marks a
// dense layer of an MoE model (Qwen's mlp_only_layers / decoder_sparse_step).
typedef struct {
  Mat router;   // [experts, hidden], the model's dtype (never quantized)
  Mat gate_up;  // expert 0's fused [2 * inter, hidden] (gate rows first); expert e's weight / scale pointers
  Mat down;     // are expert 0's plus e times the strides below. down: [hidden, inter]
  int64_t gate_up_stride, gate_up_scale_stride, down_stride, down_scale_stride;  // bytes between experts
  Mat shared_gate_up, shared_down;  // the shared expert (Qwen2-MoE): [2 * shared_inter, hidden], [hidden, shared_inter]
  Mat shared_gate;                  // its sigmoid gate [1, hidden], the router's format
  int32_t experts, top_k, inter, shared_inter;  // shared_inter 0: no shared expert
  int32_t norm_topk_prob, weights_fp32;
} MoeLayer;

static inline const MoeLayer* moe_layer(const Model* m, int l) {
  const MoeLayer* ml = (const MoeLayer*)m->moe;
  return ml && ml[l].experts > 0 ? &ml[l] : nullptr;
}

// ------------------------------------------------------------------------------------------ workspace

typedef struct {
  int experts, top_k, inter, shared;
} MoeDims;

// The largest sizes over the model's MoE layers (all zero for a dense model).
static MoeDims moe_dims(const Model* m) {
  MoeDims d = {0, 0, 0, 0};
  for (int l = 0; l < m->layers; l++) {
    const MoeLayer* ml = moe_layer(m, l);
    if (!ml) continue;
    d.experts = ml->experts > d.experts ? ml->experts : d.experts;
    d.top_k = ml->top_k > d.top_k ? ml->top_k : d.top_k;
    d.inter = ml->inter > d.inter ? ml->inter : d.inter;
    d.shared = ml->shared_inter > d.shared ? ml->shared_inter : d.shared;
  }
  return d;
}

static inline size_t moe_align(size_t n) { return (n + 15) & ~(size_t)15; }

// Pointers into the MoE workspace: the shared part (outputs that threads write by disjoint rows), then
// one private part per thread. Index buffers are int32 in float-sized slots.
typedef struct {
  int* claim;      // [2] work-item counters of the gate/up and the down phases (dynamic schedule)
  int* done;       // [P] gate/up items finished per distinct expert (fused schedule)
  float* logits;   // [B, experts] router logits
  float* gu;       // [P, 2 * inter] gate/up outputs by slot (P = B * top_k pairs)
  void* down_in;   // [P, inter] down-projection inputs by slot (4 bytes per element at most)
  float* dout;     // [P, hidden] expert outputs by slot
  float* sgu;      // [B, 2 * shared_inter]
  void* sdown_in;  // [B, shared_inter]
  float* sout;     // [B, hidden] shared expert output
  float* sgate;    // [B] shared expert gate logit
  // this thread's
  void *xr, *xe, *xg;  // [B, hidden] each: router input, expert input, gathered / shared-expert input
  float* sum;          // [B, hidden] the layer's output (fused schedule: every thread sums all rows)
  int* ids;            // [P] expert of pair p = b * top_k + j
  float* weight;       // [P] its routing weight
  int* slot_pair;      // [P] pair held by slot s (slots grouped by expert, ascending)
  int* pair_slot;      // [P] inverse
  int* uexp;           // [P] distinct experts of the batch, ascending
  int* ustart;         // [P + 1] first slot of each
  float* probs;        // [experts]
  int* count;          // [experts + 1]
} MoeWs;

static size_t moe_shared_floats(const Model* m, const MoeDims* d, int B) {
  const size_t P = (size_t)B * d->top_k, h = m->hidden;
  return moe_align(2) + moe_align(P) + moe_align((size_t)B * d->experts) + moe_align(P * 2 * d->inter) + moe_align(P * d->inter) +
         moe_align(P * h) + moe_align((size_t)B * 2 * d->shared) + moe_align((size_t)B * d->shared) +
         moe_align((size_t)B * h) + moe_align(B);
}

static size_t moe_thread_floats(const Model* m, const MoeDims* d, int B) {
  const size_t P = (size_t)B * d->top_k;
  return 4 * moe_align((size_t)B * m->hidden) + 5 * moe_align(P) + moe_align(P + 1) + moe_align(d->experts) +
         moe_align((size_t)d->experts + 1);
}

// Bytes of MoE workspace solo_decode needs after its own (0 for a dense model).
static size_t moe_workspace_bytes(const Model* m, int B, int nthreads) {
  const MoeDims d = moe_dims(m);
  if (d.experts == 0) return 0;
  return (moe_shared_floats(m, &d, B) + (size_t)nthreads * moe_thread_floats(m, &d, B)) * sizeof(float) + 64;
}

static MoeWs moe_ws(const Model* m, int B, int tid, void* base) {
  const MoeDims d = moe_dims(m);
  const size_t P = (size_t)B * d.top_k, h = m->hidden;
  float* p = (float*)base;
  MoeWs w;
  w.claim = (int*)p, p += moe_align(2);
  w.done = (int*)p, p += moe_align(P);
  w.logits = p, p += moe_align((size_t)B * d.experts);
  w.gu = p, p += moe_align(P * 2 * d.inter);
  w.down_in = p, p += moe_align(P * d.inter);
  w.dout = p, p += moe_align(P * h);
  w.sgu = p, p += moe_align((size_t)B * 2 * d.shared);
  w.sdown_in = p, p += moe_align((size_t)B * d.shared);
  w.sout = p, p += moe_align((size_t)B * h);
  w.sgate = p, p += moe_align(B);
  p += (size_t)tid * moe_thread_floats(m, &d, B);
  w.xr = p, p += moe_align((size_t)B * h);
  w.xe = p, p += moe_align((size_t)B * h);
  w.xg = p, p += moe_align((size_t)B * h);
  w.sum = p, p += moe_align((size_t)B * h);
  w.ids = (int*)p, p += moe_align(P);
  w.weight = p, p += moe_align(P);
  w.slot_pair = (int*)p, p += moe_align(P);
  w.pair_slot = (int*)p, p += moe_align(P);
  w.uexp = (int*)p, p += moe_align(P);
  w.ustart = (int*)p, p += moe_align(P + 1);
  w.probs = p, p += moe_align(d.experts);
  w.count = (int*)p;
  return w;
}

// ------------------------------------------------------------------------------------------ pieces

// Expert e's matrix: expert 0's with its weight and scale pointers moved by e strides.
static inline Mat expert_mat(const Mat* first, int e, int64_t stride, int64_t scale_stride) {
  Mat w = *first;
  w.weight = (const char*)first->weight + (size_t)e * stride;
  if (first->scale) w.scale = (const char*)first->scale + (size_t)e * scale_stride;
  return w;
}

// One token's routing from its (dtype-rounded) router logits [experts]: softmax in float32, the top-k
// in torch.topk's order, optionally renormalized over the k, then rounded to the dtype unless the weights
// stay float32 (Mixtral).
//
// Ties: torch.topk on the CPU does not prefer the lower index. Its kernel (ATen's topk_impl_loop) puts
// (value, index) pairs through std::nth_element to the k-th place and std::sort of the first k - 1 (or
// std::partial_sort when k * 64 <= experts), comparing values only (NaN first), so equal probabilities
// come out in the order those libstdc++ algorithms leave them (e.g. experts 6, 5 of 8 equal ones for
// k = 2). The same calls on the same pairs reproduce that order exactly.
static void moe_route(const float* logits, int ne, int k, int norm, int fp32_weights, int bf, float* probs,
                      int* ids, float* weight) {
  float mx = logits[0];
  for (int e = 1; e < ne; e++) mx = logits[e] > mx ? logits[e] : mx;
  float sum = 0.f;
  for (int e = 0; e < ne; e++) {
    probs[e] = expf(logits[e] - mx);
    sum += probs[e];
  }
  typedef std::pair<double, int64_t> Elem;  // ATen's elem_t: (acc_type<float> = double, index)
  Elem queue[1024];
  for (int e = 0; e < ne; e++) {
    probs[e] /= sum;
    queue[e] = Elem((double)probs[e], e);
  }
  auto comp = [](const Elem& a, const Elem& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || (a.first > b.first);
  };
  if ((int64_t)k * 64 <= ne) {
    std::partial_sort(queue, queue + k, queue + ne, comp);
  } else {
    std::nth_element(queue, queue + k - 1, queue + ne, comp);
    std::sort(queue, queue + k - 1, comp);
  }
  float total = 0.f;
  for (int j = 0; j < k; j++) {
    ids[j] = (int)queue[j].second;
    weight[j] = probs[ids[j]];
    total += weight[j];
  }
  for (int j = 0; j < k; j++) {
    float p = norm ? weight[j] / total : weight[j];
    weight[j] = fp32_weights ? p : rnd(p, bf);
  }
}

// Group the P = B * k pairs by expert: slots in ascending expert order, pairs in order within an expert
// (a stable counting sort). Fills slot_pair, pair_slot, the distinct experts and their first slots;
// returns how many distinct experts there are.
static int moe_group(const MoeWs* w, int ne, int P) {
  int* count = w->count;
  for (int e = 0; e <= ne; e++) count[e] = 0;
  for (int p = 0; p < P; p++) count[w->ids[p] + 1]++;
  int nu = 0;
  for (int e = 0; e < ne; e++) {
    if (count[e + 1] > 0) {
      w->uexp[nu] = e;
      w->ustart[nu] = count[e];
      nu++;
    }
    count[e + 1] += count[e];  // count[e] = first slot of expert e
  }
  w->ustart[nu] = P;
  for (int p = 0; p < P; p++) {
    const int s = count[w->ids[p]]++;
    w->slot_pair[s] = p;
    w->pair_slot[p] = s;
  }
  return nu;
}

// This thread's rows [i0, i1) of gate and up of a gated MLP for `np` inputs `x` [np, hidden], the
// rounded activation product, written as the down projection's input columns [i0, i1) of `down_in`
// rows [np, down->cols].
static void gated_rows(const Model* m, const Mat* gate_up, const Mat* down, const void* x, int np, float* gu,
                       void* down_in, int i0, int i1, int skip) {
  const int f = gate_up->rows / 2, bf = m->dtype == DT_BF16;
  gemv_rows_pair(gate_up, product_input(gate_up, x, gate_up->cols, np, skip), np, gu, 2 * f, i0, i1, f + i0, skip);
  finish_linear_rows(gate_up, gu, np, 2 * f, bf, i0, i1);
  finish_linear_rows(gate_up, gu, np, 2 * f, bf, f + i0, f + i1);
  for (int q = 0; q < np; q++) {
    float* g = gu + (size_t)q * 2 * f;
    act_mul(g, g + f, g, i0, i1, m->act, bf);  // in place: the gate half holds the product
    prepare_input_cols(down, g, 1, (char*)down_in + (size_t)q * f * input_elem_bytes(down), i0, i1);
  }
}

// ------------------------------------------------------------------------------------------ the layer

// Work items of the two expert phases (rows per item; multiples of 32, so int4 groups never straddle two).
// Gate/up: (expert, block of 128 gate rows and the same 128 up rows), 1 MiB of bf16 weights at OLMoE's
// widths; down: a block of 256 output rows of every selected expert, then their weighted sum. An item reads
// its weights as ~512 KiB pieces, which stream about as fast as one long read (128 KiB pieces ~15% slower;
// benchmarks/results/amd-epyc-zen4/gemv-stream.md). Knobs "moe_gu_rows" / "moe_down_rows" (solo_set_knob,
// measurement only) change the sizes; the arithmetic of a row never depends on them.
static int g_moe_gu_rows = 128, g_moe_down_rows = 256;

// How the expert phases share their work out: claimed one item at a time from a shared counter (dynamic,
// the default), or each thread its fixed contiguous block of rows (static: SOLO_MOE_SCHEDULE=static). Either
// way every row's arithmetic is the same, so the logits are bit for bit equal. Dynamic claiming matters when
// a thread loses its core for a while (a busy machine): the others take its remaining items instead of
// waiting for them at the next barrier; measured in benchmarks/results/moe-cpu-schedule-*.txt.
static inline int moe_dynamic_schedule() {
  const char* env = getenv("SOLO_MOE_SCHEDULE");
  return !(env && strcmp(env, "static") == 0);
}

// The next work item of the phase whose counter this is (a value past the last item: none left).
static inline int moe_claim(int* counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

// The dynamic schedule's shape (knob "moe_fused"): 1 (the default) = one stream of work items per layer, the
// gate/up items of every selected expert (ascending) and then its down items (expert, block of output rows),
// claimed from one counter with no barrier between them: a down item of expert u waits only for u's own
// gate/up items (a per-expert count of finished items), which were all claimed before any down item, so
// only the last expert's can still be running; after the one barrier every thread sums the k outputs of
// every row itself (a few microseconds), so the layer's output needs no barrier of its own. Two barriers
// per MoE layer instead of three, and the end of the gate/up phase no longer idles the thread that
// finishes first. 0 = the phased schedule (gate/up items, barrier, down items of all experts' rows with
// their weighted sum, barrier). Same arithmetic for every row either way.
static int g_moe_fused = 1;

// The MoE MLP of one layer for B tokens. t: this thread's normed inputs [B, hidden] (float32 holding
// dtype-rounded values); out: the shared [B, hidden] output (rounded to the dtype), complete for every
// thread when this returns (phased and static schedules). Returns the [B, hidden] output to read: `out`,
// or with the fused schedule this thread's own copy in the workspace (valid until the next MoE layer). `wait(phase)` is the step's barrier, called after phase 0 (router), 1 (gate/up)
// and 2 (down) (the phase number lets the step's profile time them); every thread must call this function.
template <class Wait>
static const float* moe_mlp(const Model* m, const MoeLayer* E, const float* t, int B, float* out, void* workspace, int tid,
                    int nt, int skip, Wait wait) {
  const int h = m->hidden, bf = m->dtype == DT_BF16, k = E->top_k, ne = E->experts;
  const int I = E->inter, S = E->shared_inter, P = B * k;
  const MoeWs w = moe_ws(m, B, tid, workspace);
  const size_t xesz = input_elem_bytes(&E->gate_up);
  const int dynamic = moe_dynamic_schedule() && nt > 1;
  // The counters' last users finished behind at least one barrier (the previous layer's phases); the
  // barriers below publish the resets before anyone claims.
  const int fused = dynamic && g_moe_fused;
  if (tid == 0) {
    w.claim[0] = 0;
    if (fused)
      for (int p = 0; p < P; p++) w.done[p] = 0;
  }
  // --- router logits (rows split), and the shared expert, which needs no routing: its gate and its
  // gate/up rows with the activation
  prepare_input(&E->router, t, B, w.xr);
  gemv(&E->router, w.xr, B, w.logits, ne, tid, nt, skip);
  if (S > 0) {
    gemv(&E->shared_gate, w.xr, B, w.sgate, 1, tid, nt, skip);
    if (tid == 0) finish_linear_rows(&E->shared_gate, w.sgate, B, 1, bf, 0, 1);  // row 0 is thread 0's
    int i0, i1;
    row_range(S, tid, nt, &i0, &i1);
    if (i0 < i1) {
      prepare_input(&E->shared_gate_up, t, B, w.xg);
      gated_rows(m, &E->shared_gate_up, &E->shared_down, w.xg, B, w.sgu, w.sdown_in, i0, i1, skip);
    }
  }
  prepare_input(&E->gate_up, t, B, w.xe);
  wait(0);
  // --- routing, the same on every thread (a few hundred flops), then the selected experts' gate/up rows
  const float* lg = w.logits;
  for (int b = 0; b < B; b++) {
    float row[1024];  // the router logits rounded as eager's F.linear output (experts <= 1024, checked in Python)
    for (int e = 0; e < ne; e++) row[e] = rnd(lg[(size_t)b * ne + e], bf);
    moe_route(row, ne, k, E->norm_topk_prob, E->weights_fp32, bf, w.probs, w.ids + b * k, w.weight + b * k);
  }
  const int nu = moe_group(&w, ne, P);
  if (tid == 0) w.claim[1] = 0;
  {
    int gathered = -1;  // the expert whose tokens w.xg holds
    auto gate_up_rows = [&](int u, int i0, int i1) {
      const int e = w.uexp[u], s0 = w.ustart[u], np = w.ustart[u + 1] - s0;
      const Mat gu = expert_mat(&E->gate_up, e, E->gate_up_stride, E->gate_up_scale_stride);
      const void* x;
      if (np == 1) {
        x = (const char*)w.xe + (size_t)(w.slot_pair[s0] / k) * h * xesz;
      } else {  // this expert's tokens, gathered
        if (gathered != u)
          for (int q = 0; q < np; q++)
            memcpy((char*)w.xg + (size_t)q * h * xesz,
                   (const char*)w.xe + (size_t)(w.slot_pair[s0 + q] / k) * h * xesz, h * xesz);
        gathered = u;
        x = w.xg;
      }
      gated_rows(m, &gu, &E->down, x, np, w.gu + (size_t)s0 * 2 * I,
                 (char*)w.down_in + (size_t)s0 * I * input_elem_bytes(&E->down), i0, i1, skip);
    };
    if (fused) {
      // gate/up items (u, row block), then the shared expert's down row blocks, then (u, down row block)
      const int Rg = g_moe_gu_rows, gb = (I + Rg - 1) / Rg, Rd = g_moe_down_rows, db = (h + Rd - 1) / Rd;
      const int ngu = nu * gb, nsd = S > 0 ? db : 0, items = ngu + nsd + nu * db;
      const size_t desz = input_elem_bytes(&E->down);
      for (int it = moe_claim(&w.claim[0]); it < items; it = moe_claim(&w.claim[0])) {
        if (it < ngu) {
          const int u = it / gb, i0 = it % gb * Rg, i1 = i0 + Rg < I ? i0 + Rg : I;
          gate_up_rows(u, i0, i1);
          __atomic_fetch_add(&w.done[u], 1, __ATOMIC_RELEASE);  // publishes this block's down inputs
        } else if (it < ngu + nsd) {
          const int n0 = (it - ngu) * Rd, n1 = n0 + Rd < h ? n0 + Rd : h;
          gemv_rows(&E->shared_down, w.sdown_in, E->shared_down.cols, B, w.sout, h, n0, n1, skip);
          finish_linear_rows(&E->shared_down, w.sout, B, h, bf, n0, n1);
        } else {
          const int d = it - ngu - nsd, u = d / db, n0 = d % db * Rd, n1 = n0 + Rd < h ? n0 + Rd : h;
          // every gate/up item of u was claimed before this item; wait for the ones still running
          for (int spins = 0; __atomic_load_n(&w.done[u], __ATOMIC_ACQUIRE) < gb; spins++)
            if (spins < 4096)
              cpu_relax();
            else
              sched_yield();  // its owner lost its core: let it run
          const int e = w.uexp[u], s0 = w.ustart[u], np = w.ustart[u + 1] - s0;
          const Mat dn = expert_mat(&E->down, e, E->down_stride, E->down_scale_stride);
          float* y = w.dout + (size_t)s0 * h;
          gemv_rows(&dn, (const char*)w.down_in + (size_t)s0 * I * desz, dn.cols, np, y, h, n0, n1, skip);
          finish_linear_rows(&dn, y, np, h, bf, n0, n1);
        }
      }
    } else if (dynamic) {
      const int R = g_moe_gu_rows, blocks = (I + R - 1) / R, items = nu * blocks;
      for (int it = moe_claim(&w.claim[0]); it < items; it = moe_claim(&w.claim[0])) {
        const int i0 = it % blocks * R, i1 = i0 + R < I ? i0 + R : I;
        gate_up_rows(it / blocks, i0, i1);
      }
    } else {
      int i0, i1;
      row_range(I, tid, nt, &i0, &i1);
      if (i0 < i1)
        for (int u = 0; u < nu; u++) gate_up_rows(u, i0, i1);
    }
  }
  if (fused) {
    wait(2);  // every expert output written
    // every row's weighted sum on this thread, into its own copy: the arithmetic of the phased schedule's
    // sum below (products rounded unless float32 weights, added in top-k order from 0, rounded once), with
    // the loops turned so the rows vectorize
    for (int b = 0; b < B; b++) {
      float* o = w.sum + (size_t)b * h;
      for (int n = 0; n < h; n++) o[n] = 0.f;
      for (int j = 0; j < k; j++) {
        const float* d = w.dout + (size_t)w.pair_slot[b * k + j] * h;
        const float wt = w.weight[b * k + j];
        if (E->weights_fp32)
          for (int n = 0; n < h; n++) o[n] += d[n] * wt;
        else
          for (int n = 0; n < h; n++) o[n] += rnd(d[n] * wt, bf);
      }
      if (S > 0) {
        const float sg = rnd(1.0f / (1.0f + expf(-w.sgate[b])), bf);
        const float* so = w.sout + (size_t)b * h;
        for (int n = 0; n < h; n++) o[n] = rnd(rnd(o[n], bf) + rnd(sg * so[n], bf), bf);
      } else {
        for (int n = 0; n < h; n++) o[n] = rnd(o[n], bf);
      }
    }
    return w.sum;
  }
  wait(1);
  // --- output rows [n0, n1) of every selected expert's down projection, then their weighted sum
  const size_t desz = input_elem_bytes(&E->down);
  auto down_rows = [&](int n0, int n1) {
    for (int u = 0; u < nu; u++) {
      const int e = w.uexp[u], s0 = w.ustart[u], np = w.ustart[u + 1] - s0;
      const Mat dn = expert_mat(&E->down, e, E->down_stride, E->down_scale_stride);
      float* y = w.dout + (size_t)s0 * h;
      gemv_rows(&dn, (const char*)w.down_in + (size_t)s0 * I * desz, dn.cols, np, y, h, n0, n1, skip);
      finish_linear_rows(&dn, y, np, h, bf, n0, n1);
    }
    if (S > 0) {
      gemv_rows(&E->shared_down, w.sdown_in, E->shared_down.cols, B, w.sout, h, n0, n1, skip);
      finish_linear_rows(&E->shared_down, w.sout, B, h, bf, n0, n1);
    }
    for (int b = 0; b < B; b++) {
      float* ob = out + (size_t)b * h;
      const float sg = S > 0 ? rnd(1.0f / (1.0f + expf(-w.sgate[b])), bf) : 0.f;
      for (int n = n0; n < n1; n++) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
          const float v = w.dout[(size_t)w.pair_slot[b * k + j] * h + n] * w.weight[b * k + j];
          acc += E->weights_fp32 ? v : rnd(v, bf);
        }
        float r = rnd(acc, bf);
        if (S > 0) r = rnd(r + rnd(sg * w.sout[(size_t)b * h + n], bf), bf);
        ob[n] = r;
      }
    }
  };
  if (dynamic) {
    const int R = g_moe_down_rows, items = (h + R - 1) / R;
    for (int it = moe_claim(&w.claim[1]); it < items; it = moe_claim(&w.claim[1]))
      down_rows(it * R, (it + 1) * R < h ? (it + 1) * R : h);
  } else {
    int n0, n1;
    row_range(h, tid, nt, &n0, &n1);
    if (n0 < n1) down_rows(n0, n1);
  }
  wait(2);
  return out;
}

// ------------------------------------------------------------------------------------------ prefill
// The routed experts of one MoE layer over a prompt's S tokens (CpuRuntime.prefill): the (token, slot)
// pairs, routed on the host by solo.model.moe.route (the eager block's own call, ties included), are
// grouped by expert once; then each expert's gate/up rows run as one matrix product over all its tokens,
// the activation follows per row block, each expert's down rows run over the same tokens, and every
// token's k outputs are summed weighted, as the decode step's MoE (moe_mlp) and the eager block round
// them. Work items (expert, block of rows) are shared out dynamically over the threads, so a popular
// expert's rows spread over every core.
//
// Why not PyTorch's matmuls (the eager block, which prefill ran before): oneDNN generates a kernel for
// each new matrix shape, and every expert's token count is a new M: on the Qwen3-30B-A3B-2L shape a
// 512-token prompt's MoE layers spent 2-5 s generating kernels against ~0.2 s of arithmetic per layer.
//
// The products: with bf16 activations on AVX512-BF16, an MT tokens x NT rows register tile of dot products
// (vdpbf16ps, one float32 accumulator per token and row over the whole row, reduced once), int8/int4
// experts dequantized block by block to bf16 first, exactly as eager's dequantize rounds them; every other
// case (float32, lower ISA levels) takes the decode step's multi-sequence GEMV on the gathered tokens. A
// token's result never depends on which other tokens share its expert or its tile.

#if SOLO_AVX512 && defined(__AVX512BF16__)
#define SOLO_MOE_GEMM 1
// y[m * ldy + n] = W[n, :] . x_m for n < NT rows of W (row stride K) and m < MT tokens (row pointers xs).
template <int MT, int NT, bool PF>
static inline void moe_tile_bf16(const uint16_t* W, int K, const uint16_t* const* xs, float* y, int ldy,
                                 const uint16_t* next = nullptr, int next_rows = 0) {
  __m512 acc[MT][NT];
  for (int m = 0; m < MT; m++)
    for (int n = 0; n < NT; n++) acc[m][n] = _mm512_setzero_ps();
  const int kmain = K & ~31, rem = K - kmain;
  for (int k = 0; k < kmain; k += 32) {
    __m512bh xv[MT];
    for (int m = 0; m < MT; m++) xv[m] = (__m512bh)_mm512_loadu_si512(xs[m] + k);
    if (PF)
      for (int r = 0; r < next_rows; r++) _mm_prefetch((const char*)(next + (size_t)r * K + k), _MM_HINT_T1);
    for (int n = 0; n < NT; n++) {
      if (PF) _mm_prefetch((const char*)(W + (size_t)n * K + k) + 1024, _MM_HINT_T0);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(W + (size_t)n * K + k);
      for (int m = 0; m < MT; m++) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], wv, xv[m]);
    }
  }
  if (rem) {
    const __mmask32 tail = (__mmask32)((1ull << rem) - 1);
    __m512bh xv[MT];
    for (int m = 0; m < MT; m++) xv[m] = (__m512bh)_mm512_maskz_loadu_epi16(tail, xs[m] + kmain);
    for (int n = 0; n < NT; n++) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, W + (size_t)n * K + kmain);
      for (int m = 0; m < MT; m++) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], wv, xv[m]);
    }
  }
  for (int m = 0; m < MT; m++)
    for (int n = 0; n < NT; n++) y[(size_t)m * ldy + n] = _mm512_reduce_add_ps(acc[m][n]);
}

// One tile of NT rows over all M tokens, 4 at a time: the rows' weights stay in L1 while the token tiles
// pass over them (rows outer, tokens inner); the first token tile also prefetches the next row tile.
template <int NT>
static void moe_ntile_bf16(const uint16_t* W, int K, const uint16_t* const* xs, int M, float* y, int ldy,
                           const uint16_t* next, int next_rows) {
  for (int m = 0; m < M; m += 4) {
    const uint16_t* const* x = xs + m;
    float* ym = y + (size_t)m * ldy;
    const int left = M - m < 4 ? M - m : 4;
    if (m == 0) {
      if (left == 4) moe_tile_bf16<4, NT, true>(W, K, x, ym, ldy, next, next_rows);
      if (left == 3) moe_tile_bf16<3, NT, true>(W, K, x, ym, ldy, next, next_rows);
      if (left == 2) moe_tile_bf16<2, NT, true>(W, K, x, ym, ldy, next, next_rows);
      if (left == 1) moe_tile_bf16<1, NT, true>(W, K, x, ym, ldy, next, next_rows);
    } else {
      if (left == 4) moe_tile_bf16<4, NT, false>(W, K, x, ym, ldy);
      if (left == 3) moe_tile_bf16<3, NT, false>(W, K, x, ym, ldy);
      if (left == 2) moe_tile_bf16<2, NT, false>(W, K, x, ym, ldy);
      if (left == 1) moe_tile_bf16<1, NT, false>(W, K, x, ym, ldy);
    }
  }
}

// y[m * ldy + n] = W[n, :] . xs[m] for n < N rows, m < M tokens, in tiles of 6 rows. While the first token
// tile of a row tile runs, the next row tile's weights are prefetched into L2 (one line per row per step),
// so the product waits less for DRAM (1-thread CPU-time A/B on Qwen3-30B-A3B's layer, noisy: 57 vs 33
// GFLOP/cpu-s median at 128 tokens, 74 vs 56 at 512, 33 vs 25 at 32).
static void moe_gemm_bf16(const uint16_t* W, int K, const uint16_t* const* xs, int M, float* y, int ldy, int N) {
  constexpr int NT = 6;
  int n = 0;
  for (; n + NT <= N; n += NT) {
    const int nr = std::min(NT, N - n - NT);
    moe_ntile_bf16<NT>(W + (size_t)n * K, K, xs, M, y + n, ldy, W + (size_t)(n + NT) * K, nr);
  }
  const uint16_t* w = W + (size_t)n * K;
  switch (N - n) {
    case 1: moe_ntile_bf16<1>(w, K, xs, M, y + n, ldy, nullptr, 0); break;
    case 2: moe_ntile_bf16<2>(w, K, xs, M, y + n, ldy, nullptr, 0); break;
    case 3: moe_ntile_bf16<3>(w, K, xs, M, y + n, ldy, nullptr, 0); break;
    case 4: moe_ntile_bf16<4>(w, K, xs, M, y + n, ldy, nullptr, 0); break;
    case 5: moe_ntile_bf16<5>(w, K, xs, M, y + n, ldy, nullptr, 0); break;
    default: break;
  }
}
#else
#define SOLO_MOE_GEMM 0
#endif

// Rows [n0, n1) of an int8/int4 matrix as bf16 [n1 - n0, cols], rounded as solo_dequantize (and eager's
// dequantize) round them.
static void moe_dequant_rows_bf16(const Mat* W, int n0, int n1, uint16_t* out) {
  const int K = W->cols;
  for (int n = n0; n < n1; n++) {
    uint16_t* o = out + (size_t)(n - n0) * K;
    if (W->format == W_INT8) {
      const int8_t* q = (const int8_t*)W->weight + (size_t)n * K;
      const float sc = ((const float*)W->scale)[n];
      for (int i = 0; i < K; i++) o[i] = f32_to_bf16((float)q[i] * sc);
    } else {  // int4 (either flavour): per group of 32 inputs, 16 bytes (low nibble i, high nibble i + 16)
      for (int k0 = 0; k0 < K; k0 += 32) {
        const uint8_t* q = (const uint8_t*)W->weight + (size_t)n * (K / 2) + k0 / 2;
        const float sc = bf16_to_f32(((const uint16_t*)W->scale)[(size_t)n * (K / 32) + k0 / 32]);
        for (int i = 0; i < 16; i++) {
          o[k0 + i] = f32_to_bf16((float)((int)(q[i] & 0xF) - 8) * sc);
          o[k0 + i + 16] = f32_to_bf16((float)((int)(q[i] >> 4) - 8) * sc);
        }
      }
    }
  }
}

// Rows per work item of the prefill phases, and tokens per fallback GEMV call (bounds its buffers).
static constexpr int MOE_PF_GU_ROWS = 64, MOE_PF_DOWN_ROWS = 128, MOE_PF_CHUNK = 64;

// Does the prefill of this layer take the bf16 register-tile products (else the GEMV fallback)?
static inline int moe_prefill_gemm(const Model* m, const MoeLayer* E) {
  if (!SOLO_MOE_GEMM || m->dtype != DT_BF16) return 0;
  for (const Mat* W : {&E->gate_up, &E->down})
    if (W->format == W_F32) return 0;
  return 1;
}

// Workspace bytes of solo_moe_prefill: the shared part (down inputs, expert outputs, the grouping) and each
// thread's private part (dequantized rows, gate/up outputs, gathered inputs, token pointers).
static void moe_prefill_sizes(const Model* m, const MoeLayer* E, int S, size_t* shared, size_t* priv) {
  const size_t P = (size_t)S * E->top_k, h = m->hidden, I = E->inter, cols = h > I ? h : I;
  *shared = moe_align(P * I) * 4 + moe_align(P * h) * 4 + 3 * moe_align(P) * 4 + 2 * moe_align((size_t)E->experts + 2) * 4;
  const size_t ybuf = std::max((size_t)S * 2 * MOE_PF_GU_ROWS, (size_t)MOE_PF_CHUNK * 2 * I);
  *priv = moe_align((2 * (size_t)MOE_PF_GU_ROWS + MOE_PF_DOWN_ROWS) * cols / 2) * 4 + moe_align(ybuf) * 4 +
          moe_align((size_t)MOE_PF_CHUNK * h) * 4 + moe_align(h) * 4 + moe_align((size_t)S * 2) * 4;
}

// Bytes of workspace solo_moe_prefill needs for S tokens of MoE layer `layer` on nthreads threads.
extern "C" size_t solo_moe_prefill_workspace_bytes(const Model* m, int layer, int S, int nthreads) {
  const MoeLayer* E = moe_layer(m, layer);
  if (!E) return 0;
  size_t shared, priv;
  moe_prefill_sizes(m, E, S, &shared, &priv);
  return shared + (size_t)nthreads * priv + 64;
}

// The routed experts of MoE layer `layer` for S prompt tokens (see the section comment).
//   x: [S, hidden] normed inputs in the model's dtype; ids: int32 [S, top_k] and weights: float32 [S, top_k]
//   from solo.model.moe.route (the weights hold their dtype-rounded values unless the family keeps them in
//   float32); out: [S, hidden] in the model's dtype, the weighted sum of each token's experts (no shared
//   expert: the caller adds it).
extern "C" void solo_moe_prefill(const Model* m, int layer, const void* x, int S, const int* ids, const float* weights,
                                 void* out, void* workspace, int nthreads) {
  const MoeLayer* E = moe_layer(m, layer);
  if (!E || S <= 0) return;
  const int h = m->hidden, bf = m->dtype == DT_BF16, k = E->top_k, ne = E->experts, I = E->inter, P = S * k;
  const int gemm = moe_prefill_gemm(m, E);
  const size_t desz = gemm ? 2 : input_elem_bytes(&E->down), gesz = input_elem_bytes(&E->gate_up);
  size_t shared_bytes, priv_bytes;
  moe_prefill_sizes(m, E, S, &shared_bytes, &priv_bytes);
  (void)shared_bytes;
  float* p = (float*)(((uintptr_t)workspace + 63) & ~(uintptr_t)63);  // 64-byte aligned, moe_align'ed parts
  void* down_in = p;  // [P, I] down inputs by slot (bf16 on the tile path)
  p += moe_align((size_t)P * I);
  float* dout = p;  // [P, h] expert outputs by slot, dtype-rounded
  p += moe_align((size_t)P * h);
  int* slot_pair = (int*)p;
  p += moe_align(P);
  int* pair_slot = (int*)p;
  p += moe_align(P);
  int* uexp = (int*)p;
  p += moe_align(P);
  int* start = (int*)p;
  p += moe_align((size_t)ne + 2);
  int* count = (int*)p;
  p += moe_align((size_t)ne + 2);
  char* priv_base = (char*)p;
  // group the pairs by expert (ascending, tokens in order within): a stable counting sort
  for (int e = 0; e <= ne; e++) count[e] = 0;
  for (int q = 0; q < P; q++) count[ids[q] + 1]++;
  int nu = 0;
  for (int e = 0; e < ne; e++) {
    if (count[e + 1] > 0) uexp[nu] = e, start[nu++] = count[e];
    count[e + 1] += count[e];
  }
  start[nu] = P;
  for (int q = 0; q < P; q++) {
    const int s = count[ids[q]]++;
    slot_pair[s] = q;
    pair_slot[q] = s;
  }
  const int gu_blocks = (I + MOE_PF_GU_ROWS - 1) / MOE_PF_GU_ROWS;
  const int dn_blocks = (h + MOE_PF_DOWN_ROWS - 1) / MOE_PF_DOWN_ROWS;
  PlacedWorkers placed(nthreads);
#pragma omp parallel num_threads(nthreads)
  {
    const int tid = omp_get_thread_num();
    note_worker(placed.placement, tid);
    float* q = (float*)(priv_base + (size_t)tid * priv_bytes);
    const size_t cols = h > I ? h : I;
    uint16_t* wbuf = (uint16_t*)q;  // dequantized rows (bf16)
    q += moe_align((2 * (size_t)MOE_PF_GU_ROWS + MOE_PF_DOWN_ROWS) * cols / 2);
    float* ybuf = q;  // gate/up outputs of one work item
    q += moe_align(std::max((size_t)S * 2 * MOE_PF_GU_ROWS, (size_t)MOE_PF_CHUNK * 2 * I));
    void* xg = q;  // gathered inputs (fallback)
    q += moe_align((size_t)MOE_PF_CHUNK * h);
    float* xrow = q;
    q += moe_align(h);
    const uint16_t** xs = (const uint16_t**)q;  // the tokens' input rows (tile path)
    // --- gate/up rows of every expert over its tokens, then the activation into the down inputs
#pragma omp for schedule(dynamic, 1)
    for (int it = 0; it < nu * gu_blocks; it++) {
      const int u = it / gu_blocks, i0 = it % gu_blocks * MOE_PF_GU_ROWS;
      const int i1 = i0 + MOE_PF_GU_ROWS < I ? i0 + MOE_PF_GU_ROWS : I, nr = i1 - i0;
      const int e = uexp[u], s0 = start[u], np = start[u + 1] - s0;
      const Mat gu = expert_mat(&E->gate_up, e, E->gate_up_stride, E->gate_up_scale_stride);
      if (gemm) {
#if SOLO_MOE_GEMM
        for (int j = 0; j < np; j++) xs[j] = (const uint16_t*)x + (size_t)(slot_pair[s0 + j] / k) * h;
        const uint16_t *wg = (const uint16_t*)gu.weight + (size_t)i0 * h, *wu = wg + (size_t)I * h;
        if (gu.format != W_BF16) {  // int8 / int4: this block's gate and up rows as bf16
          moe_dequant_rows_bf16(&gu, i0, i1, wbuf);
          moe_dequant_rows_bf16(&gu, I + i0, I + i1, wbuf + (size_t)nr * h);
          wg = wbuf, wu = wbuf + (size_t)nr * h;
        }
        moe_gemm_bf16(wg, h, xs, np, ybuf, 2 * nr, nr);
        moe_gemm_bf16(wu, h, xs, np, ybuf + nr, 2 * nr, nr);
        for (int j = 0; j < np; j++) {
          float* g = ybuf + (size_t)j * 2 * nr;
          for (int c = 0; c < 2 * nr; c++) g[c] = rnd(g[c], bf);  // eager's F.linear output (no bias)
          act_mul(g, g + nr, g, 0, nr, m->act, bf);
          uint16_t* d = (uint16_t*)down_in + (size_t)(s0 + j) * I + i0;
          for (int c = 0; c < nr; c++) d[c] = f32_to_bf16(g[c]);
        }
#endif
      } else {
        for (int c0 = 0; c0 < np; c0 += MOE_PF_CHUNK) {
          const int nc = np - c0 < MOE_PF_CHUNK ? np - c0 : MOE_PF_CHUNK;
          for (int j = 0; j < nc; j++) {
            const int tok = slot_pair[s0 + c0 + j] / k;
            for (int c = 0; c < h; c++) xrow[c] = load_act(x, (size_t)tok * h + c, bf);
            prepare_input(&gu, xrow, 1, (char*)xg + (size_t)j * h * gesz);
          }
          gated_rows(m, &gu, &E->down, xg, nc, ybuf, (char*)down_in + (size_t)(s0 + c0) * I * desz, i0, i1, 0);
        }
      }
    }
    // --- down rows of every expert over its tokens (the implicit barrier above: every down input is written)
#pragma omp for schedule(dynamic, 1)
    for (int it = 0; it < nu * dn_blocks; it++) {
      const int u = it / dn_blocks, n0 = it % dn_blocks * MOE_PF_DOWN_ROWS;
      const int n1 = n0 + MOE_PF_DOWN_ROWS < h ? n0 + MOE_PF_DOWN_ROWS : h;
      const int e = uexp[u], s0 = start[u], np = start[u + 1] - s0;
      const Mat dn = expert_mat(&E->down, e, E->down_stride, E->down_scale_stride);
      float* y = dout + (size_t)s0 * h;
      if (gemm) {
#if SOLO_MOE_GEMM
        for (int j = 0; j < np; j++) xs[j] = (const uint16_t*)down_in + (size_t)(s0 + j) * I;
        const uint16_t* wd = (const uint16_t*)dn.weight + (size_t)n0 * I;
        if (dn.format != W_BF16) {
          moe_dequant_rows_bf16(&dn, n0, n1, wbuf);
          wd = wbuf;
        }
        moe_gemm_bf16(wd, I, xs, np, y + n0, h, n1 - n0);
#endif
      } else {
        gemv_rows(&dn, (const char*)down_in + (size_t)s0 * I * desz, I, np, y, h, n0, n1, 0);
      }
      finish_linear_rows(&dn, y, np, h, bf, n0, n1);
    }
    // --- every token's weighted sum of its k expert outputs (moe_mlp's arithmetic)
#pragma omp for schedule(static)
    for (int b = 0; b < S; b++) {
      for (int n = 0; n < h; n++) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
          const float v = dout[(size_t)pair_slot[b * k + j] * h + n] * weights[b * k + j];
          acc += E->weights_fp32 ? v : rnd(v, bf);
        }
        const float r = rnd(acc, bf);
        if (bf)
          ((uint16_t*)out)[(size_t)b * h + n] = f32_to_bf16(r);
        else
          ((float*)out)[(size_t)b * h + n] = r;
      }
    }
  }
}

// moe_route for `tokens` rows of router logits [tokens, experts] (tests compare it with solo.model.moe.route):
// ids int32 [tokens, k], weights float32 [tokens, k]; experts <= 1024.
extern "C" void solo_moe_route(const float* logits, int tokens, int ne, int k, int norm, int fp32_weights, int bf,
                               int* ids, float* weights) {
  float probs[1024];
  for (int b = 0; b < tokens; b++)
    moe_route(logits + (size_t)b * ne, ne, k, norm, fp32_weights, bf, probs, ids + (size_t)b * k,
              weights + (size_t)b * k);
}

// The MoeLayer struct layout this library was compiled with (cpu_moe.py compares it with its ctypes
// mirror): sizeof and every field's offset, in declaration order. Returns the count.
#define SOLO_MOE_OFF(f) (int64_t) offsetof(MoeLayer, f)
extern "C" int solo_moe_struct_layout(int64_t* out, int capacity) {
  const int64_t v[] = {
      (int64_t)sizeof(MoeLayer), SOLO_MOE_OFF(router), SOLO_MOE_OFF(gate_up), SOLO_MOE_OFF(down),
      SOLO_MOE_OFF(gate_up_stride), SOLO_MOE_OFF(gate_up_scale_stride), SOLO_MOE_OFF(down_stride),
      SOLO_MOE_OFF(down_scale_stride), SOLO_MOE_OFF(shared_gate_up), SOLO_MOE_OFF(shared_down),
      SOLO_MOE_OFF(shared_gate), SOLO_MOE_OFF(experts), SOLO_MOE_OFF(top_k), SOLO_MOE_OFF(inter),
      SOLO_MOE_OFF(shared_inter), SOLO_MOE_OFF(norm_topk_prob), SOLO_MOE_OFF(weights_fp32),
  };
  const int n = (int)(sizeof v / sizeof v[0]);
  for (int i = 0; i < n && i < capacity; i++) out[i] = v[i];
  return n;
}
