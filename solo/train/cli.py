"""Command line for the training recipe: ``python -m solo.train`` (wired as ``solo train``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from solo.train.config import SIZE_PRESETS, TrainConfig
from solo.train.pipeline import RunOptions, run_recipe

# CLI flag -> TrainConfig field, for the optional overrides of a size preset.
_OVERRIDES = {
    "vocab_size": int,
    "hidden_size": int,
    "num_layers": int,
    "num_heads": int,
    "num_kv_heads": int,
    "head_dim": int,
    "ffn_size": int,
    "context": int,
    "batch_size": int,
    "lr": float,
    "warmup_steps": int,
    "eval_every": int,
    "eval_windows": int,
    "log_every": int,
    "checkpoint_every_min": float,
    "sample_tokens": int,
    "heldout_permille": int,
}


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the training recipe.

    Returns:
        The :class:`argparse.ArgumentParser`.
    """
    from solo.cli import OneLineErrorParser

    p = OneLineErrorParser(
        prog="solo train",
        description=(
            "Train Solo's small Llama code model from scratch on the CPython standard library, "
            "then write a Hugging Face folder (weights, tokenizer, model card, evaluation summary). "
            "`solo train chat --out FOLDER` then instruction-tunes it so that it chats."
        ),
    )
    p.add_argument("--out", type=Path, required=True, help="model folder to write (e.g. solo/assets/solo-code-16m)")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="working folder for checkpoints, caches and logs (default: runs/<name of --out>)",
    )
    p.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed for init, data order, sampling")
    p.add_argument("--size", choices=sorted(SIZE_PRESETS), default="default", help="model/tokenizer size preset")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps (default: 3000 for default, 20 for tiny)")
    p.add_argument(
        "--time-budget-min",
        type=float,
        default=None,
        help="wall-clock cap for the training loop in minutes; the LR schedule follows "
        "whichever of steps or time runs out first",
    )
    p.add_argument("--max-files", type=int, default=None, help="use only this many train files (quick runs)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="autocast for training (auto: bf16 where the hardware has it)",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="torch.compile the training forward pass (about a minute to compile; faster steps)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder / run")
    p.add_argument("--eval-batch-size", type=int, default=8, help="windows per forward pass in final evaluation")
    lanes = p.add_argument_group("lane models (Laneformer; Delayed Tensor Parallelism)")
    lanes.add_argument("--lanes", type=int, default=None, metavar="L",
                       help="train a lane model with L lanes instead of the dense Llama (same parameter count)")
    lanes.add_argument("--delay", type=int, default=None, metavar="D",
                       help="DTP delay in layers: a lane adds the other lanes' partials D layers late (default: 0)")
    lanes.add_argument("--early-comm", action=argparse.BooleanOptionalAction, default=None,
                       help="all-reduce the first D layers at once (default) or let them add sqrt(L) x their own")
    group = p.add_argument_group("overrides of the size preset")
    for name, kind in _OVERRIDES.items():
        group.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the training recipe.

    Args:
        argv: command-line arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        Process exit status: 0 on success, 1 on a reported error.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["chat"]:  # `solo train chat`: instruction-tune a trained model so that it chats
        from solo.train.chat_tune import main as chat_main

        return chat_main(argv[1:])
    args = build_parser().parse_args(argv)
    cfg = TrainConfig().with_preset(args.size)
    if args.size == "tiny":
        cfg = replace(cfg, steps=20, warmup_steps=5, eval_every=10, eval_windows=4, log_every=5, sample_tokens=16)
    overrides = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    cfg = replace(cfg, seed=args.seed, time_budget_min=args.time_budget_min, max_files=args.max_files, **overrides)
    if args.steps is not None:
        cfg = replace(cfg, steps=args.steps)
    if args.lanes is None and (args.delay is not None or args.early_comm is not None):
        print("solo train: error: --delay and --early-comm need --lanes L", file=sys.stderr)
        return 2
    if args.lanes is not None:
        cfg = replace(cfg, num_lanes=args.lanes, broadcast_delay=args.delay or 0,
                      use_early_comm=True if args.early_comm is None else args.early_comm)
    opts = RunOptions(
        out=args.out,
        run_dir=args.run_dir if args.run_dir is not None else Path("runs") / args.out.name,
        device=args.device,
        precision=args.precision,
        compile=args.compile,
        threads=args.threads,
        resume=args.resume,
        overwrite=args.overwrite,
        eval_batch_size=args.eval_batch_size,
    )
    try:
        summary = run_recipe(cfg, opts, log=lambda line: print(line, flush=True))
    except (FileExistsError, FileNotFoundError, ValueError) as exc:  # a flag or path to change: as `solo`'s
        print(f"solo train: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"solo train: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        from solo.train.trainer import CHECKPOINT_NAME

        if (opts.run_dir / CHECKPOINT_NAME).is_file():
            print(f"\nsolo train: interrupted; the checkpoint is in {opts.run_dir}: add --resume to continue",
                  file=sys.stderr)
        else:  # (stopped before the first step: the tokenizer and token caches are kept)
            print(f"\nsolo train: interrupted before training began; --resume starts it from step 0 with the "
                  f"tokenizer and data prepared in {opts.run_dir}", file=sys.stderr)
        return 130
    held, xz = summary["heldout"], summary["xz_heldout"]
    print(
        f"done: held-out {held['bits_per_byte']:.4f} bits/byte vs xz -9e "
        f"{xz['concatenated_bits_per_byte']:.4f}; folder {args.out}"
    )
    return 0
