"""`python -m solo ...` and the `solo` command's entry point."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import TracebackType


def run() -> int:
    """Run the `solo` command with `sys.argv`; returns the exit status.

    A Ctrl-C while `solo.cli` itself is imported (its first ~0.1 s, before `solo.cli.main` can watch for one)
    ends quietly, as one during the rest of the start-up does, instead of a KeyboardInterrupt traceback.

    Raises:
        KeyboardInterrupt: the command was interrupted (`main()` returned 130), with Python's traceback turned
            off for it, so that Python ends the process as killed by SIGINT after its clean-up, as it does for
            any interrupted program. A shell script or loop running `solo` then stops too: bash goes on after a
            command that exits with 130 and stops when the command died by SIGINT. The shell's `$?` is 130
            either way. Where SIGINT is ignored (a background job) the status is returned instead.
    """
    try:
        from solo.cli import main
    except KeyboardInterrupt:
        print(file=sys.stderr)
        code = 130
    else:
        code = main()
    if code == 130 and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        sys.excepthook = _quiet_keyboard_interrupt(sys.excepthook)
        raise KeyboardInterrupt
    return code


def _quiet_keyboard_interrupt(hook: Callable[..., object]) -> Callable[..., object]:
    def quiet(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> object:
        return None if issubclass(kind, KeyboardInterrupt) else hook(kind, value, tb)

    return quiet


if __name__ == "__main__":
    raise SystemExit(run())
