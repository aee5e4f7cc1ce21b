"""What a loaded engine does in a child process made by `os.fork()`.

The native CPU kernels' worker threads (OpenMP) and PyTorch's intra-op threads do not survive a fork: in the
child, the thread pool's bookkeeping still counts workers that do not exist, and the first parallel region
waits for them forever. That is the hang PyTorch alone has in a child forked after OpenMP ran in the parent
(multiprocessing's "fork" start method, gunicorn's `--preload`). So in a child of a process that loaded an
engine, the engines' runtimes and PyTorch run on one thread, which needs no pool (an engine loaded in the child
takes PyTorch's count, one, too), and the child's first request warns once. Every core takes processes started
with the "spawn" or "forkserver" method, or before an engine is loaded.

Each tracked object's `after_fork_in_child()` runs in the child too (an engine held by another thread's
generation at the fork refuses its next call there). Threads are a process's own; the parent is never affected.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import torch

_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
_loaded = False  # an engine was loaded in this process (or in the one it was forked from)
_threads_before_fork = 0  # in a forked child: the most threads its parent's engines had; 0 = nothing to say


def track(engine: Any) -> None:  # noqa: ANN401 -- an Engine (its `runtime` and `after_fork_in_child`)
    """Have `engine`, and PyTorch, run on one thread in any child process forked from this one.

    Args:
        engine: held weakly. Its `runtime.num_threads`, where the runtime has one, becomes 1 in a forked child,
            and its `after_fork_in_child()`, where it has one, is called there.
    """
    global _loaded
    if not _loaded:
        os.register_at_fork(after_in_child=_in_child)
        _loaded = True
    _tracked.add(engine)


def _in_child() -> None:
    global _threads_before_fork
    threads = torch.get_num_threads()
    for engine in list(_tracked):
        runtime = getattr(engine, "runtime", None)
        if isinstance(getattr(runtime, "num_threads", None), int):
            threads = max(threads, runtime.num_threads)
            runtime.num_threads = 1
        after = getattr(engine, "after_fork_in_child", None)
        if callable(after):
            after()
    torch.set_num_threads(1)
    _threads_before_fork = threads


def warn_if_forked() -> None:
    """Warn once in a forked child whose engines run on one thread instead of several (module docstring)."""
    global _threads_before_fork
    if _threads_before_fork > 1:
        threads, _threads_before_fork = _threads_before_fork, 0
        warnings.warn(f"this process was forked from one that had loaded an engine on {threads} CPU threads, which "
                      "do not survive a fork: Solo and PyTorch run on 1 thread here (with more they would hang). "
                      "For every core, start processes with multiprocessing's \"spawn\" or \"forkserver\" method, or "
                      "before loading the engine", RuntimeWarning, stacklevel=4)
