"""`solo chat`: an interactive conversation in the terminal.

Line editing and history come from `prompt_toolkit` when stdin is a terminal (plain line reads otherwise,
so the loop can be driven by a pipe or a test). Ctrl-C during a reply stops that reply only; at the prompt it
clears the line; Ctrl-D or /exit quits. Commands start with '/': see `COMMANDS`. A thinking model's
`<think>` block (the server's reasoning_content, `solo.engine.reasoning`) is shown apart from its answer:
dimmed on a terminal, on stderr when stdout is not one (so a pipe gets the answers only); the conversation
keeps the block as the reply's reasoning_content, for the next turn's template to handle as it does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from solo.errors import SoloError

COMMANDS = {
    "/help": "show this list",
    "/reset": "clear the conversation (asks first)",
    "/system [TEXT]": "show the system message, or set it to TEXT (/system - removes it)",
    "/save FILE": "write the conversation to FILE as JSON (OpenAI messages)",
    "/exit": "quit (also /quit or Ctrl-D)",
}
_HELP = "\n".join(f"  {name:<16} {what}" for name, what in COMMANDS.items()) + (
    "\n  Ctrl-C stops the reply being written; Up/Down recall earlier lines."
)


def history_file() -> Path:
    """Where the prompt's line history is kept: $XDG_STATE_HOME/solo/chat_history (~/.local/state by default)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "solo" / "chat_history"


def _line_reader() -> Callable[[str], str]:
    """A function that shows a prompt and returns one line; raises EOFError at the end, KeyboardInterrupt on ^C."""
    if sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty():
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        try:
            path = history_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and not (path.is_file() and os.access(path, os.R_OK | os.W_OK)) or (
                    not path.exists() and not os.access(path.parent, os.W_OK)):
                # (prompt_toolkit printed a traceback at every line it could not append)
                raise OSError(f"{path} cannot be read and written")
            history = FileHistory(str(path))
        except OSError as exc:  # a read-only home: history for this session only
            print(f"(line history is kept for this session only: {exc})", file=sys.stderr)
            history = InMemoryHistory()
        session: Any = PromptSession(history=history)
        return lambda prompt: session.prompt(prompt)

    from solo.tokenizer import is_valid_unicode

    if sys.stdin is not None and hasattr(sys.stdin, "reconfigure"):
        # UTF-8 whatever the locale's encoding; a line that is not UTF-8 is refused below, not a traceback
        sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")

    def read(prompt: str) -> str:
        while True:
            sys.stderr.write(prompt)  # (stdout holds the replies only: a pipe gets the answers)
            sys.stderr.flush()
            line = sys.stdin.readline() if sys.stdin is not None else ""  # (stdin closed: the end of input)
            if not line:
                raise EOFError
            line = line.rstrip("\r\n")  # (a CRLF line's \r is no part of the message)
            if is_valid_unicode(line):
                return line
            sys.stderr.write("(that line is not valid UTF-8 text and was not sent; send UTF-8)\n")

    return read


class ChatSession:
    """One conversation: the system message, the turns, and the commands that edit them.

    Args:
        engine: a loaded `Engine` whose tokenizer has a chat template.
        params: the sampling parameters of every turn (`SamplingParams`).
        system: the system message, or None.
        read_line: shows a prompt and returns the user's line (see `_line_reader`).
        out, err: where replies and messages/stats go.
        template_kwargs: extra chat template variables of every turn ({"enable_thinking": False}: --no-think).
    """

    def __init__(self, engine: Any, params: Any, system: str | None, read_line: Callable[[str], str],  # noqa: ANN401
                 out: Any = None, err: Any = None, template_kwargs: dict | None = None) -> None:  # noqa: ANN401
        self.engine = engine
        self.params = params
        self.system = system
        self.history: list[dict[str, str]] = []
        self.first = 0  # history[first:] is what the model sees: older turns left out once they outgrow the context
        self.read_line = read_line
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.template_kwargs = template_kwargs

    def messages(self, whole: bool = False) -> list[dict[str, str]]:
        """The conversation as OpenAI-style messages, system message first.

        Args:
            whole: every message, also those left out of the context (for /save); else what the model sees.
        """
        shown = self.history if whole else self.history[self.first:]
        return ([{"role": "system", "content": self.system}] if self.system is not None else []) + shown

    def say(self, text: str) -> None:
        """A line to the user (stderr, so that stdout holds only the model's replies)."""
        print(text, file=self.err, flush=True)

    def loop(self) -> int:
        """Read lines until /exit or end of input; returns the exit status (0)."""
        self.say(f"Chatting with {self.engine.name}. /help lists the commands; Ctrl-C stops a reply; "
                 "/exit or Ctrl-D quits.")
        while True:
            try:
                line = self.read_line(">>> ")
            except EOFError:
                self.say("")
                return 0
            except KeyboardInterrupt:  # at the prompt: drop the line, as shells do
                self.say("(Ctrl-D or /exit quits)")
                continue
            text = line.strip()
            if not text:
                continue
            if text.startswith("/") and not text.startswith("//"):
                if self.command(text) == "exit":
                    return 0
                continue
            # "//x" sends "/x": the escape is the first non-blank character, whatever blanks lead the line
            size, first = len(self.history), self.first
            try:
                self.turn(line.replace("/", "", 1) if text.startswith("//") else line)
            except KeyboardInterrupt:  # (a Ctrl-C in the instant before or after a turn's own handling)
                if len(self.history) == size + 1:  # the message without its reply: not sent
                    self.history.pop()
                    self.first = first
                self.say("[reply stopped]")

    def command(self, text: str) -> str | None:
        """Run one /command; returns "exit" to end the loop."""
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        if name in ("/exit", "/quit", "/bye"):
            return "exit"
        if name in ("/help", "/?"):
            self.say(_HELP + "\n  Start a message with // to send a line that begins with /.")
        elif name == "/reset":
            self._reset()
        elif name == "/system":
            if not rest:
                self.say(f"system message: {self.system!r}" if self.system is not None else "no system message; "
                         "/system TEXT sets one")
            elif rest == "-":
                self.system = None
                self.say("system message removed")
            else:
                from solo.chat_template import system_prompt_ids

                try:
                    alone = len(system_prompt_ids(self.engine, rest, self.template_kwargs))
                except SoloError as exc:
                    self.say(f"solo: error: {exc}")
                    return None
                context = self.engine.config.context_length
                reply = self.params.max_tokens  # (--max-tokens: every reply needs that much room)
                if alone >= context:  # (every message after it was refused)
                    self.say(f"solo: error: that system message is {alone} tokens with a one-word message, which "
                             f"leaves no room in {self.engine.context_name}, {context} tokens; shorten it")
                elif reply is not None and alone + reply > context:
                    self.say(f"solo: error: that system message is {alone} tokens with a one-word message, which "
                             f"leaves {context - alone} tokens of {self.engine.context_name} ({context}), fewer "
                             f"than the {reply} of --max-tokens each reply needs; shorten it")
                else:
                    self.system = rest
                    self.say("system message set; it applies to the whole conversation")
        elif name == "/save":
            self._save(rest)
        else:
            self.say(f"unknown command {name}; /help lists the commands (start with // to send a line "
                     "beginning with /)")
        return None

    def _reset(self) -> None:
        if not self.history:
            self.say("the conversation is already empty")
            return
        try:
            answer = self.read_line(f"Clear the conversation ({len(self.history)} messages)? [y/N] ")
        except (EOFError, KeyboardInterrupt):
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            self.history.clear()
            self.first = 0
            self.say("conversation cleared")
        else:
            self.say("kept the conversation")

    def _save(self, name: str) -> None:
        if not name:
            self.say("/save needs a file name: /save FILE")
            return
        path = Path(name).expanduser()
        data = {"model": self.engine.name, "messages": self.messages(whole=True)}
        try:
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            self.say(f"could not save to {path}: {exc.strerror or exc}")
            return
        self.say(f"saved {len(data['messages'])} messages to {path}")

    def _prompt_tokens(self) -> int:
        # The conversation's prompt length as the model will see it (with the template variables of the turns).
        return len(self.engine.encode_prompt(self.messages(), self.template_kwargs))

    def turn(self, line: str) -> None:
        """Send one user message, stream the reply, then print the stats line."""
        from solo.cli import _default_max_tokens, _stats_line

        engine = self.engine
        self.history.append({"role": "user", "content": line})
        turn = self.params.copy(max_tokens=self.params.max_tokens)
        seed = None
        if not turn.resolve(engine.defaults).greedy:  # a sampled reply names its seed, as `solo run` does
            seed = turn.seed if turn.seed not in (None, -1) else random.randrange(2**32)
            turn = turn.copy(seed=seed)
        context = engine.config.context_length
        # Without --max-tokens the reply's default budget (at most half the context) is what the older turns make
        # room for (they were kept and the reply cut to the few tokens left); a message too long for it alone
        # takes whatever room there is.
        default = min(max(engine.defaults.max_new_tokens or 256, turn.min_tokens or 0), context // 2)
        first, need = self.first, turn.max_tokens or default
        stream: Iterator[Any] | None = None
        last = show = None
        # One Ctrl-C stops the reply, wherever the turn is; any more while it stops are let go (they used to
        # land in the handling below and end the session).
        with _ReplyInterrupts() as interrupts:
            try:
                try:
                    used = self._prompt_tokens()
                    # As Ollama and llama.cpp's chat keep going: the oldest turns leave the context, said once here.
                    while used + need > context and self.first < len(self.history) - 1:
                        self.first += 1
                        while self.first < len(self.history) - 1 and self.history[self.first]["role"] != "user":
                            self.first += 1  # the model's context starts at a user message
                        used = self._prompt_tokens()
                    if turn.max_tokens is None and used + need > context:
                        need = 1
                except SoloError as exc:
                    self.history.pop()
                    self.first = first
                    self.say(f"solo: error: {exc}")
                    return
                if used + need > context:
                    self.history.pop()
                    self.first = first
                    system = " with the system message" if self.system is not None else ""
                    self.say(f"solo: error: the prompt of this message is {used} tokens{system}; with {need} more "
                             f"it does not fit {engine.context_name}, {context} tokens. Shorten the message"
                             f"{' or the system message (/system)' if system else ''}"
                             f"{' (or start the chat with a lower --max-tokens)' if turn.max_tokens else ''}")
                    return
                messages = self.messages()
                _default_max_tokens(engine, messages, turn, self.template_kwargs)
                show = ReplyWriter.for_prompt(engine, messages, self.template_kwargs, self.out, self.err)
                if self.first > first:
                    self.say(f"[the conversation outgrew {engine.context_name}, {context} tokens: its oldest "
                             f"{self.first} messages are left out from now on (/save keeps them; /reset starts "
                             "anew)]")
                stream = engine.generate(messages, turn, chat_template_kwargs=self.template_kwargs)
                for event in stream:
                    if event.text:
                        with interrupts.held():  # shown and kept together: Ctrl-C lands between pieces
                            show.write(event.text)
                    last = event
                show.finish()
            except KeyboardInterrupt:
                interrupts.stopped = True
                if show is None:  # before the reply began: the message is not sent
                    self.history.pop()
                    self.first = first
                    self.say("[message not sent]")
                    return
                # Only this reply stops; what was shown stays in the conversation, as the user saw it.
                if show.thinking and not show.tty:
                    self.err.write("\n")  # (the block's line on stderr ends before the note)
                self.out.write("\n")
                self.say("[reply stopped]")
            except SoloError as exc:
                interrupts.stopped = True
                self.history.pop()
                self.say(f"solo: error: {exc}")
                return
            finally:
                interrupts.stopped = True
                if stream is not None:
                    stream.close()  # releases the engine for the next turn
            if last is not None and last.finish_reason is not None:
                self.out.write("\n")
                self.out.flush()
                self.say(_stats_line(last.stats, last.finish_reason, engine.backend_name, seed))
            self.history.append(show.message())


def opens_reasoning(engine: Any, messages: list[dict[str, str]], kwargs: dict | None) -> bool:  # noqa: ANN401
    """Whether the rendered chat prompt leaves the reply inside a `<think>` block (DeepSeek-R1's templates)."""
    from solo.engine.reasoning import prompt_opens_reasoning

    return prompt_opens_reasoning(engine.tokenizer.render_chat(messages, **(kwargs or {})))


class ReplyWriter:
    """Writes a reply as it streams: a thinking model's reasoning block apart from the answer.

    On a terminal the block is dimmed; when `out` is not one, the block goes to `err`, so `out` holds answers only.
    Without `split` (not a chat, or a model that does not think) the reply is written as it comes.
    """

    _DIM, _PLAIN = "\x1b[2m", "\x1b[0m"

    def __init__(self, out: Any, err: Any, in_reasoning: bool, split: bool = True) -> None:  # noqa: ANN401
        from solo.engine.reasoning import ReasoningParser

        self.parser = ReasoningParser(in_reasoning) if split else None
        self.out, self.err = out, err
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        # The dimmed block needs a terminal that shows colour (no-color.org's NO_COLOR; TERM=dumb shows none).
        self.dim = self.tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.thinking = False  # reasoning text is on the screen and its block not yet closed there
        self.answered = False  # some of the answer is on the screen
        self._pieces: list[str] = []  # the reply as it came (unsplit)

    @classmethod
    def for_prompt(cls, engine: Any, prompt: Any, kwargs: dict | None, out: Any, err: Any) -> ReplyWriter:  # noqa: ANN401
        """The writer of `prompt`'s reply: split where it is chat messages to a model that thinks."""
        from solo.engine.reasoning import detect_reasoning

        template = engine.tokenizer.chat_template
        chat = not isinstance(prompt, str) and bool(prompt) and isinstance(prompt[0], dict)
        split = chat and template is not None and detect_reasoning(template.source)
        return cls(out, err, split and opens_reasoning(engine, prompt, kwargs), split)

    def write(self, text: str) -> None:
        """One piece of the reply."""
        if self.parser is None:
            self._pieces.append(text)
            self.out.write(text)
            self.out.flush()
            return
        self._show(*self.parser.feed(text))

    def finish(self) -> None:
        """The end of the reply: what the parser held back (the caller ends the line)."""
        if self.parser is None:
            return
        self._show(*self.parser.finish())
        if self.thinking and not self.tty:
            self.err.write("\n")
        self.thinking = False

    def message(self) -> dict[str, str]:
        """The reply as a chat message: its answer as content, its block as reasoning_content.

        A reply cut inside its block is then thinking to the next turn's template, not an answer.
        """
        if self.parser is None:
            return {"role": "assistant", "content": "".join(self._pieces)}
        message = {"role": "assistant", "content": self.parser.content.lstrip("\n")}  # (as shown)
        if self.parser.reasoning:
            message["reasoning_content"] = self.parser.reasoning
        return message

    def _show(self, reasoning: str, content: str) -> None:
        if reasoning:
            if self.tty:
                self.out.write(self._DIM + reasoning + self._PLAIN if self.dim else reasoning)
                self.out.flush()
            else:
                self.err.write(reasoning)
                self.err.flush()
            self.thinking = True
        if not self.answered:
            content = content.lstrip("\n")  # (the blank lines after </think>)
        if content:
            self._end_thinking()
            self.answered = True
            self.out.write(content)
            self.out.flush()

    def _end_thinking(self) -> None:
        if self.thinking:
            (self.out if self.tty else self.err).write("\n\n" if self.tty else "\n")
            self.thinking = False


class _ReplyInterrupts:
    """Ctrl-C (SIGINT) during one reply: the first stops it, the others are let go.

    The first raises KeyboardInterrupt, at once or where a `held()` block ends; later ones do nothing once it
    was raised or `stopped` is set (the reply is stopping already). A handler, not a signal mask: a mask holds
    only this thread, and SIGINT then goes to another thread (torch's, the mask worker), whose delivery still
    interrupts the main thread. Off the main thread (no handlers) Ctrl-C is Python's as usual.
    """

    def __init__(self) -> None:
        self.stopped = False
        self._holding = self._pending = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _ReplyInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def _on_interrupt(self, signum: int, frame: Any) -> None:  # noqa: ANN401
        if self.stopped:
            return
        if self._holding:
            self._pending = True
            return
        self.stopped = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block a Ctrl-C does not cut: one that lands in it is raised when it ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._pending and not self.stopped:
            self.stopped = True
            raise KeyboardInterrupt


def cmd_chat(args: argparse.Namespace) -> int:
    """`solo chat`: load the model, then run the conversation loop."""
    from solo.cli import _load_engine, sampling_params_from_args, template_kwargs_from_args

    if sys.stdout is None:  # (`>&-`: Python leaves no stream to write the replies to)
        raise SoloError("standard output is closed; redirect it instead (>/dev/null discards the replies)")
    params = sampling_params_from_args(args)
    engine = _load_engine(args)
    if engine.tokenizer.chat_template is None and engine.tokenizer.chat_template_error is not None:
        raise SoloError(f"{engine.tokenizer.chat_template_error}, so {engine.name} cannot chat; give it a working "
                        "template with --chat-template")
    if engine.tokenizer.chat_template is None:
        raise SoloError(
            f"{engine.name} is a completion model without a chat template, so it cannot chat; use "
            "`solo run --prompt ...` with it, give `solo chat` a chat (instruct) model, or give this one a "
            "template with --chat-template"
        )
    session = ChatSession(engine, params, args.system, _line_reader(),
                          template_kwargs=template_kwargs_from_args(engine, args))
    if args.system is not None:
        from solo.chat_template import system_prompt_ids

        system_prompt_ids(engine, args.system, session.template_kwargs)
    # Checked once here, not refused at every message: the shortest message's prompt (the system prompt and the
    # template around a one-character message) must leave room for a reply, of --max-tokens where given.
    shortest = len(engine.encode_prompt([*session.messages(), {"role": "user", "content": "x"}],
                                        session.template_kwargs))
    context = engine.config.context_length
    # (--max-model-len helps only where the context was loaded below the model's longest)
    raise_it = f" (or raise --max-model-len, up to {engine.config.max_context_length})" \
        if engine.config.max_context_length > context else ""
    if shortest >= context:
        raise SoloError(f"the shortest message's prompt (the system prompt and the template) is {shortest} "
                        f"tokens, which fills {engine.context_name} of {context}; shorten the system prompt"
                        f"{raise_it}")
    if params.max_tokens is not None and shortest + params.max_tokens > context:
        raise SoloError(f"--max-tokens {params.max_tokens} leaves no room for a message: the shortest one's "
                        f"prompt is {shortest} tokens and {engine.context_name} is {context}; lower --max-tokens "
                        f"to at most {max(1, context - shortest)}{raise_it}")
    # Every other field as a request checks it (a --logit-bias id outside the vocabulary), once here: it used to
    # refuse each message instead.
    engine.make_request([*session.messages(), {"role": "user", "content": "x"}], params,
                        chat_template_kwargs=session.template_kwargs)
    return session.loop()
