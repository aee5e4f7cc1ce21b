"""What a loaded engine does in a child process made by `os.fork()`.

The native CPU kernels' worker threads (OpenMP) and PyTorch's intra-op threads do not survive a fork: in the
child, the thread pool's bookkeeping still counts workers that do not exist, and the first parallel region
waits for them forever. That is the hang PyTorch alone has in a child forked after OpenMP ran in the parent
(multiprocessing's "fork" start method, gunicorn's `--preload`). So in a child of a process holding an engine,
the engine's runtime and PyTorch run on one thread, which needs no pool, and the child's first generation warns
once. For every core, load the engine in the child, or use the "spawn" start method.

Threads are a process's own; this module only lowers counts, so the parent is never affected.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import torch

_runtimes: weakref.WeakSet[Any] = weakref.WeakSet()
_hook_registered = False
_threads_before_fork = 0  # in a forked child: the most threads its engines had; 0 = nothing to warn about


def track(runtime: Any) -> None:  # noqa: ANN401 -- any runtime; those with `num_threads` get one thread
    """Run `runtime` (and PyTorch) on one thread in any child process forked while it exists.

    Args:
        runtime: an engine's runtime. Its `num_threads`, where it has one, becomes 1 in a forked child; the
            runtime itself is held weakly.
    """
    global _hook_registered
    if not _hook_registered:
        os.register_at_fork(after_in_child=_in_child)
        _hook_registered = True
    _runtimes.add(runtime)


def _in_child() -> None:
    global _threads_before_fork
    runtimes = list(_runtimes)
    if not runtimes:
        return
    threads = torch.get_num_threads()
    for runtime in runtimes:
        if isinstance(getattr(runtime, "num_threads", None), int):
            threads = max(threads, runtime.num_threads)
            runtime.num_threads = 1
    torch.set_num_threads(1)
    _threads_before_fork = threads


def warn_if_forked() -> None:
    """Warn once in a forked child whose engine runs on one thread instead of several (module docstring)."""
    global _threads_before_fork
    if _threads_before_fork > 1:
        threads, _threads_before_fork = _threads_before_fork, 0
        warnings.warn(f"this process was forked from one holding a loaded engine, whose {threads} CPU threads do "
                      "not survive a fork: it runs on 1 thread here (with more it would hang). Load the engine "
                      "in this process, or use multiprocessing's \"spawn\" start method, to use every core",
                      RuntimeWarning, stacklevel=4)
