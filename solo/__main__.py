"""`python -m solo ...` and the `solo` command's entry point."""

from __future__ import annotations

import sys


def run() -> int:
    """Run the `solo` command with `sys.argv`; returns the exit status.

    A Ctrl-C while `solo.cli` itself is imported (its first ~0.1 s, before `solo.cli.main` can watch for one)
    ends quietly with 130, as one during the rest of the start-up does, instead of a KeyboardInterrupt traceback.
    """
    try:
        from solo.cli import main
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
