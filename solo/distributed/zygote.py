"""A pristine helper process that forks tensor-parallel followers fast.

Starting a follower as a fresh interpreter costs an import of torch each time (seconds). Rank 0 instead
starts this helper once (`python -m solo.distributed.zygote`); it imports torch and Solo's model code and
never runs a kernel, so forking it is safe (no OpenMP thread pool or CUDA context to inherit), and each
follower is a fork of it. Protocol on its stdin/stdout: one JSON line `["module:function", [args...]]` in
(the function returns the exit status), one line with the forked process's pid out. It exits when its
stdin closes (rank 0 exited). Followers are reaped automatically.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys


class FollowerHandle:
    """A follower forked by the helper (not our child): poll / kill it by pid.

    Args:
        pid: the follower's process id.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """None while the follower runs, else 1 (its real status belongs to the helper)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = 1
            except PermissionError:
                pass
        return self.returncode

    def terminate(self) -> None:
        """SIGTERM the follower (no error when it already exited)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the follower (no error when it already exited)."""
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float = 10.0) -> int | None:
        """Wait up to `timeout` seconds for the follower to be gone; returns `poll()`."""
        import time

        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.poll()

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass


def fork(target: str, args: list) -> FollowerHandle:
    """Fork a process from this process's helper (started on first use) running `target(*args)`.

    Args:
        target: "module:function"; the function returns the exit status.
        args: JSON-serialisable arguments.

    Raises:
        SoloError: the helper could not start.
    """
    import subprocess

    from solo.errors import SoloError

    global _HELPER
    if _HELPER is not None and _HELPER.poll() is not None:
        stop_helper()  # (a helper that died: its pipes)
    if _HELPER is None:
        _HELPER = subprocess.Popen([sys.executable, "-m", "solo.distributed.zygote"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        if _HELPER.stdout.readline().strip() != "ready":
            raise SoloError("could not start the tensor-parallel helper process (see the error above)")
    _HELPER.stdin.write(json.dumps([target, args]) + "\n")
    _HELPER.stdin.flush()
    return FollowerHandle(int(_HELPER.stdout.readline()))


_HELPER = None


def stop_helper(timeout_s: float = 5.0) -> None:
    """Stop this process's helper, if one runs; followers it forked are not touched.

    Its stdin is closed (it exits), then its stdout; it is killed after `timeout_s` seconds. Runs at exit (the
    helper was left running, its pipes open, at the end of every process that used it).
    """
    import subprocess

    global _HELPER
    helper, _HELPER = _HELPER, None
    if helper is None:
        return
    for pipe in (helper.stdin, helper.stdout):
        try:
            pipe.close()
        except OSError:  # (a helper gone already: the flush of its stdin fails)
            pass
    try:
        helper.wait(timeout_s)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


atexit.register(stop_helper)  # (nothing to do where no helper started)


def main() -> None:
    """Serve fork requests until stdin closes."""
    # Ctrl-C reaches the terminal's whole process group: rank 0 stops this helper (its stdin closes), so the
    # signal is no reason to print a traceback here. The followers take it as before.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import importlib

    import torch  # noqa: F401 -- preloaded for the followers

    from solo.distributed import bench, launch  # noqa: F401 -- preloaded for the followers
    from solo.model import lanes, weights  # noqa: F401 -- preloaded for the followers

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # followers are reaped by the kernel
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        target, args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(2, 1)  # the follower's prints must not reach rank 0's pipe
            code = 1
            try:
                module, _, function = target.partition(":")
                code = int(getattr(importlib.import_module(module), function)(*args) or 0)
            finally:
                sys.stderr.flush()
                os._exit(code)
        out.write(f"{pid}\n")
        out.flush()


if __name__ == "__main__":
    main()
