"""`solo bench`: roofline arithmetic, real shapes, the report and its files, and the llama.cpp conversion."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from checkpoints import make_checkpoint

from solo.bench.roofline import decode_bytes, probe_cpu_bandwidth, roofline_tokens_per_s
from solo.bench.shapes import SHAPES, build_model, shape_config
from solo.cli import main
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.cpu import CpuRuntime

# Published parameter counts (model cards), in billions.
PUBLISHED = {"SmolLM2-135M": 0.135, "Qwen2.5-0.5B": 0.494, "Llama-3.2-1B": 1.236, "Llama-3.1-8B": 8.03,
             "Phi-3-mini": 3.821}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shape_sizes_and_roofline_bytes(name):
    cfg = shape_config(name)
    if name in PUBLISHED:
        assert cfg.num_parameters() / 1e9 == pytest.approx(PUBLISHED[name], rel=0.01)
    # Every active weight once (a tied head reads the embedding matrix as the head), plus one embedding row.
    embed = cfg.vocab_size * cfg.hidden_size
    expected = 2 * (cfg.num_active_parameters() + cfg.hidden_size - (0 if cfg.tie_word_embeddings else embed))
    nbytes = decode_bytes(cfg, 2, context=100)
    assert nbytes.weights == expected
    assert nbytes.kv_cache == cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 100 * 2


def test_moe_shapes_count_active_bytes():
    # Published sizes: OLMoE-1B-7B 6.9B total / 1.3B active; Qwen3-30B-A3B 30.5B / 3.3B (the bench shape keeps
    # 8 of its 48 layers).
    olmoe = shape_config("OLMoE-1B-7B")
    assert olmoe.num_parameters() / 1e9 == pytest.approx(6.92, rel=0.01)
    assert olmoe.num_active_parameters() / 1e9 == pytest.approx(1.28, rel=0.01)
    full = ModelConfig.from_dict({**SHAPES["Qwen3-30B-A3B-8L"], "num_hidden_layers": 48})
    assert full.num_parameters() / 1e9 == pytest.approx(30.5, rel=0.01)
    assert full.num_active_parameters() / 1e9 == pytest.approx(3.3, rel=0.03)
    nbytes = decode_bytes(olmoe, 2, 0)
    assert nbytes.experts == 16 * 8 * 3 * 2048 * 1024 * 2  # layers x top-8 x (gate, up, down) x bf16
    assert nbytes.weights < 2 * olmoe.num_parameters() / 5


def test_laneformer_shape():
    cfg = shape_config("Laneformer-2B")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (15, 3072, 32, 16, 96)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (12288, 32000, False)


def test_quantized_bytes_and_sliding_windows():
    cfg = shape_config("Qwen2.5-0.5B")
    dense, int8, int4 = (decode_bytes(cfg, 2, 0, q).weights for q in (None, "int8", "int4"))
    assert 0.5 < int8 / dense < 0.52 and 0.27 < int4 / dense < 0.29
    windowed = ModelConfig.from_dict({**SHAPES["SmolLM2-135M"], "architectures": ["MistralForCausalLM"],
                                      "sliding_window": 64})
    assert decode_bytes(windowed, 2, 1000).kv_cache == decode_bytes(windowed, 2, 64).kv_cache


def test_runtime_streams_what_the_roofline_counts(tmp_path):
    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    assert CpuRuntime(model).weight_nbytes() == decode_bytes(model.config, 2, 0).weights


def test_build_model_random_weights():
    cfg = ModelConfig.from_dict({**SHAPES["SmolLM2-135M"], "num_hidden_layers": 2, "vocab_size": 512})
    model = build_model(cfg, torch.bfloat16, seed=3)
    again = build_model(cfg, torch.bfloat16, seed=3)
    assert model.dtype == torch.bfloat16
    assert torch.equal(model.layers[1].mlp.up_proj.weight, again.layers[1].mlp.up_proj.weight)
    assert float(model.layers[0].attn.q_proj.weight.float().std()) == pytest.approx(0.02, rel=0.05)


def test_bandwidth_probe():
    probe = probe_cpu_bandwidth(64 * 2**20, passes=2)
    assert probe.bandwidth_gbps > 0.1 and probe.buffer_bytes == 64 * 2**20
    assert roofline_tokens_per_s(10.0, 10**9) == pytest.approx(10.0)


def test_bench_end_to_end(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    out, plot = tmp_path / "bench.json", tmp_path / "sweep.png"
    code = main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "2", "--probe-gib", "0.0625",
                 "--compare", "hf-eager,llama.cpp", "--sweep-context", "--contexts", "8,16", "--sweep-gen-len", "3",
                 "--pause-ms", "20", "--json", str(out), "--plot", str(plot), "--energy-s", "0.2"])
    assert code == 0
    text = capsys.readouterr().out
    assert "roofline" in text and "GB/s" in text and "solo" in text
    report = json.loads(out.read_text())
    for key in ("machine", "versions", "command", "bandwidth", "roofline", "engines", "sweep", "memory"):
        assert key in report
    solo = report["engines"]["solo"]
    assert len(solo["runs"]) == 2 and solo["decode_tokens_per_s"]["median"] > 0
    # Each run's own roofline: the better of the short probes right before and after it.
    assert all(len(run["bandwidth_gbps_around"]) == 2 and min(run["bandwidth_gbps_around"]) > 0
               for run in solo["runs"])
    assert solo["point_roofline_fraction"]["median"] > 0 and "pt roof" in text
    assert report["backend"] == "cpu" and report["versions"]["torch"] == torch.__version__
    assert report["pause_s"] == pytest.approx(0.02)
    for peer in ("hf-eager", "llama.cpp-F32"):  # a float32 checkpoint: llama.cpp runs an F32 GGUF
        # Each peer either ran (with its build named and its greedy tokens checked) or was skipped with a reason.
        assert peer in report["engines"] or report["peers_skipped"].get(peer)
        if peer in report["engines"]:
            assert report["engines"][peer]["build"]
            assert report["engines"][peer]["token_check"]["passed"]
            # Interleaved: each round's Solo run over the peer's run of the same round.
            assert report["engines"][peer]["solo_ratio_by_round"]["median"] > 0
    assert report["sweep"]["contexts"] == [8, 16] and len(report["sweep"]["engines"]["solo"]) == 2
    assert plot.stat().st_size > 1000
    energy = report["energy"]  # measured where a counter is readable, else said so
    assert (energy["measurable"] and energy["tokens"] > 0) or energy["reason"]
    assert "energy" in text and ("J/token" in text or "not measurable here" in text)


def test_peers_after_solo_times_llamacpp_once_solo_is_freed(tmp_path, capsys):
    # A tiny OLMoE: the GGUF is written while Solo's weights are here, llama.cpp runs after they are freed, and
    # its greedy tokens are still checked against Solo's.
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
    pytest.importorskip("gguf", reason="gguf is not installed")
    folder = make_checkpoint(tmp_path / "olmoe", "olmoe", num_key_value_heads=4)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "2", "--probe-gib",
                 "0.0625", "--compare", "llama.cpp", "--peers-after-solo", "--pause-ms", "20", "--energy-s", "0",
                 "--json", str(out)]) == 0
    assert "after Solo's weights were freed" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["peers_after_solo"] and report["parameters"]["active_per_token"] < report["parameters"]["total"]
    assert report["memory"]["process_rss_after_freeing_solo_bytes"] > 0
    peer = report["engines"]["llama.cpp-F32"]
    assert len(peer["runs"]) == 2 and peer["token_check"]["passed"]
    assert "solo_ratio_by_round" not in peer  # not interleaved: no rounds to pair
    assert len(report["engines"]["solo"]["runs"]) == 2 and "outside_matmuls" in report["engines"]["solo"]
    assert main(["bench", str(folder), "--compare", "hf-eager", "--peers-after-solo"]) == 2
    assert "llama.cpp (or llama.cpp-<type>) only" in capsys.readouterr().err


def test_a_quantized_run_frees_the_dense_model_before_llamacpp_loads(tmp_path):
    # The dense weights only feed the GGUF conversion: freed before the peer loads, so the full OLMoE-1B-7B in
    # int8 fits beside llama.cpp's Q8_0 in turns.
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
    pytest.importorskip("gguf", reason="gguf is not installed")
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--quantize", "int8", "--prompt-len", "8", "--gen-len", "8", "--repeats", "1",
                 "--probe-gib", "0.0625", "--compare", "llama.cpp", "--lockstep", "4", "--pause-ms", "20",
                 "--energy-s", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["memory"]["dense_model_freed_before_peers"]
    assert "llama.cpp-Q8_0" in report["engines"] or "greedy tokens" in report["peers_skipped"]["llama.cpp-Q8_0"]


def test_a_quantized_run_writes_no_gguf_for_a_llamacpp_peer_that_cannot_run(tmp_path, monkeypatch, capsys):
    # Each peer's own reason is kept (not "no GGUF was written before Solo's weights were freed"), and no GGUF
    # is converted for it.
    import importlib.util

    import solo.bench.peers.llamacpp as llamacpp

    written: list[str] = []
    monkeypatch.setattr(llamacpp, "cached_gguf", lambda spec, type_name: written.append(type_name))
    find_spec = importlib.util.find_spec
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    args = ["bench", str(folder), "--quantize", "int8", "--prompt-len", "8", "--gen-len", "4", "--repeats", "1",
            "--probe-gib", "0.0625", "--pause-ms", "0", "--energy-s", "0", "--json", str(tmp_path / "bench.json")]
    with monkeypatch.context() as patch:
        patch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "llama_cpp" else find_spec(name, *a))
        assert main([*args, "--compare", "llama.cpp"]) == 0
    skipped = json.loads((tmp_path / "bench.json").read_text())["peers_skipped"]
    assert "llama-cpp-python is not installed" in skipped["llama.cpp-Q8_0"]
    assert main([*args, "--compare", "llama.cpp-F16"]) == 0
    skipped = json.loads((tmp_path / "bench.json").read_text())["peers_skipped"]
    assert "not Solo's precision" in skipped["llama.cpp-F16"] or "not installed" in skipped["llama.cpp-F16"]
    assert written == [] and "freed" not in capsys.readouterr().err


def test_sweep_fill_random_decodes_after_a_random_cache(tmp_path, capsys):
    # Contexts past one 512-position block take the split-KV attention; no prefill of them is run.
    folder = make_checkpoint(tmp_path / "llama", "llama", head_dim=64, hidden_size=128,
                             max_position_embeddings=1200)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--backend", "cpu", "--prompt-len", "8", "--gen-len", "3", "--repeats", "1",
                 "--probe-gib", "0.0625", "--sweep-context", "--contexts", "100,1100", "--sweep-gen-len", "4",
                 "--sweep-fill", "random", "--pause-ms", "0", "--energy-s", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "random keys and values" in text and "solo/roof" in text and "solo/pt" in text
    sweep = json.loads(out.read_text())["sweep"]
    assert sweep["fill"] == "random" and all(v > 0 for v in sweep["engines"]["solo"])
    # Each point's own bandwidth probes (before, after) and the roofline at the better of them.
    assert len(sweep["point_bandwidth_gbps"]) == 2 and all(len(p) == 2 and min(p) > 0
                                                           for p in sweep["point_bandwidth_gbps"])
    assert all(r > 0 for r in sweep["point_roofline_tokens_per_s"])


def test_a_sweep_gen_len_that_leaves_no_context_is_refused(tmp_path, capsys):
    # It printed "context sweep at  tokens", swept nothing, wrote no --plot and exited 0.
    folder = make_checkpoint(tmp_path / "llama", "llama")  # (a context of 256)
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "3", "--repeats", "1", "--sweep-context",
                 "--sweep-gen-len", "300", "--energy-s", "0"]) == 2
    assert "--sweep-gen-len 300 leaves no context to sweep" in capsys.readouterr().err


def test_a_prompt_and_generation_that_fill_the_context_exactly_are_benched(tmp_path, capsys):
    # A trial: --prompt-len 252 --gen-len 4 on a 256 context was refused as needing 257 tokens, while solo run
    # takes a 252-token prompt with --max-tokens 4.
    folder = make_checkpoint(tmp_path / "llama", "llama")  # (a context of 256)
    flags = ["--gen-len", "4", "--repeats", "1", "--probe-gib", "0.0625", "--energy-s", "0"]
    assert main(["bench", str(folder), "--prompt-len", "252", *flags]) == 0
    capsys.readouterr()
    assert main(["bench", str(folder), "--prompt-len", "253", *flags]) == 2
    assert "--prompt-len 253 + --gen-len 4 is 257 tokens but the model's context is 256" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_moe_reports_active_bytes_and_parameters(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "olmoe", "olmoe", dtype=torch.bfloat16)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--probe-gib",
                 "0.0625", "--compare", "hf-eager", "--json", str(out)]) == 0
    assert "active per token" in capsys.readouterr().out
    report = json.loads(out.read_text())
    config = ModelConfig.from_file(folder)
    assert report["parameters"] == {"total": config.num_parameters(),
                                    "active_per_token": config.num_active_parameters()}
    assert report["backend"] == "cpu" and report["roofline"]["routed_expert_bytes"] > 0
    assert "hf-eager" in report["engines"]  # transformers runs on Solo's fused expert tensors


def test_bench_phi3_runs_transformers_on_solos_split_tensors(tmp_path, capsys):
    # transformers holds Phi-3's qkv_proj / gate_up_proj fused: the peer joins Solo's parts back.
    folder = make_checkpoint(tmp_path / "phi3", "phi3", dtype=torch.bfloat16)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--probe-gib",
                 "0.0625", "--energy-s", "0", "--compare", "hf-eager", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "hf-eager" in report["engines"], capsys.readouterr()


def test_bench_quantized_reports_quality(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--quantize", "int8", "--prompt-len", "8", "--gen-len", "4", "--repeats", "1",
                 "--probe-gib", "0.0625", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quantize"] == "int8"
    assert 0 <= report["quantization_quality"]["top1_agreement"] <= 1
    assert "quantization vs bfloat16" in capsys.readouterr().out


def test_unknown_peer_is_an_error(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    assert main(["bench", str(folder), "--compare", "vllm"]) == 2
    assert "unknown peer" in capsys.readouterr().err


def test_interleaved_runs_pause_before_every_run():
    from solo.bench.cli import _interleaved
    from solo.bench.peers import RunResult

    events: list[tuple[str, float]] = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def run(self, prompt, gen_len):
            events.append((self.name, time.perf_counter()))
            return RunResult(ttft_s=0.0, decode_s=1.0, decode_tokens=gen_len - 1)

    results = _interleaved([Engine("solo"), Engine("peer")], [1, 2], 3, 2, {},
                           between=lambda: events.append(("probe", time.perf_counter())), pause_s=0.05)
    assert [name for name, _ in events] == ["probe", "solo", "peer", "probe", "solo", "peer"]
    gaps = [b - a for (_, a), (_, b) in zip(events, events[1:], strict=False)]
    assert min(gaps) >= 0.05  # the same idle pause in front of every engine's run and every probe
    assert {name: len(runs) for name, runs in results.items()} == {"solo": 2, "peer": 2}


def test_interleaved_probes_around_every_run():
    # The probe after one run is the probe before the next; each run gets its own [before, after] pair.
    from solo.bench.cli import _interleaved
    from solo.bench.peers import PeerSkipped, RunResult

    events: list[str] = []
    rates = iter(range(1, 100))

    class Engine:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def run(self, prompt, gen_len):
            events.append(self.name)
            if self.fail:
                raise PeerSkipped("broken")
            return RunResult(ttft_s=0.0, decode_s=1.0, decode_tokens=gen_len - 1)

    def probe():
        events.append("p")
        return float(next(rates))

    around: dict[str, list[list[float]]] = {}
    skipped: dict[str, str] = {}
    results = _interleaved([Engine("solo"), Engine("bad", fail=True), Engine("peer")], [1], 3, 2, skipped,
                           between=lambda: events.append("round"), point_probe=probe, around=around)
    assert events == ["round", "p", "solo", "p", "bad", "peer", "p", "round", "p", "solo", "p", "peer", "p"]
    assert around == {"solo": [[1, 2], [4, 5]], "peer": [[2, 3], [5, 6]]} and "bad" in skipped
    assert len(results["solo"]) == len(around["solo"]) == 2


def test_lockstep_turns_alternate_engines_with_a_probe_between_every_two():
    # Prefill each engine, then turns of 2 tokens: solo, peer, solo, peer, ... each turn between two probes.
    from solo.bench.cli import _lockstep
    from solo.bench.peers import PeerSkipped

    events: list[str] = []
    rates = iter(range(1, 100))

    class Engine:
        def __init__(self, name, fail_at=None):
            self.name, self.fail_at, self.turns = name, fail_at, 0

        def begin(self, prompt, gen_len):
            events.append(f"{self.name}:begin")
            return 0.5

        def advance(self, tokens):
            events.append(f"{self.name}:{tokens}")
            self.turns += 1
            if self.turns == self.fail_at:
                raise PeerSkipped("broken")
            return 0.1 * tokens

    def probe():
        events.append("p")
        return float(next(rates))

    skipped: dict[str, str] = {}
    results, turns = _lockstep([Engine("solo"), Engine("bad", fail_at=2), Engine("peer")], [7, 8, 9], 6, 1, 2,
                               skipped, 0.0, probe, between=lambda: events.append("round"))
    # 5 decode tokens after the first: turns of 2, 2, 1; "bad" drops out at its second turn.
    assert events == ["round", "solo:begin", "bad:begin", "peer:begin", "p",
                      "solo:2", "p", "bad:2", "p", "peer:2", "p",
                      "solo:2", "p", "bad:2", "peer:2", "p",
                      "solo:1", "p", "peer:1", "p"]
    assert "bad" in skipped and set(results) == set(turns) == {"solo", "peer"}
    assert [t["tokens"] for t in turns["solo"]] == [2, 2, 1]
    assert [t["position"] for t in turns["peer"]] == [3, 5, 7]  # the context at each turn's start
    assert [t["bandwidth_gbps_around"] for t in turns["solo"]] == [[1, 2], [4, 5], [6, 7]]
    assert [t["bandwidth_gbps_around"] for t in turns["peer"]] == [[3, 4], [5, 6], [7, 8]]
    run = results["peer"][0]
    assert run.ttft_s == 0.5 and run.decode_tokens == 5 and run.decode_s == pytest.approx(0.5)


def test_bench_lockstep_end_to_end(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama", head_dim=64, hidden_size=128)
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--backend", "cpu", "--prompt-len", "8", "--gen-len", "6", "--repeats", "2",
                 "--probe-gib", "0.0625", "--lockstep", "2", "--compare", "llama.cpp", "--sweep-context",
                 "--contexts", "16", "--sweep-gen-len", "5", "--sweep-fill", "random", "--pause-ms", "0",
                 "--energy-s", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "in turns of 2 decode tokens" in text and "each turn against" in text and "solo/turn roof" in text
    report = json.loads(out.read_text())
    assert report["lockstep_tokens"] == 2
    solo = report["engines"]["solo"]
    assert len(solo["runs"]) == 2 and len(solo["turns"]) == 2 * 3  # 5 tokens a run in turns of 2, 2, 1
    assert solo["point_roofline_fraction"]["median"] > 0
    peer = report["engines"].get("llama.cpp-F32")
    if peer is not None:  # llama-cpp-python installed: the peer took its turns beside Solo's
        assert "turn by turn" in text and peer["solo_ratio_by_turn"]["median"] > 0 and len(peer["turns"]) == 6
    assert all(t["roofline_fraction"] > 0 for t in solo["turns"])
    assert len(report["bandwidth"]["samples_gbps"]) == 2 + 2  # the first and last probes, and one per round
    sweep = report["sweep"]
    assert len(sweep["turn_roofline_fraction"]) == 1 and sweep["turn_roofline_fraction"][0]["median"] > 0
    assert sweep["engines"]["solo"][0] > 0 and len(sweep["turns"][0]) == 2  # 4 tokens after the first: 2 + 2
    # A prefilled sweep point in turns too (every engine), each turn with its own fraction.
    assert main(["bench", str(folder), "--backend", "cpu", "--prompt-len", "8", "--gen-len", "3", "--repeats", "1",
                 "--probe-gib", "0.0625", "--lockstep", "2", "--sweep-context", "--contexts", "16",
                 "--sweep-gen-len", "4", "--pause-ms", "0", "--energy-s", "0", "--json", str(out)]) == 0
    sweep = json.loads(out.read_text())["sweep"]
    assert [t["tokens"] for t in sweep["turns"][0]] == [2, 1] and sweep["turn_roofline_fraction"][0]["median"] > 0
    assert all(t["roofline_fraction"] > 0 for t in sweep["turns"][0]) and len(sweep["point_bandwidth_gbps"][0]) == 2


def test_lockstep_refuses_engines_without_turns(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    assert main(["bench", str(folder), "--lockstep", "4", "--compare", "hf-eager"]) == 2
    assert "drop the hf peers" in capsys.readouterr().err
    assert main(["bench", str(folder), "--lockstep", "-1"]) == 2
    assert "--lockstep must be >= 1" in capsys.readouterr().err
    assert main(["bench", str(folder), "--lockstep", "4", "--structured"]) == 2
    assert "--structured runs another benchmark that has no turns" in capsys.readouterr().err


def test_tokenizer_is_refused_where_no_benchmark_reads_it(tmp_path, capsys):
    # From a break test: the decode benchmark (and --agent with a model folder) ran with --tokenizer ignored, a
    # folder that does not exist included.
    folder = make_checkpoint(tmp_path / "llama", "llama")
    for command in (["bench", str(folder), "--tokenizer", str(folder)],
                    ["bench", "--shape", "SmolLM2-135M", "--tokenizer", str(folder)],
                    ["bench", str(folder), "--structured", "--tokenizer", str(folder)]):
        assert main(command) == 2
        assert "--tokenizer gives --shape's random weights a real tokenizer" in capsys.readouterr().err
    assert main(["bench", "--shape", "SmolLM2-135M", "--structured", "--tokenizer", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_llamacpp_worker_advances_in_turns():
    # The worker's turn protocol: a generation begun, then advanced, without a model errors by name.
    from solo.bench.peers.llamacpp_worker import serve

    replies = io.StringIO()
    serve(io.StringIO('{"op": "begin", "prompt": [1]}\n{"op": "advance", "tokens": 2}\n{"op": "quit"}\n'), replies)
    answers = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert "no model loaded" in answers[0]["error"] and "advance needs a model" in answers[1]["error"]


def test_llamacpp_worker_protocol_without_a_model():
    from solo.bench.peers.llamacpp_worker import serve

    requests = io.StringIO('{"op": "run", "prompt": [1], "gen_len": 2}\n\n{"op": "fly"}\nnot json\n'
                           '{"op": "quit"}\n{"op": "run", "prompt": [1], "gen_len": 2}\n')
    replies = io.StringIO()
    serve(requests, replies)
    answers = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert "no model loaded" in answers[0]["error"] and "unknown op" in answers[1]["error"]
    assert "error" in answers[2] and answers[3] == {}
    assert len(answers) == 4  # nothing served after "quit"


def test_llamacpp_peer_skips_without_llama_cpp(monkeypatch):
    import importlib.util

    from solo.bench.peers import PeerSkipped, PeerSpec, load_peer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    spec = PeerSpec(model=None, raw_config={}, dtype=torch.bfloat16, quantize=None, device=torch.device("cpu"),
                    threads=1, max_seq=16)
    with pytest.raises(PeerSkipped, match="llama-cpp-python is not installed"):
        load_peer("llama.cpp", spec)


def test_llamacpp_peer_reports_a_dead_worker():
    from solo.bench.peers import PeerSkipped
    from solo.bench.peers.llamacpp import LlamaCppPeer

    peer = LlamaCppPeer.__new__(LlamaCppPeer)  # only the pipe handling, no model
    peer._log = tempfile.TemporaryFile()
    peer._proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=peer._log, text=True)
    with pytest.raises(PeerSkipped, match="exited with status 3: boom"):
        peer.run([1, 2], 4)
    peer.close()


def test_cpu_hog_runs_beside_the_timed_runs(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--probe-gib",
                 "0.0625", "--pause-ms", "0", "--energy-s", "0", "--cpu-hog", "1", "--json", str(out)]) == 0
    assert "beside 1 busy-loop process" in capsys.readouterr().out
    assert json.loads(out.read_text())["cpu_hog_processes"] == 1


def test_token_check_passes_near_ties_and_fails_a_wrong_first_token():
    from solo.bench.runner import token_check

    ok = token_check([5, 6, 7, 8], [5, 9, 1, 2, 3], [5, 6, 9, 9])
    assert ok["passed"] and ok["identical_prefix"] == 2 and ok["summary"] == "identical for 2/4 tokens"
    near_tie = token_check([5, 6], [5, 9, 1, 2, 3], [9, 6])  # the runner-up of a near tie: still the same model
    assert near_tie["passed"] and near_tie["identical_prefix"] == 0
    wrong = token_check([5, 6], [5, 9, 1, 2, 3], [77, 6])
    assert not wrong["passed"] and "not in Solo's top 5" in wrong["summary"]


def test_bf16_weights_get_both_16_bit_llamacpp_peers_and_the_best_is_reported():
    import importlib.util

    from solo.bench.cli import best_peers
    from solo.bench.peers import PeerSkipped, PeerSpec, expand_names, load_peer, peer_variants

    def spec(dtype, quantize=None):
        return PeerSpec(model=None, raw_config={}, dtype=dtype, quantize=quantize, device=torch.device("cpu"),
                        threads=1, max_seq=16)

    assert peer_variants("llama.cpp", spec(torch.bfloat16)) == ["llama.cpp-F16", "llama.cpp-BF16"]
    assert peer_variants("llama.cpp", spec(torch.float32)) == ["llama.cpp-F32"]
    assert peer_variants("llama.cpp", spec(torch.bfloat16, "int8")) == ["llama.cpp-Q8_0"]
    # One GGUF type alone (a large model whose two 16-bit GGUFs would not fit in memory beside Solo's weights).
    assert expand_names(["llama.cpp-BF16"]) == ["llama.cpp-BF16"]
    assert peer_variants("llama.cpp-BF16", spec(torch.bfloat16)) == ["llama.cpp-BF16"]
    with pytest.raises(ValueError, match="llama.cpp-<type>"):
        expand_names(["llama.cpp-Q5_K"])
    if importlib.util.find_spec("llama_cpp") is not None:
        with pytest.raises(PeerSkipped, match="compare with llama.cpp-Q8_0"):
            load_peer("llama.cpp-BF16", spec(torch.bfloat16, "int8"))
    assert peer_variants("hf-eager", spec(torch.bfloat16)) == ["hf-eager"]
    engines = {name: {"decode_tokens_per_s": {"median": speed}}
               for name, speed in (("solo", 30.0), ("llama.cpp-F16", 20.0), ("llama.cpp-BF16", 22.0))}
    assert best_peers(engines) == {"llama.cpp": "llama.cpp-BF16"}


def test_quantize_with_hf_peers_is_refused(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    assert main(["bench", str(folder), "--quantize", "int8", "--compare", "hf", "--gen-len", "4"]) == 2
    assert "unquantized weights" in capsys.readouterr().err


# Mixture-of-experts checkpoints as llama.cpp's families hold them: OLMoE's full-width k norm needs as many KV
# heads as query heads, and llama.cpp's qwen3moe has no dense layers between the expert layers.
# Gemma 3 and SmolLM3 with llama.cpp's fixed layer patterns (five sliding layers then a global one; a NoPE layer
# every fourth one).
_GGUF_OVERRIDES = {"olmoe": {"num_key_value_heads": 4}, "qwen3_moe": {"decoder_sparse_step": 1},
                   "gemma3": {"num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
                   "smollm3": {"num_hidden_layers": 4, "no_rope_layer_interval": 4}}


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float32), ("qwen2", torch.float32),
                                        ("llama", torch.bfloat16), ("qwen3", torch.float32),
                                        ("olmoe", torch.float32), ("olmoe", torch.bfloat16),
                                        ("qwen3_moe", torch.float32), ("mixtral", torch.float32),
                                        ("gemma3", torch.float32), ("smollm3", torch.float32)])
def test_llamacpp_gguf_conversion_generates_the_same_tokens(tmp_path, arch, dtype):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
    pytest.importorskip("gguf", reason="gguf is not installed")
    from solo.bench.peers import PeerSpec
    from solo.bench.peers.llamacpp import LlamaCppPeer

    folder = make_checkpoint(tmp_path / arch, arch, **_GGUF_OVERRIDES.get(arch, {}))
    model = load_weights(folder, ModelConfig.from_file(folder), dtype)
    prompt = [1, 17, 93, 5, 250, 31, 77, 8]
    spec = PeerSpec(model=model, raw_config={}, dtype=dtype, quantize=None, device=torch.device("cpu"),
                    threads=2, max_seq=64, extra={"cache_key": None})
    # bf16 weights: the BF16 GGUF holds them bit for bit; llama.cpp still rounds activations its own way,
    # so only the first tokens are compared there (the tiny model's logits are far from ties early on).
    type_name = "F32" if dtype == torch.float32 else "BF16"
    peer = LlamaCppPeer(spec, type_name)
    theirs = peer.generate(prompt, 12)
    timed = peer.run(prompt, 12)
    peer.close()
    assert peer.name == f"llama.cpp-{type_name}"
    assert timed.decode_tokens == 11 and timed.decode_s > 0 and timed.ttft_s > 0
    assert "worker process" in peer.build_info and f"GGUF {type_name}" in peer.build_info
    runtime = CpuRuntime(model)
    runtime.reserve(1, 32)
    ours = [int(runtime.prefill(0, torch.tensor(prompt)).argmax())]
    for i in range(11):
        ours.append(int(runtime.decode(torch.tensor([0]), torch.tensor([ours[-1]]),
                                       torch.tensor([len(prompt) + i]))[0].argmax()))
    n = 12 if dtype == torch.float32 else 4
    assert ours[:n] == theirs[:n]
    if model.config.is_moe:  # the bench's own check passes too (first token in Solo's top 5)
        from solo.bench.runner import token_check

        top5 = runtime.prefill(0, torch.tensor(prompt)).topk(5).indices.tolist()
        assert token_check(ours, top5, theirs)["passed"]


def test_llamacpp_runs_outside_the_bench_process(tmp_path):
    # llama.cpp and its OpenMP runtime must not be loaded here, and the bench must not change their settings.
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
    pytest.importorskip("gguf", reason="gguf is not installed")
    script = (
        "import os, pathlib, sys, torch\n"
        "from solo.bench.peers import PeerSpec\n"
        "from solo.bench.peers.llamacpp import LlamaCppPeer\n"
        "from solo.model.config import ModelConfig\n"
        "from solo.model.weights import load_weights\n"
        f"folder = pathlib.Path({str(make_checkpoint(tmp_path / 'llama', 'llama'))!r})\n"
        "model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)\n"
        "spec = PeerSpec(model=model, raw_config={}, dtype=torch.float32, quantize=None,\n"
        "                device=torch.device('cpu'), threads=1, max_seq=32, extra={'cache_key': None})\n"
        "peer = LlamaCppPeer(spec)\n"
        "peer.run([1, 2, 3], 4)\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('llama_cpp' in sys.modules, 'libllama' in maps, 'libomp' in maps, 'KMP_BLOCKTIME' in os.environ)\n"
        "peer.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KMP_BLOCKTIME"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False", "False"]


@pytest.mark.parametrize("arch, overrides, feature", [
    ("mistral", {}, "a sliding window"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "linear RoPE scaling"),
    ("llama", {"mlp_bias": True}, "o_proj / MLP biases"),
    ("olmoe", {}, "grouped-query attention with full-width q/k norms"),
    ("olmoe", {"num_key_value_heads": 4, "norm_topk_prob": True}, "norm_topk_prob = True"),
    ("qwen3_moe", {}, "dense MLP layers between the expert layers"),
    ("qwen2_moe", {}, "no GGUF conversion for Qwen2MoeForCausalLM"),
    ("gemma3", {}, "a sliding-window pattern other than llama.cpp's"),
    ("smollm3", {"no_rope_layer_interval": 2}, "NoPE layers other than every fourth"),
])
def test_gguf_writer_refuses_what_it_cannot_carry_over(tmp_path, arch, overrides, feature):
    pytest.importorskip("gguf", reason="gguf is not installed")
    from solo.bench.peers import PeerSkipped
    from solo.bench.peers.llamacpp import write_gguf

    folder = make_checkpoint(tmp_path / arch, arch, **overrides)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    with pytest.raises(PeerSkipped, match=feature):
        write_gguf(model, tmp_path / "m.gguf", "F32")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("longrope,partial", [(False, 1.0), (True, 1.0), (True, 0.75)],
                         ids=["window", "longrope", "phi4-partial-rotary"])
def test_gguf_writer_writes_phi3_as_llama_cpp_reads_it(tmp_path, monkeypatch, longrope, partial):
    # Read back through Solo's own GGUF loader (transformers' reader + the phi3 fields it drops): the same
    # model, so fused attn_qkv / ffn_up, the window and LongRoPE's factors went out as llama.cpp lays them out;
    # Phi-4-mini's partial rotary as rope.dimension_count, its q/k rows in the checkpoint's order, its tied head.
    pytest.importorskip("gguf", reason="gguf is not installed")
    from checkpoints import make_longrope_checkpoint

    from solo import Engine, SamplingParams
    from solo.bench.peers.llamacpp import write_gguf

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    folder = make_longrope_checkpoint(tmp_path / "phi3", partial_rotary_factor=partial) if longrope else \
        make_checkpoint(tmp_path / "phi3", "phi3")
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    write_gguf(model, tmp_path / "m.gguf", "F32")
    assert model.config.rotary_dim == (12 if partial != 1.0 else None)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ids = [1, 5, 9, 33, 70, 2, 100, 7, 250, 31, 12, 44]  # longer than the window of 8
    read = Engine.load(tmp_path / "m.gguf", backend="eager")
    assert read.config.layer_sliding_windows == model.config.layer_sliding_windows
    assert read.config.rope.rope_type == model.config.rope.rope_type
    assert read.config.rotary_dim == model.config.rotary_dim
    expected = Engine.load(folder, dtype="float32", backend="eager").complete(ids, params).token_ids
    assert read.complete(ids, params).token_ids == expected


def test_gguf_writer_writes_gemma3_as_llama_cpp_reads_it(tmp_path, monkeypatch):
    # Read back through Solo's GGUF loader: norms stored as 1 + w, the window and the global layers' linear RoPE
    # scaling went out as llama.cpp's gemma3 reads them (its fixed pattern and sliding-layer theta match).
    pytest.importorskip("gguf", reason="gguf is not installed")
    from solo import Engine, SamplingParams
    from solo.bench.peers.llamacpp import write_gguf

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    folder = make_checkpoint(tmp_path / "gemma3", "gemma3", **_GGUF_OVERRIDES["gemma3"])
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    with torch.no_grad():  # norms away from 0, so that a missing or doubled + 1 changes the tokens
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.5)
    write_gguf(model, tmp_path / "m.gguf", "F32")
    read = Engine.load(tmp_path / "m.gguf", backend="eager")
    assert read.config.rope_tables == model.config.rope_tables
    assert read.config.layer_sliding_windows == model.config.layer_sliding_windows
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ids = [1, 5, 9, 33, 70, 2, 100, 7, 250, 31, 12, 44]  # longer than the window of 8
    from solo.runtime.eager import EagerRuntime

    expected = Engine(model, read.tokenizer, read.defaults, EagerRuntime(model), folder, "written").complete(
        ids, params).token_ids
    assert read.complete(ids, params).token_ids == expected


@pytest.mark.parametrize("arch", ["llama", "phi3", "phi4", "gemma3", "smollm3"])
def test_the_hf_peer_holds_solos_weights_as_transformers_loads_them(tmp_path, arch):
    # Built on the meta device around Solo's tensors: its buffers (RoPE tables, one per layer type in Gemma 3;
    # Gemma's embedding scale) must be rebuilt, or its logits would not be transformers' own.
    from transformers import AutoModelForCausalLM

    from solo.bench.peers.hf import hf_model_from_solo

    folder = make_checkpoint(tmp_path / arch, arch)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    raw = json.loads((folder / "config.json").read_text())
    peer = hf_model_from_solo(model, raw, torch.float32, torch.device("cpu"))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 33, 70, 2, 100, 7, 250, 31, 12, 44]])
    with torch.no_grad():
        torch.testing.assert_close(peer(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)


def test_sweep_context_defaults_fit_the_model():
    from solo.bench.cli import default_contexts

    assert default_contexts(512, 32) == [128, 479]
    assert default_contexts(4096, 32) == [128, 512, 1024, 2048, 4063]
    assert default_contexts(8192, 32) == [128, 512, 1024, 2048, 4096, 8159]
    assert default_contexts(100, 32) == [67]


def _fake_powercap(root, values):
    for i, value in enumerate(values):
        d = root / f"intel-rapl:{i}"
        d.mkdir(parents=True)
        (d / "name").write_text(f"package-{i}\n")
        (d / "energy_uj").write_text(str(value))
        (d / "max_energy_range_uj").write_text(str(2**32))
    (root / "intel-rapl:0:0").mkdir()  # a sub-domain (core): part of package 0, never added twice


def test_rapl_energy_per_token(tmp_path):
    from solo.bench.energy import measure, rapl_counter

    _fake_powercap(tmp_path, [1_000_000])
    counter, reason = rapl_counter(tmp_path)
    assert counter is not None and counter.name == "RAPL package-0" and not reason

    def run():  # each run: 10 tokens, 2 J
        f = tmp_path / "intel-rapl:0" / "energy_uj"
        f.write_text(str(int(f.read_text()) + 2_000_000))
        return 10

    result = measure(counter, run, window_s=0.0)
    assert result["joules"] == pytest.approx(2.0) and result["tokens"] == 10
    assert result["joules_per_token"] == pytest.approx(0.2) and result["tokens_per_joule"] == pytest.approx(5.0)


def test_rapl_wraparound_and_absent_counters(tmp_path):
    from solo.bench.energy import measure, rapl_counter

    _fake_powercap(tmp_path / "a", [2**32 - 1_000_000])
    counter, _ = rapl_counter(tmp_path / "a")
    f = tmp_path / "a" / "intel-rapl:0" / "energy_uj"
    result = measure(counter, lambda: f.write_text(str(2_000_000)) and 4, window_s=0.0)
    assert result["joules"] == pytest.approx(3.0)  # 1 J to the wrap, 2 J after it
    counter, reason = rapl_counter(tmp_path / "none")
    assert counter is None and "no RAPL counters" in reason


def test_report_command_reads_solo_and_cuts_absolute_paths():
    from solo.bench.report import report_command

    for program in ("/venv/bin/solo", "/repo/solo/cli.py"):  # the entry point, `python -m solo.cli`
        argv = [program, "bench", "--shape", "Qwen2.5-0.5B", "--json", "/home/me/runs/x.json", "--plot", "p.png"]
        assert report_command(argv) == "solo bench --shape Qwen2.5-0.5B --json x.json --plot p.png"
    assert report_command(["solo", "bench", "--json=/home/me/r/x.json", "--note", "two words"]) == \
        "solo bench --json=x.json --note 'two words'"


def test_the_machine_line_and_record_name_a_containers_cpu_quota(monkeypatch):
    # Inside a container limited to 1.5 CPUs the probe and the decode run at the quota's pace: the report says so.
    import torch

    from solo.bench.report import machine_info, machine_line

    monkeypatch.setattr("solo.bench.report.cgroup_cpu_limit", lambda: 1.5)
    info = machine_info(torch.device("cpu"))
    assert info["cpu_quota"] == 1.5 and machine_line(info).endswith("threads, CPU quota 1.5 CPUs (cgroup)")
    monkeypatch.setattr("solo.bench.report.cgroup_cpu_limit", lambda: None)
    info = machine_info(torch.device("cpu"))
    assert info["cpu_quota"] is None and "quota" not in machine_line(info)


def test_a_model_folder_is_named_by_its_name_in_the_report(tmp_path, capsys):
    # The command's paths were cut, the report's "model" kept the whole local path.
    folder = make_checkpoint(tmp_path / "tiny-llama", "llama")
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "2", "--repeats", "1", "--probe-gib",
                 "0.0625", "--pause-ms", "0", "--energy-s", "0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["model"] == "tiny-llama"
    assert str(tmp_path) not in out.read_text() and str(tmp_path) not in capsys.readouterr().out


def test_peers_after_solo_without_llamacpp_writes_no_gguf(tmp_path, capsys, monkeypatch):
    # From a break test: the GGUFs (270 MB each there) were written, and only then was the peer skipped.
    import importlib.util

    from solo.bench.peers import llamacpp

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    written: list = []
    monkeypatch.setattr(llamacpp, "cached_gguf", lambda *a, **k: written.append(a))
    folder = make_checkpoint(tmp_path / "llama", "llama")
    assert main(["bench", str(folder), "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--probe-gib",
                 "0.0625", "--compare", "llama.cpp", "--peers-after-solo", "--energy-s", "0"]) == 0
    assert not written and "llama-cpp-python is not installed" in capsys.readouterr().err


def test_ms_per_token_is_the_median_speeds_reciprocal():
    from types import SimpleNamespace

    from solo.bench.cli import _stats

    runs = [SimpleNamespace(decode_tokens_per_s=tps, ttft_s=0.1, decode_s=1.0, decode_tokens=10, host_syncs=None)
            for tps in (20.0, 60.0)]  # an even count: the median speed is 40 tok/s
    stats = _stats(runs)
    assert stats["decode_tokens_per_s"]["median"] == 40.0 and stats["ms_per_token"]["median"] == 25.0
    assert stats["ms_per_token"]["min"] == pytest.approx(1000 / 60) and stats["ms_per_token"]["max"] == 50.0


def test_a_results_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    # From a break test: `--json` on a full file system left an empty file and said "cannot write the output"
    # without naming it.
    import errno

    from solo.bench import report
    from solo.errors import SoloError

    out = tmp_path / "results.json"
    report.write_output("--json", str(out), '{"run": 1}\n')
    assert out.read_text() == '{"run": 1}\n' and oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    replace = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report.os, "replace", full)
    with pytest.raises(SoloError, match=r"cannot write --json .*results.json \(No space left on device\)"):
        report.write_output("--json", str(out), '{"run": 2}\n')
    monkeypatch.setattr(report.os, "replace", replace)
    assert out.read_text() == '{"run": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_turn_ratios_split_by_memory_speed():
    from solo.bench.report import ratio_by_memory_speed

    assert ratio_by_memory_speed([1.0, 1.1], [[50.0, 52.0], [55.0, 51.0]]) is None  # one speed
    assert ratio_by_memory_speed([], []) is None
    split = ratio_by_memory_speed([1.02, 1.04, 1.30, 1.20, 1.03, 0.7],
                                  [[34.0, 35.0], [35.0, 36.0], [66.0, 64.0], [64.0, 60.0], [36.0, 34.0], [34.0, 66.0]])
    assert split["split_gbps"] == 50.0
    assert split["slow_turns"] == 3 and split["slow"]["median"] == 1.03
    assert split["fast_turns"] == 2 and split["fast"]["median"] == 1.25
    assert split["mixed_turns"] == 1  # the speed changed between the two turns
    with pytest.raises(ValueError, match="2 ratios but 1 probe lists"):
        ratio_by_memory_speed([1.0, 1.0], [[30.0]])
