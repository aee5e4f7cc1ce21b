"""Run kernel.cu itself on the CPU: its source compiled by the host C++ compiler over emulate.h.

The Python VM checks the program; this checks the CUDA C++ that interprets it (indexing, tiling, the
prefetch stages, the reductions, the ring and the stop check), with real concurrency between CTAs:
one OS thread per CTA, its CUDA threads as fibers switched at every barrier, CTAs synchronising only
through the counters. Meant for tests on machines without a GPU; needs g++ (C++20) and ucontext.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import torch

from solo.errors import SoloError
from solo.runtime.megakernel.graph import Dims
from solo.runtime.megakernel.nvrtc import kernel_source, pointer_table, shared_memory_bytes
from solo.runtime.megakernel.schedule import Program
from solo.runtime.megakernel.vm import ModelWeights

_LAUNCHER = r"""
struct EmuArgs {
    const int* program; const int* lengths; int max_len; const unsigned long long* table;
    unsigned* counters; int* state; int* ring; int n_steps; int max_seq;
};
static thread_local EmuArgs emu_args;

static void emu_fiber_main() {
    threadIdx = {(unsigned)emu_cta->current, 0, 0};  // a fresh fiber: nothing set it yet
    const EmuArgs& a = emu_args;
    solo_megakernel(a.program, a.lengths, a.max_len, a.table, a.counters, a.state, a.ring, a.n_steps, a.max_seq);
    EmuCta& c = *emu_cta;
    c.finished[c.current] = 1;
    if (--c.running == 0) {
        swapcontext(&c.fibers[c.current], &c.home);
    } else {
        emu_yield();  // never resumed: it is finished
    }
}

static void emu_run_cta(EmuCta* cta, int block, EmuArgs args, long smem_bytes) {
    emu_cta = cta;
    emu_args = args;
    blockIdx = {(unsigned)block, 0, 0};
    cta->smem = static_cast<char*>(std::aligned_alloc(16, (smem_bytes + 15) / 16 * 16));
    std::memset(cta->smem, 0, smem_bytes);
    const int n = cta->nthreads;
    cta->fibers.resize(n);
    cta->stacks.assign(n, std::vector<char>(256 * 1024));
    cta->finished.assign(n, 0);
    cta->running = n;
    cta->warp_arrived.assign(n / 32, 0);
    cta->warp_generation.assign(n / 32, 0);
    cta->slots.assign(n, 0);
    for (int t = 0; t < n; ++t) {
        getcontext(&cta->fibers[t]);
        cta->fibers[t].uc_stack.ss_sp = cta->stacks[t].data();
        cta->fibers[t].uc_stack.ss_size = cta->stacks[t].size();
        cta->fibers[t].uc_link = &cta->home;
        makecontext(&cta->fibers[t], emu_fiber_main, 0);
    }
    cta->current = 0;
    threadIdx = {0, 0, 0};
    swapcontext(&cta->home, &cta->fibers[0]);
    std::free(cta->smem);
}

extern "C" int solo_emu_launch(int grid, int nthreads, long smem_bytes, const int* program, const int* lengths,
                               int max_len, const unsigned long long* table, unsigned* counters, int* state,
                               int* ring, int n_steps, int max_seq, double timeout_s) {
    emu_abort = false;
    emu_deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(timeout_s));
    std::vector<EmuCta> ctas(grid);
    std::vector<std::thread> threads;
    const EmuArgs args = {program, lengths, max_len, table, counters, state, ring, n_steps, max_seq};
    for (int b = 0; b < grid; ++b) {
        ctas[b].nthreads = nthreads;
        threads.emplace_back(emu_run_cta, &ctas[b], b, args, smem_bytes);
    }
    for (auto& th : threads) th.join();
    return emu_abort ? 1 : 0;
}
"""


def emulator_unavailable_reason() -> str | None:
    """None when a host C++20 compiler (g++) is on PATH, else why not."""
    if shutil.which("g++") is None:
        return "g++ is not installed (needed to run the kernel's source on the CPU)"
    return None


class EmulatedKernel:
    """kernel.cu compiled for the host, specialised for `dims`.

    Args:
        dims: the lowering's sizes.
        nthreads: threads per CTA (a multiple of 32).
        stage_bytes: bytes of a shared-memory prefetch stage (tiles larger than this stream from
            "global" memory, the kernel's other path).
        build_dir: where to build (default: a cache folder under the system temp directory).
        wait_timeout_s: the kernel's counter-wait timeout (emulated steps are slow: generous).

    Raises:
        SoloError: no compiler, or the source does not compile (the compiler's message is quoted).
    """

    def __init__(self, dims: Dims, nthreads: int = 64, stage_bytes: int = 2048, build_dir: Path | None = None,
                 wait_timeout_s: float = 30.0) -> None:
        reason = emulator_unavailable_reason()
        if reason is not None:
            raise SoloError(reason)
        self.dims, self.nthreads, self.stage_bytes = dims, nthreads, stage_bytes
        header = resources.files("solo.runtime.megakernel").joinpath("emulate.h").read_text()
        source = header + kernel_source(dims, nthreads, stage_bytes, wait_timeout_s) + _LAUNCHER
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        if build_dir is None:
            from solo.runtime.cpu_build import private_temp_dir  # (the temp folder is shared: this user's own)

            build_dir = private_temp_dir("solo-megakernel-emu")
        folder = build_dir
        folder.mkdir(parents=True, exist_ok=True)
        lib = folder / f"emu-{digest}.so"
        if not lib.exists():
            src = folder / f"emu-{digest}.cpp"
            src.write_text(source)
            tmp = folder / f"emu-{digest}.{id(self)}.so"
            done = subprocess.run(["g++", "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w", "-o", str(tmp),
                                   str(src)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SoloError(f"the kernel source does not compile for the host: {done.stderr[:3000]}")
            tmp.replace(lib)
        self.lib = ctypes.CDLL(str(lib))
        self.lib.solo_emu_launch.restype = ctypes.c_int
        self.lib.solo_emu_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long] + [ctypes.c_void_p] * 2 + [
            ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_double]

    def launch(self, program: Program, weights: ModelWeights, buffers: dict[str, torch.Tensor],
               ring: torch.Tensor, n_steps: int, timeout_s: float = 60.0) -> None:
        """Run one launch of `n_steps` steps (counters zeroed first) over CPU tensors.

        Args:
            program: the encoded step (its SM count is the grid).
            weights: bf16 weights from `model_weights`.
            buffers: from `make_buffers` (with k_cache / v_cache), bf16; their state set for the launch.
            ring: int32 [1 + n_steps]: [count, token 0, token 1, ...] as the GPU's mapped ring.
            n_steps: steps in the launch.
            timeout_s: give up (and raise) after this long: a deadlock.

        Raises:
            SoloError: the launch deadlocked.
        """
        buffers["counters"].zero_()
        ring.zero_()
        table = torch.tensor(pointer_table(weights, buffers, list(buffers["k_cache"]), list(buffers["v_cache"])),
                             dtype=torch.int64)
        instructions = torch.from_numpy(program.instructions.copy())
        lengths = torch.from_numpy(program.lengths.copy())
        smem = shared_memory_bytes(self.dims, self.nthreads, self.stage_bytes)
        code = self.lib.solo_emu_launch(
            program.num_sms, self.nthreads, smem, instructions.data_ptr(), lengths.data_ptr(),
            int(program.instructions.shape[1]), table.data_ptr(), buffers["counters"].data_ptr(),
            buffers["state"].data_ptr(), ring.data_ptr(), n_steps, int(buffers["k_cache"].shape[2]), timeout_s)
        if code != 0:
            raise SoloError(f"the emulated launch deadlocked (no progress within {timeout_s:.0f} s)")
