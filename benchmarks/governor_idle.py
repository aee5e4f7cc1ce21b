r"""Diagnostic of the thread governor on an idle machine (not a `solo bench` report): steps it ran on fewer threads.

Decodes `--tokens` tokens after a 128-token prompt, `--runs` times per setting of `late_steps` (the steps in a row
with late barrier waits that start a try of one thread fewer; solo/runtime/cpu_threads.py), the settings taking
turns run by run on one runtime (random weights of a bench shape). Prints per setting the decode steps, how many
had late waits (and how many of those came right after another), and how many ran on fewer threads:

    python benchmarks/governor_idle.py --shape Qwen2.5-0.5B --runs 6 --tokens 256 --late-steps 1 2

On an idle machine every step on fewer threads is a loss (about half speed on a 2-core VM). The governor's holds
after a failed try carry from one run to the next (each run's prefill ends a try in progress).
"""

from __future__ import annotations

import argparse

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="Qwen2.5-0.5B", help="a `solo bench --shape` name")
    ap.add_argument("--runs", type=int, default=6, help="runs per setting")
    ap.add_argument("--tokens", type=int, default=256, help="decode steps per run")
    ap.add_argument("--late-steps", type=int, nargs="+", default=[1, 2], help="settings of late_steps to compare")
    args = ap.parse_args()
    model = build_model(shape_config(args.shape), torch.bfloat16)
    runtime = CpuRuntime(model, rows=1, max_seq=128 + args.tokens + 1)
    gov = runtime.threads
    steps: dict[int, list[tuple[int, float, int]]] = {n: [] for n in args.late_steps}
    report = gov.report
    current: list[tuple[int, float, int]] = []

    def logged(late: int, seconds: float, batch: int = 1) -> None:
        current.append((late, seconds, gov._used))
        report(late, seconds, batch)

    gov.report = logged
    ids = torch.randint(0, model.config.vocab_size, (128,), generator=torch.Generator().manual_seed(0))
    for _ in range(args.runs):
        for n in args.late_steps:
            gov.late_steps = n
            runtime.reserve(1, 128 + args.tokens + 1)
            token = int(runtime.prefill(0, ids).argmax())
            current.clear()
            for i in range(args.tokens):
                logits = runtime.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([128 + i]))[0]
                token = int(logits.argmax())
            steps[n].extend(current)
    print(f"{args.shape}, {runtime.threads.max_threads} threads, {args.runs} runs of {args.tokens} decode steps "
          f"per setting, settings in turns")
    for n, log in steps.items():
        late = {i for i, (waits, seconds, _) in enumerate(log) if gov.is_late(waits, seconds)}
        in_a_row = sum(1 for i in late if i - 1 in late)
        fewer = sum(1 for *_, used in log if used < gov.max_threads)
        print(f"late_steps {n}: {len(log)} steps, {len(late)} with late waits ({in_a_row} right after another), "
              f"{fewer} on fewer threads")


if __name__ == "__main__":
    main()
