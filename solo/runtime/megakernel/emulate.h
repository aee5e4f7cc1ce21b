// Host emulation of the CUDA features kernel.cu uses, so the kernel's own source runs on a CPU.
//
// Every CUDA thread is an OS thread: threadIdx / blockIdx are thread-locals, __syncthreads is a
// std::barrier per CTA, warp shuffles exchange through per-warp slots between two warp barriers,
// dynamic shared memory is a per-CTA buffer, the counters' ld.acquire / red.release are C++ acquire
// loads / release adds, and cp.async is a plain copy. Spinning waits yield, and give up (flagging a
// deadlock) after the launch's timeout. Used by solo.runtime.megakernel.emulate (tests only).

#define SOLO_EMULATE 1
#include <algorithm>
#include <atomic>
#include <barrier>
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
    std::barrier<>* block;
    std::vector<std::barrier<>*> warps;
    std::vector<unsigned long long> slots;
    char* smem;
};
static thread_local EmuCta* emu_cta;
static std::atomic<bool> emu_abort{false};
static std::chrono::steady_clock::time_point emu_deadline;

#define SOLO_DYNAMIC_SMEM(name) char* name = emu_cta->smem

using std::max;
using std::min;

static inline void __syncthreads() { emu_cta->block->arrive_and_wait(); }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int offset) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    std::memcpy(&emu_cta->slots[warp * 32 + lane], &v, sizeof(T));
    emu_cta->warps[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &emu_cta->slots[warp * 32 + (lane ^ offset)], sizeof(T));
    emu_cta->warps[warp]->arrive_and_wait();
    return r;
}

static inline unsigned short ld_act(const unsigned short* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline float ld_actf(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline int ld_acti(const int* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static inline unsigned ld_acquire(const unsigned* p) {
    static thread_local unsigned spins = 0;
    const unsigned v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    if (++spins % 256 == 0) {
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() > emu_deadline) emu_abort = true;
    }
    return emu_abort ? 0xffffffffu : v;  // a deadlock ends the waits (the launch reports it)
}
static inline void red_release(unsigned* p, unsigned v) { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
static inline void cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
static inline void cp_async_commit() {}
static inline void cp_async_wait1() {}
