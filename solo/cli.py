"""The `solo` command line: run, chat, serve, bench, train.

User mistakes (a missing folder, a bad flag value, a prompt too long for the context) print one line,
`solo: error: ...`, and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import random
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from solo.errors import EngineFailedError, SoloError, shown_path

_DESCRIPTION = """\
Solo: a latency-first LLM inference engine for one request at a time.

With no MODEL, Solo uses its bundled model (offline; it completes Python code and chats). MODEL may be a
local Hugging Face model folder (config.json + safetensors + tokenizer files), a .gguf file, or a Hugging Face
Hub id such as 'org/name' (`solo pull` fetches one, `solo list` shows what is cached).
"""

# Subcommands that live in their own packages: name -> (module, help). Each module has
# add_arguments(parser) and main(args) -> int, and imports its heavy dependencies inside main().
_EXTERNAL_COMMANDS = {
    "serve": ("solo.server.cli", "serve an OpenAI-compatible HTTP API (and Anthropic's, Ollama's and llama-server's)"),
    "bench": ("solo.bench.cli", "measure TTFT, decode tok/s and the roofline, against peers"),
}


def output_path(text: str) -> str:
    """The argparse type of output file flags (`solo bench --json/--plot/--markdown`): `~` expanded.

    The shell leaves `--json=~/x.json` as it is, and a benchmark wrote its file only after the whole run.
    """
    return str(Path(text).expanduser())


def finite_float(text: str) -> float:
    """The argparse type of float flags: nan and inf are refused (`--prefix-cache-gb inf` crashed).

    Raises:
        argparse.ArgumentTypeError: not a finite number (argparse prints it as a one-line error, exit status 2).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def argv_text(text: str) -> str:
    """The argparse type of text flags (--prompt, --system, --stop, --served-model-name, ...): UTF-8 always.

    Under an ASCII locale (LC_ALL=C without Python's UTF-8 mode) Python decodes the arguments as ASCII and keeps
    every other byte as a lone surrogate, so a UTF-8 prompt was refused as "not UTF-8" while the same text on
    stdin (read as UTF-8) ran. The argument's bytes are decoded as UTF-8 again; bytes that are not UTF-8 stay
    as they were, for the tokenizer's refusal to name.
    """
    if not any("\udc80" <= ch <= "\udcff" for ch in text):
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except (UnicodeError, ValueError):
        return text


def add_model_arguments(parser: argparse.ArgumentParser, model_optional: bool = True) -> None:
    """MODEL, --device, --dtype, --backend, --revision."""
    from solo.model.hub import DTYPE_CHOICES
    from solo.runtime import BACKENDS

    parser.add_argument(
        "model", nargs="?" if model_optional else None, default=None, metavar="MODEL",
        help="model folder, .gguf file or Hugging Face Hub id (default: Solo's bundled model)",
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
                        help="CPU threads for prefill and decode (default: one per physical core; at most the "
                        "CPUs this process may use; decode steps within a container's CPU limit); fewer helps when "
                        "other work shares the cores")
    parser.add_argument(
        "--quantize", default=None, choices=("int8", "int4"),
        help="weight-only quantization for the CPU runtime (off by default; int8 keeps quality closest)",
    )
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="tensor parallelism over N ranks (torch.distributed: gloo on CPU, NCCL on CUDA); "
                        "starts N processes itself, or joins a torchrun job (default: 1)")


def add_template_arguments(parser: argparse.ArgumentParser, tools: bool = False) -> None:
    """--chat-template, and with `tools` --tool-call-parser (`Engine.load`'s chat_template, tool_call_parser)."""
    from solo.engine.tool_calls import TOOL_FORMATS

    parser.add_argument("--chat-template", default=None, metavar="FILE_OR_TEXT",
                        help="a chat template to use instead of the model's: a .jinja file or the template text "
                        "(as vLLM's --chat-template)")
    if not tools:  # (the server's requests say it themselves: chat_template_kwargs, think)
        parser.add_argument("--no-think", action="store_true",
                            help="ask a thinking model not to think (its chat template's enable_thinking=false, "
                            "as Ollama's --think=false)")
    if tools:  # (only the server takes requests with tools)
        parser.add_argument("--tool-call-parser", default=None, choices=TOOL_FORMATS,
                            help="the tool-call syntax to parse instead of the one detected from the chat template "
                            "(as vLLM's --tool-call-parser)")


def add_context_argument(parser: argparse.ArgumentParser, help_suffix: str = "") -> None:
    """--max-model-len (`Engine.load`'s context_length)."""
    parser.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                        help="longest sequence, prompt plus completion (default: the model's context length; a "
                        "LongRoPE model such as Phi-3.5 starts at its original context and takes its long RoPE "
                        "factors above it)" + help_suffix)


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    """--prefix-cache-gb, --no-prefix-cache, --speculative (see `solo.engine.prefix_cache` / `.speculative`)."""
    from solo.engine.prefix_cache import DEFAULT_PREFIX_CACHE_GB
    from solo.engine.speculative import SPECULATIVE_MODES

    parser.add_argument("--prefix-cache-gb", type=finite_float, default=None, metavar="GB",
                        help="reuse the KV cache of earlier prompts that start the same way; GB of KV snapshots "
                        f"kept besides the live cache rows (default: {DEFAULT_PREFIX_CACHE_GB:g})")
    parser.add_argument("--no-prefix-cache", action="store_true", help="turn prefix caching off")
    parser.add_argument("--speculative", default="auto", choices=SPECULATIVE_MODES,
                        help="speculative decoding from text already seen, without a draft model: ngram (the "
                        "request's own prompt and output), suffix (also the session's earlier requests), off; "
                        "auto = ngram on runtimes where it cannot change the output (the native CPU runtime), "
                        "else off (default: auto)")


def prefix_cache_gb_from_args(args: argparse.Namespace) -> float | None:
    """The `prefix_cache_gb` for `Engine.load` from the flags (None when --no-prefix-cache).

    Raises:
        SoloError: a negative --prefix-cache-gb, --prefix-cache-gb beside --no-prefix-cache, or with --tp.
    """
    from solo.engine.prefix_cache import DEFAULT_PREFIX_CACHE_GB

    if getattr(args, "tp", 1) != 1 and args.prefix_cache_gb is not None:
        raise SoloError("--prefix-cache-gb needs a runtime that copies KV-cache rows out and back; the tensor-parallel "
                        "runtime (--tp) has none, so prefix caching is off there: drop --prefix-cache-gb")
    if args.no_prefix_cache:
        if args.prefix_cache_gb is not None:
            raise SoloError("--no-prefix-cache turns prefix caching off and --prefix-cache-gb sizes it; give one of "
                            "them")
        return None
    if args.prefix_cache_gb is None:
        return DEFAULT_PREFIX_CACHE_GB
    if not args.prefix_cache_gb >= 0:
        raise SoloError(f"--prefix-cache-gb must be >= 0, got {args.prefix_cache_gb} (--no-prefix-cache turns it "
                        "off)")
    return args.prefix_cache_gb


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """Every sampling parameter of `SamplingParams` as a flag."""
    g = parser.add_argument_group("sampling (unset values come from the model's generation_config.json)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="most tokens to generate (default: 256, or what fits the context)")
    g.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy; higher = more random (default: the model's, else greedy)")
    g.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (0 or -1 = off)")
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
    g.add_argument("--repeat-last-n", type=int, default=None, metavar="N",
                   help="the penalties look at the last N tokens only (llama.cpp's flag; -1 or unset: all of them, "
                   "0: no penalties)")
    g.add_argument("--seed", type=int, default=None,
                   help="random seed; the same seed repeats a sampled run (-1 or unset: a random one)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", type=argv_text,
                   help="stop when this text is generated (repeatable); it is left out of the output; taken as "
                   "written, escapes included (a newline: --stop $'\\n' in bash)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    g.add_argument("--min-tokens", type=int, default=0, metavar="N",
                   help="generate at least N tokens before an end-of-sequence token or a stop string ends the output")
    g.add_argument("--logit-bias", action="append", default=[], metavar="ID+BIAS",
                   help="add BIAS (-100 to 100) to token ID's logit, as llama.cpp writes it: 15043+1, 15043-100 "
                   "(or 15043=-100); llama.cpp's 15043-inf, a ban, is -100 here; repeatable")


class _Once(argparse.Action):
    """Store a flag's value, refusing it a second time (argparse would keep the last and drop the others)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,  # noqa: ANN401
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} was given twice; give it once")
        setattr(namespace, self.dest, values)


def _logit_bias(items: Sequence[str]) -> dict[int, float] | None:
    # llama.cpp's --logit-bias form, ID+BIAS / ID-BIAS, or ID=BIAS.
    from solo.errors import InvalidRequestError

    number = r"(?:[0-9.]+(?:[eE][+-]?\d+)?|inf)"
    bias: dict[int, float] = {}
    for item in items:
        match = re.fullmatch(rf"\s*(\d+)\s*(=\s*[+-]?{number}|[+-]\s*{number})\s*", item)
        try:
            value = float(match[2].lstrip("=").replace(" ", ""))
            if int(match[1]) in bias:
                raise InvalidRequestError(f"--logit-bias gives token {int(match[1])} twice; give each token once",
                                          param="logit_bias")
            if "inf" in match[2]:  # llama.cpp's ban, written as such (1e500 overflows to inf: out of range)
                value = max(-100.0, min(100.0, value))
            bias[int(match[1])] = value
        except (TypeError, ValueError):
            raise InvalidRequestError(f"--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, "
                                      f"15043-100), got {item!r}", param="logit_bias") from None
        if not -100 <= value <= 100:  # OpenAI's range
            raise InvalidRequestError(f"--logit-bias {item.strip()}: the bias must be within [-100, 100] (-100 in "
                                      "effect bans the token, +100 forces it)", param="logit_bias")
    return bias or None


def sampling_params_from_args(args: argparse.Namespace):  # noqa: ANN201
    """Build `SamplingParams` from parsed flags (raises InvalidRequestError on bad values)."""
    import warnings

    from solo.engine.sampling import SamplingParams
    from solo.errors import SoloWarning

    for stop in args.stop:
        if re.search(r"\\[ntr]", stop):  # llama.cpp reads escapes in its flags; a shell passes them as written
            warnings.warn(f"--stop '{stop}' holds a backslash escape, which Solo takes as written (a backslash, then a "
                          "letter), not as the character llama.cpp reads; for a newline write --stop $'\\n' in the "
                          "shell", SoloWarning, stacklevel=2)
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed,
        stop=list(args.stop),
        ignore_eos=args.ignore_eos, min_tokens=args.min_tokens, logit_bias=_logit_bias(args.logit_bias),
    )


def _load_engine(args: argparse.Namespace):  # noqa: ANN202
    from solo.engine.engine import Engine

    engine = Engine.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                         revision=args.revision, quantize=args.quantize,
                         prefix_cache_gb=prefix_cache_gb_from_args(args), speculative=args.speculative, tp=args.tp,
                         context_length=args.max_model_len, chat_template=args.chat_template)
    _end_of_start()
    return engine


# Ctrl-C while the command starts (imports, parsing, loading), kept where a library swallowed its KeyboardInterrupt:
# torch imports numpy from C and clears whatever that import raises, so a Ctrl-C that landed inside numpy's import
# was lost and `solo chat` went on to wait at its prompt (3 in 30 tries with SIGINT 0.25 s after the start).
_start_interrupted = False


def _on_start_interrupt(signum: int, frame: object) -> NoReturn:
    global _start_interrupted
    _start_interrupted = True
    raise KeyboardInterrupt


def _watch_start_interrupts() -> None:
    global _start_interrupted
    _start_interrupted = False
    # (only over Python's own handler: not where SIGINT is ignored, as in a background job, or handled by the caller)
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _on_start_interrupt)


def _stop_watching_start_interrupts() -> None:
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is _on_start_interrupt):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _end_of_start() -> None:
    """Give Ctrl-C back to Python's handler once the model is loaded, and act on one that a library swallowed.

    Raises:
        KeyboardInterrupt: a Ctrl-C arrived during start-up (main() exits 130).
    """
    _stop_watching_start_interrupts()
    if _start_interrupted:
        raise KeyboardInterrupt


def template_kwargs_from_args(engine, args: argparse.Namespace) -> dict | None:  # noqa: ANN001
    """The chat template variables the flags ask for (--no-think), or None.

    Raises:
        SoloError: --no-think on a model whose template has no enable_thinking switch.
    """
    from solo.engine.reasoning import detect_reasoning, has_thinking_switch

    if not getattr(args, "no_think", False):
        return None
    template = engine.tokenizer.chat_template
    source = template.source if template is not None else None
    if has_thinking_switch(source):
        return {"enable_thinking": False}
    if detect_reasoning(source):
        raise SoloError(f"--no-think: {engine.name}'s chat template has no enable_thinking switch (the model thinks "
                        "whatever it is asked); drop --no-think")
    return None  # (a model that does not think: as asked already)


def _default_max_tokens(engine, prompt, params, template_kwargs: dict | None = None) -> None:  # noqa: ANN001
    # Without --max-tokens, generate 256 tokens (or the generation config's max_new_tokens) or as many as fit
    # the context, never an error.
    # A prompt that alone fills the context keeps None, so the error counts the prompt, not a budget the user
    # never gave.
    if params.max_tokens is None:
        room = engine.config.context_length - len(engine.encode_prompt(prompt, template_kwargs))
        if room > 0 and params.min_tokens <= room:  # (else the engine's error names the room, not a budget)
            # --min-tokens above the default raises the budget with it (room permitting), rather than an error
            # naming a max_tokens the user never set.
            default = engine.defaults.max_new_tokens or 256  # the generation config's, as transformers
            params.max_tokens = min(max(default, params.min_tokens), room)


def _stats_line(stats, finish_reason: str, backend: str, seed: int | None = None) -> str:  # noqa: ANN001
    ttft = f"{stats.ttft_s * 1000:.1f} ms" if stats.ttft_s is not None else "n/a"
    tps = stats.decode_tokens_per_s
    decode = f"{tps:.1f} tok/s" if tps is not None else "n/a"
    cached = f" ({stats.cached_tokens} cached)" if stats.cached_tokens else ""
    accept = "" if stats.acceptance_length is None else f" | acceptance {stats.acceptance_length:.2f} tok/step"
    return (f"[TTFT {ttft} | decode {decode} | {stats.prompt_tokens} prompt{cached} + {stats.completion_tokens} "
            f"generated tokens{accept} | finish: {finish_reason} | backend: {backend}"
            f"{'' if seed is None else f' | seed: {seed}'}]")


def _stream(engine, prompt, params, template_kwargs: dict | None = None) -> tuple[str, object]:  # noqa: ANN001
    # A thinking model's block (chat prompts) is shown apart from its answer, as in solo chat.
    from solo.chat import ReplyWriter

    show = ReplyWriter.for_prompt(engine, prompt, template_kwargs, sys.stdout, sys.stderr)
    pieces = []
    last = None
    for event in engine.generate(prompt, params, chat_template_kwargs=template_kwargs):
        if event.text:
            show.write(event.text)
            pieces.append(event.text)
        last = event
    show.finish()
    return "".join(pieces), last


def cmd_run(args: argparse.Namespace) -> int:
    """`solo run`: stream one completion to stdout, then a line of timings to stderr."""
    if sys.stdout is None:  # (`>&-`: Python leaves no stream to write the completion to)
        raise SoloError("standard output is closed; redirect it instead (>/dev/null discards the completion)")
    prompt = args.prompt
    if prompt is None or prompt == "-":  # (`-p -`: stdin, as the convention is)
        if sys.stdin is None or (prompt is None and sys.stdin.isatty()):
            raise SoloError("no prompt given; pass --prompt TEXT (or pipe the prompt on stdin)")
        try:  # (UTF-8 whatever the locale's encoding: a prompt is text in UTF-8, as the API's)
            if hasattr(sys.stdin, "reconfigure"):
                sys.stdin.reconfigure(encoding="utf-8")
            prompt = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise SoloError(f"stdin is not valid UTF-8 text ({exc.reason} at byte {exc.start}); send UTF-8 "
                            "text") from None
    if args.system is not None and not args.chat:
        raise SoloError("--system only applies to chat prompts; add --chat (or put the text in --prompt)")
    for flag, given in (("--chat-template", args.chat_template is not None), ("--no-think", args.no_think)):
        if given and not args.chat:
            raise SoloError(f"{flag} only applies to chat prompts; add --chat (a plain prompt is sent as it is)")
    if args.chat and not prompt:  # as a plain prompt's (the chat template would still render a turn)
        raise SoloError("the prompt is empty; give some text")
    params = sampling_params_from_args(args)
    engine = _load_engine(args)
    kwargs = template_kwargs_from_args(engine, args)
    if args.chat:
        if args.system is not None:
            from solo.chat_template import system_prompt_ids

            system_prompt_ids(engine, args.system, kwargs)
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        prompt = messages + [{"role": "user", "content": prompt}]
    _default_max_tokens(engine, prompt, params, kwargs)
    seed = None
    if not params.resolve(engine.defaults).greedy:
        # A sampled run names its seed, so a run worth keeping can be repeated (llama.cpp prints its seed too);
        # -1 or unset draws one here rather than inside the engine.
        seed = params.seed if params.seed not in (None, -1) else random.randrange(2**32)
        params = params.copy(seed=seed)
    _, last = _stream(engine, prompt, params, kwargs)
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_stats_line(last.stats, last.finish_reason, engine.backend_name, seed), file=sys.stderr)
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """`solo pull`: download into the Hugging Face cache, then say what was fetched and whether Solo runs it."""
    import huggingface_hub.constants as hf_constants

    from solo.model.hub import pick_gguf, split_gguf_tag
    from solo.model.store import human_size, inspect_folder, pull

    folder = pull(args.model, args.revision, args.include)
    if hf_constants.HF_HUB_OFFLINE:  # snapshot_download returned what the cache holds, complete or not
        print("offline (HF_HUB_OFFLINE is set): nothing was downloaded; this is what the cache holds",
              file=sys.stderr)
    arch, ok, reason, ggufs = inspect_folder(folder)
    repo_id, tag = split_gguf_tag(args.model)
    if tag is not None or (ggufs and not (folder / "config.json").is_file()):
        pick_gguf(folder, repo_id, tag)  # what `solo run` would pick: several files or none is an error now
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{args.model}: {human_size(size)}, {arch}, in {folder}")  # (after the checks: only what succeeded)
    if ok:
        print(f"ready: solo run {args.model} --prompt ...")
    else:
        print(f"Solo cannot run it: {reason}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """`solo list`: the cached models as a table (or --json), interrupted downloads and GGUF conversions."""
    import json

    from solo.model.gguf import list_conversions
    from solo.model.store import damaged_repos, human_size, list_models, partial_downloads

    models = list_models()
    damaged = damaged_repos()
    if args.json:  # the same four things the table and its notes show
        print(json.dumps({
            "models": [m.to_dict() for m in models],
            "interrupted_downloads": [{"repo_id": repo, "size_bytes": size}
                                      for repo, size in partial_downloads().items()],
            "damaged": [{"repo_id": repo, "path": str(folder)} for repo, folder in damaged.items()],
            "gguf_conversions": [{"source": str(c.source), "folder": str(c.folder), "size_bytes": c.size_bytes,
                                  "source_exists": c.source_exists} for c in list_conversions()],
        }, indent=2))
        return 0
    for repo, size in partial_downloads().items():  # not in the table: nothing of them runs yet
        print(f"{repo}: an interrupted download holds {human_size(size)}; `solo pull {repo}` resumes it, "
              f"`solo rm {repo}` deletes it", file=sys.stderr)
    for repo, folder in damaged.items():  # not in the table: huggingface_hub cannot read them
        print(f"{repo}: its cache folder is damaged (a file or a ref is missing: {folder}); `solo rm {repo}` deletes "
              f"it, `solo pull {repo}` downloads it again", file=sys.stderr)
    if not models:
        print("no models in the Hugging Face cache; `solo pull ORG/NAME` downloads one", file=sys.stderr)
    else:
        from solo.errors import ModelNotFoundError
        from solo.model.hub import pick_gguf

        rows = [("MODEL", "REVISION", "SIZE", "ARCHITECTURE", "SOLO")]
        for m in models:
            reason = m.reason.replace(m.path, "the snapshot")  # (the local path said nothing in 100 characters)
            cell = "yes" if m.supported else f"no: {reason if len(reason) <= 100 else reason[:99] + '…'}"
            if m.supported and len(m.gguf_files) > 1 and not (Path(m.path) / "config.json").is_file():
                try:  # what `solo run ORG/NAME` picks: of several files, one must be named
                    pick_gguf(Path(m.path), m.repo_id, None)
                except ModelNotFoundError:
                    cell = (f"yes, naming a file: {m.repo_id}:<quantization> of "
                            f"{', '.join(Path(f).name for f in m.gguf_files)}")
            rows.append((m.repo_id, m.revision, human_size(m.size_bytes), m.architecture, cell))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    _print_conversions()
    return 0


def _print_conversions() -> None:
    # GGUF files Solo converted into its own cache: disk no Hugging Face command shows.
    from solo.model.gguf import cache_root, list_conversions
    from solo.model.store import human_size

    conversions = list_conversions()
    if not conversions:
        return
    print(f"\nGGUF files converted into Solo's cache ({cache_root() / 'gguf'}; `solo rm FILE.gguf` deletes one):")
    for c in conversions:
        # (a name with a newline or bytes that are not UTF-8 is quoted, as ls does: one entry per line)
        print(f"  {human_size(c.size_bytes):>9}  {shown_path(c.source)}{'' if c.source_exists else '  (source gone)'}")


def cmd_rm(args: argparse.Namespace) -> int:
    """`solo rm`: delete a cached model."""
    from solo.model.store import human_size, remove

    if args.model.lower().endswith(".gguf") or Path(args.model).expanduser().is_file():
        from solo.model.gguf import remove_conversions

        if args.revision is not None:
            raise SoloError("--revision applies to Hub ids; a GGUF file's conversions have none: drop it")
        freed = remove_conversions(args.model)  # the file itself is the user's: left alone
        kept = "the file itself is kept" if Path(args.model).expanduser().is_file() else "the file itself was gone"
        print(f"deleted Solo's conversion of {shown_path(args.model)} ({human_size(freed)} freed; {kept})")
        return 0
    freed = remove(args.model, args.revision)
    print(f"deleted {args.model}{'@' + args.revision if args.revision else ''} ({human_size(freed)} freed)")
    return 0


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with one-line errors: `solo: error: MESSAGE (did you mean X?); see 'solo CMD --help'`."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        hint = _suggestion(self, message)
        command = getattr(self, "_solo_command", None) or self.prog
        self.exit(2, f"solo: error: {message}{hint}; see '{command} --help'\n")


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    # "unrecognized arguments: --tempreature 0.5" -> " (did you mean --temperature?)"
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice and message.startswith("argument --quantize") and choice.group(1).upper().startswith("Q"):
        bits = "int8" if choice.group(1).upper().startswith(("Q8", "Q6", "Q5")) else "int4"
        return (f" (llama.cpp's types are read from GGUF files; Solo quantizes a model itself to int8, 8 bits per "
                f"weight as Q8_0, or int4, 4 bits as Q4_0: --quantize {bits})")
    if choice:
        close = difflib.get_close_matches(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)), n=1)
        return f" (did you mean {close[0]}?)" if close else ""
    glued = re.search(r"-h/--help: ignored explicit argument '([^']*)'", message)  # -hf read as -h f
    if glued and f"-h{glued.group(1)}" in _FOREIGN_FLAGS:
        return f" (-h{glued.group(1)} is {_FOREIGN_FLAGS['-h' + glued.group(1)]})"
    prefix = "unrecognized arguments: "
    options = [o for p in _all_parsers(parser) for a in p._actions for o in a.option_strings]
    if message.startswith("the following arguments are required: COMMAND"):
        # (`solo --versoin`: argparse asks for the command before it looks at the flag)
        for flag in (a.split("=")[0] for a in getattr(parser, "_solo_argv", []) if a.startswith("-")):
            close = difflib.get_close_matches(flag, [o for a in parser._actions for o in a.option_strings], n=1,
                                              cutoff=0.6)
            if flag not in options and close:
                return f" ({flag} is no option; did you mean {close[0]}?)"
        return ""
    if not message.startswith(prefix):
        return ""
    words = message[len(prefix):].split()
    for flag in (word.split("=")[0] for word in words):
        if flag in _FOREIGN_FLAGS:
            return f" ({flag} is {_FOREIGN_FLAGS[flag]})"
    if words and not words[0].startswith("-") and getattr(parser, "_solo_command", "") == "solo run":
        return " (the prompt goes after -p / --prompt, quoted, or on stdin: solo run MODEL -p 'PROMPT')"
    if getattr(parser, "_solo_command", "") == "solo chat" and any(w.split("=")[0] in ("-p", "--prompt")
                                                                    for w in words):
        return " (solo chat reads each message at its prompt; for one prompt and its reply: solo run MODEL -p 'PROMPT')"
    for word in words:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


# Other engines' flags for the same thing (llama.cpp, Ollama, vLLM), named in the error.
_FOREIGN_FLAGS = {
    "-n": "llama.cpp's --n-predict: use --max-tokens", "--n-predict": "llama.cpp's: use --max-tokens",
    "--num-predict": "Ollama's: use --max-tokens", "-c": "llama.cpp's --ctx-size: use --max-model-len",
    "--ctx-size": "llama.cpp's: use --max-model-len", "--num-ctx": "Ollama's: use --max-model-len",
    "-m": "llama.cpp's --model: the model is the first argument, solo run MODEL",
    "--model": "the first argument here: solo COMMAND MODEL", "-t": "llama.cpp's --threads: use --threads",
    "--repeat-penalty": "llama.cpp's: use --repetition-penalty",
    "-ngl": "llama.cpp's GPU offload: use --device cuda (the whole model)",
    "--n-gpu-layers": "llama.cpp's GPU offload: use --device cuda (the whole model)",
    "--tensor-parallel-size": "vLLM's: use --tp", "-tp": "vLLM's --tensor-parallel-size: use --tp",
    "--enable-auto-tool-choice": "vLLM's: Solo parses tool calls whenever a request sends tools; drop it",
    "--chat-template-file": "llama.cpp's: use --chat-template FILE",
    "--jinja": "llama.cpp's: Solo always renders the model's Jinja chat template; drop it",
    **dict.fromkeys(("-hf", "-hfr", "--hf-repo"), "llama.cpp's: name the repository and file as MODEL, "
                    "solo run ORG/NAME-GGUF:Q4_K_M"),
    **dict.fromkeys(("-r", "--reverse-prompt"), "llama.cpp's: use --stop TEXT"),
    "-s": "llama.cpp's --seed: use --seed",
    **dict.fromkeys(("-f", "--file"), "llama.cpp's: give the prompt on stdin, solo run MODEL < FILE"),
    **dict.fromkeys(("-i", "-cnv", "--interactive", "--conversation"), "llama.cpp's: use solo chat MODEL"),
    **dict.fromkeys(("--grammar", "--grammar-file", "--json-schema", "-j"),
                    "llama.cpp's: solo serve takes grammars and JSON schemas as response_format (and Python's "
                    "Engine.complete as SamplingParams.response_format)"),
    **dict.fromkeys(("--typical", "--mirostat", "--mirostat-lr", "--mirostat-ent"),
                    "a llama.cpp sampler Solo does not run; drop it, or use --top-p, --min-p or --top-k"),
    **dict.fromkeys(("-fa", "--flash-attn", "--no-mmap", "--mlock", "-b", "--batch-size", "-ub", "--ubatch-size"),
                    "llama.cpp's memory / kernel tuning, which Solo does itself; drop it"),
    "--alias": "llama-server's: use --served-model-name",
    **dict.fromkeys(("-np", "--parallel"), "llama-server's: use --max-batch (concurrent requests)"),
    "--slots": "llama-server's: /metrics shows the running and waiting requests; drop it",
}


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _all_parsers(child)
    return found


def _command_in(argv: Sequence[str]) -> str | None:
    # The only top-level options are --help and --version, so the first bare word is the command.
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `solo` argument parser.

    Args:
        argv: the arguments about to be parsed, or None. With them, only the named command's flags are
            built: building `serve` or `bench` imports torch, which `solo --help` should not wait for.
    """
    wanted = None if argv is None else (_command_in(argv) or "")
    parser = OneLineErrorParser(prog="solo", description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineErrorParser)

    def command(name: str, **kwargs: object) -> argparse.ArgumentParser | None:
        made = sub.add_parser(name, **kwargs)
        made._solo_command = f"solo {name}"  # type: ignore[attr-defined]
        if wanted == name:  # the top-level parser reports unknown flags: point at this command's --help
            parser._solo_command = made._solo_command  # type: ignore[attr-defined]
        return made if wanted is None or wanted == name else None

    run = command("run", help="generate a completion for one prompt, streamed to the terminal",
                  description="Generate a completion for one prompt and stream it to the terminal; "
                  "a line with TTFT and decode speed follows on stderr.")
    if run is not None:
        add_model_arguments(run)
        run.add_argument("--prompt", "-p", default=None, action=_Once, type=argv_text,
                         help="the prompt text (- or none: read stdin)")
        run.add_argument("--chat", action="store_true",
                         help="send the prompt as a user message through the model's chat template")
        run.add_argument("--system", default=None, type=argv_text, help="system message (with --chat)")
        add_context_argument(run)
        add_template_arguments(run)
        add_feature_arguments(run)
        add_sampling_arguments(run)
        run.set_defaults(handler=cmd_run)

    chat = command("chat", help="interactive chat that keeps the conversation history",
                   description="Chat interactively with a chat model; the history is kept. Line editing and "
                   "history (Up/Down) at the prompt; Ctrl-C stops the current reply; /help lists the commands.")
    if chat is not None:
        add_model_arguments(chat)
        next(a for a in chat._actions if a.dest == "model").help = (
            "model folder, GGUF file or Hugging Face Hub id of a chat (instruct) model, one with a chat template "
            "(default: Solo's bundled model)"
        )
        chat.add_argument("--system", default=None, type=argv_text, help="system message for the conversation")
        add_context_argument(chat)
        add_template_arguments(chat)
        add_feature_arguments(chat)
        add_sampling_arguments(chat)
        chat.set_defaults(handler=_lazy_handler("solo.chat", "cmd_chat"))

    pull = command("pull", help="download a model from the Hugging Face Hub (resumable)",
                   description="Download a model from the Hugging Face Hub into its cache, with progress bars; "
                   "an interrupted download resumes. Fetches the files Solo reads (config, tokenizer, safetensors).")
    if pull is not None:
        pull.add_argument("model", metavar="ORG/NAME", help="Hugging Face Hub id; ORG/NAME:TAG also fetches the GGUF "
                          "files whose names hold TAG (e.g. Q8_0)")
        pull.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
        pull.add_argument("--include", action="append", default=[], metavar="PATTERN",
                          help="also fetch files matching this glob, e.g. '*Q8_0.gguf' (repeatable)")
        pull.set_defaults(handler=cmd_pull)
    listing = command("list", help="list the models in the Hugging Face cache",
                      description="List the models in the Hugging Face cache: size, architecture, and whether "
                      "Solo runs them.")
    if listing is not None:
        listing.add_argument("--json", action="store_true",
                             help='print JSON instead of a table: {"models", "interrupted_downloads", '
                                  '"damaged", "gguf_conversions"}')
        listing.set_defaults(handler=cmd_list)
    rm = command("rm", help="delete a model from the Hugging Face cache (or Solo's conversion of a GGUF file)",
                 description="Delete a model (every revision, or one) from the Hugging Face cache.")
    if rm is not None:
        rm.add_argument("model", metavar="ORG/NAME[:TAG] | FILE.gguf",
                        help="Hugging Face Hub id, as `solo list` shows it; with :TAG (e.g. :Q8_0) only the GGUF "
                             "files whose names hold TAG. A local .gguf path deletes Solo's converted copy of it "
                             "(the file itself is kept)")
        rm.add_argument("--revision", default=None, help="only this branch, tag or commit (default: all)")
        rm.set_defaults(handler=cmd_rm)

    # `solo train` forwards every argument to the training recipe's own parser (see main()).
    sub.add_parser("train", add_help=False, help="train Solo's small code model (see solo train --help)")

    for name, (module_name, help_text) in _EXTERNAL_COMMANDS.items():
        sub_parser = command(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        if sub_parser is not None:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(handler=_external_handler(module_name))
    return parser


def _lazy_handler(module_name: str, function: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module_name), function)(args) or 0)

    return handler


def _external_handler(module_name: str) -> Callable[[argparse.Namespace], int]:
    return _lazy_handler(module_name, "main")


def _version() -> str:
    from solo import __version__

    return f"solo {__version__}"


def _apply_threads(args: argparse.Namespace) -> None:
    # (A container's CPU quota is not applied here: the CPU runtime runs its decode steps within it and a
    # prompt's steps on every thread, solo.runtime.cpu_threads.)
    threads = getattr(args, "threads", None)
    if threads is None:
        return
    if threads < 1:
        raise SoloError(f"--threads must be >= 1, got {threads}")
    from solo.cpus import affinity_cpus, cgroup_cpu_limit, cpus_text, threads_for_cpu_limit

    available = affinity_cpus()
    if threads > available:
        # The decode step's threads meet at barriers several times per layer: a thread without a CPU of its
        # own stalls all of them (measured on 2 CPUs: --threads 16 decoded 400x slower than 2).
        print(f"solo: warning: --threads {threads} is more than the {available} CPUs this process may run on; "
              f"using {available}", file=sys.stderr)
        threads = available
    limit = cgroup_cpu_limit()
    if limit is not None and threads > threads_for_cpu_limit(limit):
        print(f"solo: warning: --threads {threads} is more than this process's CPU quota of {cpus_text(limit)} "
              f"(a container's CPU limit: cgroup cpu.max or cpu.cfs_quota_us); decode steps run on "
              f"{threads_for_cpu_limit(limit)}, prompts on {threads}", file=sys.stderr)
    import torch

    torch.set_num_threads(threads)  # the native CPU runtime uses torch's thread count too


def show_solo_warnings_as_lines() -> None:
    """Print Solo's own warnings (`SoloWarning`) as one line, "solo: warning: <message>", the form of its errors.

    Python's default form names the file and line that warned and the category (a traceback-like line a
    user of the command cannot act on); every other warning keeps its handler and form.
    """
    import warnings

    from solo.errors import SoloWarning

    if getattr(warnings.showwarning, "solo_lines", False):
        return
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
        if not issubclass(category, SoloWarning):
            default(message, category, filename, lineno, file, line)
            return
        try:
            print(f"solo: warning: {message}", file=file or sys.stderr)
        except OSError:  # a closed stderr: as Python's own handler, never fail the work for a warning
            pass

    show.solo_lines = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def _check_temp_folder(args: argparse.Namespace) -> None:
    # The commands that run a model (those with --threads) import torch, which needs a temporary folder: without
    # one (a read-only root file system) `solo run` died in a traceback from torch's imports.
    if not hasattr(args, "threads"):
        return
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        raise SoloError("no writable temporary folder: TMPDIR, /tmp, /var/tmp and the working folder are all "
                        "read-only or missing, and PyTorch needs one; set TMPDIR to a writable folder (in a "
                        "container with a read-only root file system, mount a tmpfs at /tmp)") from None


def terminate_as_pid_1() -> None:
    """As a PID namespace's first process (a container's, which `docker stop` sends SIGTERM), let SIGTERM end Solo.

    The kernel drops a signal whose action is the default for that process, so SIGTERM did nothing until
    `solo serve` installed its own handler (about 2 s into start-up: `docker stop` then waited its whole timeout)
    and nothing at all in `solo run` or `solo chat`. The handler exits with status 143 (128 + SIGTERM), as the
    default action reads to a shell; `solo serve`'s own handling replaces it once installed. Elsewhere nothing
    changes: the default action already ends the process at once.
    """
    if os.getpid() == 1 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `solo` command; returns the exit status."""
    _watch_start_interrupts()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except Exception:
        # A Ctrl-C inside a C extension's import (numpy's, under torch's) surfaces as what the half-run import
        # raises next ("ImportError: cannot load module more than once per process", a RecursionError).
        if not _start_interrupted:
            raise
        print(file=sys.stderr)
        return 130
    finally:
        _stop_watching_start_interrupts()


def _main(argv: list[str]) -> int:
    terminate_as_pid_1()
    _usable_standard_streams()
    show_solo_warnings_as_lines()
    if argv[:1] == ["train"]:
        from solo.train.cli import main as train_main

        return train_main(argv[1:])
    try:
        # Building the parser of some commands imports torch (a second or more): Ctrl-C there is a quiet exit.
        parser = build_parser(argv)
        parser._solo_argv = argv  # type: ignore[attr-defined]  # (for the hints of its errors)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except MemoryError as exc:  # (importing torch past `ulimit -v`)
        return _out_of_memory(exc)
    try:
        _apply_threads(args)
        _check_temp_folder(args)
        launched = None
        if hasattr(args, "tp") and os.environ.get("WORLD_SIZE", "").strip() and os.environ.get("RANK", "").strip():
            from solo.distributed.launch import torchrun_world

            launched = torchrun_world()
        if getattr(args, "tp", None) == 1 and launched is not None and launched[1] > 1:
            # (each process would run the whole command: a completion printed twice, a second server's port taken)
            raise SoloError(f"the launcher started {launched[1]} processes (WORLD_SIZE) but --tp is 1; pass --tp "
                            f"{launched[1]} to shard the model over them, or run solo without the launcher")
        if getattr(args, "tp", 1) != 1 and launched is not None and launched[0] != 0:
            # A torchrun job: ranks other than 0 load their shard and follow rank 0.
            from solo.distributed.launch import run_torchrun_follower

            return run_torchrun_follower(args.model, args.dtype, args.device, args.revision,
                                         getattr(args, "max_model_len", None))
        return args.handler(args)
    except EngineFailedError as exc:  # not the command line's fault: 1, as for a crash
        print(f"solo: error: {exc}", file=sys.stderr)
        return 1
    except SoloError as exc:
        print(f"solo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except MemoryError as exc:
        return _out_of_memory(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno not in _WRITE_ERRORS:
            raise
        print(f"solo: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 1


def _out_of_memory(exc: MemoryError) -> int:
    # A Python allocation past `ulimit -v` or a container's limit: the limit, not a bug, is what to name.
    print(f"solo: error: out of memory{f' ({exc})' if str(exc) else ''}; free memory, raise this process's memory "
          "limit (ulimit -v, the container's limit) or run a smaller model", file=sys.stderr)
    return 1


# Errors of writing the output (a full disk, a quota, a file too large, an I/O error): one line, not a traceback.
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def _usable_standard_streams() -> None:
    # A closed standard descriptor (`<&-`, `>&-`, `2>&-`) is taken by /dev/null first (as daemons do), else the next
    # file or socket opened lands there: the server's event loop polled on fd 0 and libuv aborted its exit (SIGABRT,
    # status 134) closing it. Python's own sys.stdin / stdout / stderr stay None, so the commands still see them
    # closed. (In order: the lowest free descriptor is the one opened.)
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    # stderr closed: print() would write the timings and errors into stdout; they are dropped instead. Text
    # the terminal's encoding cannot show (LC_ALL=C without UTF-8 mode, PYTHONIOENCODING=ascii) is replaced, not a
    # UnicodeEncodeError.
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")


if __name__ == "__main__":
    sys.exit(main())
