"""`solo serve` arguments and entry point (the server itself lives in solo.server.app)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `solo serve`."""
    from solo.cli import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")


def main(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT."""
    raise NotImplementedError("solo serve is not implemented yet")
