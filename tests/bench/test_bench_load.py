"""`solo bench --load`: workload files, the arrival schedule, loopback only, and short runs against real servers."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from solo.bench.load.report import percentile, rss_drift
from solo.bench.load.runner import check_loopback, histogram_quantiles
from solo.bench.load.workload import WORKLOADS_DIR, load_workload, parse_rate, parse_workload, plan_phase
from solo.cli import main
from solo.errors import SoloError

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

TINY = """
name = "tiny"
description = "test"
seed = 3
rates = [6.0]
duration_s = 2
max_requests = 12

[slo]
ttft_s = 5.0
tpot_s = 1.0

[[classes]]
name = "chat"
endpoint = "chat"
prompt_tokens = [4, 24]
max_tokens = [4, 8]
stream = 0.7
greedy = 0.7
cancel = 0.3
cancel_after = [1, 2]
pool = 3

[[classes]]
name = "near-limit"
weight = 0.3
endpoint = "completions"
prompt_fraction = [0.85, 0.9]
max_tokens = [4]
stream = 0.5
greedy = 1.0
pool = 2
"""


@pytest.mark.parametrize("name", ["chat", "code", "soak"])
def test_shipped_workloads_parse(name):
    workload = load_workload(name)
    assert workload.classes and workload.rates
    assert (WORKLOADS_DIR / "README.md").is_file()


@pytest.mark.parametrize("raw, message", [
    ({"classes": [{"name": "a"}], "rats": [1]}, "'rats' is unknown"),
    ({"classes": []}, "at least one"),
    ({"classes": [{"endpoint": "embeddings"}]}, "endpoint"),
    ({"classes": [{"prompt_tokens": [10, 5]}]}, "prompt_tokens"),
    ({"classes": [{"prompt_fraction": [0.5, 1.0]}]}, "below 1"),
    ({"classes": [{"cancel": 2}]}, "cancel"),
    ({"classes": [{}], "rates": ["fast"]}, "rate"),
    ({"classes": [{}], "duration_s": 1e9}, "duration_s"),
    ({"classes": [{}], "bursts": [{"at_s": 1}]}, "bursts[0]"),
    # From a break test: each was a traceback, or taken.
    ({"classes": [{}], "slo": {"ttft_s": "fast"}}, "slo.ttft_s must be a number > 0; got 'fast'"),
    ({"classes": [{}], "slo": {"tpot_s": 0}}, "slo.tpot_s must be a number > 0"),
    ({"classes": [{"weight": "heavy"}]}, "classes[0].weight must be a number > 0"),
    ({"classes": [{"max_tokens": True}]}, "classes[0].max_tokens must be a list of token counts"),
    ({"classes": [{"prompt_tokens": [True, 8]}]}, "classes[0].prompt_tokens"),
    ({"classes": [{}], "rates": "2x"}, "rates must be a list of rates"),
    ({"classes": [{}], "bursts": {"at_s": 1}}, "bursts must be a list"),
    ({"classes": {"name": "a"}}, "at least one [[classes]]"),
    # From another: two classes of one name shared a prompt pool (an IndexError, or the other's prompts).
    ({"classes": [{"name": "a"}, {"name": "a", "pool": 2}]}, "classes[1].name 'a' names another class too"),
    ({"classes": [{"name": 5}]}, "classes[0].name must be a non-empty string; got 5"),
    ({"classes": [{}], "description": [1, 2]}, "description must be a string"),
    ({"classes": [{"prompt_tokens": [100, 5], "prompt_fraction": [0.5, 0.6]}]}, "not both"),
    # From a third: an infinite rate planned forever; a huge burst factor for half a minute (no signal answered);
    # settings with no effect were taken; unknown keys of [slo] and [[bursts]] were not named.
    ({"classes": [{}], "rates": [float("inf")]}, "rates: a rate is requests/s"),
    ({"classes": [{}], "bursts": [{"at_s": 1, "length_s": 0.001, "factor": 1e7}]},
     "bursts[0].factor must be in (0, 100]"),
    ({"classes": [{}], "bursts": [{"at_s": 1, "length_s": 1, "factor": 2, "size": 3}]},
     "bursts[0] key 'size' is unknown"),
    ({"classes": [{}], "bursts": [{"at_s": 1, "length_s": 1}]}, "bursts[0] lacks 'factor'"),
    ({"classes": [{}], "bursts": [{"at_s": -1, "length_s": 1, "factor": 2}]}, "bursts[0].at_s must be a number >= 0"),
    ({"classes": [{}], "slo": {"ttft": 1}}, "slo key 'ttft' is unknown"),
    ({"classes": [{"stream": 0.0, "cancel": 0.5}]}, "classes[0].cancel is a share of the streamed requests"),
    ({"classes": [{"cancel_after": [1, 4]}]}, "classes[0].cancel_after applies to cancelled streams"),
])
def test_bad_workloads_name_the_field(raw, message):
    with pytest.raises(SoloError, match="workload") as info:
        parse_workload(raw, "w.toml")
    assert message in str(info.value)


def test_plan_is_seeded_bounded_and_bursty():
    import tomllib

    workload = parse_workload(tomllib.loads(TINY))
    a = plan_phase(workload, 5.0, 100.0, 10_000, seed=1)
    b = plan_phase(workload, 5.0, 100.0, 10_000, seed=1)
    assert [(r.offset_s, r.prompt, r.max_tokens, r.cancel_after) for r in a] == \
        [(r.offset_s, r.prompt, r.max_tokens, r.cancel_after) for r in b]
    assert 400 < len(a) < 600 and all(r.offset_s < 100 for r in a)  # Poisson at 5/s for 100 s
    assert all(r.cancel_after is None or r.stream for r in a)
    assert len(plan_phase(workload, 5.0, 100.0, 7, seed=1)) == 7
    workload.bursts = parse_workload({**tomllib.loads(TINY), "bursts": [{"at_s": 10, "length_s": 10,
                                                                          "factor": 10}]}).bursts
    bursty = plan_phase(workload, 5.0, 100.0, 10_000, seed=1)
    inside = sum(10 <= r.offset_s < 20 for r in bursty)
    assert 400 < inside < 600  # 50/s for 10 s
    # A factor below 1 is a lull (it was read as no burst: max(1, factor)).
    workload.bursts = parse_workload({**tomllib.loads(TINY), "bursts": [{"at_s": 0, "length_s": 100,
                                                                          "factor": 0.1}]}).bursts
    assert 30 < len(plan_phase(workload, 5.0, 100.0, 10_000, seed=1)) < 70  # 0.5/s for 100 s
    # Uniform arrivals keep equal gaps in arrivals through a lull: one arrival in it does not push the next
    # past the lull's end (1 / rate(t): 10 arrivals, the last at 10 s).
    workload.process = "uniform"
    workload.bursts = parse_workload({**tomllib.loads(TINY), "bursts": [{"at_s": 10, "length_s": 5,
                                                                          "factor": 0.01}]}).bursts
    offsets = [r.offset_s for r in plan_phase(workload, 1.0, 60.0, 10_000, seed=0)]
    assert len(offsets) == 55 and offsets[9] == pytest.approx(10.0) and offsets[10] == pytest.approx(15.95)


def test_rates_and_loopback():
    assert parse_rate("1.5x") == "1.5x" and parse_rate("2") == 2.0 and parse_rate(3) == 3.0
    for bad in ("-1x", "", " ", float("inf"), float("nan"), "inf"):
        with pytest.raises(SoloError):
            parse_rate(bad)
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_loopback("http://[::1]:8000") == "http://[::1]:8000"
    for url in ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"):  # the OpenAI clients' base URL
        assert check_loopback(url) == "http://127.0.0.1:8000"
    for url in ("http://10.1.2.3:8000", "http://192.168.0.1", "ftp://127.0.0.1"):
        with pytest.raises(SoloError):
            check_loopback(url)


def test_report_numbers():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
    drift = rss_drift([(0.0, 100 << 20), (40.0, 200 << 20), (50.0, 202 << 20)], warmup_s=30)
    assert drift["after_warmup_mib"] == 200 and drift["drift_pct"] == 1.0
    # Server histograms: quantiles of the counts between two scrapes, as bucket upper bounds.
    before = {"queue": [(0.1, 5.0), (1.0, 5.0), (float("inf"), 5.0)]}
    after = {"queue": [(0.1, 95.0), (1.0, 104.0), (float("inf"), 105.0)]}
    q = histogram_quantiles(before, after)["queue"]
    assert q == {"p50": 0.1, "p90": 0.1, "p99": 1.0, "count": 100.0}


@pytest.fixture(scope="module")
def server(tiny_llama):
    from server_harness import start_server

    running = start_server(tiny_llama, max_batch=4, max_queue=16)
    yield running
    running.stop()


def test_load_run_against_a_running_server(server, tmp_path, capsys):
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY)
    out = tmp_path / "load.json"
    md = tmp_path / "load.md"
    plot = tmp_path / "load.png"
    status = main(["bench", "--load", str(workload), "--url", server.base_url, "--json", str(out),
                   "--markdown", str(md), "--plot", str(plot), "--verify", "20", "--request-timeout", "60"])
    assert status == 0
    result = json.loads(out.read_text())
    phase = result["phases"][0]
    assert 1 <= phase["sent"] <= 12 and phase["http_5xx"] == 0  # Poisson at 6/s for 2 s, at most 12
    assert phase["completed"] + phase["cancelled"] == phase["sent"], phase["errors"]
    assert phase["errors"] == {} and phase["arrivals_end_s"] is None  # the duration ended the arrivals
    assert result["meta"]["server_slots"] == 4  # read from the running server's /metrics
    assert phase["ttft_s"]["p50"] is not None and phase["goodput_rps"] > 0
    # Where TTFT goes: the server's own histograms over the phase, and every request's record.
    assert phase["server_latency_s"]["queue"]["count"] >= phase["completed"]
    assert len(phase["requests"]) == phase["sent"] and "Where TTFT goes" in md.read_text()
    check = result["output_check"]
    assert check["checked"] > 0 and check["wrong"] == 0
    pools = {c.name: c.pool for c in parse_workload(__import__("tomllib").loads(TINY), "tiny.toml").classes}
    for name, idle in result["idle"].items():  # every pool prompt's idle TTFT, cold and (cached) warm
        assert len(idle["prompts"]) == pools[name]
        assert all(p["new_ttft_s"] and p["warm_ttft_s"] for p in idle["prompts"])
        assert phase["p99_ttft_over_idle_same_prompt"][name] > 0
    assert "| 6 req/s |" in md.read_text() and plot.stat().st_size > 0
    assert str(tmp_path) not in md.read_text()  # the command is quoted without local paths


def test_max_requests_ending_a_phase_early_is_reported(server, tmp_path, capsys):
    # A bound on the requests that ends the arrivals before the phase's duration is said, not hidden, and
    # the arrival rate counts the window the arrivals had.
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY.replace("rates = [6.0]", "rates = [20.0]").replace("duration_s = 2", "duration_s = 5"))
    out, md = tmp_path / "load.json", tmp_path / "load.md"
    assert main(["bench", "--load", str(workload), "--url", server.base_url, "--max-requests", "3", "--json",
                 str(out), "--markdown", str(md), "--request-timeout", "60"]) == 0
    # (named as the flag that set it: it was "the workload's max_requests", which the user had not written)
    assert "--max-requests (3) ends its arrivals at" in capsys.readouterr().err
    phase = json.loads(out.read_text())["phases"][0]
    assert phase["sent"] == 3 and 0 < phase["arrivals_end_s"] < 5
    assert phase["arrivals_rps"] == pytest.approx(3 / phase["arrivals_end_s"], rel=1e-3)
    assert "--max-requests ended the arrivals at" in md.read_text()


@pytest.mark.slow
def test_load_run_starts_the_bundled_model_and_measures_capacity(tmp_path):
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY.replace("rates = [6.0]", 'rates = ["0.5x"]'))
    out = tmp_path / "load.json"
    status = main(["bench", "--load", str(workload), "--capacity-s", "2", "--max-batch", "2", "--json", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["meta"]["capacity_rps"] > 0 and result["meta"]["server_exit_status"] == 0
    assert result["phases"][0]["http_5xx"] == 0 and result["output_check"]["wrong"] == 0
    assert result["phases"][0]["rss"]  # the server's RSS was sampled


def test_a_keyed_server_and_its_error_messages(tiny_llama, tmp_path, capsys):
    # From a break test: --url could not reach a server with --api-key, and the report kept "400: 3" but not
    # the server's message, as did the capacity run's failure.
    from server_harness import start_server

    running = start_server(tiny_llama, max_batch=1, max_queue=0, api_key="sesame")
    try:
        workload = tmp_path / "busy.toml"
        workload.write_text(TINY.replace("rates = [6.0]", "rates = [30.0]").replace("max_tokens = [4, 8]",
                                                                                    "max_tokens = [64]"))
        out, md = tmp_path / "load.json", tmp_path / "load.md"
        assert main(["bench", "--load", str(workload), "--url", f"{running.base_url}/v1", "--verify", "0",
                     "--api-key", "sesame", "--json", str(out), "--markdown", str(md)]) == 0
        phase = json.loads(out.read_text())["phases"][0]
        assert phase["completed"] > 0 and phase["errors"]["503 queue_full"] > 0
        assert "at capacity" in phase["error_examples"]["503 queue_full"]
        assert "503 queue_full, the first message: the server is at capacity" in md.read_text()
        assert "sesame" not in md.read_text() and "sesame" not in out.read_text()
    finally:
        running.stop()
    assert main(["bench", "--load", "chat", "--api-key", "k"]) == 2
    assert "--api-key is the key of a server given with --url" in capsys.readouterr().err


def test_load_flag_errors(tmp_path, capsys):
    assert main(["bench", "--load", "no-such-workload"]) == 2
    assert "not a shipped workload" in capsys.readouterr().err
    assert main(["bench", "--load", "chat", "--url", "http://10.0.0.1:8000"]) == 2
    assert "loopback" in capsys.readouterr().err
    for flag, value in (("--capacity-s", "0"), ("--verify", "-1"), ("--request-timeout", "-2")):
        assert main(["bench", "--load", "chat", flag, value]) == 2
        assert capsys.readouterr().err.strip().endswith(f"{flag} must be {'>= 0' if flag == '--verify' else '> 0'}, "
                                                        f"got {float(value):g}")


def _bench_args(*argv: str):
    import argparse

    from solo.bench.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_server_flags_reach_the_server_it_starts():
    from solo.bench.load.cli import serve_arguments

    args = _bench_args("--load", "chat", "--threads", "1", "--revision", "v2", "--no-prefix-cache", "--tp", "2",
                       "--max-queue-wait", "0.1", "--dtype", "bfloat16")
    serve = serve_arguments(args)
    for flags in (["--threads", "1"], ["--revision", "v2"], ["--tp", "2"], ["--max-queue-wait", "0.1"],
                  ["--dtype", "bfloat16"], ["--no-prefix-cache"]):
        i = serve.index(flags[0])
        assert serve[i:i + len(flags)] == flags
    assert "--device" not in serve and "--prefix-cache-gb" not in serve  # defaults stay the server's own
    assert serve_arguments(_bench_args("--load", "chat", "--prefix-cache-gb", "0.5"))[-2:] == ["--prefix-cache-gb",
                                                                                                 "0.5"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt-len", "64"], "--prompt-len: flags of the decode benchmark"),
    (["--compare", "llama.cpp", "--cpu-hog", "1"], "--compare, --cpu-hog: flags of the decode benchmark"),
    (["--speculative", "off"], "use --serve-speculative"),
    (["--url", "http://127.0.0.1:9", "--threads", "1"], "--threads: flags of the `solo serve`"),
    (["--tokenizer", "somewhere"], "--tokenizer and --seed make a --shape"),
    (["--shape", "Qwen2.5-0.5B", "--url", "http://127.0.0.1:9"], "not several"),
    (["--agent", "edit-loop"], "--load and --agent run different benchmarks"),
    (["--revision", "main"], "drop --revision"),
])
def test_load_refuses_flags_it_would_ignore(argv, message, capsys):
    assert main(["bench", "--load", "chat", *argv]) == 2
    assert message in capsys.readouterr().err


TINY_SHAPES = {
    "TinyQwen": dict(architectures=["Qwen2ForCausalLM"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                     rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=512, torch_dtype="bfloat16"),
    "TinyOlmoe": dict(architectures=["OlmoeForCausalLM"], hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=50304, tie_word_embeddings=False,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=512, torch_dtype="bfloat16"),
}


@pytest.mark.parametrize("shape", sorted(TINY_SHAPES))
def test_shape_folder_holds_the_bench_weights(shape, tmp_path, monkeypatch):
    # The folder `--load --shape` serves: the bench's random weights of the shape (same seed), the vocabulary cut
    # to the lent tokenizer's, which Solo's loader reads back bit for bit.
    import torch

    from solo.bench import shapes
    from solo.bench.load.shape_folder import write_shape_folder
    from solo.model.config import ModelConfig
    from solo.model.default_model import default_model_path
    from solo.model.weights import load_weights
    from solo.tokenizer import Tokenizer

    monkeypatch.setitem(shapes.SHAPES, shape, TINY_SHAPES[shape])
    raw = write_shape_folder(shape, tmp_path, default_model_path(), seed=3)
    assert raw["vocab_size"] == Tokenizer.from_folder(default_model_path()).vocab_size
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == raw["vocab_size"]
    assert (tmp_path / "tokenizer.json").is_file()
    config = ModelConfig.from_dict(dict(raw))
    loaded = load_weights(tmp_path, config, torch.bfloat16, torch.device("cpu")).state_dict()
    expected = shapes.build_model(config, torch.bfloat16, seed=3).state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_shape_folder_refuses_a_lane_shape(tmp_path):
    from solo.bench.load.shape_folder import write_shape_folder
    from solo.model.default_model import default_model_path

    with pytest.raises(SoloError, match="lane shape"):
        write_shape_folder("Laneformer-2B", tmp_path, default_model_path())


@pytest.mark.slow
def test_load_run_on_a_shape(tmp_path, monkeypatch):
    from solo.bench import shapes

    monkeypatch.setitem(shapes.SHAPES, "TinyQwen", TINY_SHAPES["TinyQwen"])
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY)
    out = tmp_path / "load.json"
    # A temporary folder of its own: another run on the machine has its own shape folders and logs meanwhile.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made, folder = [], tempfile.TemporaryDirectory

    def recorded(*args, **kwargs):
        made.append(folder(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recorded)
    status = main(["bench", "--load", str(workload), "--shape", "TinyQwen", "--max-batch", "2", "--threads", "1",
                   "--verify", "4", "--json", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["meta"]["model"].startswith("TinyQwen shape, random weights")
    assert "--threads 1" in result["meta"]["server"] and "TinyQwen" in result["meta"]["command"]
    assert result["phases"][0]["http_5xx"] == 0 and result["output_check"]["wrong"] == 0
    shape_folders = [Path(d.name) for d in made if Path(d.name).name.startswith("solo-bench-shape-")]
    assert shape_folders and all(f.parent == scratch and not f.exists() for f in shape_folders)  # removed after
    assert not list(scratch.glob("solo-bench-load-*.log"))  # and its log


def test_arrivals_the_generator_could_not_send_are_not_server_errors():
    from solo.bench.load.report import markdown, summarize_phase
    from solo.bench.load.runner import Outcome, PhaseResult

    workload = parse_workload(__import__("tomllib").loads(TINY), "tiny.toml")
    failed = Outcome(cls="chat", offered_at=0.0)
    failed.error = "http 500"
    phase = summarize_phase(PhaseResult(6.0, "6 req/s", 2.0, [failed], 2.0, saturated=7), workload, {})
    assert phase["errors"] == {"http 500": 1, "client saturated": 7}
    meta = {"command": "solo bench --load tiny", "server": "solo serve", "machine": {}, "cpu_load_before": None}
    report = markdown({"meta": meta, "phases": [phase], "output_check": None,
                       "workload": {"name": "tiny", "description": "", "slo_ttft_s": 5.0, "slo_tpot_s": 1.0}})
    row = next(line for line in report.splitlines() if line.startswith("| 6 req/s |"))
    assert row.split("|")[7].strip() == "1"  # other errors: the 500 only
    assert "7 arrivals not sent" in report and "client saturated: 7" in report


@pytest.mark.parametrize("argv", [["--rates", "1x"], ["--url", "http://127.0.0.1:9", "--max-queue-wait", "0.5"],
                                  ["--markdown", "out.md"], ["--verify", "3"]])
def test_load_flags_without_load_are_refused(argv, capsys):
    assert main(["bench", "--gen-len", "4", *argv]) == 2
    assert "flags of the load test; add --load" in capsys.readouterr().err


def test_an_unreachable_server_is_a_clear_error(capsys):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--load", "chat", "--url", f"http://127.0.0.1:{port}"]) == 2
    assert "no answer from the server" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_stops_the_server_and_removes_the_shape_folder(tmp_path):
    import os
    import signal
    import subprocess
    import time

    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY.replace("duration_s = 2", "duration_s = 60").replace("max_requests = 12",
                                                                                  "max_requests = 600"))
    # The bench in a child process that knows the tiny shape (a real shape's random weights take most of a minute).
    child = (f"import sys; from solo.bench import shapes; shapes.SHAPES['TinyQwen'] = {TINY_SHAPES['TinyQwen']!r}; "
             "from solo.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", child, "bench", "--load", str(workload), "--shape", "TinyQwen",
                             "--max-batch", "2", "--verify", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})  # the shape folder goes there
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "phase" not in (line := proc.stderr.readline()):
            assert line or proc.poll() is None, "the bench ended before its phase"
        assert time.monotonic() < deadline
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not list(tmp_path.glob("solo-bench-shape-*"))


def test_ttft_over_the_idle_ttft_of_the_same_prompt():
    # "within 3x of an idle server's TTFT for the same prompt": each request against its own prompt's idle
    # TTFT in the same prefix-cache state (warm after a full hit or when unknown, else the prompt's first send).
    from solo.bench.load.report import summarize_phase
    from solo.bench.load.runner import Outcome, PhaseResult

    workload = parse_workload(__import__("tomllib").loads(TINY), "tiny.toml")
    idle = {"chat": {"ttft_s": 0.1, "e2e_s": 1.0, "prompts": [{"new_ttft_s": 0.1, "warm_ttft_s": 0.05},
                                                              {"new_ttft_s": 0.4, "warm_ttft_s": None}]}}
    outs = []
    # (prompt, cached, prompt_tokens, ttft): a full hit reuses all but the last prompt token
    for prompt, cached, n, ttft in [(0, 0, 40, 0.2), (0, 39, 40, 0.2), (0, None, None, 0.1), (1, 39, 40, 0.8),
                                    (1, 28, 40, 0.4), (5, 0, 40, 9.0)]:
        o = Outcome(cls="chat", offered_at=0.0, prompt=prompt, cached_tokens=cached, prompt_tokens=n, status=200)
        o.ttft_s, o.e2e_s = ttft, 1.0
        outs.append(o)
    assert [o.prefix_hit for o in outs] == [False, True, None, True, False, False]
    phase = summarize_phase(PhaseResult(6.0, "6 req/s", 2.0, outs, 2.0), workload, idle)
    # ratios 2 (new), 4 (warm), 2 (unknown: warm), 2 (warm missing: new), 1 (a partial hit: new); prompt 5 is
    # not in the pool
    assert phase["p99_ttft_over_idle_same_prompt"] == {"chat": round(2 + 0.96 * 2, 2)}
    assert phase["p99_ttft_over_idle"] == {"chat": round(percentile([o.ttft_s for o in outs], 0.99) / 0.1, 2)}


def test_the_report_names_the_gpu_a_started_server_runs_on(monkeypatch):
    import argparse

    from solo.bench.load import cli as load_cli
    from solo.bench.load.report import markdown

    monkeypatch.setattr(load_cli, "_gpu_name", lambda index: f"NVIDIA H200 #{index}")
    started = load_cli._machine(argparse.Namespace(device="cuda:1", url=None))
    assert started["gpu"] == "NVIDIA H200 #1" and started["cpu"]
    assert "gpu" not in load_cli._machine(argparse.Namespace(device="cuda", url="http://127.0.0.1:8000"))
    assert "gpu" not in load_cli._machine(argparse.Namespace(device=None, url=None))
    meta = {"command": "solo bench --load tiny", "server": "solo serve", "machine": started, "cpu_load_before": None}
    report = markdown({"meta": meta, "phases": [], "output_check": None,
                       "workload": {"name": "tiny", "description": "", "slo_ttft_s": 5.0, "slo_tpot_s": 1.0}})
    assert "NVIDIA H200 #1; load average before" in report


def test_the_load_generator_runs_its_phases_on_a_frozen_heap(monkeypatch, tmp_path):
    import gc

    from solo.bench.load import runner

    seen = []

    def idle_baseline(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        raise RuntimeError("stop here")

    async def fake(*args, **kwargs):
        return idle_baseline()

    monkeypatch.setattr(runner, "idle_baseline", fake)
    monkeypatch.setattr(runner, "check_loopback", lambda url: url)
    monkeypatch.setattr(runner, "build_prompts", lambda *a, **k: type("P", (), {"model": "m", "max_model_len": 64,
                                                                                  "notes": []})())
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY)
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError, match="stop here"):
        main(["bench", "--load", str(workload), "--url", "http://127.0.0.1:9"])
    assert seen and seen[0] > 0  # frozen while it ran
    assert gc.get_freeze_count() == before  # and as it was after


def test_bursts_the_phases_do_not_reach_are_said():
    from solo.bench.load.report import _bursts_line

    bursts = [{"at_s": 1.0, "length_s": 2.0, "factor": 10.0}, {"at_s": 60.0, "length_s": 10.0, "factor": 5.0}]
    assert _bursts_line(bursts, [15.0]) == [
        "- Bursts: 10x the rate for 2 s at 1 s; 5x the rate for 10 s at 60 s (not reached: a phase lasts 15 s)"]
    assert _bursts_line([], [15.0]) == []


def test_rates_count_over_the_phase_not_only_until_the_last_answer():
    # Two requests answered by 5.15 s of a 10 s phase at 0.3 req/s: 0.2 done per second, not 0.388 (above the
    # offered rate); where max_requests ended the arrivals early, over their window.
    from solo.bench.load.report import summarize_phase
    from solo.bench.load.runner import Outcome, PhaseResult

    workload = parse_workload(__import__("tomllib").loads(TINY), "tiny.toml")
    done = []
    for i in range(2):
        o = Outcome(cls="chat", offered_at=float(i))
        o.status, o.ttft_s, o.e2e_s, o.completion_tokens = 200, 0.1, 0.2, 4
        done.append(o)
    phase = summarize_phase(PhaseResult(0.3, "0.3 req/s", 10.0, done, 5.15), workload, {})
    assert phase["span_s"] == 10.0 and phase["throughput_rps"] == 0.2 and phase["completed_per_hour"] == 720
    assert phase["goodput_rps"] <= phase["offered_rps"]
    early = summarize_phase(PhaseResult(20.0, "20 req/s", 10.0, done, 1.5, arrivals_end_s=1.0), workload, {})
    assert early["span_s"] == 1.5 and early["throughput_rps"] == pytest.approx(2 / 1.5, rel=1e-3)


def test_unanswered_requests_fail_the_run():
    # A server that died mid-phase: its requests' connection errors were counted, and the bench exited 0.
    from solo.bench.load.report import summarize_phase
    from solo.bench.load.runner import Outcome, PhaseResult

    workload = parse_workload(__import__("tomllib").loads(TINY), "tiny.toml")
    outcomes = []
    for kind in ("connect", "reset", "timeout", "incomplete stream", "503 queue_full", "400 bad_request"):
        o = Outcome(cls="chat", offered_at=0.0)
        o.error = kind
        outcomes.append(o)
    phase = summarize_phase(PhaseResult(6.0, "6 req/s", 2.0, outcomes, 2.0, saturated=3), workload, {})
    assert phase["unanswered"] == 4  # not the statuses the server chose, nor the generator's own saturation


def test_an_interrupted_start_leaves_no_server(monkeypatch, tmp_path):
    # Ctrl-C or SIGTERM (raised as SystemExit) while the started server loads: it was left running, orphaned.
    import subprocess

    from solo.bench.load import runner

    started = []
    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        started.append(real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return started[-1]

    def interrupted(*args, **kwargs):
        raise SystemExit(143)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    monkeypatch.setattr(runner.httpx, "get", interrupted)
    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path))  # where its log goes
    with pytest.raises(SystemExit):
        runner.start_server(None, [])
    assert started and started[0].poll() is not None  # stopped, not orphaned
    assert not list(tmp_path.glob("solo-bench-load-*.log"))  # nor its empty log left in the temp folder


@pytest.mark.parametrize("routes, message", [
    ({"/v1/models": (200, "<html>proxy</html>")}, "GET /v1/models answered 200 without [\'data\'][0][\'id\']"),
    ({"/v1/models": (200, {"data": []})}, "GET /v1/models answered 200 without"),
    ({"/tokenize": (200, {"tokens": [1, 2]})}, "POST /tokenize answered 200 without ['max_model_len']"),
    ({"/tokenize": (200, {"tokens": "abc", "max_model_len": 64})}, "POST /tokenize answered tokens = 'abc'"),
])
def test_a_server_that_is_not_solo_is_named(routes, message, monkeypatch):
    # Another OpenAI-compatible server (llama-server's /tokenize has no max_model_len) or a proxy's page: a
    # KeyError, IndexError or JSONDecodeError traceback before.
    import httpx

    from solo.bench.load import runner

    answers = {"/v1/models": (200, {"data": [{"id": "m"}]}),
               "/tokenize": (200, {"tokens": [1, 2, 3], "max_model_len": 64, "count": 3}),
               "/detokenize": (200, {"prompt": "x"}), **routes}

    def handler(request):
        status, body = answers[request.url.path]
        return httpx.Response(status, text=body) if isinstance(body, str) else httpx.Response(status, json=body)

    real_client = httpx.Client
    monkeypatch.setattr(runner.httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw))
    workload = parse_workload(__import__("tomllib").loads(TINY), "tiny.toml")
    with pytest.raises(SoloError, match="Solo server") as info:
        runner.build_prompts("http://127.0.0.1:1", workload, 0)
    assert message.replace("\\", "") in str(info.value).replace("\\", "")


def test_output_files_expand_the_home_folder(tmp_path, monkeypatch):
    # `--json=~/x.json` (the shell does not expand ~ after "="): checked as expanded, then written as given,
    # which failed after the whole run and lost the results.
    import argparse

    from solo.bench.cli import add_arguments

    monkeypatch.setenv("HOME", str(tmp_path))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--json=~/x.json", "--plot=~/x.png", "--load", "chat", "--markdown=~/x.md"])
    assert (args.json, args.plot, args.markdown) == tuple(str(tmp_path / f"x.{e}") for e in ("json", "png", "md"))
