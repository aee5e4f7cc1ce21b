"""Launch-configuration search for the decode kernels, with an in-process and an on-disk cache.

Each kernel module lists a few candidate configurations. For one call site (kernel, shape, dtype,
GPU) the tuner launches every candidate on the real weights, drops any that fail to compile or whose
output differs from the reference configuration's (a guard against a wrong configuration, e.g. a
split-K race), times the rest and keeps the fastest. Results are cached by key in memory and in a JSON
file, so a model is tuned once per GPU type.

Timing is the way the decode step runs the kernel when the caller can say so (`graph_launches`): one
launch per layer's weights, back to back in a CUDA graph (`time_graph`), with the step's launch mode
(PDL or not). A decode kernel of a 1B model streams 8-30 MB in 4-15 us, less than one launch's latency,
so timing a lone launch (`triton.testing.do_bench`, the fallback) measures mostly the launch and picks
configurations at random among the small kernels; back to back, the next layer's weights are not in the
L2 and the kernels overlap as they do in the step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch

from solo.env import solo_cache_home

log = logging.getLogger(__name__)

C = TypeVar("C")

_MEMORY: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()
_ANNOUNCED = False


def cache_path() -> Path:
    """The on-disk tuning cache: $SOLO_TUNING_CACHE, else $XDG_CACHE_HOME/solo/triton_tuning.json (~/.cache)."""
    env = os.environ.get("SOLO_TUNING_CACHE")
    if env:
        return Path(env)
    return solo_cache_home() / "triton_tuning.json"


def _load_disk() -> dict[str, dict[str, Any]]:
    return _read_disk(cache_path()) or {}


def _read_disk(path: Path) -> dict[str, dict[str, Any]] | None:
    # The file's entries: {} when there is none yet, or it is not a JSON object; None when it cannot be read.
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _store_disk(key: str, entry: dict[str, Any]) -> None:
    # Read, add, write under a lock, through a temporary file of this writer's own: two servers tuning at once on
    # one machine shared one temporary name and no lock, and lost most of each other's entries. A file this process
    # cannot read (another user's) is left as it is, not replaced by this one entry.
    path = Path(os.path.realpath(cache_path()))  # (a link: its target is the cache; a loop: left to the write)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path.with_name(path.name + ".lock")):
            data = _read_disk(path)
            if data is None:
                log.warning("cannot read the tuning cache %s; leaving it as it is", path)
                return
            data[key] = entry
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
            try:  # (0666 less the umask, as a file written in place would be; mkstemp's 0600 shut others out)
                with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as f:
                    f.write(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    except OSError as exc:  # a read-only home must not stop decoding
        log.warning("could not write the tuning cache %s: %s", path, exc)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # An exclusive lock on `path` (created, never removed) while the block runs; none without fcntl (not POSIX).
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:  # (read-write: NFS locks exclusively only what is open for writing)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # (another user's lock file in a shared folder: read-only locks too, locally)
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (released when the descriptor closes)
        yield
    finally:
        os.close(fd)


KEY_VERSION = 3
"""Bumped when candidates or the timing method change, so cached choices are made again."""


def make_key(kernel: str, **shape: Any) -> str:
    """Cache key of one call site: kernel name, shape fields, the GPU's name and `KEY_VERSION`."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    fields = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"{kernel}|{fields}|{device}|v{KEY_VERSION}"


L2_FLUSH_BYTES = 256 << 20
"""Bytes the tuner writes between timed graph replays, several times any GPU's L2 (H200: 60 MB)."""


def time_graph(launches: Sequence[Callable[[], Any]], rounds: int = 4, replays: int = 5,
               flush_bytes: int = 0) -> float:
    """Median seconds per launch of `launches` captured back to back (`rounds` times) in one CUDA graph.

    Each launch is run once first (compilation, warm-up) outside the capture; the graph is replayed once
    untimed, then `replays` times, each timed with CUDA events. With `flush_bytes`, a buffer of that many
    bytes is overwritten before each timed replay (outside the timing), so no launch finds its operands in
    the L2 from the previous replay (a model's layers of one call site may fit in it together).
    """
    flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device="cuda") if flush_bytes else None
    for fn in launches:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for fn in launches:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / (rounds * len(launches)))
    times.sort()
    return times[len(times) // 2]


def lookup(key: str, config_type: type[C]) -> C | None:
    """A cached configuration for `key` (memory first, then the disk cache), or None.

    Args:
        key: cache key (`make_key`).
        config_type: the configuration dataclass to rebuild (None when its fields changed since caching).
    """
    with _LOCK:
        entry = _MEMORY.get(key)
        if entry is None:
            entry = _load_disk().get(key)
            if entry is not None:
                _MEMORY[key] = entry
    if entry is None:
        return None
    try:
        return config_type(**entry["config"])
    except TypeError:  # the config's fields changed since it was cached
        return None


def tune(
    key: str,
    candidates: Sequence[C],
    launch: Callable[[C], torch.Tensor],
    reference: C,
    rtol: float = 1e-2,
    warmup_ms: float = 5.0,
    rep_ms: float = 25.0,
    graph_launches: Callable[[C], Sequence[Callable[[], Any]]] | None = None,
) -> C:
    """The fastest candidate whose output matches the reference configuration's.

    Args:
        key: cache key (`make_key`).
        candidates: configurations to try.
        launch: runs the kernel with a configuration and returns its output tensor.
        reference: configuration whose output is trusted (the untuned default).
        rtol: allowed max |out - ref| relative to max |ref| (summation order differs between configs).
        warmup_ms, rep_ms: `do_bench` budgets per candidate, in milliseconds.
        graph_launches: for a configuration, the launches a decode step makes (one per layer, in the
            step's launch mode), timed once back to back in a CUDA graph, the L2 flushed between replays
            (`time_graph`); a candidate whose capture fails is dropped. None, or no candidate captured:
            every candidate is timed by `do_bench` of `launch` (one method per choice; the cache entry's
            "timing" says which).

    Returns:
        The chosen configuration (the reference when nothing else works); cached under `key`.
    """
    cached = lookup(key, type(reference))
    if cached is not None:
        return cached
    global _ANNOUNCED
    if not _ANNOUNCED:  # a pause of tens of seconds deserves a word, once per process
        log.warning("tuning the decode kernels for this GPU and model shape (once; cached in %s)", cache_path())
        _ANNOUNCED = True
    from triton.testing import do_bench

    expected = launch(reference).float().clone()
    scale = float(expected.abs().max()) or 1.0
    correct: list[C] = []
    for config in dict.fromkeys([reference, *candidates]):
        try:
            out = launch(config).float()
            error = float((out - expected).abs().max())
            if not error <= rtol * scale:
                log.warning("tuning %s: %s disagrees with the reference (max error %.3g); skipped", key, config, error)
                continue
            correct.append(config)
        except Exception as exc:  # a configuration that fails to compile or launch is skipped
            log.warning("tuning %s: %s failed (%s: %s)", key, config, type(exc).__name__, exc)
    timings: list[tuple[float, C]] = []
    if graph_launches is not None:
        method = "graph"
        for config in correct:
            try:
                ms = time_graph(graph_launches(config), rounds=1, flush_bytes=L2_FLUSH_BYTES) * 1e3
                timings.append((ms, config))
            except Exception as exc:  # e.g. capture refused: this candidate is not compared
                log.warning("tuning %s: graph timing of %s failed (%s); skipped", key, config, exc)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
    if not timings:
        method = "do_bench"
        for config in correct:
            try:
                timings.append((do_bench(lambda config=config: launch(config), warmup=warmup_ms, rep=rep_ms,
                                         return_mode="median"), config))
            except Exception as exc:
                log.warning("tuning %s: %s failed (%s: %s)", key, config, type(exc).__name__, exc)
    best = min(timings, key=lambda t: t[0])[1] if timings else reference
    entry = {"config": asdict(best), "ms": {str(asdict(c)): ms for ms, c in timings},  # type: ignore[call-overload]
             "timing": method}
    with _LOCK:
        _MEMORY[key] = entry
    _store_disk(key, entry)
    return best


def cached_entries() -> dict[str, dict[str, Any]]:
    """Everything tuned in this process (for reports)."""
    with _LOCK:
        return dict(_MEMORY)
