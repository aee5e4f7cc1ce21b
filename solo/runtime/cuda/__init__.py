"""The CUDA decode runtime: a static KV cache, whole-step CUDA graphs and multi-token decode blocks.

    state.py       decode state on the device (token, position, row, sampling values, stop tokens)
    weights.py     fused weight layout (QKV and gate/up stacked; the eager modules keep views)
    triton_step.py one decode step from the fused Triton kernels (torch ops for rare features)
    torch_step.py  one decode step from graph-safe torch ops (optionally torch.compile'd)
    runtime.py     `CudaGraphRuntime`: DecodeRuntime + `decode_block` / `iter_blocks`
    (the engine-side loop that streams tokens block by block is solo.engine.block_decoding)
    bench.py       standalone GPU benchmark (decode tok/s against the HBM roofline and transformers)

Importing this package imports neither Triton nor the server.
"""
