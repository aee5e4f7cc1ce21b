// Host emulation of the CUDA features kernel.cu uses, so the kernel's own source runs on a CPU.
//
// Every CTA is an OS thread and every CUDA thread of it a fiber (ucontext) on that OS thread, switched
// round robin whenever it waits: __syncthreads and the warp barriers around a shuffle's slot exchange
// wait until every fiber of the CTA (of the warp) arrived. CTAs run truly in parallel and talk only
// through memory: the counters' ld.acquire / red.release are C++ acquire loads / release adds; a spin
// on a counter yields the fiber (and the OS thread after a fruitless round), and gives up, flagging a
// deadlock, after the launch's timeout. Dynamic shared memory is a per-CTA buffer; cp.async is a plain
// copy. Used by solo.runtime.megakernel.emulate (tests only).

#define SOLO_EMULATE 1
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __restrict__ __restrict

struct uint4 { unsigned x, y, z, w; };
struct EmuDim3 { unsigned x, y, z; };
static thread_local EmuDim3 threadIdx, blockIdx;

struct EmuCta {
    int nthreads = 0;
    std::vector<ucontext_t> fibers;
    std::vector<std::vector<char>> stacks;
    std::vector<char> finished;
    ucontext_t home;                 // the OS thread's own context (returns here when all are done)
    int current = 0;
    int running = 0;
    int block_arrived = 0;
    unsigned block_generation = 0;
    std::vector<int> warp_arrived;
    std::vector<unsigned> warp_generation;
    std::vector<unsigned long long> slots;
    char* smem = nullptr;
};
static thread_local EmuCta* emu_cta;
static std::atomic<bool> emu_abort{false};
static std::chrono::steady_clock::time_point emu_deadline;

// Switch to the next unfinished fiber of this CTA (round robin); returns when this one is resumed.
static inline void emu_yield() {
    EmuCta& c = *emu_cta;
    const int me = c.current;
    int next = me;
    do { next = (next + 1) % c.nthreads; } while (c.finished[next] && next != me);
    if (next == me) return;
    c.current = next;
    swapcontext(&c.fibers[me], &c.fibers[next]);
    c.current = me;
    threadIdx.x = me;
}

static inline void emu_wait_all(int& arrived, unsigned& generation, int count) {
    const unsigned gen = generation;
    if (++arrived == count) {
        arrived = 0;
        ++generation;
        return;
    }
    while (generation == gen) emu_yield();
}

#define SOLO_DYNAMIC_SMEM(name) char* name = emu_cta->smem

using std::max;
using std::min;

static inline void __syncthreads() { emu_wait_all(emu_cta->block_arrived, emu_cta->block_generation, emu_cta->nthreads); }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int offset) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    EmuCta& c = *emu_cta;
    std::memcpy(&c.slots[warp * 32 + lane], &v, sizeof(T));
    emu_wait_all(c.warp_arrived[warp], c.warp_generation[warp], 32);
    T r;
    std::memcpy(&r, &c.slots[warp * 32 + (lane ^ offset)], sizeof(T));
    emu_wait_all(c.warp_arrived[warp], c.warp_generation[warp], 32);
    return r;
}

static inline unsigned short ld_act(const unsigned short* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline float ld_actf(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline int ld_acti(const int* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void ld_act8(const unsigned short* p, float* out) {
    for (int i = 0; i < 8; ++i) {
        const unsigned u = (unsigned)__atomic_load_n(p + i, __ATOMIC_RELAXED) << 16;
        std::memcpy(out + i, &u, 4);
    }
}

static inline unsigned ld_acquire(const unsigned* p) {
    static thread_local unsigned spins = 0;
    const unsigned v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    emu_yield();  // let the CTA's other fibers reach their barrier
    if (++spins % 64 == 0) {
        std::this_thread::yield();  // and other CTAs (OS threads) make progress
        if (std::chrono::steady_clock::now() > emu_deadline) emu_abort = true;
    }
    return emu_abort ? 0xffffffffu : v;  // a deadlock ends the waits (the launch reports it)
}
static inline unsigned long long clock_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}
static inline void st_flag(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void red_release(unsigned* p, unsigned v) { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
static inline void cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
static inline void cp_async_commit() {}
static inline void cp_async_wait1() {}
