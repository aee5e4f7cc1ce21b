"""The `solo` command line: run, chat, serve, bench, train.

User mistakes (a missing folder, a bad flag value, a prompt too long for the context) print one line,
`solo: error: ...`, and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from solo.errors import SoloError

_DESCRIPTION = """\
Solo: a latency-first LLM inference engine for one request at a time.

With no MODEL, Solo uses its bundled code model (offline). MODEL may be a local Hugging Face model folder
(config.json + safetensors + tokenizer files) or a Hugging Face Hub id such as 'org/name'.
"""

# Subcommands that live in their own packages: name -> (module, help). Each module has
# add_arguments(parser) and main(args) -> int, and imports its heavy dependencies inside main().
_EXTERNAL_COMMANDS = {
    "serve": ("solo.server.cli", "serve an OpenAI-compatible HTTP API"),
    "bench": ("solo.bench.cli", "measure TTFT, decode tok/s and the roofline, against peers"),
}


def add_model_arguments(parser: argparse.ArgumentParser, model_optional: bool = True) -> None:
    """MODEL, --device, --dtype, --backend, --revision."""
    from solo.model.hub import DTYPE_CHOICES
    from solo.runtime import BACKENDS

    parser.add_argument(
        "model", nargs="?" if model_optional else None, default=None, metavar="MODEL",
        help="model folder or Hugging Face Hub id (default: Solo's bundled code model)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument(
        "--dtype", default="auto", metavar="DTYPE",
        help=f"weight dtype: {', '.join(DTYPE_CHOICES)} (or bf16, fp16, fp32); auto keeps the checkpoint's "
        "own (default: auto)",
    )
    parser.add_argument(
        "--backend", default="auto", choices=BACKENDS,
        help="decode runtime: auto picks the fastest for the device (cpu: native CPU kernels, cuda: CUDA "
        "graphs + Triton); eager runs the reference model (default: auto)",
    )
    parser.add_argument("--revision", default=None, help="hub branch, tag or commit (hub ids only)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for prefill and decode (default: one per physical core); fewer "
                        "helps when other work shares the cores")
    parser.add_argument(
        "--quantize", default=None, choices=("int8", "int4"),
        help="weight-only quantization for the CPU runtime (off by default; int8 keeps quality closest)",
    )
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="tensor parallelism over N ranks (torch.distributed: gloo on CPU, NCCL on CUDA); "
                        "starts N processes itself, or joins a torchrun job (default: 1)")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """Every sampling parameter of `SamplingParams` as a flag."""
    g = parser.add_argument_group("sampling (unset values come from the model's generation_config.json)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="most tokens to generate (default: 256, or what fits the context)")
    g.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy; higher = more random (default: the model's, else greedy)")
    g.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling: keep tokens until their probability reaches p, in (0, 1]")
    g.add_argument("--min-p", type=float, default=None,
                   help="drop tokens less likely than min-p x the most likely one, in [0, 1]")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="> 1 discourages tokens already in the prompt or output (transformers' definition)")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="in [-2, 2]: penalise tokens already generated, once (OpenAI's definition)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="in [-2, 2]: penalise tokens by how often they were generated (OpenAI's definition)")
    g.add_argument("--seed", type=int, default=None, help="random seed; the same seed repeats a sampled run")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text is generated (repeatable); it is left out of the output")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def sampling_params_from_args(args: argparse.Namespace):  # noqa: ANN201
    """Build `SamplingParams` from parsed flags (raises InvalidRequestError on bad values)."""
    from solo.engine.sampling import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed, stop=list(args.stop),
        ignore_eos=args.ignore_eos,
    )


def _load_engine(args: argparse.Namespace):  # noqa: ANN202
    from solo.engine.engine import Engine

    return Engine.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                       revision=args.revision, quantize=args.quantize, tp=args.tp)


def _default_max_tokens(engine, prompt, params) -> None:  # noqa: ANN001
    # Without --max-tokens, generate 256 tokens or as many as fit the context, never an error.
    if params.max_tokens is None:
        room = engine.config.context_length - len(engine.encode_prompt(prompt))
        params.max_tokens = max(1, min(256, room))


def _stats_line(stats, finish_reason: str, backend: str) -> str:  # noqa: ANN001
    ttft = f"{stats.ttft_s * 1000:.1f} ms" if stats.ttft_s is not None else "n/a"
    tps = stats.decode_tokens_per_s
    decode = f"{tps:.1f} tok/s" if tps is not None else "n/a"
    return (f"[TTFT {ttft} | decode {decode} | {stats.prompt_tokens} prompt + {stats.completion_tokens} "
            f"generated tokens | finish: {finish_reason} | backend: {backend}]")


def _stream(engine, prompt, params) -> tuple[str, object]:  # noqa: ANN001
    out = sys.stdout
    pieces = []
    last = None
    for event in engine.generate(prompt, params):
        if event.text:
            out.write(event.text)
            out.flush()
            pieces.append(event.text)
        last = event
    return "".join(pieces), last


def cmd_run(args: argparse.Namespace) -> int:
    """`solo run`: stream one completion to stdout, then a line of timings to stderr."""
    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise SoloError("no prompt given; pass --prompt TEXT (or pipe the prompt on stdin)")
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise SoloError(f"stdin is not valid UTF-8 text ({exc.reason} at byte {exc.start}); send UTF-8 "
                            "text") from None
    if args.system is not None and not args.chat:
        raise SoloError("--system only applies to chat prompts; add --chat (or put the text in --prompt)")
    params = sampling_params_from_args(args)
    engine = _load_engine(args)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        prompt = messages + [{"role": "user", "content": prompt}]
    _default_max_tokens(engine, prompt, params)
    _, last = _stream(engine, prompt, params)
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_stats_line(last.stats, last.finish_reason, engine.runtime.name), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """`solo chat`: an interactive conversation that keeps its history."""
    params = sampling_params_from_args(args)
    engine = _load_engine(args)
    if engine.tokenizer.chat_template is None:
        raise SoloError(
            f"{engine.name} is a completion model without a chat template, so it cannot chat; use "
            "`solo run --prompt ...` with it, or give `solo chat` a chat (instruct) model"
        )
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    print(f"Chatting with {engine.name}. /reset clears the history, /exit (or Ctrl-D) quits.", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history.clear()
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        turn = params.copy(max_tokens=params.max_tokens)
        used = len(engine.encode_prompt(system + history))
        if used + (turn.max_tokens or 1) > engine.config.context_length:
            history.pop()
            print(f"solo: error: the conversation is {used} tokens; with {turn.max_tokens or 1} more it no longer "
                  f"fits the context ({engine.config.context_length} tokens). /reset starts a new conversation"
                  f"{'; or lower --max-tokens' if turn.max_tokens else ''}", file=sys.stderr)
            continue
        try:
            _default_max_tokens(engine, system + history, turn)
            reply, last = _stream(engine, system + history, turn)
        except SoloError as exc:
            history.pop()
            print(f"solo: error: {exc}", file=sys.stderr)
            continue
        print()
        print(_stats_line(last.stats, last.finish_reason, engine.runtime.name), file=sys.stderr)
        history.append({"role": "assistant", "content": reply})


def build_parser() -> argparse.ArgumentParser:
    """The full `solo` argument parser."""
    parser = argparse.ArgumentParser(
        prog="solo", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="generate a completion for one prompt, streamed to the terminal",
                         description="Generate a completion for one prompt and stream it to the terminal; "
                         "a line with TTFT and decode speed follows on stderr.")
    add_model_arguments(run)
    run.add_argument("--prompt", "-p", default=None, help="the prompt text (default: read stdin)")
    run.add_argument("--chat", action="store_true",
                     help="send the prompt as a user message through the model's chat template")
    run.add_argument("--system", default=None, help="system message (with --chat)")
    add_sampling_arguments(run)
    run.set_defaults(handler=cmd_run)

    chat = sub.add_parser("chat", help="interactive chat that keeps the conversation history",
                          description="Chat interactively with a chat model; the history is kept.")
    add_model_arguments(chat)
    next(a for a in chat._actions if a.dest == "model").help = (
        "model folder or Hugging Face Hub id of a chat (instruct) model, one with a chat template (the bundled "
        "code model is a completion model: with no MODEL, solo chat says so and stops)"
    )
    chat.add_argument("--system", default=None, help="system message for the conversation")
    add_sampling_arguments(chat)
    chat.set_defaults(handler=cmd_chat)

    # `solo train` forwards every argument to the training recipe's own parser (see main()).
    sub.add_parser("train", add_help=False, help="train Solo's small code model (see solo train --help)")

    for name, (module_name, help_text) in _EXTERNAL_COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        module = importlib.import_module(module_name)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(handler=_external_handler(module_name))
    return parser


def _external_handler(module_name: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module_name).main(args) or 0)

    return handler


def _version() -> str:
    from solo import __version__

    return f"solo {__version__}"


def _apply_threads(args: argparse.Namespace) -> None:
    threads = getattr(args, "threads", None)
    if threads is None:
        return
    if threads < 1:
        raise SoloError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)  # the native CPU runtime uses torch's thread count too


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `solo` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from solo.train.cli import main as train_main

        return train_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _apply_threads(args)
        if getattr(args, "tp", 1) != 1 and os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
            # A torchrun job: ranks other than 0 load their shard and follow rank 0.
            from solo.distributed.launch import run_torchrun_follower

            return run_torchrun_follower(args.model, args.dtype, args.device, args.revision)
        return args.handler(args)
    except SoloError as exc:
        print(f"solo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
