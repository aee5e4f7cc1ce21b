// Lane models (Laneformer, solo/model/lanes.py; spec ../shared/laneformer.md) in the CPU decode step.
//
// Included at the end of decode.cpp (it uses the step's barrier and the dense kernels' pieces); called
// through ctypes from solo/runtime/cpu_lanes.py.
//
// On one device the L lanes are a batch dimension (spec section 5):
//   - a "row" lane linear (wq, wk, wv, w1, w3) is the [L, out/L, in] tensor read as one row-major matrix of
//     L * out/L rows, row n taking lane n / (out/L)'s input; a "column" one (wo, w2) is [L, out, in/L] read
//     as L * out rows of in/L columns, row n taking lane n / out's slice of the input. Both run as one
//     matrix-vector product split by rows across the threads (`lane_gemv`), so every weight byte is
//     streamed once per step, as in a dense model of the same shape;
//   - the residual is [batch, L, hidden], one copy per thread (like the dense step's residual);
//   - the delayed sums read a ring of the last d + 1 layers' partials per module, [2, d + 1, batch, L, hidden],
//     written directly by the wo / w2 products (shared by all threads).
// Query heads and KV heads are lane-major, so the q/k/v outputs of all lanes side by side are exactly the
// dense step's [heads | kv heads | kv heads] layout and attention is the dense step's attention.
//
// Numerics mirror the eager LaneTransformer: each rounding to the activation dtype where eager rounds
// (partials, lane sums, the DTP update `partial + (sum - old)`, the residual add), sums over lanes in lane
// order accumulated in float32 (what torch.sum over the lane dim does), interleaved RoPE in float32 with
// the products and the sum rounded separately (no fused multiply-add, as PyTorch's elementwise ops).
#pragma once
#include "common.h"
#include "elementwise.h"
#include "gemv.h"

enum { HEAD_REPLICATE = 0, HEAD_PRE_NORM_LANE_AGG = 1, HEAD_LANE = 2, HEAD_VOCAB_PARALLEL = 3 };

typedef struct {
  Mat wq, wk, wv, wo, w1, w3, w2;  // rows = L * rows per lane (see above); no biases
  const void *attn_norm, *ffn_norm;
  int32_t bcast_attn, bcast_mlp;  // broadcast_attention_to_future / broadcast_mlp_to_future of this layer
} LaneLayer;

typedef struct {
  // Dimensions, eps, attention scale, embedding, final norm, LM head and, per layer (Model.layer), the KV
  // cache and sliding window. The head: [vocab, hidden] (replicate, pre_norm_lane_agg, vocab_parallel:
  // lane l gives rows l * vocab/L ...), or [vocab, L * hidden] (lane).
  const Model* base;
  int32_t lanes, delay, early_comm, head_type;
  float sqrt_lanes;  // (float)sqrt(L): the scale of a lane's own partial in early layers without communication
  LaneLayer* layer;
} LaneModel;

// y[b, n] = W[n, :] . x_{lane(n)}[b, :] for this thread's rows n of W (row_range over all rows), where
// lane(n) = n / per_lane and lane l's input of sequence b starts `b * ldx + l * lane_stride` elements (of
// W's input dtype) into x. With `round`, outputs are rounded to the activation dtype (lane models have
// no biases). A row's arithmetic is the dense `gemv`'s, whatever the batch (batch invariance).
static void lane_gemv(const Mat* W, int per_lane, const void* x, int lane_stride, int ldx, int B, float* y, int ldy,
                      int tid, int nt, int skip, int round, int bf) {
  int n0, n1;
  row_range(W->rows, tid, nt, &n0, &n1);
  if (n0 >= n1) return;
  if (skip) {
    for (int b = 0; b < B; b++) memset(y + (size_t)b * ldy + n0, 0, (size_t)(n1 - n0) * sizeof(float));
    return;
  }
  const size_t esz = input_elem_bytes(W);
  for (int s0 = n0; s0 < n1;) {
    const int lane = s0 / per_lane;
    const int s1 = (lane + 1) * per_lane < n1 ? (lane + 1) * per_lane : n1;
    gemv_rows(W, (const char*)x + (size_t)lane * lane_stride * esz, ldx, B, y, ldy, s0, s1, 0);
    s0 = s1;
  }
  if (round) finish_linear_rows(W, y, B, ldy, bf, n0, n1);  // W->bias is NULL: rounding only
}

// Elements [i0, i1) of the float32 activations `src` written as W's input dtype at the same indices of dst.
static void lane_input(const Mat* W, const float* src, void* dst, size_t i0, size_t i1) {
  Mat flat = *W;
  flat.cols = (int32_t)i1;  // prepare_input_cols reads W for the input dtype only (one "row" of i1 values)
  prepare_input_cols(&flat, src, 1, dst, (int)i0, (int)i1);
}

// Meta's interleaved RoPE on one head [hd] in place: pairs (x[2i], x[2i+1]) rotated by (c[i], s[i]) in
// float32, each product and each sum rounded on its own (eager: `x0 * cos - x1 * sin` as separate ops),
// the results rounded to the dtype once.
static void rope_interleaved(float* x, const float* c, const float* s, int hd, int bf) {
  for (int i = 0; i < hd / 2; i++) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    const float a = x0 * c[i];
    const float b = x1 * s[i];
    const float e = x0 * s[i];
    const float f = x1 * c[i];
    x[2 * i] = rnd(a - b, bf);
    x[2 * i + 1] = rnd(e + f, bf);
  }
}

// out[i] = rnd(sum over lanes of p[l * D + i]) in lane order, float32 accumulation (eager: torch.sum over
// the lane dim of the partials).
static void lane_sum(const float* p, int lanes, int D, float* out, int bf) {
  memcpy(out, p, (size_t)D * sizeof(float));
  for (int l = 1; l < lanes; l++) {
    const float* pl = p + (size_t)l * D;
    for (int i = 0; i < D; i++) out[i] += pl[i];
  }
  int i = 0;
#if SOLO_VEC
  for (; i + 16 <= D; i += 16) _mm512_storeu_ps(out + i, rnd16(_mm512_loadu_ps(out + i), bf));
#elif SOLO_GVEC
  for (; i + GVW <= D; i += GVW) vstore(out + i, vrnd(vload(out + i), bf));
#endif
  for (; i < D; i++) out[i] = rnd(out[i], bf);
}

// h[k] = rnd(h[k] + rnd(p[k] + rnd(s[k] - o[k]))) for k < n: eager's `h + (partial + (pending - old))`.
static void dtp_add(float* h, const float* p, const float* s, const float* o, int n, int bf) {
  int k = 0;
#if SOLO_VEC
  for (; k + 16 <= n; k += 16) {
    const __m512 u = rnd16(_mm512_sub_ps(_mm512_loadu_ps(s + k), _mm512_loadu_ps(o + k)), bf);
    const __m512 w = rnd16(_mm512_add_ps(_mm512_loadu_ps(p + k), u), bf);
    _mm512_storeu_ps(h + k, rnd16(_mm512_add_ps(_mm512_loadu_ps(h + k), w), bf));
  }
#elif SOLO_GVEC
  for (; k + GVW <= n; k += GVW) {
    const vf u = vrnd(vload(s + k) - vload(o + k), bf);
    const vf w = vrnd(vload(p + k) + u, bf);
    vstore(h + k, vrnd(vload(h + k) + w, bf));
  }
#endif
  for (; k < n; k++) h[k] = rnd(h[k] + rnd(p[k] + rnd(s[k] - o[k], bf), bf), bf);
}

// h[k] = rnd(h[k] + rnd(p[k] * sc)) for k < n: eager's `h + partial * sqrt(L)`.
static void scaled_add(float* h, const float* p, float sc, int n, int bf) {
  int k = 0;
#if SOLO_VEC
  const __m512 vs = _mm512_set1_ps(sc);
  for (; k + 16 <= n; k += 16) {
    const __m512 w = rnd16(_mm512_mul_ps(_mm512_loadu_ps(p + k), vs), bf);
    _mm512_storeu_ps(h + k, rnd16(_mm512_add_ps(_mm512_loadu_ps(h + k), w), bf));
  }
#elif SOLO_GVEC
  const vf vs = vset1(sc);
  for (; k + GVW <= n; k += GVW) vstore(h + k, vrnd(vload(h + k) + vrnd(vload(p + k) * vs, bf), bf));
#endif
  for (; k < n; k++) h[k] = rnd(h[k] + rnd(p[k] * sc, bf), bf);
}

// The DTP residual update of module `kind` (0 attention, 1 MLP) of layer i (spec section 4; eager
// LaneTransformer._update), for every sequence and lane of this thread's residual h [B, L, D].
//   ring: [2, d + 1, B, L, D] partials (layer j's in slot j % (d + 1)); sum: [D] scratch.
static void lane_update(const LaneModel* lm, int kind, int i, const float* ring, float* h, float* sum, int B) {
  const Model* m = lm->base;
  const int D = m->hidden, Ln = lm->lanes, d = lm->delay, bf = m->dtype == DT_BF16;
  const size_t LD = (size_t)Ln * D, slots = (size_t)d + 1;
  const LaneLayer* LL = &lm->layer[i];
  const float* P = ring + ((size_t)kind * slots + (size_t)i % slots) * B * LD;
  const int flag = kind ? LL->bcast_mlp : LL->bcast_attn;
  for (int b = 0; b < B; b++) {
    float* hb = h + (size_t)b * LD;
    const float* pb = P + (size_t)b * LD;
    if ((d == 0 && flag) || (d > 0 && i < d && lm->early_comm)) {
      // All-reduced at once: every lane adds the sum of all lanes' partials.
      lane_sum(pb, Ln, D, sum, bf);
      for (int l = 0; l < Ln; l++) residual_add(hb + (size_t)l * D, sum, D, bf);
    } else if (d > 0 && i < d) {
      // Early layer without communication: h_l += sqrt(L) * own_l.
      scaled_add(hb, pb, lm->sqrt_lanes, (int)LD, bf);
    } else if (d > 0 && (kind ? lm->layer[i - d].bcast_mlp : lm->layer[i - d].bcast_attn)) {
      // h_l += own_l(i) + (sum_j partial_j(i - d) - partial_l(i - d)), rounded as eager's
      // `partial + (pending - old)`.
      const float* old = ring + ((size_t)kind * slots + (size_t)(i - d) % slots) * B * LD + (size_t)b * LD;
      lane_sum(old, Ln, D, sum, bf);
      for (int l = 0; l < Ln; l++)
        dtp_add(hb + (size_t)l * D, pb + (size_t)l * D, sum, old + (size_t)l * D, D, bf);
    } else {
      residual_add(hb, pb, (int)LD, bf);  // the own partial alone
    }
  }
}

// Per-thread scratch floats: residual and normed residual [B, L, D], post-processed q/k/v, the
// matrix-vector input [B, L * D], the aggregated final state [B, D], a lane-sum row [D], attention
// scores of one GQA group.
static size_t lane_private_floats(const LaneModel* lm, int B) {
  const Model* m = lm->base;
  const size_t LD = (size_t)lm->lanes * m->hidden;
  const size_t nqkv = (size_t)(m->heads + 2 * m->kv_heads) * m->head_dim;
  const size_t group = (size_t)(m->heads / m->kv_heads);
  const size_t floats = (3 * LD + nqkv + m->hidden) * B + m->hidden + (size_t)m->max_seq * group + 64;
  return (floats + 15) & ~(size_t)15;
}

static size_t lane_shared_floats(const LaneModel* lm, int B) {
  const Model* m = lm->base;
  const size_t LD = (size_t)lm->lanes * m->hidden, nq = (size_t)m->heads * m->head_dim;
  const size_t nqkv = nq + 2 * (size_t)m->kv_heads * m->head_dim, f = m->inter;
  size_t floats = 0;
  floats += B * nqkv;                        // q, k, v (matrix-vector output)
  floats += 2 * B * nq;                      // attention output, wo input
  floats += B * 2 * f;                       // w1 | w3 outputs
  floats += B * f;                           // w2 input
  floats += 2 * ((size_t)lm->delay + 1) * B * LD;  // the ring of partials
  return (floats + 15) & ~(size_t)15;
}

// Bytes of workspace `solo_lane_decode` needs for `batch` sequences and `nthreads` threads.
extern "C" size_t solo_lane_workspace_bytes(const LaneModel* lm, int batch, int nthreads) {
  return (lane_shared_floats(lm, batch) + (size_t)nthreads * lane_private_floats(lm, batch)) * sizeof(float) + 256;
}

// One decode step of a lane model for `batch` sequences (see CpuLaneRuntime.decode in cpu_lanes.py).
//   tokens, positions, rows: int64 [batch]; cos, sin: float32 [batch, head_dim / 2] (interleaved RoPE);
//   logits: float32 [batch, vocab] out; workspace: solo_lane_workspace_bytes(lm, batch, nthreads) bytes.
// Barriers: after each matrix product whose output every thread reads, and after attention and the
// activation (six per layer, as the dense step).
extern "C" void solo_lane_decode(const LaneModel* lm, int batch, const int64_t* tokens, const int64_t* positions,
                                 const int64_t* rows, const float* cos, const float* sin, float* logits,
                                 void* workspace, int nthreads) {
  const Model* m = lm->base;
  const int B = batch, D = m->hidden, hd = m->head_dim, bf = m->dtype == DT_BF16, Ln = lm->lanes;
  const int nq = m->heads * hd, nkv = m->kv_heads * hd, nqkv = nq + 2 * nkv, f = m->inter;
  const int LD = Ln * D, ql = nq / Ln, kvl = nkv / Ln, fl = f / Ln;
  const size_t slots = (size_t)lm->delay + 1;
  float* qkv = (float*)workspace;
  float* att = qkv + (size_t)B * nqkv;
  void* o_in = att + (size_t)B * nq;
  float* gu = (float*)o_in + (size_t)B * nq;
  void* down_in = gu + (size_t)B * 2 * f;
  float* ring = (float*)down_in + (size_t)B * f;
  float* private_base = (float*)workspace + lane_shared_floats(lm, B);
  SpinBarrier bar;
  bar.arrived.store(0);
  bar.generation.store(0);
  bar.sleepers.store(0);
  bar.late.store(0);
  PlacedWorkers placed(nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    note_worker(placed.placement, tid);
    const int skip = m->skip_matmuls;
    const int gs = attend_group_size(m, B, nt);  // query heads per attention work item (0: per-head kernel)
    float* h = private_base + (size_t)tid * lane_private_floats(lm, B);  // residual [B, L, D]
    float* t = h + (size_t)B * LD;                                         // normed residual [B, L, D]
    float* lq = t + (size_t)B * LD;                                        // post-processed q, k, v [B, nqkv]
    void* xin = lq + (size_t)B * nqkv;                                     // matrix-vector input [B, L * D]
    float* agg = (float*)xin + (size_t)B * LD;                             // final aggregated state [B, D]
    float* sum = agg + (size_t)B * D;                                      // one lane sum [D]
    float* scores = sum + D;                                               // attention scores [group, max_seq]
    // The embedding copied into every lane, then layer 0's attention norm.
    for (int b = 0; b < B; b++) {
      for (int l = 0; l < Ln; l++) {
        float* hl = h + (size_t)b * LD + (size_t)l * D;
        for (int i = 0; i < D; i++) hl[i] = load_act(m->embed, (size_t)tokens[b] * D + i, bf);
        rms_norm(hl, t + (size_t)b * LD + (size_t)l * D, D, lm->layer[0].attn_norm, m->eps, 0, bf);
      }
    }
    lane_input(&lm->layer[0].wq, t, xin, 0, (size_t)B * LD);
    for (int li = 0; li < m->layers; li++) {
      const Layer* L = &m->layer[li];
      const LaneLayer* LL = &lm->layer[li];
      // --- q, k, v: each lane's rows from its own normed residual
      lane_gemv(&LL->wq, ql, xin, D, LD, B, qkv, nqkv, tid, nt, skip, 0, bf);
      lane_gemv(&LL->wk, kvl, xin, D, LD, B, qkv + nq, nqkv, tid, nt, skip, 0, bf);
      lane_gemv(&LL->wv, kvl, xin, D, LD, B, qkv + nq + nkv, nqkv, tid, nt, skip, 0, bf);
      barrier_wait(&bar, nt);
      memcpy(lq, qkv, (size_t)B * nqkv * sizeof(float));
      finish_linear_rows(&LL->wq, lq, B, nqkv, bf, 0, nqkv);  // no bias: rounds to the dtype
      for (int b = 0; b < B; b++) {
        float* qb = lq + (size_t)b * nqkv;
        for (int hh = 0; hh < m->heads + m->kv_heads; hh++)
          rope_interleaved(qb + (size_t)hh * hd, cos + (size_t)b * (hd / 2), sin + (size_t)b * (hd / 2), hd, bf);
        if (tid == 0) {
          // Read by attention only in later steps (this step's own key and value come from each thread's
          // copy), so one writer and no barrier.
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
      // --- attention over all lanes' heads at once: (sequence, group of query heads) split across threads
      {
        const int per = gs > 0 ? gs : 1, groups = m->heads / per;
        const int items = B * groups;
        const int i0 = (int)((long)items * tid / nt), i1 = (int)((long)items * (tid + 1) / nt);
        for (int it = i0; it < i1; it++) {
          const int b = it / groups, hh = (it % groups) * per, kvh = hh / (m->heads / m->kv_heads);
          const float* qb = lq + (size_t)b * nqkv;
          const float* k_now = qb + nq + (size_t)kvh * hd;
          const float* v_now = qb + nq + nkv + (size_t)kvh * hd;
          float* out = att + (size_t)b * nq + (size_t)hh * hd;
          if (gs > 0)
            attend_heads(m, L, qb + (size_t)hh * hd, k_now, v_now, (int)rows[b], (int)positions[b], kvh, gs, scores,
                         (size_t)m->max_seq, out);
          else
            attend(m, L, qb + (size_t)hh * hd, k_now, v_now, (int)rows[b], (int)positions[b], kvh, scores, out);
          lane_input(&LL->wo, att, o_in, (size_t)b * nq + (size_t)hh * hd, (size_t)b * nq + (size_t)(hh + per) * hd);
        }
      }
      barrier_wait(&bar, nt);
      // --- wo: lane l's heads -> its full-width partial, straight into the ring
      float* pa = ring + (0 * slots + (size_t)li % slots) * B * LD;
      lane_gemv(&LL->wo, D, o_in, ql, nq, B, pa, LD, tid, nt, skip, 1, bf);
      barrier_wait(&bar, nt);
      lane_update(lm, 0, li, ring, h, sum, B);
      for (int b = 0; b < B; b++)
        for (int l = 0; l < Ln; l++) {
          const size_t off = (size_t)b * LD + (size_t)l * D;
          rms_norm(h + off, t + off, D, LL->ffn_norm, m->eps, 0, bf);
        }
      lane_input(&LL->w1, t, xin, 0, (size_t)B * LD);
      // --- MLP: w1 and w3 per lane, the activation split across threads, then w2 into the ring
      lane_gemv(&LL->w1, fl, xin, D, LD, B, gu, 2 * f, tid, nt, skip, 0, bf);
      lane_gemv(&LL->w3, fl, xin, D, LD, B, gu + f, 2 * f, tid, nt, skip, 0, bf);
      barrier_wait(&bar, nt);
      {
        int i0, i1;
        row_range(f, tid, nt, &i0, &i1);
        if (i0 < i1) {
          finish_linear_rows(&LL->w1, gu, B, 2 * f, bf, i0, i1);
          finish_linear_rows(&LL->w3, gu, B, 2 * f, bf, f + i0, f + i1);
          for (int b = 0; b < B; b++) {
            float* g = gu + (size_t)b * 2 * f;
            act_mul(g, g + f, g, i0, i1, ACT_SILU, bf);  // in place: the w1 half holds the product
            Mat flat = LL->w2;
            flat.cols = f;  // the input row of all lanes' columns, [f]
            prepare_input_cols(&flat, g, 1, (char*)down_in + (size_t)b * f * input_elem_bytes(&LL->w2), i0, i1);
          }
        }
      }
      barrier_wait(&bar, nt);
      float* pm = ring + (1 * slots + (size_t)li % slots) * B * LD;
      lane_gemv(&LL->w2, D, down_in, fl, f, B, pm, LD, tid, nt, skip, 1, bf);
      barrier_wait(&bar, nt);
      lane_update(lm, 1, li, ring, h, sum, B);
      const bool last = li + 1 == m->layers;
      if (!last) {
        const LaneLayer* next = &lm->layer[li + 1];
        for (int b = 0; b < B; b++)
          for (int l = 0; l < Ln; l++) {
            const size_t off = (size_t)b * LD + (size_t)l * D;
            rms_norm(h + off, t + off, D, next->attn_norm, m->eps, 0, bf);
          }
        lane_input(&next->wq, t, xin, 0, (size_t)B * LD);
      }
    }
    // --- final aggregation of the lanes (lm_head_type) and the LM head
    const Mat* head = &m->head;
    if (lm->head_type == HEAD_PRE_NORM_LANE_AGG) {
      for (int b = 0; b < B; b++) {
        lane_sum(h + (size_t)b * LD, Ln, D, sum, bf);
        rms_norm(sum, agg + (size_t)b * D, D, m->final_norm, m->eps, 0, bf);
      }
    } else {
      for (int b = 0; b < B; b++)
        for (int l = 0; l < Ln; l++) {
          const size_t off = (size_t)b * LD + (size_t)l * D;
          rms_norm(h + off, t + off, D, m->final_norm, m->eps, 0, bf);
        }
      if (lm->head_type == HEAD_REPLICATE) {
        // mean over lanes of the normed streams: rnd(rnd(sum) / L), as eager's `lane_sum(norm(h)) / L`
        for (int b = 0; b < B; b++) {
          lane_sum(t + (size_t)b * LD, Ln, D, sum, bf);
          for (int i = 0; i < D; i++) agg[(size_t)b * D + i] = rnd(sum[i] / (float)Ln, bf);
        }
      }
    }
    if (lm->head_type == HEAD_REPLICATE || lm->head_type == HEAD_PRE_NORM_LANE_AGG) {
      lane_input(head, agg, xin, 0, (size_t)B * D);
      lane_gemv(head, head->rows, xin, 0, D, B, logits, m->vocab, tid, nt, skip, 1, bf);
    } else if (lm->head_type == HEAD_LANE) {
      // lanes concatenated: one [vocab, L * D] product over t [B, L * D]
      lane_input(head, t, xin, 0, (size_t)B * LD);
      lane_gemv(head, head->rows, xin, 0, LD, B, logits, m->vocab, tid, nt, skip, 1, bf);
    } else {
      // vocab_parallel: lane l's normed stream gives vocabulary rows l * vocab / L ...
      lane_input(head, t, xin, 0, (size_t)B * LD);
      lane_gemv(head, m->vocab / Ln, xin, D, LD, B, logits, m->vocab, tid, nt, skip, 1, bf);
    }
  }
}

// The struct layout the lane kernels were compiled with: sizeof and every field's offset of LaneLayer and
// LaneModel, in declaration order. cpu_lanes.py compares it with its ctypes mirrors at load. Returns the count.
extern "C" int solo_lane_struct_layout(int64_t* out, int capacity) {
  const int64_t v[] = {
      (int64_t)sizeof(LaneLayer), SOLO_OFF(LaneLayer, wq), SOLO_OFF(LaneLayer, wk), SOLO_OFF(LaneLayer, wv),
      SOLO_OFF(LaneLayer, wo), SOLO_OFF(LaneLayer, w1), SOLO_OFF(LaneLayer, w3), SOLO_OFF(LaneLayer, w2),
      SOLO_OFF(LaneLayer, attn_norm), SOLO_OFF(LaneLayer, ffn_norm), SOLO_OFF(LaneLayer, bcast_attn),
      SOLO_OFF(LaneLayer, bcast_mlp),
      (int64_t)sizeof(LaneModel), SOLO_OFF(LaneModel, base), SOLO_OFF(LaneModel, lanes), SOLO_OFF(LaneModel, delay),
      SOLO_OFF(LaneModel, early_comm), SOLO_OFF(LaneModel, head_type), SOLO_OFF(LaneModel, sqrt_lanes),
      SOLO_OFF(LaneModel, layer),
  };
  const int n = (int)(sizeof v / sizeof v[0]);
  for (int i = 0; i < n && i < capacity; i++) out[i] = v[i];
  return n;
}
