"""A small-scale DTP quality study: dense vs lanes without communication vs DTP d = 1, 2, at equal budget.

    python -m solo.train.lane_study --steps 60 --seeds 1,2 --eval-bytes 60000 --out benchmarks/results/dtp_study

Every variant is the same lane model (`solo.model.lanes`, L lanes, the dense parameter count: replicate head
tied to the embedding) trained with the recipe's `Trainer` on the same token stream, in the same order, for
the same steps, from the same seeds; only the residual update differs (../shared/laneformer.md section 4):

- dense: delay 0, every module all-reduced at once (equal to the dense model it shards; tested);
- lanes, no communication: delay = number of layers without early communication (`h_l += sqrt(L) * own_l`
  everywhere; the lanes meet only at the final mean);
- DTP d = 1 and d = 2 (early all-reduce of the first d layers, the spec's default broadcast flags).

The corpus, tokenizer and held-out accounting are the recipe's (CPython standard library; bits per byte of
the held-out files' UTF-8 text). Writes `<out>.json`, `<out>.md` (table) and `<out>.png` (held-out loss
curves). The scale is tiny (about a million parameters, a few hundred steps): it says how the variants
order at that scale, nothing about large models.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from solo.bench.report import cpu_model
from solo.train.config import TrainConfig
from solo.train.corpus import load_corpus, select_eval_subset
from solo.train.data import BatchSchedule, pack_documents
from solo.train.evaluate import evaluate_documents
from solo.train.lanes import build_lane_model
from solo.train.tokenizer_training import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, encode_documents, train_tokenizer
from solo.train.trainer import Trainer, count_parameters

BASE = TrainConfig(vocab_size=1024, hidden_size=128, num_layers=6, num_heads=8, num_kv_heads=4, head_dim=16,
                   ffn_size=384, context=128, batch_size=8, lr=2e-3, warmup_steps=10, steps=60, eval_every=15,
                   eval_windows=8, log_every=15, checkpoint_every_min=1e9, heldout_permille=30)
"""The study's shape and schedule (CPU-sized)."""


def variants(lanes: int, num_layers: int) -> list[tuple[str, dict]]:
    """(label, TrainConfig overrides) of the four variants."""
    return [
        ("dense (d=0: all-reduce every module)", dict(num_lanes=lanes, broadcast_delay=0, use_early_comm=True)),
        ("lanes, no communication", dict(num_lanes=lanes, broadcast_delay=num_layers, use_early_comm=False)),
        ("DTP d=1", dict(num_lanes=lanes, broadcast_delay=1, use_early_comm=True)),
        ("DTP d=2", dict(num_lanes=lanes, broadcast_delay=2, use_early_comm=True)),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the study; returns 0."""
    p = argparse.ArgumentParser(prog="python -m solo.train.lane_study", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/dtp_study"),
                   help="output path without suffix (.json, .md and .png are written)")
    p.add_argument("--run-dir", type=Path, default=Path("runs/dtp_study"), help="checkpoints and logs")
    p.add_argument("--steps", type=int, default=BASE.steps)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default: 1,2)")
    p.add_argument("--max-files", type=int, default=400, help="train files of the corpus (default: 400)")
    p.add_argument("--eval-bytes", type=int, default=150_000, help="held-out text scored at the end (bytes)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    base = replace(BASE, steps=args.steps, max_files=args.max_files)
    t_start = time.monotonic()

    corpus = load_corpus(heldout_permille=base.heldout_permille, max_files=base.max_files)
    tokenizer = train_tokenizer([f.text for f in corpus.train], base.vocab_size, n_texts=len(corpus.train))
    train_tokens = pack_documents(encode_documents(tokenizer, [f.text for f in corpus.train]))
    heldout_stream = pack_documents(encode_documents(tokenizer, [f.text for f in corpus.heldout]))
    eval_files = select_eval_subset(corpus.heldout, target_bytes=args.eval_bytes)
    eval_docs = encode_documents(tokenizer, [f.text for f in eval_files])
    eval_bytes = sum(f.n_bytes for f in eval_files)
    bos, eos, pad = (tokenizer.token_to_id(t) for t in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN))
    print(f"corpus: {len(corpus.train)} train files, {len(train_tokens):,} tokens; held-out scored: "
          f"{len(eval_files)} files, {eval_bytes:,} bytes", flush=True)

    runs = []
    for label, overrides in variants(args.lanes, base.num_layers):
        for seed in seeds:
            cfg = replace(base, seed=seed, **overrides)
            cfg.validate()
            torch.manual_seed(seed)
            model = build_lane_model(cfg, bos, eos, pad)
            schedule = BatchSchedule(train_tokens, cfg.context, cfg.batch_size, cfg.seed)
            name = f"{label.split(' (')[0].replace(' ', '_').replace(',', '').replace('=', '')}-seed{seed}"
            run_dir = args.run_dir / name
            run_dir.mkdir(parents=True, exist_ok=True)
            trainer = Trainer(model, cfg, schedule, heldout_stream, run_dir, torch.device("cpu"), None, False,
                              log=lambda line, n=name: print(f"[{n}] {line}", flush=True))
            state = trainer.train()
            result = evaluate_documents(model, eval_docs, eval_bytes, cfg.context, stride=cfg.stride, batch_size=8,
                                        device="cpu", pad_id=pad)
            curve = [(r["step"], r["heldout_loss"]) for r in state.history if "heldout_loss" in r]
            runs.append({"variant": label, "seed": seed, "bits_per_byte": result.bits_per_byte,
                         "loss": result.loss, "train_time_s": state.elapsed_s, "steps": state.step,
                         "tokens": state.tokens_seen, "parameters": count_parameters(model), "curve": curve,
                         "config": cfg.to_dict()})
            print(f"[{name}] held-out {result.bits_per_byte:.4f} bits/byte", flush=True)

    report = {
        "command": "python -m solo.train.lane_study " + _quoted_args(sys.argv[1:] if argv is None else argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_time_s": time.monotonic() - t_start,
        "torch": torch.__version__, "python": platform.python_version(), "threads": args.threads,
        "cpu": cpu_model(), "corpus_train_files": len(corpus.train), "train_stream_tokens": int(len(train_tokens)),
        "heldout_scored_files": len(eval_files), "heldout_scored_bytes": eval_bytes, "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_table(report))
    _plot(report, args.out.with_suffix(".png"))
    print(render_table(report))
    return 0


def _quoted_args(argv: list[str]) -> str:
    # The run folder is a local detail: the command is quoted without it.
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--run-dir":
            skip = True
        elif not arg.startswith("--run-dir="):
            out.append(arg)
    return " ".join(out)


def render_table(report: dict) -> str:
    """The Markdown table of the study: per variant, held-out bits/byte per seed and their mean."""
    by_variant: dict[str, list[dict]] = {}
    for run in report["runs"]:
        by_variant.setdefault(run["variant"], []).append(run)
    first = report["runs"][0]
    cfg = first["config"]
    lines = [
        "# DTP quality study (small scale)",
        "",
        f"Command: `{report['command']}`; CPU: {report['cpu']}, {report['threads']} thread(s), "
        f"torch {report['torch']}; "
        f"{report['wall_time_s'] / 60:.1f} min in all, on a machine shared with other work (times are noisy, "
        "losses are not: same seeds give the same numbers).",
        "",
        f"Every run: {first['parameters']:,} parameters ({cfg['num_lanes']} lanes; hidden {cfg['hidden_size']}, "
        f"{cfg['num_layers']} layers, {cfg['num_heads']} query / {cfg['num_kv_heads']} KV heads, FFN "
        f"{cfg['ffn_size']}, vocab {cfg['vocab_size']}, context {cfg['context']}), {first['steps']} steps of "
        f"{cfg['batch_size']} x {cfg['context']} tokens ({first['tokens']:,} tokens), AdamW lr {cfg['lr']}, float32; "
        f"the same token stream and order per seed. Held-out: {report['heldout_scored_files']} CPython stdlib "
        f"files never trained on ({report['heldout_scored_bytes']:,} bytes), bits per byte of their text.",
        "",
        "| variant | " + " | ".join(f"seed {r['seed']}" for r in next(iter(by_variant.values())))
        + " | mean bits/byte | vs dense |",
        "|---|" + "---|" * (len(next(iter(by_variant.values()))) + 2),
    ]
    dense_mean = statistics.mean(r["bits_per_byte"] for r in next(iter(by_variant.values())))
    for variant, runs in by_variant.items():
        mean = statistics.mean(r["bits_per_byte"] for r in runs)
        cells = " | ".join(f"{r['bits_per_byte']:.4f}" for r in runs)
        lines.append(f"| {variant} | {cells} | {mean:.4f} | {100 * (mean / dense_mean - 1):+.2f}% |")
    lines += ["", f"A small-scale result ({first['parameters'] / 1e6:.1f}M parameters, {first['steps']} steps, "
              f"{len(next(iter(by_variant.values())))} seeds): it shows how the variants order this early in "
              "training at this size, and does not predict how they compare for large models trained long.", ""]
    return "\n".join(lines)


def _plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_variant: dict[str, list[dict]] = {}
    for run in report["runs"]:
        by_variant.setdefault(run["variant"], []).append(run)
    for variant, runs in by_variant.items():
        steps = [s for s, _ in runs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][1] for r in runs) for i in range(len(steps))]
        ax.plot(steps, mean, marker="o", markersize=3, label=variant)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("held-out loss estimate (nats/token, mean of seeds)")
    ax.set_title("DTP quality study (small scale, CPU)")
    ax.set_ylim(top=min(ax.get_ylim()[1], 6.0))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
