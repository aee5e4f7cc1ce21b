"""`solo chat`: commands never reach the model, /reset asks first, /save writes JSON, Ctrl-C stops one reply."""

from __future__ import annotations

import io
import json

import pytest

from solo import Engine, SamplingParams
from solo.chat import ChatSession


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.load(tiny_llama)


def _reader(lines):
    """A `read_line` that gives `lines`, then the end of input (EOFError)."""
    feed = iter(lines)

    def read(prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read


def _session(engine, lines, system=None):
    out, err = io.StringIO(), io.StringIO()
    session = ChatSession(engine, SamplingParams(max_tokens=3, ignore_eos=True), system, _reader(lines), out, err)
    return session, out, err


def test_commands_are_not_sent_to_the_model(engine, monkeypatch):
    sent = []
    original = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, p, s=None, **kw: sent.append(p) or original(self, p, s, **kw))
    session, _, err = _session(engine, ["/help", "/nope", "/system be brief", "/system", "hi"])
    assert session.loop() == 0
    text = err.getvalue()
    assert "/reset" in text and "/save FILE" in text  # /help
    assert "unknown command /nope" in text
    assert "system message: 'be brief'" in text
    assert len(sent) == 1 and sent[0] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert "[TTFT" in text and "tok/s" in text


def test_reset_asks_first(engine):
    session, _, err = _session(engine, ["hi", "/reset", "n", "/reset", "y"])
    session.loop()
    assert "Clear the conversation (2 messages)? [y/N]" not in err.getvalue()  # the question goes to the prompt
    assert "kept the conversation" in err.getvalue() and "conversation cleared" in err.getvalue()
    assert session.history == []


def test_save_writes_the_conversation(engine, tmp_path):
    path = tmp_path / "chat.json"
    session, out, err = _session(engine, ["hi", f"/save {path}"], system="sys")
    session.loop()
    data = json.loads(path.read_text())
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert data["messages"][2]["content"] == out.getvalue().strip("\n")
    assert f"saved 3 messages to {path}" in err.getvalue()
    session, _, err = _session(engine, [f"/save {tmp_path}/missing/x.json"])
    session.loop()
    assert "could not save" in err.getvalue()


def test_ctrl_c_stops_the_reply_not_the_session(engine, monkeypatch):
    original = Engine.generate
    calls = []

    def first_interrupted(self, prompt, params=None, **kwargs):
        calls.append(prompt)
        stream = original(self, prompt, params, **kwargs)
        if len(calls) > 1:
            yield from stream
            return
        yield next(stream)
        stream.close()
        raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "generate", first_interrupted)
    session, _, err = _session(engine, ["first", "second"])
    assert session.loop() == 0
    assert "[reply stopped]" in err.getvalue()
    assert err.getvalue().count("[TTFT") == 1  # the second reply ran to the end on the same engine
    assert [m["role"] for m in session.history] == ["user", "assistant", "user", "assistant"]


def test_ctrl_c_keeps_what_was_shown(engine):
    # The interrupt arriving while a piece is written: the saved reply is what the screen shows, not a piece less.
    import os
    import signal

    class Screen(io.StringIO):
        writes = 0

        def write(self, text):
            Screen.writes += 1
            if Screen.writes == 2:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C before the piece shows: it must not be lost
            return super().write(text)

    read = _reader(["hi"])
    out, err = Screen(), io.StringIO()
    session = ChatSession(engine, SamplingParams(max_tokens=8, ignore_eos=True, temperature=0), None, read, out, err)
    assert session.loop() == 0
    assert "[reply stopped]" in err.getvalue()
    assert Screen.writes >= 2
    assert session.history[-1]["content"] == out.getvalue().removesuffix("\n")


def test_ctrl_c_at_the_prompt_keeps_going(engine):
    calls = iter([KeyboardInterrupt, "hi"])

    def read(prompt):
        item = next(calls, None)
        if item is None:
            raise EOFError
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    session = ChatSession(engine, SamplingParams(max_tokens=2), None, read, io.StringIO(), io.StringIO())
    assert session.loop() == 0
    assert len(session.history) == 2


def test_help_and_version_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from solo.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_argparse_errors_are_one_line_with_a_hint(capsys):
    from solo.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "--tempreature=0.5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err == ("solo: error: unrecognized arguments: --tempreature=0.5 (did you mean --temperature?); "
                   "see 'solo run --help'\n")
    with pytest.raises(SystemExit):
        main(["runn"])
    assert "(did you mean run?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # (argparse asked for the command first, without a word on the flag)
        main(["--versoin"])
    assert "(--versoin is no option; did you mean --version?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # (and `solo chat -p` was told "did you mean --tp?")
        main(["chat", "-p", "hi"])
    assert "solo chat reads each message at its prompt" in capsys.readouterr().err
    # Other engines' flags and an Ollama-style positional prompt say what Solo calls them.
    for argv, hint in ((["run", "-n", "3"], "-n is llama.cpp's --n-predict: use --max-tokens"),
                       (["serve", "--ctx-size=64"], "--ctx-size is llama.cpp's: use --max-model-len"),
                       (["run", "org/model", "hello world"], "the prompt goes after -p / --prompt"),
                       # -hf is parsed as -h with an argument "f": named for what it is, not as --help's misuse.
                       (["run", "-hf", "org/m-GGUF:Q4_K_M"], "-hf is llama.cpp's: name the repository and file"),
                       (["run", "-p", "hi", "-r", "User:"], "-r is llama.cpp's: use --stop TEXT"),
                       (["serve", "--alias", "m"], "--alias is llama-server's: use --served-model-name"),
                       (["run", "-p", "hi", "--quantize", "Q4_K_M"], "--quantize int4")):
        with pytest.raises(SystemExit):
            main(argv)
        assert hint in capsys.readouterr().err, argv


def test_escaped_slash_and_an_empty_system_message_are_sent_as_given(engine, monkeypatch):
    sent = []
    original = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, p, s=None, **kw: sent.append(p) or original(self, p, s, **kw))
    session, _, _ = _session(engine, ["  //x"], system="")
    session.loop()
    # "//" escapes a leading "/" even after blanks; an empty system message is still a system turn.
    assert sent[0] == [{"role": "system", "content": ""}, {"role": "user", "content": "  /x"}]


def test_a_thinking_models_block_is_shown_apart_from_its_answer(tmp_path):
    """DeepSeek-R1's template shape (the prompt opens <think>): the block goes to stderr when stdout is not a
    terminal, dimmed on stdout when it is, and the conversation keeps it as the reply's reasoning_content."""
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "model", max_position_embeddings=512)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|A|>{{ m['content'].split('</think>')[-1] }}"
                "{% else %}<|U|>{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|A|><think>\n"
                "{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    thinker = Engine.load(folder)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for out in (io.StringIO(), Terminal()):
        err = io.StringIO()
        session = ChatSession(thinker, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0), None,
                              iter(["hi"]).__next__, out, err)
        session.turn("hi")
        reply = session.history[-1]["reasoning_content"]  # (kept as thinking for the next turn's template)
        assert reply and session.history[-1]["content"] == ""  # (a random model never closes the block)
        if isinstance(out, Terminal):
            assert out.getvalue().startswith("\x1b[2m") and reply.strip() in out.getvalue().replace(
                "\x1b[2m", "").replace("\x1b[0m", "")
        else:
            assert out.getvalue().strip() == "" and reply.strip() in err.getvalue()


def test_no_think_keeps_leaving_the_oldest_turns_out(tiny_llama, shared_hf):
    """--no-think's template variables are counted as the turn renders them, so a conversation that outgrows
    the context leaves its oldest turns out instead of failing every turn (Qwen3's real template)."""
    qwen3 = json.loads((shared_hf / "Qwen3-0.6B" / "tokenizer_config.json").read_text())["chat_template"]
    engine = Engine.load(tiny_llama, chat_template=qwen3)  # (a 256-token context)
    err = io.StringIO()
    session = ChatSession(engine, SamplingParams(max_tokens=8, ignore_eos=True), None, iter(()).__next__,
                          io.StringIO(), err, template_kwargs={"enable_thinking": False})
    for turn in range(8):
        session.turn(f"turn {turn}: " + "word " * 30)
        assert session.history[-1]["role"] == "assistant", err.getvalue()
    assert session.first > 0 and "left out" in err.getvalue() and "error" not in err.getvalue()


def test_a_max_tokens_that_leaves_no_room_for_a_message_is_refused_at_start(tiny_llama, capsys):
    from solo.cli import main

    # (main prints a SoloError as one line and returns 2, before reading a message)
    assert main(["chat", str(tiny_llama), "--max-model-len", "32", "--max-tokens", "100"]) == 2
    err = capsys.readouterr().err
    assert "solo: error: --max-tokens 100 leaves no room for a message: the shortest one's prompt is " in err
    assert "lower --max-tokens to at most" in err
    # Without --max-tokens, a --system that fills the context alone is refused at start too (every message was
    # refused after it, "hi" included).
    assert main(["chat", str(tiny_llama), "--max-model-len", "32", "--system", "word " * 40]) == 2
    assert "the shortest message's prompt (the system prompt and the template) is" in capsys.readouterr().err


def test_without_max_tokens_older_turns_make_room_for_a_whole_reply(tiny_llama):
    # From a break test: without --max-tokens the turns were kept while the prompt fit with one token to spare,
    # and the reply was cut to the few tokens left (finish: length after 1-9 tokens).
    import dataclasses

    engine = Engine.load(tiny_llama)  # (a 256-token context)
    engine.defaults = dataclasses.replace(engine.defaults, max_new_tokens=32)
    err = io.StringIO()
    session = ChatSession(engine, SamplingParams(ignore_eos=True), None, iter(()).__next__, io.StringIO(), err)
    session.turn("word " * 10)
    assert "+ 32 generated" in err.getvalue() and session.first == 0
    session.turn("word " * 28)  # beside the first turn 235 of 256 tokens, fewer than 32 left: that turn leaves
    assert session.first == 2 and "left out" in err.getvalue() and "error" not in err.getvalue()
    assert err.getvalue().count("+ 32 generated") == 2


def test_a_system_message_that_leaves_no_room_is_refused_when_set(engine):
    # From a break test: /system accepted it, then every message was refused as too long, naming the message.
    long = "word " * 400
    session, _, err = _session(engine, [f"/system {long}", "hi"])
    session.loop()
    text = err.getvalue()
    assert "that system message is" in text and "shorten it" in text and session.system is None
    assert "[TTFT" in text  # "hi" still runs


def test_piped_prompts_go_to_stderr(tiny_llama, monkeypatch, capsys):
    # From a break test: piped, the ">>> " prompts and /reset's question were written among the replies on stdout.
    from solo.chat import _line_reader

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nthere\r\n"))
    read = _line_reader()
    assert read(">>> ") == "hi"
    assert read(">>> ") == "there"  # (a CRLF line's \r stayed in the message)
    out, err = capsys.readouterr()
    assert out == "" and err == ">>> >>> "


def test_a_history_file_that_cannot_be_written_is_kept_in_memory(tmp_path, monkeypatch, capsys):
    # From a break test: a history path that is a folder (or a file in a read-only home) made prompt_toolkit
    # print a traceback at every line.
    pytest.importorskip("prompt_toolkit")
    from prompt_toolkit.history import InMemoryHistory

    import solo.chat as chat

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "solo" / "chat_history").mkdir(parents=True)  # a folder where the file should be
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    made = {}

    class Session:
        def __init__(self, history):
            made["history"] = history

    monkeypatch.setattr("prompt_toolkit.PromptSession", Session)
    chat._line_reader()
    assert isinstance(made["history"], InMemoryHistory)
    assert "line history is kept for this session only" in capsys.readouterr().err


def test_a_sampled_reply_names_its_seed(engine):
    # As `solo run` does, so a reply worth keeping can be repeated; a greedy one has no seed to name.
    err = io.StringIO()
    session = ChatSession(engine, SamplingParams(max_tokens=3, temperature=1.0), None, iter(()).__next__,
                          io.StringIO(), err)
    session.turn("hi")
    seed = int(err.getvalue().rsplit("seed: ", 1)[1].split("]")[0])
    again = ChatSession(engine, SamplingParams(max_tokens=3, temperature=1.0, seed=seed), None, iter(()).__next__,
                        io.StringIO(), io.StringIO())
    again.turn("hi")
    assert again.history[-1] == session.history[-1]
    greedy, _, greedy_err = _session(engine, ["hi"])
    greedy.loop()
    assert "seed:" not in greedy_err.getvalue()


@pytest.mark.parametrize("env, dimmed", [({}, True), ({"NO_COLOR": "1"}, False), ({"TERM": "dumb"}, False)])
def test_reasoning_is_dimmed_only_where_the_terminal_shows_colour(monkeypatch, env, dimmed):
    # From a break-test: NO_COLOR (no-color.org) and TERM=dumb were ignored.
    import io

    from solo.chat import ReplyWriter

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out, err = Terminal(), io.StringIO()
    writer = ReplyWriter(out, err, in_reasoning=True)
    writer.write("thinking</think>answer")
    writer.finish()
    assert ("\x1b[2m" in out.getvalue()) is dimmed and "thinking" in out.getvalue() and "answer" in out.getvalue()
    assert err.getvalue() == ""


def test_a_second_ctrl_c_while_the_reply_stops_keeps_the_session(engine):
    # From a break test: two Ctrl-C in a row, the second landing while the first was handled (the newline after the
    # stopped reply), ended the whole chat with exit 130 and lost the conversation.
    import os
    import signal

    class Screen(io.StringIO):
        def write(self, text):
            if text == "\n" and not getattr(self, "again", False):
                self.again = True
                os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, during the first one's handling
            return super().write(text)

    original = Engine.generate

    def interrupted(self, prompt, params=None, **kwargs):
        stream = original(self, prompt, params, **kwargs)
        yield next(stream)
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, mid-reply
        yield from stream

    read = _reader(["second"])
    out, err = Screen(), io.StringIO()
    session = ChatSession(engine, SamplingParams(max_tokens=8, ignore_eos=True), None, read, out, err)
    generate = Engine.generate
    Engine.generate = interrupted
    handler = signal.getsignal(signal.SIGINT)  # (SIG_IGN where the suite runs as a background job)
    try:
        session.turn("first")
    finally:
        Engine.generate = generate
    assert "[reply stopped]" in err.getvalue() and out.again
    assert signal.getsignal(signal.SIGINT) == handler  # the turn's handler is gone
    assert session.loop() == 0 and err.getvalue().count("[TTFT") == 1
    assert [m["role"] for m in session.history] == ["user", "assistant", "user", "assistant"]


def test_ctrl_c_before_the_reply_begins_drops_the_message(engine, monkeypatch):
    # From a break test: Ctrl-C just after Enter, while the prompt was measured against the context (before the
    # handling of a reply's Ctrl-C), ended the whole chat.
    import os
    import signal

    measured = []

    def prompt_tokens(self):
        measured.append(1)
        if len(measured) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return 10

    monkeypatch.setattr(ChatSession, "_prompt_tokens", prompt_tokens)
    session, _, err = _session(engine, ["oops, not this", "hi"])
    assert session.loop() == 0
    assert "[message not sent]" in err.getvalue() and err.getvalue().count("[TTFT") == 1
    assert [m["content"] for m in session.history if m["role"] == "user"] == ["hi"]


def test_a_system_message_that_leaves_no_room_for_max_tokens_is_refused_when_set(engine):
    # From a break test: /system took a message that --system refuses, and then every message was refused.
    session, _, err = _session(engine, ["/system " + "word " * 20, "hi"])
    session.params = SamplingParams(max_tokens=200, ignore_eos=True)  # the tiny model's context: 256 tokens
    session.loop()
    text = err.getvalue()
    assert "fewer than the 200 of --max-tokens each reply needs; shorten it" in text and session.system is None
    assert "[TTFT" in text


def test_a_logit_bias_outside_the_vocabulary_is_refused_at_start(tiny_llama, capsys):
    # From a break test: the chat started, then refused every message, and exited 0.
    from solo.cli import main

    assert main(["chat", str(tiny_llama), "--logit-bias", "999999+5"]) == 2
    assert "logit_bias holds token id 999999, outside this model's vocabulary" in capsys.readouterr().err


def test_a_refused_piped_line_prompts_again(monkeypatch, capsys):
    from solo.chat import _line_reader

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe\nhi\n"), encoding="utf-8"))
    read = _line_reader()
    assert read(">>> ") == "hi"
    assert capsys.readouterr().err == ">>> (that line is not valid UTF-8 text and was not sent; send UTF-8)\n>>> "


def test_ctrl_c_that_a_library_swallows_during_start_up_still_quits(tiny_llama, monkeypatch, capsys):
    # torch imports numpy from C and clears whatever that import raises: a Ctrl-C landing there was lost and
    # `solo chat` went on to wait at its prompt. Here a load that swallows its own KeyboardInterrupt stands in.
    import os
    import signal

    from solo.cli import main

    real_load = Engine.load

    def load_swallowing_ctrl_c(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # (Python runs its handler right after this call)
        except KeyboardInterrupt:
            pass  # (what torch does with an error in numpy's import)
        return real_load(*args, **kwargs)

    def no_prompt(prompt):
        raise AssertionError("solo chat reached its prompt after Ctrl-C")

    monkeypatch.setattr(Engine, "load", staticmethod(load_swallowing_ctrl_c))
    monkeypatch.setattr("solo.chat._line_reader", lambda: no_prompt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's SIGINT is ignored)
    try:
        assert main(["chat", str(tiny_llama)]) == 130
        # Python's own handler is back once the command ends.
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


_NO_SYSTEM = "{% for m in messages %}{% if m.role != 'system' %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}<a>"
_REFUSES_SYSTEM = ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                   + _NO_SYSTEM)


@pytest.mark.parametrize(("template", "words"), [
    (_NO_SYSTEM, "this model's chat template leaves system messages out"),
    (_REFUSES_SYSTEM, "this model's chat template refuses a system message (the chat template rejected"),
])
def test_a_system_message_the_template_leaves_out_or_refuses_is_refused(tiny_llama, capsys, template, words):
    # From a new user's trial: --system (and /system, which answered "system message set") on a template without
    # a system branch changed nothing, without a word; /system on one that refuses it was accepted, then every
    # message failed.
    from solo.cli import main

    flags = ["--chat-template", template, "--system", "be a pirate", "--max-tokens", "2"]
    assert main(["run", str(tiny_llama), "--chat", "--prompt", "hi", *flags]) == 2
    assert words in capsys.readouterr().err
    assert main(["chat", str(tiny_llama), *flags]) == 2
    assert words in capsys.readouterr().err
    session, _, err = _session(Engine.load(tiny_llama, chat_template=template), ["/system be a pirate", "hi"])
    session.loop()
    assert words in err.getvalue() and "system message set" not in err.getvalue() and session.system is None
    assert "[TTFT" in err.getvalue()  # "hi" still runs


def test_a_system_message_on_a_template_that_takes_no_messages_gets_that_error(tiny_llama):
    # A break test: every failure to render was called a refusal of the system message (here: no template).
    from solo.chat_template import system_prompt_ids
    from solo.errors import SoloError

    engine = Engine.load(tiny_llama)
    engine.tokenizer.chat_template = None
    with pytest.raises(SoloError, match="has no chat template") as info:
        system_prompt_ids(engine, "be brief", None)
    assert "refuses a system message" not in str(info.value)
    # An empty system message loses nothing where the template leaves them out.
    assert system_prompt_ids(Engine.load(tiny_llama, chat_template=_NO_SYSTEM), "", None)
