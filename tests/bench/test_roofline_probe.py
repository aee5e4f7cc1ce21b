"""The bench's instrument: the best-of-several bandwidth probe, its ISA label, and the warnings on its limits."""

from __future__ import annotations

import pytest
import torch

from solo.bench.roofline import instrument_warnings, last_level_cache_bytes, probe_cpu_bandwidth
from solo.runtime.cpu_build import load_library, selected_level


def test_the_probe_is_the_best_of_torch_and_the_native_loop_and_names_the_isa():
    probe = probe_cpu_bandwidth(32 * 2**20, passes=2, threads=2)
    names = list(probe.candidates_gbps)
    assert any(n.startswith("torch.sum") for n in names)
    native = [n for n in names if n.startswith("native ")]
    level = selected_level().name  # the level in use, not "AVX-512"
    assert native == [f"native {level} streaming sum, 2 threads",
                      f"native {level} streaming sum, 2 threads x 4 streams"]
    assert probe.method in names and probe.bandwidth_gbps == max(probe.candidates_gbps.values())


def test_the_torch_candidate_reads_with_the_threads_it_is_labelled_with(monkeypatch):
    """torch.sum used torch's own thread count whatever `threads` said: a one-thread probe's torch candidate
    read with every thread (29 GB/s against 11 on one core of a 2-core Xeon) under a "1 threads" label."""
    seen = []
    sum_of = torch.Tensor.sum
    monkeypatch.setattr(torch.Tensor, "sum", lambda self, *a, **k: (seen.append(torch.get_num_threads()),
                                                                       sum_of(self, *a, **k))[1])
    before = torch.get_num_threads()
    probe = probe_cpu_bandwidth(8 * 2**20, passes=1, threads=1)
    assert "torch.sum over int64, 1 threads" in probe.candidates_gbps
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


def test_instrument_warnings():
    gib = 2**30
    assert instrument_warnings(2 * gib, 2 * gib, 20.0, {"solo": 9.0}, 32 * 2**20) == []
    lines = instrument_warnings(100 * 2**20, 101 * 2**20, 20.0, {"solo": 300.0, "peer": 10.0}, 256 * 2**20)
    assert len(lines) == 2
    assert "fit in the last-level cache" in lines[0]
    assert lines[1].startswith("solo read 31.8 GB/s, above the probe's 20.0 GB/s")
    assert last_level_cache_bytes() is None or last_level_cache_bytes() > 2**16


@pytest.mark.parametrize("streams", [1, 2, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_native_streaming_sum_reads_every_byte_once(streams, threads):
    """However many streams and threads, every 8-byte word is summed once per pass (64-byte multiples that do
    not split evenly into runs: the rest of each thread's share is read after them)."""
    buf = torch.arange(8 * 1001, dtype=torch.int64)
    total = load_library().solo_stream_read(buf.data_ptr(), buf.numel() * 8, 3, threads, streams)
    assert total == 3 * float(buf.sum())
