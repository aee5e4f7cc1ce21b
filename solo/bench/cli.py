"""`solo bench` arguments and entry point."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `solo bench`."""
    from solo.cli import add_model_arguments

    add_model_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark."""
    raise NotImplementedError("solo bench is not implemented yet")
