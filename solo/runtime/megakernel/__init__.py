"""The monokernel: whole decode steps (N tokens per launch) as one persistent GPU kernel.

At batch 1 the time between kernels (launches, grid-wide barriers, a host round trip per token)
decides decode speed. Here the decode step is lowered in Python to a graph of tile-sized tasks,
scheduled statically onto the SMs and encoded as fixed-size int32 instructions; one persistent CTA per
SM interprets its queue, waiting only on per-dependency counters (acquire/release), with the next
instruction's weights already streaming into shared memory. The same encoded program runs in a Python
VM and a schedule checker, so its correctness is tested without a GPU.

    graph.py     lowering of a Llama-family decode step to a task graph (tiles; cost = bytes streamed)
    schedule.py  static list schedule onto SMs; the int32 instruction format
    vm.py        the Python VM: the instructions executed with PyTorch ops (reference semantics)
    checker.py   random counter-allowed orders: hazards, deadlocks, counters off target / not reset
    kernel.cu    the persistent interpreter kernel (CUDA C++)
    nvrtc.py     run-time compilation with NVRTC; ptxas' register / spill report
    runtime.py   `MegakernelRuntime` (DecodeRuntime + `iter_blocks`, N tokens per launch, token ring)

Why CUDA C++ through NVRTC (`cuda-bindings`) and not Triton: the interpreter needs per-counter waits
with acquire semantics and signals with release semantics at GPU scope (`ld.acquire.gpu`,
`red.release.gpu`), `cp.async` into shared memory issued before such a wait, and a cooperative launch
that guarantees every CTA is resident. Triton 3.6 (the version on the target machines) exposes atomics
only as read-modify-write with a `sem` argument, has no plain acquire load to spin on without writing,
no control over shared-memory staging across a data-dependent loop of different ops, and launches
without the co-residency guarantee; one kernel with a `switch` over opcodes is also far from its
block-programming model. NVRTC ships as a pip wheel beside CUDA builds of torch, needs no CUDA
toolkit, and compiles for sm_90a on a machine without a GPU or driver (CI checks the kernel does).

Importing this package imports neither CUDA bindings nor Triton.
"""
