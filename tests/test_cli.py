"""The `solo` command line: streaming output, the stats line, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from checkpoints import make_checkpoint, write_tokenizer

from solo import Engine, SamplingParams
from solo.cli import main
from solo.errors import SoloError


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # (argparse's own errors: a flag's value of the wrong type)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_run_streams_text_and_ends_with_stats(capsys, tiny_llama):
    code, out, err = _run(capsys, "run", str(tiny_llama), "--prompt", "def f(x):", "--max-tokens", "12",
                          "--ignore-eos")
    assert code == 0
    expected = Engine.load(tiny_llama).complete("def f(x):", SamplingParams(max_tokens=12, ignore_eos=True))
    assert out == expected.text + "\n"
    assert "TTFT" in err and "tok/s" in err and "12 generated tokens" in err


def test_a_sampled_run_names_its_seed_and_the_seed_repeats_it(capsys, tiny_llama):
    args = ("run", str(tiny_llama), "--prompt", "def f(x):", "--max-tokens", "8", "--ignore-eos", "--temperature", "1")
    code, out, err = _run(capsys, *args)  # no --seed: one is drawn and named, as llama.cpp does
    seed = re.search(r"\| seed: (\d+)\]", err)
    assert code == 0 and seed
    for given in (seed[1], seed[1]):
        code, again, err = _run(capsys, *args, "--seed", given)
        assert code == 0 and again == out and f"| seed: {given}]" in err
    code, _, err = _run(capsys, *args[:-2], "--temperature", "0")  # greedy: no seed is used, none is named
    assert code == 0 and "seed" not in err


def test_run_takes_logit_bias_and_min_tokens_as_llama_cpp_writes_them(capsys, tiny_llama):
    code, out, _ = _run(capsys, "run", str(tiny_llama), "--prompt", "def f(x):", "--max-tokens", "3", "--ignore-eos",
                        "--temperature", "0", "--logit-bias", "7+100", "--min-tokens", "2")
    engine = Engine.load(tiny_llama)
    assert code == 0 and out == engine.tokenizer.decode([7, 7, 7]) + "\n"
    # --min-tokens past the context's room named a max_tokens the user never set ("must be <= max_tokens (253)")
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--min-tokens", "300")
    assert code == 2 and "min_tokens (300) exceeds the" in err and "lower min_tokens" in err and "<=" not in err
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--logit-bias", "7")
    assert code == 2 and "--logit-bias takes TOKEN_ID+BIAS" in err and err.count("\n") == 1
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--logit-bias", "5+200")
    assert code == 2 and "--logit-bias 5+200: the bias must be within [-100, 100]" in err and "bans" in err
    # llama.cpp reads escapes in --stop ('\n'); Solo takes text as written, and says so (a trial's stop never hit).
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--max-tokens", "1", "--stop", "\\n")
    assert code == 0 and "solo: warning: --stop '\\n' holds a backslash escape" in err and "$'\\n'" in err
    from solo.cli import _logit_bias  # llama.cpp's ban (a trial found it refused): -100, as OpenAI's ban

    assert _logit_bias(["5-inf", "6+inf", "7=-inf"]) == {5: -100.0, 6: 100.0, 7: -100.0}
    with pytest.raises(SoloError, match=r"5\+1e500: the bias must be within"):  # (it overflowed to inf: 100)
        _logit_bias(["5+1e500"])
    # A flag given twice is refused, not reduced to its last value.
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--logit-bias", "7-100", "--logit-bias",
                        "7+0")
    assert code == 2 and "token 7 twice" in err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own exit, as for any bad flag
        main(["run", str(tiny_llama), "-p", "hi", "-p", "there"])
    assert exit_info.value.code == 2 and "-p was given twice" in capsys.readouterr().err


def test_run_reads_prompt_from_stdin(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(tiny_llama), "--max-tokens", "3"],
                          input="def f(x):", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("bash") is None, reason="bash, /dev/full")
@pytest.mark.parametrize("shell, code, out, err", [
    # (from a break-test: each was a traceback, or text in the wrong place)
    ("run -p hi >&-", 2, "", "solo: error: standard output is closed"),
    ("chat >&- <<< hi", 2, "", "solo: error: standard output is closed"),
    ("run <&-", 2, "", "solo: error: no prompt given"),
    ("chat <&-", 0, "", ">>> "),  # (closed stdin: the end of the conversation)
    ("run -p hi >/dev/full", 1, "", "solo: error: cannot write the output: No space left on device"),
    ("run -p hi 2>&-", 0, "\n", None),  # (the timings are dropped, not written into stdout)
    ("run -p - <<< 'def f(x):'", 0, "\n", "7 prompt"),  # (-p -: stdin, not the text "-")
    ("run -p \"x = '\" --logit-bias 130+100 --logit-bias 105+100 --ignore-eos", 0, "???\n", "TTFT"),
    ("chat < <(printf 'abc\\xff\\nhi\\n')", 0, None, "not valid UTF-8 text and was not sent"),
])
def test_closed_or_odd_standard_streams_give_one_line(tiny_llama, tmp_path, shell, code, out, err):
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": os.pathsep.join(sys.path)}
    solo = f"{sys.executable} -m solo.cli"
    first, rest = shell.split(" ", 1)
    command = f"{solo} {first} {tiny_llama} --max-tokens 3 {rest}"
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path, encoding="utf-8", errors="replace")
    assert proc.returncode == code and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    if out is not None:
        assert proc.stdout.endswith(out) and (out != "" or proc.stdout == ""), proc.stdout
    if err is not None:
        assert err in proc.stderr, proc.stderr
    else:
        assert proc.stderr == "" and "TTFT" not in proc.stdout


def test_chat_keeps_history(tiny_llama, monkeypatch, capsys):
    seen = []
    original = Engine.generate

    def spy(self, prompt, params=None, **kwargs):
        seen.append(list(prompt))
        return original(self, prompt, params, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\nsecond turn\n"))
    code, out, err = _run(capsys, "chat", str(tiny_llama), "--max-tokens", "4", "--system", "be brief")
    assert code == 0
    assert [m["role"] for m in seen[0]] == ["system", "user"]
    assert [m["role"] for m in seen[1]] == ["system", "user", "assistant", "user"]
    assert seen[1][1]["content"] == "hello" and seen[1][3]["content"] == "second turn"


@pytest.fixture()
def no_template_model(tmp_path, tiny_llama):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_llama, folder)
    write_tokenizer(folder, chat_template=False)
    return folder


def test_chat_on_a_completion_model_says_so(capsys, no_template_model):
    code, _, err = _run(capsys, "chat", str(no_template_model))
    assert code == 2
    assert "completion model without a chat template" in err and "solo run" in err


@pytest.mark.parametrize(
    "case, extra, message",
    [
        ("missing folder", ["/definitely/not/here"], "does not exist"),
        ("max tokens", ["--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        ("top_p", ["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        ("temperature", ["--temperature", "-1"], "temperature must be >= 0"),
        ("too long", ["--max-tokens", "5000"], "needs 5003 tokens (prompt 3 + max_tokens 5000) but the model's"),
        ("prefix cache off and sized", ["--no-prefix-cache", "--prefix-cache-gb", "1"],
         "--no-prefix-cache turns prefix caching off and --prefix-cache-gb sizes it; give one of them"),
        ("prefix cache inf", ["--prefix-cache-gb", "inf"], "must be a finite number, got 'inf'"),  # (a traceback)
    ],
)
def test_bad_input_is_one_clear_line(capsys, tiny_llama, case, extra, message):
    argv = ["run", *(extra if case == "missing folder" else [str(tiny_llama), *extra]), "--prompt", "hi"]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith("solo: error: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_prompt_longer_than_context_names_both_numbers(capsys, tiny_llama):
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "word " * 400)
    assert code == 2 and "needs at least 1602 tokens (prompt 1601 + 1 new token) but the model's context is 256" in err
    assert "shorten the prompt (the prompt alone exceeds it; at most 255 prompt tokens leave room for one new " \
        "token)" in err


@pytest.mark.parametrize("prompt_len, max_tokens, note", [
    (256, None, "the prompt alone fills it; at most 255 prompt tokens leave room for one new token"),
    (300, 56, "the prompt alone exceeds it; at most 200 prompt tokens leave room for max_tokens 56"),
    (300, 400, "the prompt alone exceeds it; and max_tokens 400 alone does not fit either: lower it below 256"),
])
def test_a_prompt_that_alone_fills_the_context_says_how_long_it_may_be(prompt_len, max_tokens, note):
    from solo.engine.engine import context_budget
    from solo.errors import ContextLengthError

    with pytest.raises(ContextLengthError, match=re.escape(f"shorten the prompt ({note})")):
        context_budget(prompt_len, max_tokens, 256, "the model's context")


def test_messages_to_a_model_without_template(capsys, no_template_model):
    code, _, err = _run(capsys, "run", str(no_template_model), "--chat", "--prompt", "hi")
    assert code == 2 and "no chat template" in err


def test_partial_folder_and_unknown_architecture(capsys, tmp_path, tiny_llama):
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(tiny_llama / "config.json", partial / "config.json")
    write_tokenizer(partial)
    code, _, err = _run(capsys, "run", str(partial), "--prompt", "hi")
    assert code == 2 and "no model.safetensors" in err
    ggufs = tmp_path / "ggufs"  # a folder of GGUF files only: the error names the file to give
    ggufs.mkdir()
    (ggufs / "m-Q8_0.gguf").write_bytes(b"GGUF")
    code, _, err = _run(capsys, "run", str(ggufs), "--prompt", "hi")
    assert code == 2 and f"solo run {ggufs / 'm-Q8_0.gguf'}" in err

    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama, odd)
    config = json.loads((odd / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (odd / "config.json").write_text(json.dumps(config))
    code, _, err = _run(capsys, "run", str(odd), "--prompt", "hi")
    assert code == 2 and "MambaForCausalLM" in err and "Qwen3ForCausalLM" in err


def test_missing_shard_via_cli(capsys, tmp_path):
    folder = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="100KB")
    sorted(folder.glob("model-*.safetensors"))[0].unlink()
    code, _, err = _run(capsys, "run", str(folder), "--prompt", "hi")
    assert code == 2 and "missing shard" in err


def test_unknown_dtype_via_cli(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(tiny_llama), "--dtype", "float8",
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown dtype 'float8'; choose one of auto" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_python_dash_m_solo_is_the_solo_command():
    import solo

    proc = subprocess.run([sys.executable, "-m", "solo", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"solo {solo.__version__}", proc.stderr


def test_help_explains_every_flag():
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=120)
    for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--repetition-penalty", "--presence-penalty",
                 "--frequency-penalty", "--seed", "--stop", "--max-tokens", "--device", "--dtype"):
        assert flag in proc.stdout


def test_dtype_aliases_match_the_python_api(capsys, tiny_llama):
    code, _, err = _run(capsys, "run", str(tiny_llama), "--dtype", "fp32", "--prompt", "hi", "--max-tokens", "2")
    assert code == 0, err


def test_corrupt_weights_empty_config_and_bad_generation_config(capsys, tmp_path, tiny_llama):
    cases = {
        "truncated": ("model.safetensors", None, "damaged or incomplete, re-download it"),
        "empty-config": ("config.json", "{}", "config.json names no architecture"),
        "bad-gen": ("generation_config.json", '{"temperature": -3, "top_p": 7}', "temperature must be >= 0, got -3"),
    }
    for name, (file, text, message) in cases.items():
        folder = tmp_path / name
        shutil.copytree(tiny_llama, folder)
        if text is None:
            with open(folder / file, "r+b") as f:
                f.truncate(1000)
        else:
            (folder / file).write_text(text)
        code, _, err = _run(capsys, "run", str(folder), "--prompt", "hi")
        assert code == 2 and message in err, (name, err)
        assert "Traceback" not in err and err.count("\n") == 1


def test_system_without_chat_and_bad_threads_are_refused(capsys, tiny_llama):
    code, _, err = _run(capsys, "run", str(tiny_llama), "--system", "be brief", "--prompt", "hi")
    assert code == 2 and "--system only applies to chat prompts; add --chat" in err
    code, _, err = _run(capsys, "run", str(tiny_llama), "--threads", "0", "--prompt", "hi")
    assert code == 2 and "--threads must be >= 1" in err


def test_an_empty_chat_prompt_is_refused(capsys, tiny_llama):
    code, _, err = _run(capsys, "run", str(tiny_llama), "--chat", "--prompt", "")
    assert code == 2 and "the prompt is empty" in err


def test_threads_flag_sets_the_thread_count(capsys, tiny_llama, monkeypatch):
    import torch

    monkeypatch.setattr("solo.cpus.cgroup_cpu_limit", lambda: None)  # (a CI runner in a container with a quota)
    before = torch.get_num_threads()
    try:
        code, _, err = _run(capsys, "run", str(tiny_llama), "--threads", "1", "--prompt", "hi", "--max-tokens", "2")
        assert code == 0, err
        assert torch.get_num_threads() == 1
        # More threads than CPUs would stall the decode step's barriers: capped, with a warning.
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        code, _, err = _run(capsys, "run", str(tiny_llama), "--threads", str(available + 7), "--prompt", "hi",
                            "--max-tokens", "2")
        assert code == 0 and f"--threads {available + 7} is more than the {available} CPUs" in err
        assert torch.get_num_threads() == available
    finally:
        torch.set_num_threads(before)


def test_threads_above_a_container_cpu_quota_are_named(capsys, tiny_llama, monkeypatch):
    # torch's default (one per physical core) does not see a cgroup CPU quota; the CPU runtime runs decode steps
    # within it (solo/cpus.py has the measurements) and says so when --threads asks for more.
    import torch

    monkeypatch.setattr("solo.cpus.affinity_cpus", lambda: 64)
    monkeypatch.setattr("solo.cpus.cgroup_cpu_limit", lambda: 1.0)
    before = torch.get_num_threads()
    try:
        code, _, err = _run(capsys, "run", str(tiny_llama), "--threads", "2", "--prompt", "hi", "--max-tokens", "2")
        assert code == 0 and "--threads 2 is more than this process's CPU quota of 1 CPU" in err
        assert "decode steps run on 1, prompts on 2" in err and torch.get_num_threads() == 2
        monkeypatch.setattr("solo.cpus.cgroup_cpu_limit", lambda: 2.5)
        code, _, err = _run(capsys, "run", str(tiny_llama), "--threads", "2", "--prompt", "hi", "--max-tokens", "2")
        assert code == 0 and "warning" not in err
    finally:
        torch.set_num_threads(before)


def test_chat_leaves_the_oldest_turns_out_when_the_history_fills_the_context(tiny_llama, monkeypatch, capsys,
                                                                              tmp_path):
    # The tiny model's context is 256 tokens: the second long turn fits with 100 more tokens only without the
    # first turn (as Ollama and llama.cpp's chat go on), which /save still keeps.
    turn = "word " * 15  # about 60 tokens
    saved = tmp_path / "chat.json"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(f"{turn}\n{turn}\n/save {saved}\n"))
    code, out, err = _run(capsys, "chat", str(tiny_llama), "--max-tokens", "100", "--ignore-eos")
    assert code == 0
    assert ("[the conversation outgrew the model's context, 256 tokens: its oldest 2 messages are left out from now "
            "on (/save keeps them; /reset starts anew)]") in err
    assert err.count("[TTFT") == 2
    assert len(json.loads(saved.read_text())["messages"]) == 4
    # A message that does not fit alone is refused, and the conversation stays as it was.
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(f"{turn}\nhi\n"))
    code, out, err = _run(capsys, "chat", str(tiny_llama), "--max-tokens", "30", "--max-model-len", "64",
                          "--ignore-eos")
    assert code == 0 and ("does not fit the context it was loaded with (context_length, --max-model-len), 64 "
                          "tokens. Shorten the message (or start the chat with a lower --max-tokens)") in err
    assert err.count("[TTFT") == 1  # "hi" + 30 tokens fits
    # A --max-tokens that leaves no room for any message is refused at start (test_chat.py).


def test_serve_refuses_a_missing_folder_before_listening(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "serve", str(tmp_path / "nope"), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert "Uvicorn" not in proc.stderr and "Started server" not in proc.stderr


@pytest.mark.parametrize("extra, message", [
    (["--device", "gpu"], "device 'gpu'"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--revision", "main"], "applies to Hub ids only"),
    (["--max-model-len", "99999999"], "must be an integer from 2 to"),
    # (an audit of the README found these listening first)
    (["--tp", "2", "--quantize", "int8"], "--tp runs the eager model on every rank; drop --quantize"),
    (["--tp", "2", "--backend", "cpu"], "--tp runs the eager model on every rank"),
    (["--tp", "2", "--speculative", "ngram"], "--speculative ngram needs a runtime with multi-token verify"),
    (["--backend", "megakernel"], "the megakernel backend runs on a CUDA GPU, and the device is cpu"),
    (["--backend", "cuda-graph"], "the cuda-graph backend runs on a CUDA GPU"),
])
def test_serve_refuses_what_would_fail_the_load_before_listening(capsys, monkeypatch, extra, message):
    # A trial saw each one print "Uvicorn running" first, then fail the load.
    import solo.server.runner as runner

    monkeypatch.setattr(runner, "serve", lambda *args, **kwargs: pytest.fail("the server started"))
    code, _, err = _run(capsys, "serve", "--port", "0", *extra)
    assert code == 2 and message in err, err


def test_serve_takes_prefix_cache_gb_auto_as_written(monkeypatch):
    # The README and --help give its default as auto, which the flag refused ("invalid float value: 'auto'").
    from solo.cli import build_parser

    assert build_parser().parse_args(["serve", "--prefix-cache-gb", "auto"]).prefix_cache_gb is None
    assert build_parser().parse_args(["serve", "--prefix-cache-gb", "0.5"]).prefix_cache_gb == 0.5


def test_serve_takes_the_api_key_from_the_environment(monkeypatch):
    # vLLM's VLLM_API_KEY: a key on the command line shows in the process list.
    from solo.cli import build_parser

    monkeypatch.setenv("SOLO_API_KEY", "sesame")
    assert build_parser().parse_args(["serve"]).api_key == "sesame"
    assert build_parser().parse_args(["serve", "--api-key", "other"]).api_key == "other"


def test_prompt_bytes_that_are_not_utf8_are_one_clear_line(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(tiny_llama), "--max-tokens", "2"],
                          input=b"abc\xff", capture_output=True, timeout=120)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert b"stdin is not valid UTF-8 text (invalid start byte at byte 3)" in proc.stderr


@pytest.mark.parametrize("extra, message", [
    (["--probe-gib", "0"], "--probe-gib must be > 0, got 0"),
    (["--gen-len", "0"], "--gen-len must be >= 2 (decode speed needs a second token), got 0"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--compare", ""], "--compare needs peer names"),
    (["--contexts", "64,128"], "add --sweep-context"),
    (["--json", "/definitely/not/here/x.json"], "does not exist; create it first"),
    (["--sweep-context", "--sweep-gen-len", "0"], "--sweep-gen-len must be >= 2"),
    (["--energy-s", "-1"], "--energy-s must be >= 0"),
    # From a break test: each was taken and ignored, or failed after the whole run.
    (["--speculative", "ngram"], "--speculative: used by --agent only; the decode benchmark"),
    (["--no-prefix-cache"], "--no-prefix-cache: used by --agent only"),
    (["--sweep-fill", "random"], "--sweep-fill sets the context sweep's runs; add --sweep-context"),
    (["--sweep-context", "--plot", "sweep.txt"], "--plot sweep.txt: matplotlib writes"),
    (["--sweep-context", "--plot", "sweep", "--repeats", "0"], "--repeats must be >= 1"),  # (no suffix: PNG)
    # From a trial: a folder as --json, or nan / inf, crashed after (or during) the whole run.
    (["--json", "."], "--json . is a folder; give a file name in it"),
    (["--structured", "--json", "/definitely/not/here/x.json"], "does not exist; create it first"),
    (["--pause-ms", "nan"], "argument --pause-ms: must be a finite number, got 'nan'"),
    (["--probe-gib", "inf"], "argument --probe-gib: must be a finite number, got 'inf'"),
    (["--load", "chat", "--duration", "inf"], "argument --duration: must be a finite number"),
])
def test_bench_refuses_bad_flag_values_before_running(capsys, extra, message):
    code, _, err = _run(capsys, "bench", "--shape", "SmolLM2-135M", *extra)
    assert code == 2 and message in err


def test_a_tokenizer_larger_than_the_model_vocabulary_is_named(capsys, tmp_path):
    # The bundled model's tokenizer (8194 ids) beside a model of 100: the error says the two do not match.
    import transformers

    from solo.model.default_model import default_model_path

    folder = tmp_path / "small-vocab"
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=100)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(default_model_path() / name, folder / name)
    code, _, err = _run(capsys, "run", str(folder), "--prompt", "def f(x):", "--max-tokens", "2")
    assert code == 2 and "the tokenizer does not belong to this model" in err, err


def test_solo_warnings_print_as_one_line(capsys, monkeypatch):
    import warnings

    import solo.cli as cli
    from solo.errors import SoloWarning

    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *rest: others.append((category, message)))
    cli.show_solo_warnings_as_lines()
    cli.show_solo_warnings_as_lines()  # idempotent: one wrapper
    warnings.showwarning(SoloWarning("the kernel cache folder /x is not writable"), SoloWarning, cli.__file__, 1)
    warnings.showwarning(UserWarning("from a library"), UserWarning, cli.__file__, 7)
    assert capsys.readouterr().err == "solo: warning: the kernel cache folder /x is not writable\n"
    assert [(c, str(m)) for c, m in others] == [(UserWarning, "from a library")]  # its own handler and form


def test_max_model_len_sets_the_context_and_a_longrope_models_factors(capsys, tmp_path):
    from checkpoints import make_longrope_checkpoint

    folder = make_longrope_checkpoint(tmp_path / "phi3-longrope")
    prompt = "The quick brown fox jumps over the lazy dog. " * 2  # > 32 tokens: past the original context
    code, _, err = _run(capsys, "run", str(folder), "--prompt", prompt, "--max-tokens", "2")
    assert code == 2 and ("but the model's original context (--max-model-len up to 128 extends it, with LongRoPE's "
                          "long factors) is 32") in err
    code, out, _ = _run(capsys, "run", str(folder), "--prompt", prompt, "--max-tokens", "2", "--max-model-len", "128")
    assert code == 0
    expected = Engine.load(folder, context_length=128).complete(prompt, SamplingParams(max_tokens=2, temperature=0))
    assert out.startswith(expected.text)
    code, _, err = _run(capsys, "run", str(folder), "--prompt", "hi", "--max-model-len", "129")
    assert code == 2 and "--max-model-len (context_length) must be an integer from 2 to 128, this model's longest " \
        "context; got 129" in err
    code, _, err = _run(capsys, "run", str(folder), "--prompt", prompt, "--max-model-len", "16")
    assert code == 2 and "but the context it was loaded with (context_length, --max-model-len) is 16" in err


def test_tp_refuses_what_its_runtime_cannot_honour(capsys, tiny_llama):
    # The tensor-parallel runtime has no multi-token verify nor KV snapshots, and its bench no peers: refused
    # before any rank starts, never dropped.
    for argv, words in ((["run", str(tiny_llama), "--tp", "2", "--speculative", "ngram", "-p", "x"], "--speculative"),
                        (["run", str(tiny_llama), "--tp", "2", "--prefix-cache-gb", "1", "-p", "x"],
                         "--prefix-cache-gb"),
                        (["bench", str(tiny_llama), "--tp", "2", "--quantize", "int8"], "--quantize: not used by --tp"),
                        (["bench", str(tiny_llama), "--tp", "2", "--backend", "cpu"], "--backend: not used by --tp")):
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv


def test_chat_template_and_tool_call_parser_flags(capsys, tmp_path, no_template_model):
    """vLLM's --chat-template (a file or the text) gives a completion model a template, or replaces a model's;
    --tool-call-parser (solo serve, which takes tools) picks the syntax parsed; bad values are one line each,
    before any weight is read (and before the server listens)."""
    from solo.server.state import ServerSettings

    template = tmp_path / "turns.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    code, out, _ = _run(capsys, "run", str(no_template_model), "--chat", "--chat-template", str(template),
                        "--prompt", "hi", "--max-tokens", "3", "--temperature", "0")
    engine = Engine.load(no_template_model, chat_template=str(template))
    assert code == 0 and out == engine.complete([{"role": "user", "content": "hi"}],
                                                SamplingParams(max_tokens=3, temperature=0)).text + "\n"
    assert engine.tokenizer.render_chat([{"role": "user", "content": "hi"}]) == "<user>hi\n<assistant>"
    inline = Engine.load(no_template_model, chat_template=template.read_text(), tool_call_parser="qwen3_coder")
    assert inline.tokenizer.chat_template.tool_format == "qwen3_coder"
    assert Engine.load(None, tool_call_parser="qwen3_coder").tokenizer.chat_template.tool_format == "qwen3_coder"
    broken = tmp_path / "broken.jinja"
    broken.write_text("line one\n{{ messages[0].content }")
    empty = tmp_path / "empty.jinja"
    empty.write_text("\n")
    for extra, message in ((["--chat-template", "no-such-file.jinja"], "'no-such-file.jinja': no such file"),
                           (["--chat-template", "no-such-words"], "neither a file nor a Jinja template"),
                           (["--chat-template", str(empty)], "empty.jinja is empty"),
                           (["--chat-template", str(tmp_path)], "is a folder"),
                           (["--chat-template", ""], "--chat-template is empty"),  # (was "'' is a folder")
                           (["--chat-template", str(broken)], "broken.jinja does not compile"),
                           (["--chat-template", str(template)], "only applies to chat prompts; add --chat")):
        chat = [] if "only applies" in message else ["--chat"]
        code, _, err = _run(capsys, "run", str(no_template_model), "--prompt", "hi", *chat, *extra)
        assert code == 2 and message in err and "Traceback" not in err, (extra, err)
    assert "(line 2)" in str(pytest.raises(SoloError, Engine.load, no_template_model, chat_template=str(broken)).value)
    with pytest.raises(SoloError, match="needs a chat template"):
        Engine.load(no_template_model, tool_call_parser="hermes")
    with pytest.raises(SoloError, match="does not compile"):  # solo serve: before it listens
        ServerSettings(chat_template=str(broken)).validate()
    for argv, message in ((["serve", str(no_template_model), "--tool-call-parser", "pythonic"], "invalid choice"),
                          (["serve", "--enable-auto-tool-choice"], "parses tool calls whenever a request sends tools"),
                          (["run", "--tool-call-parser", "hermes", "-p", "hi"], "unrecognized arguments")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err, argv


def test_a_model_template_that_does_not_compile_can_be_replaced(capsys, tmp_path, no_template_model):
    # It failed the load: a plain prompt (which needs no template) and --chat-template (which replaces it) alike.
    config = json.loads((no_template_model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content "
    (no_template_model / "tokenizer_config.json").write_text(json.dumps(config))
    code, out, err = _run(capsys, "run", str(no_template_model), "--prompt", "hi", "--max-tokens", "2")
    assert code == 0 and "the model's chat template does not compile" in err, err
    code, _, err = _run(capsys, "run", str(no_template_model), "--prompt", "hi", "--chat", "--max-tokens", "2")
    assert code == 2 and "does not compile" in err and "--chat-template" in err and "Traceback" not in err, err
    code, _, err = _run(capsys, "run", str(no_template_model), "--prompt", "hi", "--chat", "--max-tokens", "2",
                        "--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert code == 0 and "does not compile" not in err, err  # (replaced: no warning about it)
    code, _, err = _run(capsys, "chat", str(no_template_model))
    assert code == 2 and "does not compile" in err and "cannot chat" in err, err
    with pytest.raises(SoloError, match="this model's does not compile"):
        Engine.load(no_template_model, tool_call_parser="hermes")


def test_no_think_and_chat_template_kwargs(capsys, tmp_path, shared_hf, no_template_model):
    """--no-think (solo run --chat, solo chat) and Engine's chat_template_kwargs reach the template as
    enable_thinking=false (Qwen3's real template writes an empty block); refused where the template has no
    such switch, on a plain prompt, or naming a variable Solo sets itself."""
    from solo.errors import InvalidRequestError

    qwen3 = json.loads((shared_hf / "Qwen3-0.6B" / "tokenizer_config.json").read_text())["chat_template"]
    template = tmp_path / "qwen3.jinja"
    template.write_text(qwen3)
    engine = Engine.load(no_template_model, chat_template=str(template))
    ask = [{"role": "user", "content": "hi"}]
    off = engine.make_request(ask, {"max_tokens": 2}, chat_template_kwargs={"enable_thinking": False})
    assert engine.tokenizer.decode(off.prompt_ids).endswith("<think>\n\n</think>\n\n")
    assert not engine.tokenizer.decode(engine.make_request(ask, {"max_tokens": 2}).prompt_ids).endswith("</think>\n\n")
    for prompt, kwargs, words in (("hi", {"enable_thinking": False}, "need chat messages"),
                                  (ask, {"messages": []}, "cannot set 'messages'")):
        with pytest.raises(InvalidRequestError, match=words):
            engine.make_request(prompt, chat_template_kwargs=kwargs)
    code, out, _ = _run(capsys, "run", str(no_template_model), "--chat", "--chat-template", str(template),
                        "--no-think", "--prompt", "hi", "--max-tokens", "3", "--temperature", "0")
    expected = engine.complete(ask, SamplingParams(max_tokens=3, temperature=0),
                               chat_template_kwargs={"enable_thinking": False})
    assert code == 0 and out == expected.text + "\n"
    # Refused where it cannot be honoured: a plain prompt, a thinking template without the switch; a model that does
    # not think is as asked already.
    thinks = "{% for m in messages %}{{ m['content'].split('</think>')[-1] }}{% endfor %}<think>\n"
    for extra, code_words in ((["--no-think"], (2, "only applies to chat prompts")),
                              (["--chat", "--no-think", "--chat-template", thinks], (2, "no enable_thinking switch")),
                              (["--chat", "--no-think", "--chat-template", "{{ messages[0]['content'] }}"], (0, ""))):
        code, _, err = _run(capsys, "run", str(no_template_model), "--prompt", "hi", "--max-tokens", "2", *extra)
        assert (code, code_words[1] in err) == (code_words[0], True), (extra, err)
    with pytest.raises(InvalidRequestError, match="never reads"):  # (the Python API: a variable no one reads)
        engine.make_request(ask, chat_template_kwargs={"bogus": 1})


def test_launcher_variables_that_are_not_numbers_are_one_line(capsys, tiny_llama, monkeypatch):
    # WORLD_SIZE=abc RANK=0 solo run --tp 2 was a ValueError traceback from int().
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "abc")
    for world, rank, local, words in (("abc", "0", None, "WORLD_SIZE='abc' is not a whole number"),
                                      ("2", "x", None, "RANK='x' is not a whole number from 0 to 1"),
                                      ("2", "2", None, "RANK='2' is not a whole number from 0 to 1"),
                                      ("2", "0", "-1", "LOCAL_RANK='-1' is not a whole number"),
                                      ("2", "0", None, "MASTER_ADDR or MASTER_PORT is not: start the ranks with "
                                                       "torchrun"),
                                      ("2", "0", "0", "MASTER_PORT='abc' is not a whole number from 1 to 65535")):
        if local == "0":
            monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("RANK", rank)
        if local is None:
            monkeypatch.delenv("LOCAL_RANK", raising=False)
        else:
            monkeypatch.setenv("LOCAL_RANK", local)
        code, _, err = _run(capsys, "run", str(tiny_llama), "--tp", "2", "--prompt", "x")
        assert code == 2 and words in err and err.count("\n") == 1, err
    monkeypatch.setenv("WORLD_SIZE", "abc")
    code, _, err = _run(capsys, "list")  # commands without --tp never read them
    assert code == 0, err


def test_text_arguments_are_utf8_under_an_ascii_locale(capsys, tiny_llama):
    # Under LC_ALL=C without UTF-8 mode Python decodes argv as ASCII with surrogate escapes: a UTF-8 --prompt was
    # refused as "not UTF-8" while the same text on stdin ran.
    from solo.cli import argv_text

    escaped = "s = '\udcc3\udcbc'"  # "s = 'ü'" as an ASCII locale gives it
    assert argv_text(escaped) == "s = '\u00fc'" and argv_text("plain") == "plain"
    assert argv_text("\udcff") == "\udcff"  # not UTF-8: left for the tokenizer's refusal
    code, out, err = _run(capsys, "run", str(tiny_llama), "--prompt", escaped, "--max-tokens", "2", "--stop",
                          "\udce2\udc80\udca6")
    assert code == 0, err
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "\udcff", "--max-tokens", "2")
    assert code == 2 and "not UTF-8" in err
    from solo.cli import build_parser

    args = build_parser(["serve"]).parse_args(["serve", "--served-model-name", "m\udcc3\udcb6del"])
    assert args.served_model_name == "m\u00f6del"  # (served as given: "mödel", not its escapes, a 500 on /v1/models)


def test_a_model_folder_with_a_non_ascii_name_loads_under_an_ascii_locale(tmp_path, tiny_llama):
    # The tokenizer took the path as a str Rust could not encode: "cannot read .../tokenizer.json; re-download it".
    folder = tmp_path / "m\u00f6del"
    folder.symlink_to(tiny_llama)
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(folder), "--prompt", "hi", "--max-tokens",
                           "2", "--threads", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_out_of_memory_while_loading_is_named_not_a_damaged_file(capsys, tiny_llama, monkeypatch):
    # Under `ulimit -v` safetensors' mmap failed with ENOMEM and Solo said "the file is damaged or incomplete,
    # re-download it"; a MemoryError elsewhere in the load was a traceback.
    from safetensors import SafetensorError

    import solo.model.weights as weights

    def no_map(*args, **kwargs):
        raise SafetensorError("Error while deserializing header: unable to mmap 31479992 bytes from file "
                              "model.safetensors: Cannot allocate memory (12)")

    monkeypatch.setattr(weights, "safe_open", no_map)
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "x", "--max-tokens", "1")
    assert code == 2 and "out of memory loading the model (" in err and "ulimit -v" in err, err
    assert "re-download" not in err and err.count("\n") == 1
    monkeypatch.undo()

    def no_room(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(weights, "_set_parameter", no_room)
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "x", "--max-tokens", "1")
    assert code == 2 and "out of memory loading the model" in err and "MemoryError" in err, err
    monkeypatch.undo()
    for where in ("_apply_threads", "build_parser"):  # anywhere else (importing torch): the last resort, one line
        monkeypatch.setattr(f"solo.cli.{where}", no_room)
        code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "x")
        assert code == 1 and err.startswith("solo: error: out of memory; free memory") and err.count("\n") == 1, err
        monkeypatch.undo()


@pytest.mark.skipif(shutil.which("bash") is None, reason="checks the quoting against bash")
def test_paths_shown_in_messages_stay_on_one_line_and_paste_into_a_shell():
    from solo.errors import shown_path

    assert shown_path("models/plain name.gguf") == "models/plain name.gguf"
    for raw in (b"two\nlines.gguf", b"g\xff\xfe/x.gguf", b"it's\ta\\b", "caf\u00e9\n".encode(), b"\x1b[31mred"):
        shown = shown_path(os.fsdecode(raw))
        assert "\n" not in shown and shown.isprintable()
        back = subprocess.run(["bash", "-c", f"printf %s {shown}"], capture_output=True, check=True).stdout
        assert back == raw


def test_sigterm_ends_solo_as_a_containers_first_process(monkeypatch):
    # From a break test: as PID 1 (`docker stop` sends it SIGTERM) the kernel drops a signal left at its default
    # action, so SIGTERM did nothing until `solo serve` installed its handler, 2 s into start-up.
    import signal

    from solo import cli

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        cli.terminate_as_pid_1()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # not PID 1: the default already ends it
        monkeypatch.setattr(cli.os, "getpid", lambda: 1)
        cli.terminate_as_pid_1()
        with pytest.raises(SystemExit) as exc:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert exc.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_sigterm_during_start_up_as_pid_1_stops_solo_serve(tmp_path):
    import signal
    import time

    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "solo", "serve",
                             "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 10
        while child is None and time.monotonic() < deadline:
            try:
                child = int(open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()[0])
            except (OSError, IndexError, ValueError):
                time.sleep(0.01)
        if child is None:
            pytest.skip("unshare --pid did not start a child here")
        time.sleep(0.3)  # in its imports: before `solo serve` installs its handlers
        os.kill(child, signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:  # (unshare's child, PID 1 of its namespace, outlives unshare: both are killed)
            if child is not None:
                os.kill(child, signal.SIGKILL)
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    if "unshare:" in err:
        pytest.skip(f"unshare refused here: {err.strip()}")
    assert "serving" not in err  # it stopped, rather than coming up


def test_no_writable_temporary_folder_is_one_line(capsys, tiny_llama, monkeypatch):
    # From a break test: on a read-only root file system `solo run` died in a 40-line traceback from torch's imports.
    import tempfile

    def none_usable():
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp']")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "hi", "--max-tokens", "2")
    assert code == 2 and err.count("\n") == 1 and "no writable temporary folder" in err and "set TMPDIR" in err


def test_ctrl_c_that_breaks_an_import_at_start_up_is_a_quiet_exit(monkeypatch, capsys):
    # SIGINT inside numpy's C module init (imported by torch while the parser is built) surfaced as "ImportError:
    # cannot load module more than once per process" with a 30-line traceback, not as KeyboardInterrupt.
    import os
    import signal

    import solo.cli as cli

    def broken_import(argv):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # (Python runs its handler right after this call)
        except KeyboardInterrupt:
            pass
        raise ImportError("cannot load module more than once per process")

    def broken_without_ctrl_c(argv):
        raise ImportError("broken")

    monkeypatch.setattr(cli, "build_parser", broken_import)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's SIGINT is ignored)
    try:
        assert cli.main(["run", "--prompt", "x"]) == 130
        assert "Traceback" not in capsys.readouterr().err
        # Without a Ctrl-C the same error is not hidden.
        monkeypatch.setattr(cli, "build_parser", broken_without_ctrl_c)
        with pytest.raises(ImportError, match="broken"):
            cli.main(["run", "--prompt", "x"])
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_the_cli_module_imports_is_a_quiet_exit(monkeypatch, capsys):
    # The `solo` script's entry imports solo.cli first: a Ctrl-C there (its first ~0.1 s) was a traceback.
    import builtins
    import signal
    import sys

    from solo.__main__ import run

    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name == "solo.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "solo.cli")
    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # (restored after the test)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run() == 130  # where SIGINT is ignored (a background job): the status
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(KeyboardInterrupt):  # else Python ends the process by SIGINT, without a traceback
            run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err == "\n\n"


def test_an_interrupted_solo_dies_by_sigint_so_a_shell_loop_stops_too():
    # It exited 130 after a Ctrl-C: the shell's $? was right, but bash went on with the next command of a loop or
    # script, since it stops only when the command itself died by SIGINT.
    import signal
    import subprocess
    import sys

    script = "import solo.cli; solo.cli.main = lambda: 130; from solo.__main__ import run; raise SystemExit(run())"
    for entry in (["-c", script], ["-m", "solo", "--version"]):
        result = subprocess.run([sys.executable, *entry], capture_output=True, text=True, timeout=120,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        if entry[0] == "-c":
            assert result.returncode == -signal.SIGINT and result.stderr == "", result.stderr
        else:  # an ordinary command keeps its status
            assert result.returncode == 0 and "solo" in result.stdout
