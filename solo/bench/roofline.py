"""The decode roofline: bytes a decode step must read, and the device's measured read bandwidth.

At batch 1 every decoded token reads each weight once (the LM head included, the embedding as one row)
plus the KV cache up to the current position, so `bandwidth / bytes` bounds tokens per second. In a
mixture-of-experts model only the active bytes count: attention, norms, the router, the top-k routed
experts and any shared expert of each layer, the LM head and the KV cache. The
bandwidth is measured in the same run: on the CPU a multi-threaded streaming read of a buffer far
larger than the last-level cache (the STREAM idea, McCalpin 1995, reduced to its read part), the best of
several read kernels (torch.sum, and the native kernels' loop for the ISA level in use) so a weak probe
cannot flatter the roofline fraction; on CUDA a device-side reduction over a large buffer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solo.model.config import ModelConfig

_GIB = 1024**3


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes read by one decode token.

    Attributes:
        weights: matrices, biases and norms read once, the LM head included, plus one embedding row.
        kv_cache: keys and values of every layer up to the context (sliding windows capped).
        experts: of `weights`, the routed experts' share (mixture-of-experts models; 0 for dense ones).
    """

    weights: int
    kv_cache: int
    experts: int = 0

    @property
    def total(self) -> int:
        """Weights + kv_cache."""
        return self.weights + self.kv_cache


def matrix_bytes(rows: int, cols: int, elem_bytes: float, quantize: str | None) -> int:
    """Bytes of one weight matrix [rows, cols] as stored.

    Dense, int8 (+ float32 row scales) or int4 (+ bf16 scales per 32 inputs), as `solo.runtime.quant` stores them.

    Args:
        rows, cols: the matrix shape [out, in].
        elem_bytes: bytes per dense element (2 for bf16).
        quantize: None, "int8" or "int4".
    """
    if quantize == "int8":
        return rows * cols + 4 * rows
    if quantize == "int4":
        return rows * cols // 2 + 2 * rows * (cols // 32)
    return int(rows * cols * elem_bytes)


def decode_bytes(config: ModelConfig, elem_bytes: float, context: int, quantize: str | None = None,
                 kv_elem_bytes: float | None = None) -> DecodeBytes:
    """Bytes one decode token reads at a given context.

    Args:
        config: model config.
        elem_bytes: bytes per weight element of the dense dtype (2 for bf16).
        context: tokens already in the KV cache (attended over).
        quantize: None, "int8" or "int4" (matrices only; norms, biases and the embedding row stay dense).
        kv_elem_bytes: bytes per cache element (default: elem_bytes).

    Returns:
        The weight and KV-cache bytes; layers with a sliding window read at most `window` positions.
    """
    h, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nq, nkv = config.num_heads * hd, config.num_kv_heads * hd
    kv_elem = elem_bytes if kv_elem_bytes is None else kv_elem_bytes
    attn = matrix_bytes(nq + 2 * nkv, h, elem_bytes, quantize) + matrix_bytes(h, nq, elem_bytes, quantize)
    dense_mlp = matrix_bytes(2 * f, h, elem_bytes, quantize) + matrix_bytes(h, f, elem_bytes, quantize)
    qk_norms = (nq + nkv if config.qk_norm_full_width else 2 * hd) if config.qk_norm else 0
    vectors = 2 * h + (2 * h if config.sandwich_norm else 0) + qk_norms
    vectors += (nq + 2 * nkv if config.qkv_bias else 0) + (h if config.o_bias else 0)
    weights = config.num_layers * (attn + int(vectors * elem_bytes))
    moe_mlp, expert_bytes = _moe_mlp_bytes(config, elem_bytes, quantize)
    for layer in range(config.num_layers):
        if config.is_moe_layer(layer):
            weights += moe_mlp
        else:
            weights += dense_mlp + int((2 * f + h if config.mlp_bias else 0) * elem_bytes)
    experts = expert_bytes * sum(config.moe_layers)
    lane_head = config.lanes is not None and config.lanes.lm_head_type == "lane"  # a [vocab, L * hidden] head
    weights += matrix_bytes(config.vocab_size, h * (config.lanes.num_lanes if lane_head else 1), elem_bytes,
                            quantize)  # LM head
    weights += int(h * elem_bytes) * 2  # one embedding row, final norm
    kv = 0
    for window in config.layer_sliding_windows or (None,) * config.num_layers:
        span = context if window is None else min(context, window)
        kv += int(2 * nkv * span * kv_elem)
    return DecodeBytes(weights=weights, kv_cache=kv, experts=experts)


def _moe_mlp_bytes(config: ModelConfig, elem_bytes: float, quantize: str | None) -> tuple[int, int]:
    # At batch 1 an MoE layer reads the router, the top-k routed experts only, and the shared expert with
    # its gate; returns (that total, the routed experts' part).
    if not config.is_moe:
        return 0, 0
    h, inter, shared = config.hidden_size, config.moe_intermediate_size, config.shared_expert_intermediate_size
    expert = matrix_bytes(2 * inter, h, elem_bytes, quantize) + matrix_bytes(h, inter, elem_bytes, quantize)
    routed = config.num_experts_per_tok * expert
    total = routed + int(config.num_experts * h * elem_bytes)  # the router stays dense
    if shared:
        total += matrix_bytes(2 * shared, h, elem_bytes, quantize) + matrix_bytes(h, shared, elem_bytes, quantize)
        total += int(h * elem_bytes)
    return total, routed


@dataclass(frozen=True)
class BandwidthProbe:
    """A read-bandwidth measurement.

    Attributes:
        bandwidth_gbps: best read bandwidth over the passes, in GB/s (1e9 bytes per second).
        median_gbps: median over the passes, in GB/s.
        buffer_bytes: size of the buffer read, in bytes.
        threads: threads that read (CPU) or 0 (CUDA).
        method: how it was measured (on the CPU: the read kernel that was fastest, and its ISA level).
        candidates_gbps: best GB/s of every read kernel tried, by name (CPU).
    """

    bandwidth_gbps: float
    median_gbps: float
    buffer_bytes: int
    threads: int
    method: str
    candidates_gbps: dict[str, float] = field(default_factory=dict)


def probe_cpu_bandwidth(buffer_bytes: int = 2 * _GIB, passes: int = 5, threads: int | None = None) -> BandwidthProbe:
    """Streaming read bandwidth of the CPU's memory with all threads: the best of several read kernels.

    Tries `torch.sum` over int64 and, when the native kernels build, their streaming sum compiled for the
    ISA level in use (e.g. "native avx2 streaming sum"), with one and with four streams per thread (four
    contiguous runs read side by side, as the portable decode kernel reads its rows); `method` names the
    fastest, `candidates_gbps` holds each one's best. The buffer (default 2 GiB) must dwarf the last-level cache.

    Args:
        buffer_bytes: bytes to read per pass.
        passes: timed passes per kernel (one untimed warm-up pass first).
        threads: reader threads (default: torch.get_num_threads()).

    Returns:
        The measurement, in GB/s (1e9 bytes per second).
    """
    threads = threads or torch.get_num_threads()
    buf = torch.ones(buffer_bytes // 8, dtype=torch.int64)  # touched, so pages are mapped before timing
    nbytes = buf.numel() * 8

    def torch_sum() -> object:
        # torch.sum runs on torch's own thread count: held at `threads` for the pass, as its label says
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return buf.sum()
        finally:
            torch.set_num_threads(before)

    kernels: dict[str, Callable[[], object]] = {f"torch.sum over int64, {threads} threads": torch_sum}
    try:
        from solo.runtime.cpu_build import KernelBuildError, library_isa, load_library

        lib = load_library()
        kernels[f"native {library_isa(lib)} streaming sum, {threads} threads"] = \
            lambda: lib.solo_stream_read(buf.data_ptr(), nbytes, 1, threads, 1)
        # Four contiguous runs per thread read side by side, as the portable decode kernel reads its rows.
        kernels[f"native {library_isa(lib)} streaming sum, {threads} threads x 4 streams"] = \
            lambda: lib.solo_stream_read(buf.data_ptr(), nbytes, 1, threads, 4)
    except KernelBuildError:
        pass
    rates: dict[str, list[float]] = {name: [] for name in kernels}
    for read in kernels.values():  # warm-up
        read()
    for _ in range(passes):  # alternate the kernels, so drift of the machine hits them alike
        for name, read in kernels.items():
            start = time.perf_counter()
            read()
            rates[name].append(nbytes / (time.perf_counter() - start) / 1e9)
    best = max(rates, key=lambda name: max(rates[name]))
    samples = sorted(rates[best])
    return BandwidthProbe(samples[-1], samples[len(samples) // 2], nbytes, threads, best,
                          {name: max(values) for name, values in rates.items()})


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest cache level in bytes (Linux sysfs), or None where unknown."""
    best: tuple[int, int] | None = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        try:
            size = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        if best is None or (level, size) > best:
            best = (level, size)
    return best[1] if best else None


def instrument_warnings(weight_bytes: int, bytes_per_token: int, bandwidth_gbps: float,
                        tokens_per_s: dict[str, float], llc_bytes: int | None) -> list[str]:
    """Reasons a roofline fraction may mislead, one line each.

    Args:
        weight_bytes: bytes of weights one decode token reads.
        bytes_per_token: all bytes one decode token reads (weights + KV cache).
        bandwidth_gbps: the probe's bandwidth, GB/s.
        tokens_per_s: decode tokens/s by engine name.
        llc_bytes: last-level cache size in bytes, or None.

    Returns:
        A line for weights that fit in the last-level cache (decode then reads them from cache, not DRAM,
        and can beat the DRAM roofline), and one for every engine whose achieved GB/s exceeds the probe.
    """
    lines = []
    if llc_bytes is not None and weight_bytes <= llc_bytes:
        lines.append(f"the weights ({weight_bytes / 2**20:.0f} MiB) fit in the last-level cache "
                     f"({llc_bytes / 2**20:.0f} MiB): decode can read them from cache, so the DRAM roofline "
                     "does not bound it; use a larger model for a bandwidth measurement")
    for name, tps in tokens_per_s.items():
        achieved = tps * bytes_per_token / 1e9
        if achieved > bandwidth_gbps:
            lines.append(f"{name} read {achieved:.1f} GB/s, above the probe's {bandwidth_gbps:.1f} GB/s: the probe "
                         "under-measured (a busy moment) or the data came from cache; treat its fraction as unreliable")
    return lines


def probe_cuda_bandwidth(device: torch.device, buffer_bytes: int = 4 * _GIB, passes: int = 10) -> BandwidthProbe:
    """Device-memory read bandwidth: a float32 sum over a large buffer, timed with CUDA events.

    Args:
        device: the CUDA device.
        buffer_bytes: bytes read per pass (default 4 GiB).
        passes: timed passes (one untimed warm-up first).

    Returns:
        The measurement, in GB/s (1e9 bytes per second).
    """
    buf = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)
    nbytes = buf.numel() * 4
    buf.sum()
    torch.cuda.synchronize(device)
    rates = []
    for _ in range(passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        buf.sum()
        end.record()
        end.synchronize()
        rates.append(nbytes / (start.elapsed_time(end) / 1000.0) / 1e9)
    del buf
    torch.cuda.empty_cache()
    rates.sort()
    return BandwidthProbe(rates[-1], rates[len(rates) // 2], nbytes, 0, "torch.sum reduction (CUDA events)")


def probe_bandwidth(device: torch.device, cpu_buffer_bytes: int = 2 * _GIB, passes: int = 5) -> BandwidthProbe:
    """The read-bandwidth probe for `device` (CPU or CUDA; the CPU buffer size, in bytes, is configurable).

    CUDA runs twice as many passes over its own 4 GiB buffer.
    """
    if device.type == "cuda":
        return probe_cuda_bandwidth(device, passes=2 * passes)
    return probe_cpu_bandwidth(cpu_buffer_bytes, passes=passes)


def roofline_tokens_per_s(bandwidth_gbps: float, bytes_per_token: int) -> float:
    """Upper bound on decode tokens/s: bandwidth (GB/s, 1e9 bytes/s) over bytes read per token (bytes)."""
    return bandwidth_gbps * 1e9 / bytes_per_token
