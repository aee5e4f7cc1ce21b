// Solo's monokernel: a persistent interpreter of the decode-step program (solo/runtime/megakernel).
//
// One CTA per SM walks its queue of fixed-size int32 instructions, once per decode step, n_steps
// times. Before an instruction runs, thread 0 spins on the counters it waits on with ld.acquire.gpu
// until each holds target * (step + 1); after it, thread 0 signals its counter with red.release.gpu
// (PTX ISA, "Memory Consistency Model": release/acquire patterns give the causality order that makes
// the producer's writes visible). No grid-wide barrier. While an instruction waits and runs, the
// weights of the next one already stream into the other shared-memory stage with cp.async (weights
// never change, so prefetching them before the wait is safe). Every reduction has a fixed order, so
// results do not depend on timing. Opcodes, instruction words and state words match graph.py /
// schedule.py; the model's sizes arrive as -D defines (see nvrtc.py). Numerics mirror the eager model
// (and the Python VM): RMSNorm in float32 rounded to bf16 before the weight multiply, float32
// accumulation rounded once to bf16, attention in float32.
//
// Needs: sm_80+ (cp.async), compiled for sm_90a on Hopper. Self-contained (no CUDA headers), so
// NVRTC compiles it without a CUDA toolkit.

#ifndef HIDDEN
#error "compile with the model's sizes (-DHIDDEN=... see nvrtc.py)"
#endif
#ifndef SOLO_DYNAMIC_SMEM
#define SOLO_DYNAMIC_SMEM(name) extern __shared__ __align__(16) char name[]
#endif

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define OP_NOP 0
#define OP_EMBED 1
#define OP_QKV 2
#define OP_ATTN 3
#define OP_MERGE 4
#define OP_OPROJ 5
#define OP_GATE_UP 6
#define OP_DOWN 7
#define OP_LM_HEAD 8
#define OP_SAMPLE 9

#define W_OP 0
#define W_LAYER 1
#define W_A 2
#define W_B 3
#define W_C 4
#define W_WAIT0 5
#define W_TARGET0 6
#define W_WAIT1 7
#define W_TARGET1 8
#define W_SIGNAL 9

#define STATE_POS 0
#define STATE_TOKEN 1
#define STATE_DONE 2
#define STATE_EMITTED 3
#define STATE_BUDGET 4
#define STATE_NUM_STOP 5
#define STATE_STOP 6
#define STATE_TEMPERATURE 16  // float bits; 0 = greedy
#define STATE_SEED 17
#define STATE_ERROR 18        // set when a counter wait timed out: every CTA then stops

// Pointer table: global entries, then PER_LAYER entries per layer.
#define P_EMBED 0
#define P_LM_HEAD 1
#define P_FINAL_NORM 2
#define P_ROPE_COS 3
#define P_ROPE_SIN 4
#define P_X0 5
#define P_X1 6
#define P_Q 7
#define P_ATTN 8
#define P_H 9
#define P_PART_O 10
#define P_PART_ML 11
#define P_LOGITS 12
#define P_AMAX_VAL 13
#define P_AMAX_IDX 14
#define P_GLOBAL 16
#define L_ATTN_NORM 0
#define L_WQKV 1
#define L_WO 2
#define L_MLP_NORM 3
#define L_WGU 4
#define L_WDOWN 5
#define L_KCACHE 6
#define L_VCACHE 7
#define PER_LAYER 8

#define NEG_INF (-__int_as_float(0x7f800000))
#define NWARPS (NTHREADS / 32)
#define HALF (HEAD_DIM / 2)
#define GROUPS (HEADS / KV_HEADS)
#define QSIZE (HEADS * HEAD_DIM)
#define MAXK (INTER > HIDDEN ? (INTER > QSIZE ? INTER : QSIZE) : (HIDDEN > QSIZE ? HIDDEN : QSIZE))

static_assert(HIDDEN % 8 == 0 && INTER % 8 == 0 && QSIZE % 8 == 0, "row lengths must be multiples of 8");
static_assert(STAGE_BYTES % 16 == 0, "stages hold 16-byte chunks");
static_assert(NWARPS * GROUPS * HEAD_DIM * 4 + 2 * NWARPS * GROUPS * 4 <= STAGE_BYTES,
              "attention's per-warp partials must fit one stage");

// ------------------------------------------------------------------------------------ bf16 and memory

__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((u32)x) << 16); }

__device__ __forceinline__ bf16_t f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                               // round to nearest even
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float rbf(float f) { return bf2f(f2bf(f)); }  // round through bf16

#ifndef SOLO_EMULATE  // the host emulation (tests/runtime/megakernel_emu.h) defines these itself
// Activations are written by other SMs: read them from L2 (.cg), never from a stale L1 line.
__device__ __forceinline__ bf16_t ld_act(const bf16_t* p) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float ld_actf(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_acti(const int* p) {
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Eight bf16 activations (16 bytes, aligned) from L2, as floats.
__device__ __forceinline__ void ld_act8(const bf16_t* p, float* out) {
    u32 a, b, c, d;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p) : "memory");
    const u32 w[4] = {a, b, c, d};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ unsigned long long clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void st_flag(int* p, int v) {
    asm volatile("st.relaxed.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
#endif

template <typename T>
__device__ __forceinline__ T* ptr(const unsigned long long* table, int i) {
    return reinterpret_cast<T*>(table[i]);
}
template <typename T>
__device__ __forceinline__ T* lptr(const unsigned long long* table, int layer, int i) {
    return reinterpret_cast<T*>(table[P_GLOBAL + layer * PER_LAYER + i]);
}

// ------------------------------------------------------------------------------------ reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block in a fixed order (per-thread strided sums, a fixed shuffle tree, warps in order).
__device__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < NWARPS; ++w) total += scratch[w];
    return total;
}

// out[i] = w[i] * bf16(x[i] * rsqrt(mean(x^2) + eps)), rounded to bf16 (the eager Llama RMSNorm).
__device__ void rmsnorm_to_smem(const bf16_t* x, const bf16_t* w, bf16_t* out, float* scratch) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < HIDDEN; i += NTHREADS) {
        float v = bf2f(ld_act(x + i));
        ss += v * v;
    }
    const float rstd = rsqrtf(block_sum(ss, scratch) / HIDDEN + RMS_EPS);
    for (int i = threadIdx.x; i < HIDDEN; i += NTHREADS) {
        float v = bf2f(ld_act(x + i));
        out[i] = f2bf(bf2f(w[i]) * rbf(v * rstd));
    }
    __syncthreads();
}

__device__ void act_to_smem(const bf16_t* src, bf16_t* out, int n) {
    for (int i = threadIdx.x; i < n; i += NTHREADS) out[i] = ld_act(src + i);
    __syncthreads();
}

// dots[r] = sum_k w[r * K + k] * x[k] for r < rows: float32 accumulation in a fixed order. Rows are
// split over warps; when there are fewer rows than warps each row is also split over K slices whose
// partial sums are added in slice order. w may point to shared or global memory.
template <int K>
__device__ void matvec(const bf16_t* w, const bf16_t* x, int rows, float* dots, float* scratch) {
    constexpr int CHUNKS = K / 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slices = rows >= NWARPS ? 1 : NWARPS / rows;
    const int items = rows * slices;
    for (int item = warp; item < items; item += NWARPS) {
        const int r = item / slices, s = item % slices;
        const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)r * K);
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        float acc = 0.f;
        for (int c = lane + 32 * s; c < CHUNKS; c += 32 * slices) {
            uint4 a = wr[c], b = xv[c];
            const u32 av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc += __uint_as_float(av[j] << 16) * __uint_as_float(bv[j] << 16);
                acc += __uint_as_float(av[j] & 0xffff0000u) * __uint_as_float(bv[j] & 0xffff0000u);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) scratch[r * slices + s] = acc;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        float total = 0.f;
        for (int s = 0; s < slices; ++s) total += scratch[threadIdx.x * slices + s];
        dots[threadIdx.x] = total;
    }
    __syncthreads();
}

// ------------------------------------------------------------------------------------ prefetch

struct Tile {
    const bf16_t* src0;
    const bf16_t* src1;  // second row range (QKV's second half, gate/up's up rows) or null
    int bytes0, bytes1;  // bytes of each range; 0 when the tile does not fit a stage
};

__device__ Tile weight_tile(const int* ins, const unsigned long long* table) {
    Tile t = {nullptr, nullptr, 0, 0};
    const int op = ins[W_OP], layer = ins[W_LAYER], a = ins[W_A], b = ins[W_B], c = ins[W_C];
    if (op == OP_QKV) {
        const bf16_t* w = lptr<const bf16_t>(table, layer, L_WQKV);
        t.src0 = w + (size_t)(a * HEAD_DIM + b) * HIDDEN;
        t.src1 = w + (size_t)(a * HEAD_DIM + HALF + b) * HIDDEN;
        t.bytes0 = t.bytes1 = c * HIDDEN * 2;
    } else if (op == OP_OPROJ) {
        t.src0 = lptr<const bf16_t>(table, layer, L_WO) + (size_t)a * QSIZE;
        t.bytes0 = b * QSIZE * 2;
    } else if (op == OP_GATE_UP) {
        const bf16_t* w = lptr<const bf16_t>(table, layer, L_WGU);
        t.src0 = w + (size_t)a * HIDDEN;
        t.src1 = w + (size_t)(INTER + a) * HIDDEN;
        t.bytes0 = t.bytes1 = b * HIDDEN * 2;
    } else if (op == OP_DOWN) {
        t.src0 = lptr<const bf16_t>(table, layer, L_WDOWN) + (size_t)a * INTER;
        t.bytes0 = b * INTER * 2;
    } else if (op == OP_LM_HEAD) {
        t.src0 = ptr<const bf16_t>(table, P_LM_HEAD) + (size_t)a * HIDDEN;
        t.bytes0 = b * HIDDEN * 2;
    }
    if (t.bytes0 + t.bytes1 > STAGE_BYTES) t.bytes0 = t.bytes1 = 0;  // streamed from global instead
    return t;
}

__device__ void prefetch(const Tile& t, char* stage) {
    for (int i = threadIdx.x * 16; i < t.bytes0; i += NTHREADS * 16)
        cp_async16(stage + i, reinterpret_cast<const char*>(t.src0) + i);
    for (int i = threadIdx.x * 16; i < t.bytes1; i += NTHREADS * 16)
        cp_async16(stage + t.bytes0 + i, reinterpret_cast<const char*>(t.src1) + i);
}

// The tile's rows: from the stage when prefetched, else straight from global memory.
__device__ __forceinline__ const bf16_t* rows0(const Tile& t, const char* stage) {
    return t.bytes0 ? reinterpret_cast<const bf16_t*>(stage) : t.src0;
}
__device__ __forceinline__ const bf16_t* rows1(const Tile& t, const char* stage) {
    return t.bytes0 ? reinterpret_cast<const bf16_t*>(stage + t.bytes0) : t.src1;
}

// ------------------------------------------------------------------------------------ the ops

struct Smem {
    int failed;   // the launch gave up (STATE_ERROR)
    int max_seq;  // KV-cache slots per (layer, KV head): a launch argument, so the cache can grow
    int vec_key;  // what `vec` holds: (step, layer, op) of the instruction that filled it, or -1
    float scratch[NTHREADS];
    float dots[2 * NTHREADS];
    int pos, done, token;
    float best_val[NWARPS];
    int best_idx[NWARPS];
};

// Consecutive instructions of one stage on an SM (QKV tiles of a layer, LM-head tiles, ...) read the
// same input vector, unchanged until every one of them is done (the schedule checker proves no
// writer intervenes), so the normalised / staged vector in shared memory is reused instead of
// recomputed. Returns true when `vec` must be filled.
__device__ __forceinline__ bool vec_stale(const Smem& sm, int key) { return sm.vec_key != key; }
__device__ __forceinline__ void vec_filled(Smem& sm, int key) {
    if (threadIdx.x == 0) sm.vec_key = key;
}
__device__ __forceinline__ int stage_key(int step, int layer, int op) { return (step * (LAYERS + 1) + layer) * 16 + op; }


__device__ void op_qkv(const int* ins, const unsigned long long* table, const Tile& t, const char* stage,
                       bf16_t* vec, Smem& sm, int step) {
    const int layer = ins[W_LAYER], head = ins[W_A], j0 = ins[W_B], pairs = ins[W_C], pos = sm.pos;
    const int key = stage_key(step, layer, OP_QKV);
    if (vec_stale(sm, key)) {
        rmsnorm_to_smem(ptr<const bf16_t>(table, P_X0), lptr<const bf16_t>(table, layer, L_ATTN_NORM), vec,
                        sm.scratch);
        vec_filled(sm, key);
    }
    matvec<HIDDEN>(rows0(t, stage), vec, pairs, sm.dots, sm.scratch);
    matvec<HIDDEN>(rows1(t, stage), vec, pairs, sm.dots + NTHREADS, sm.scratch);
    if (threadIdx.x < pairs) {
        const int j = j0 + threadIdx.x;
        float y1 = rbf(sm.dots[threadIdx.x]), y2 = rbf(sm.dots[NTHREADS + threadIdx.x]);
        if (head < HEADS + KV_HEADS) {  // RoPE, rotate-half layout, each product rounded as eager does
            const float c = bf2f(ptr<const bf16_t>(table, P_ROPE_COS)[pos * HALF + j]);
            const float s = bf2f(ptr<const bf16_t>(table, P_ROPE_SIN)[pos * HALF + j]);
            const float o1 = rbf(rbf(y1 * c) + rbf(-y2 * s));
            const float o2 = rbf(rbf(y2 * c) + rbf(y1 * s));
            y1 = o1;
            y2 = o2;
        }
        bf16_t* out;
        if (head < HEADS) {
            out = ptr<bf16_t>(table, P_Q) + head * HEAD_DIM;
        } else if (head < HEADS + KV_HEADS) {
            out = lptr<bf16_t>(table, layer, L_KCACHE) + ((size_t)(head - HEADS) * sm.max_seq + pos) * HEAD_DIM;
        } else {
            out = lptr<bf16_t>(table, layer, L_VCACHE) +
                  ((size_t)(head - HEADS - KV_HEADS) * sm.max_seq + pos) * HEAD_DIM;
        }
        out[j] = f2bf(y1);
        out[HALF + j] = f2bf(y2);
    }
}

// Split-KV partial attention of one KV group over keys [lo, hi): per query head the running max m,
// the sum l of exp(score - m) and the unnormalised output o. A key is read by LPK lanes, 16 bytes
// (8 dims) each, so a warp walks KPW keys at a time with an online softmax per lane group; the
// groups' states are merged by a fixed shuffle tree, then the warps' in warp order.
#define LPK_RAW ((HEAD_DIM + 7) / 8)
#define LPK (LPK_RAW <= 1 ? 1 : LPK_RAW <= 2 ? 2 : LPK_RAW <= 4 ? 4 : LPK_RAW <= 8 ? 8 : LPK_RAW <= 16 ? 16 : 32)
#define KPW (32 / LPK)
static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "head_dim must be a multiple of 8, at most 256");

// Merge (m, l, o) with another group's state (log-sum-exp rescaling; an empty state has m = -inf).
__device__ __forceinline__ void merge_state(float& m, float& l, float* o, float m2, float l2, const float* o2) {
    const float top = fmaxf(m, m2);
    const float a = m == NEG_INF ? 0.f : expf(m - top);
    const float b = m2 == NEG_INF ? 0.f : expf(m2 - top);
    l = l * a + l2 * b;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = o[i] * a + o2[i] * b;
    m = top;
}

__device__ void op_attn(const int* ins, const unsigned long long* table, char* stage, Smem& sm) {
    const int layer = ins[W_LAYER], g = ins[W_A], split = ins[W_B];
    const int kv_len = sm.pos + 1;
    const int chunk = (kv_len + SPLITS - 1) / SPLITS;
    const int lo = min(kv_len, split * chunk), hi = min(kv_len, lo + chunk);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / LPK, sub = lane % LPK, d0 = sub * 8;
    const bool active = d0 < HEAD_DIM;
    const bf16_t* q = ptr<const bf16_t>(table, P_Q) + g * GROUPS * HEAD_DIM;
    const bf16_t* kc = lptr<const bf16_t>(table, layer, L_KCACHE) + (size_t)g * sm.max_seq * HEAD_DIM;
    const bf16_t* vc = lptr<const bf16_t>(table, layer, L_VCACHE) + (size_t)g * sm.max_seq * HEAD_DIM;
    float o[GROUPS][8], m[GROUPS], l[GROUPS];
#pragma unroll
    for (int h = 0; h < GROUPS; ++h) {
        m[h] = NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) o[h][i] = 0.f;
    }
    for (int base = lo + warp * KPW; base < hi; base += NWARPS * KPW) {
        const int key = base + group;
        const bool valid = key < hi && active;
        float kr[8], vr[8];
        if (valid) {
            ld_act8(kc + (size_t)key * HEAD_DIM + d0, kr);
            ld_act8(vc + (size_t)key * HEAD_DIM + d0, vr);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) kr[i] = vr[i] = 0.f;
        }
#pragma unroll
        for (int h = 0; h < GROUPS; ++h) {
            float qr[8];
            if (active) {
                ld_act8(q + h * HEAD_DIM + d0, qr);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) qr[i] = 0.f;
            }
            float dot = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) dot += qr[i] * kr[i];
#pragma unroll
            for (int off = LPK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (key < hi) {
                const float s = dot * ATTN_SCALE;
                const float m_new = fmaxf(m[h], s);
                const float alpha = expf(m[h] - m_new), p = expf(s - m_new);
                l[h] = l[h] * alpha + p;
#pragma unroll
                for (int i = 0; i < 8; ++i) o[h][i] = o[h][i] * alpha + p * vr[i];
                m[h] = m_new;
            }
        }
    }
    // The KPW lane groups of a warp merged by a fixed shuffle tree (lane groups 2^k apart).
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
        for (int h = 0; h < GROUPS; ++h) {
            float o2[8];
            const float m2 = __shfl_xor_sync(0xffffffffu, m[h], off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[h], off);
#pragma unroll
            for (int i = 0; i < 8; ++i) o2[i] = __shfl_xor_sync(0xffffffffu, o[h][i], off);
            merge_state(m[h], l[h], o[h], m2, l2, o2);
        }
    }
    // Per-warp states -> stage scratch (lanes of group 0), then merged in warp order.
    float* wo = reinterpret_cast<float*>(stage);                  // [NWARPS][GROUPS][HEAD_DIM]
    float* wm = wo + NWARPS * GROUPS * HEAD_DIM;                  // [NWARPS][GROUPS]
    float* wl = wm + NWARPS * GROUPS;                             // [NWARPS][GROUPS]
    if (group == 0 && active) {
#pragma unroll
        for (int h = 0; h < GROUPS; ++h) {
#pragma unroll
            for (int i = 0; i < 8; ++i) wo[(warp * GROUPS + h) * HEAD_DIM + d0 + i] = o[h][i];
            if (sub == 0) {
                wm[warp * GROUPS + h] = m[h];
                wl[warp * GROUPS + h] = l[h];
            }
        }
    }
    __syncthreads();
    float* part_o = ptr<float>(table, P_PART_O) + ((size_t)g * SPLITS + split) * GROUPS * HEAD_DIM;
    float* part_ml = ptr<float>(table, P_PART_ML) + ((size_t)g * SPLITS + split) * GROUPS * 2;
    for (int e = threadIdx.x; e < GROUPS * HEAD_DIM; e += NTHREADS) {
        const int h = e / HEAD_DIM, d = e % HEAD_DIM;
        float top = NEG_INF;
        for (int w = 0; w < NWARPS; ++w) top = fmaxf(top, wm[w * GROUPS + h]);
        float acc = 0.f, sum = 0.f;
        for (int w = 0; w < NWARPS; ++w) {
            const float mw = wm[w * GROUPS + h];
            const float scale = mw == NEG_INF ? 0.f : expf(mw - top);
            acc += wo[(w * GROUPS + h) * HEAD_DIM + d] * scale;
            sum += wl[w * GROUPS + h] * scale;
        }
        part_o[e] = acc;
        if (d == 0) {
            part_ml[h * 2] = top;
            part_ml[h * 2 + 1] = sum;
        }
    }
}

// Merge one group's split-KV partials in split order (log-sum-exp rescaling) -> attn (bf16).
__device__ void op_merge(const int* ins, const unsigned long long* table) {
    const int g = ins[W_A];
    const float* part_o = ptr<const float>(table, P_PART_O) + (size_t)g * SPLITS * GROUPS * HEAD_DIM;
    const float* part_ml = ptr<const float>(table, P_PART_ML) + (size_t)g * SPLITS * GROUPS * 2;
    bf16_t* out = ptr<bf16_t>(table, P_ATTN) + g * GROUPS * HEAD_DIM;
    for (int e = threadIdx.x; e < GROUPS * HEAD_DIM; e += NTHREADS) {
        const int h = e / HEAD_DIM;
        float top = NEG_INF;
        for (int s = 0; s < SPLITS; ++s) top = fmaxf(top, ld_actf(part_ml + (s * GROUPS + h) * 2));
        float acc = 0.f, sum = 0.f;
        for (int s = 0; s < SPLITS; ++s) {
            const float ms = ld_actf(part_ml + (s * GROUPS + h) * 2);
            const float scale = ms == NEG_INF ? 0.f : expf(ms - top);
            acc += ld_actf(part_o + (size_t)s * GROUPS * HEAD_DIM + e) * scale;
            sum += ld_actf(part_ml + (s * GROUPS + h) * 2 + 1) * scale;
        }
        out[e] = f2bf(acc / sum);
    }
}

// x_out[r] = x_in[r] + bf16(W[r] @ v) for the tile's rows (O-projection and down-projection).
template <int K>
__device__ void op_residual_matvec(const int* ins, const unsigned long long* table, const Tile& t,
                                   const char* stage, bf16_t* vec, Smem& sm, int step, int src, int in,
                                   int outp) {
    const int a = ins[W_A], rows = ins[W_B];
    const int key = stage_key(step, ins[W_LAYER], ins[W_OP]);
    if (vec_stale(sm, key)) {
        act_to_smem(ptr<const bf16_t>(table, src), vec, K);
        vec_filled(sm, key);
    }
    matvec<K>(rows0(t, stage), vec, rows, sm.dots, sm.scratch);
    if (threadIdx.x < rows) {
        const int r = a + threadIdx.x;
        const float x = bf2f(ld_act(ptr<const bf16_t>(table, in) + r));
        ptr<bf16_t>(table, outp)[r] = f2bf(x + rbf(sm.dots[threadIdx.x]));
    }
}

__device__ void op_gate_up(const int* ins, const unsigned long long* table, const Tile& t, const char* stage,
                           bf16_t* vec, Smem& sm, int step) {
    const int layer = ins[W_LAYER], a = ins[W_A], rows = ins[W_B];
    const int key = stage_key(step, layer, OP_GATE_UP);
    if (vec_stale(sm, key)) {
        rmsnorm_to_smem(ptr<const bf16_t>(table, P_X1), lptr<const bf16_t>(table, layer, L_MLP_NORM), vec,
                        sm.scratch);
        vec_filled(sm, key);
    }
    matvec<HIDDEN>(rows0(t, stage), vec, rows, sm.dots, sm.scratch);
    matvec<HIDDEN>(rows1(t, stage), vec, rows, sm.dots + NTHREADS, sm.scratch);
    if (threadIdx.x < rows) {
        const float gate = rbf(sm.dots[threadIdx.x]), up = rbf(sm.dots[NTHREADS + threadIdx.x]);
        const float act = rbf(gate / (1.f + expf(-gate)));  // silu, rounded as torch does for bf16
        ptr<bf16_t>(table, P_H)[a + threadIdx.x] = f2bf(act * up);
    }
}

// Gumbel noise of token `v` at position `pos` for `seed`: a counter-based hash (lowbias32, C. Wellons)
// to a uniform in (0, 1), then -log(-log(u)). The VM computes the same numbers.
__device__ __forceinline__ float gumbel(u32 seed, u32 pos, u32 v) {
    u32 x = seed * 0x9E3779B1u + pos * 0x85EBCA77u + v * 0xC2B2AE3Du;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float u = ((float)(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
    return -logf(-logf(u));
}

// The LM head's rows -> float32 logits (rounded through bf16, as the eager logits) and the tile's
// argmax (the first index of the maximum, as torch.argmax) of the logits, or with a temperature T of
// logits / T + Gumbel noise: the argmax over all tiles is then a sample of softmax(logits / T)
// (the Gumbel-max trick; Gumbel 1954, Maddison et al. 2014).
__device__ void op_lm_head(const int* ins, const unsigned long long* table, const Tile& t, const char* stage,
                           bf16_t* vec, Smem& sm, int step, const int* state) {
    const int a = ins[W_A], rows = ins[W_B], tile = ins[W_C];
    const int key = stage_key(step, LAYERS, OP_LM_HEAD);
    if (vec_stale(sm, key)) {
        rmsnorm_to_smem(ptr<const bf16_t>(table, P_X0), ptr<const bf16_t>(table, P_FINAL_NORM), vec, sm.scratch);
        vec_filled(sm, key);
    }
    matvec<HIDDEN>(rows0(t, stage), vec, rows, sm.dots, sm.scratch);
    if (threadIdx.x < rows) {
        const float logit = rbf(sm.dots[threadIdx.x]);
        ptr<float>(table, P_LOGITS)[a + threadIdx.x] = logit;
        const float temperature = __int_as_float(ld_acti(state + STATE_TEMPERATURE));
        sm.dots[NTHREADS + threadIdx.x] =
            temperature > 0.f
                ? logit / temperature + gumbel((u32)ld_acti(state + STATE_SEED), (u32)sm.pos, (u32)(a + threadIdx.x))
                : logit;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float* score = sm.dots + NTHREADS;
        int best = 0;
        for (int r = 1; r < rows; ++r)
            if (score[r] > score[best]) best = r;
        ptr<float>(table, P_AMAX_VAL)[tile] = score[best];
        ptr<int>(table, P_AMAX_IDX)[tile] = a + best;
    }
}

// (value, index) order of the argmax: larger value first, then the lower index (associative, so any
// reduction tree gives the same winner).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ void op_sample(const unsigned long long* table, int* state, int* ring, int step, int n_steps,
                          Smem& sm) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* vals = ptr<const float>(table, P_AMAX_VAL);
    const int* idxs = ptr<const int>(table, P_AMAX_IDX);
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int t = threadIdx.x; t < LM_TILES; t += NTHREADS) {
        const float v = ld_actf(vals + t);
        const int i = ld_acti(idxs + t);
        if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { sm.best_val[warp] = bv; sm.best_idx[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 0; w < NWARPS; ++w)
            if (better(sm.best_val[w], sm.best_idx[w], bv, bi)) { bv = sm.best_val[w]; bi = sm.best_idx[w]; }
        const int token = bi;
        const int emitted = ld_acti(state + STATE_EMITTED);
        // The ring lives in mapped host memory: the token first, then (after a system-scope fence)
        // the count the host polls.
        volatile int* vring = ring;
        vring[1 + emitted] = token;
        __threadfence_system();
        vring[0] = emitted + 1;
        int done = emitted + 1 >= ld_acti(state + STATE_BUDGET);
        const int num_stop = ld_acti(state + STATE_NUM_STOP);
        for (int s = 0; s < num_stop; ++s) done |= ld_acti(state + STATE_STOP + s) == token;
        state[STATE_EMITTED] = emitted + 1;
        state[STATE_TOKEN] = token;
        state[STATE_POS] = sm.pos + 1;
        state[STATE_DONE] = done;
        sm.token = token;
        sm.done = done;
    }
    __syncthreads();
    if (!sm.done && step < n_steps - 1) {
        const bf16_t* row = ptr<const bf16_t>(table, P_EMBED) + (size_t)sm.token * HIDDEN;
        bf16_t* x0 = ptr<bf16_t>(table, P_X0);
        for (int i = threadIdx.x; i < HIDDEN; i += NTHREADS) x0[i] = row[i];
    }
}

// ------------------------------------------------------------------------------------ the interpreter

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
solo_megakernel(const int* __restrict__ program, const int* __restrict__ lengths, int max_len,
                const unsigned long long* __restrict__ table, u32* counters, int* state, int* ring, int n_steps,
                int max_seq) {
    SOLO_DYNAMIC_SMEM(smem_raw);
    char* stages[2] = {smem_raw, smem_raw + STAGE_BYTES};
    bf16_t* vec = reinterpret_cast<bf16_t*>(smem_raw + 2 * STAGE_BYTES);
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw + 2 * STAGE_BYTES + ((MAXK * 2 + 15) / 16) * 16);

    const int* queue = program + (size_t)blockIdx.x * max_len * INSTR_WORDS;
    const int len = lengths[blockIdx.x];
    const int total = len * n_steps;
    if (total == 0) return;

    if (threadIdx.x == 0) {
        sm.vec_key = -1;
        sm.max_seq = max_seq;
    }
    __syncthreads();
    Tile next = weight_tile(queue, table);
    prefetch(next, stages[0]);
    cp_async_commit();
    for (int k = 0; k < total; ++k) {
        const int* ins = queue + (k % len) * INSTR_WORDS;
        const int step = k / len;
        const int op = ins[W_OP];
        const Tile tile = next;
        char* stage = stages[k & 1];
        if (k + 1 < total) {  // the next instruction's weights stream in while this one waits and runs
            next = weight_tile(queue + ((k + 1) % len) * INSTR_WORDS, table);
            prefetch(next, stages[(k + 1) & 1]);
        }
        cp_async_commit();
        if (threadIdx.x == 0) {
            for (int w = 0; w < 2; ++w) {
                const int c = ins[W_WAIT0 + 2 * w];
                if (c < 0) continue;
                const u32 want = (u32)ins[W_TARGET0 + 2 * w] * (u32)(step + 1);
                if (ld_acquire(counters + c) >= want) continue;
                // A wait that never ends (a broken schedule, a CTA that is not resident) must not hang
                // the GPU: after WAIT_TIMEOUT_NS, or once another CTA gave up, flag it and stop.
                const unsigned long long t0 = clock_ns();
                while (ld_acquire(counters + c) < want) {
                    if (ld_acti(state + STATE_ERROR) || clock_ns() - t0 > WAIT_TIMEOUT_NS) {
                        st_flag(state + STATE_ERROR, 1);
                        break;
                    }
                }
            }
            sm.pos = ld_acti(state + STATE_POS);
            sm.done = ld_acti(state + STATE_DONE);
            sm.token = ld_acti(state + STATE_TOKEN);
            sm.failed = ld_acti(state + STATE_ERROR);
        }
        cp_async_wait1();  // this instruction's stage has landed (the next one's may still stream)
        __syncthreads();
        if (sm.failed) break;
        const bool skip = op == OP_NOP || (op == OP_EMBED && step > 0) || (sm.done && op != OP_EMBED);
        if (!skip) {
            switch (op) {
                case OP_EMBED: {
                    const bf16_t* row = ptr<const bf16_t>(table, P_EMBED) + (size_t)sm.token * HIDDEN;
                    bf16_t* x0 = ptr<bf16_t>(table, P_X0);
                    for (int i = threadIdx.x; i < HIDDEN; i += NTHREADS) x0[i] = row[i];
                    break;
                }
                case OP_QKV: op_qkv(ins, table, tile, stage, vec, sm, step); break;
                case OP_ATTN: op_attn(ins, table, stage, sm); break;
                case OP_MERGE: op_merge(ins, table); break;
                case OP_OPROJ:
                    op_residual_matvec<QSIZE>(ins, table, tile, stage, vec, sm, step, P_ATTN, P_X0, P_X1);
                    break;
                case OP_GATE_UP: op_gate_up(ins, table, tile, stage, vec, sm, step); break;
                case OP_DOWN:
                    op_residual_matvec<INTER>(ins, table, tile, stage, vec, sm, step, P_H, P_X1, P_X0);
                    break;
                case OP_LM_HEAD: op_lm_head(ins, table, tile, stage, vec, sm, step, state); break;
                case OP_SAMPLE: op_sample(table, state, ring, step, n_steps, sm); break;
                default: break;
            }
        }
        __syncthreads();  // every thread's writes are done before thread 0 releases them
        const int sig = ins[W_SIGNAL];
        const bool signals = op == OP_EMBED ? step == 0 : (op == OP_SAMPLE ? step < n_steps - 1 : true);
        if (threadIdx.x == 0 && sig >= 0 && signals) {
            __threadfence();
            red_release(counters + sig, 1u);
        }
    }
    cp_async_wait1();
}
