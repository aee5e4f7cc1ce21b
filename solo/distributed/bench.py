"""`solo bench --tp N`: decode speed over N ranks and the time ranks spend blocked on communication.

For a `--shape`, the same shape is run as several variants, each in N freshly spawned ranks with random
weights built directly as each rank's shard: standard TP (every module all-reduced at once: Megatron-style
for a dense shape, delay 0 for a lane shape) and DTP at delays 1 and 2 (the shape as a lane model with its
own lane count, or N lanes for a dense shape). For a MODEL folder the model itself is run. Every rank runs
the same greedy loop (the logits are gathered on every rank, so each picks the same token); per decode token
the report gives the wall time and the time blocked in collective waits (`CommStats`), the largest over
ranks and rank 0's.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from solo.errors import SoloError
from solo.model.config import ModelConfig


def variant_configs(config: ModelConfig, world: int) -> list[tuple[str, ModelConfig]]:
    """(label, config) of standard TP and DTP d = 1, 2 for a shape's config.

    DTP's lanes need the KV heads to divide into `world` lanes: a shape with fewer KV heads than ranks runs
    standard TP only, as does one with partial rotary embeddings (Phi-4-mini), which lane models do not take.
    """
    from solo.model.config import LaneConfig
    from solo.model.lane_config import default_broadcast_flags

    n = config.num_layers
    base = config.lanes or LaneConfig(num_lanes=world)
    out: list[tuple[str, ModelConfig]] = []
    if config.lanes is None:
        out.append(("standard TP (Megatron, dense)", config))
        if config.num_kv_heads % world:  # a lane owns 1/L of the KV heads: none to give with fewer heads than lanes
            return out
        if config.rotary_dim is not None:  # lanes rotate interleaved pairs of the whole head
            return out
    for delay in (0, 1, 2):
        if delay == 0 and config.lanes is None:
            continue
        flags = default_broadcast_flags(n, delay, base.use_early_comm)
        lanes = replace(base, broadcast_delay=delay, broadcast_attention_to_future=flags,
                        broadcast_mlp_to_future=flags)
        label = "standard TP (lanes, d=0)" if delay == 0 else f"DTP d={delay} ({lanes.num_lanes} lanes)"
        out.append((label, replace(config, lanes=lanes, rope_interleaved=True)))
    return out


@torch.no_grad()
def random_shard(config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """The shard of `config` this rank holds, with random weights (N(0, 0.02^2), norms 1), built directly."""
    from solo.distributed.comm import DistLanes
    from solo.distributed.sharding import (
        TPTransformer,
        attach_lane_cache_config,
        check_tp,
        kv_heads_of_rank,
        lane_shard,
    )
    from solo.model.lanes import LaneRotary, LaneTransformer
    from solo.model.rope import RotaryEmbedding
    from solo.model.transformer import Transformer

    comm = DistLanes(vocab_size=config.vocab_size)
    check_tp(config, comm.world)
    w = comm.world
    if config.lanes is not None:
        with torch.device("meta"):
            model = LaneTransformer(config, lane_shard(config, w, comm.rank), comm)
    else:
        kv = kv_heads_of_rank(config, w, comm.rank)[1]
        local_cfg = replace(config, num_heads=config.num_heads // w, num_kv_heads=kv,
                            intermediate_size=config.intermediate_size // w, tie_word_embeddings=False)
        with torch.device("meta"):
            local = Transformer(local_cfg)
            local.lm_head = torch.nn.Linear(config.hidden_size, -(-config.vocab_size // w), bias=False)
        model = local
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed + comm.rank)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
    if config.lanes is not None:
        model.rotary = LaneRotary(config).to(device)
        return attach_lane_cache_config(model.eval())
    model.rotary = RotaryEmbedding(model.config).to(device)
    n = config.num_layers
    return TPTransformer(model.eval(), config, comm, [None] * n, [None] * n)


def bench_rank(job: dict[str, Any], rank: int) -> int:
    """One rank of one benchmark variant (forked by `solo.distributed.zygote`); rank 0 posts the timings.

    Returns:
        The exit status (0).
    """
    from solo.bench.shapes import shape_config
    from solo.distributed.launch import TIMEOUT, load_shard
    from solo.engine.engine import load_dtype
    from solo.model.hub import resolve_dtype
    from solo.model.transformer import KVCache

    world = job["world"]
    torch.set_num_threads(job["threads"])
    store = dist.TCPStore("127.0.0.1", job["port"], world, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=dist.PrefixStore(job["name"], store), rank=rank, world_size=world,
                            timeout=TIMEOUT)
    device = torch.device("cpu")
    if job["folder"]:
        config = ModelConfig.from_file(job["folder"])
        dtype = load_dtype(job["dtype"], config, Path(job["folder"]), device, tp=world)  # (as Engine.load's)
        model = load_shard(Path(job["folder"]), config, dtype, device)
    else:
        config = variant_configs(shape_config(job["shape"]), world)[job["variant"]][1]
        dtype = resolve_dtype(job["dtype"], config.torch_dtype)
        model = random_shard(config, dtype, device, job["seed"])
    comm = model.comm
    prompt, gen_len = job["prompt"], job["gen_len"]
    cache = KVCache(model.cache_config, 1, len(prompt) + gen_len + 1, dtype, device)
    rows = torch.zeros(1, dtype=torch.long)

    def generate(ids: list[int], steps: int) -> tuple[float, float, int]:
        with torch.inference_mode():
            logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, rows, last_only=True)
            token, pos = int(logits[0, -1].argmax()), len(ids)
            dist.barrier()
            comm.stats.reset()
            start = time.perf_counter()
            for _ in range(steps):
                logits = model(torch.tensor([[token]]), torch.tensor([[pos]]), cache, rows, last_only=True)
                token, pos = int(logits[0, -1].argmax()), pos + 1
            return time.perf_counter() - start, comm.stats.blocked_s, comm.stats.collectives

    generate(prompt[:8], 4)  # warm-up
    runs = [generate(prompt, gen_len - 1) for _ in range(job["repeats"])]
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, runs)
    if rank == 0:
        store.set(job["name"] + "/result", json.dumps(per_rank))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _run_variant(job: dict[str, Any], timeout_s: float = 900.0) -> list[list[list[float]]]:
    from solo.distributed.launch import TIMEOUT
    from solo.distributed.zygote import fork

    world = job["world"]
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    job = dict(job, port=store.port)
    procs = [fork("solo.distributed.bench:bench_rank", [job, rank]) for rank in range(world)]
    key = job["name"] + "/result"
    deadline = time.monotonic() + timeout_s
    try:
        while not store.check([key]):
            if any(p.poll() is not None for p in procs):
                raise SoloError("a tensor-parallel rank of the benchmark exited early (see its message above)")
            if time.monotonic() > deadline:
                raise SoloError(f"the tensor-parallel benchmark did not finish within {timeout_s:.0f} s")
            time.sleep(0.05)
        return json.loads(store.get(key))
    finally:
        for p in procs:
            if p.wait(30) is None:
                p.kill()


def main_tp(args: Any) -> int:  # noqa: ANN401
    """Run `solo bench --tp N` (CPU, gloo); prints a table and writes --json.

    Raises:
        SoloError: --tp below 2, CUDA asked for, or a shape / model that cannot be split that way.
    """
    from solo.bench.report import machine_info, report_command, versions
    from solo.bench.shapes import shape_config
    from solo.distributed.launch import default_threads
    from solo.distributed.sharding import check_tp
    from solo.model.hub import resolve_model_dir

    world = args.tp
    if world < 2:
        raise SoloError(f"--tp must be >= 2 for the communication benchmark, got {world}")
    if args.device != "cpu":
        raise SoloError("solo bench --tp runs on the CPU (gloo) for now; use --device cpu")
    if args.model and args.shape:
        raise SoloError("give either MODEL or --shape, not both")
    if args.prompt_len < 1 or args.gen_len < 2 or args.repeats < 1:
        raise SoloError("--prompt-len must be >= 1, --gen-len >= 2 and --repeats >= 1")
    threads = args.threads or default_threads(world)
    rng = random.Random(args.seed)
    if args.shape:
        config = shape_config(args.shape)
        variants = variant_configs(config, world)
        label = f"{args.shape} (random weights)"
    else:
        folder = resolve_model_dir(args.model, args.revision)
        config = ModelConfig.from_file(folder)
        variants = [("model as trained", config)]
        label = str(args.model or folder.name)
    for _, cfg in variants:
        check_tp(cfg, world)
    if args.prompt_len + args.gen_len + 1 > config.context_length:
        raise SoloError(f"prompt + generation exceeds the model's context of {config.context_length}")
    prompt = [rng.randrange(3, config.vocab_size) for _ in range(args.prompt_len)]
    dtype_name = args.dtype if args.dtype != "auto" else (config.torch_dtype or "float32")
    report: dict[str, Any] = {
        "command": report_command(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": label, "tp": world, "backend": "gloo (CPU)",
        "dtype": dtype_name, "threads_per_rank": threads, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
        "repeats": args.repeats, "machine": machine_info(torch.device("cpu")), "versions": versions(),
        "variants": {},
    }
    for index, (name, _) in enumerate(variants):
        print(f"running {name} on {world} ranks ...", file=sys.stderr)
        job = dict(name=f"variant{index}", world=world, shape=args.shape, variant=index,
                   folder=None if args.shape else str(folder), dtype=dtype_name, seed=args.seed, prompt=prompt,
                   gen_len=args.gen_len, repeats=args.repeats, threads=threads)
        per_rank = _run_variant(job)
        tokens = args.gen_len - 1
        wall = [min(r[0] for r in runs) / tokens for runs in per_rank]
        blocked = [min(r[1] for r in runs) / tokens for runs in per_rank]
        report["variants"][name] = {
            "ms_per_token": 1e3 * max(wall), "tokens_per_s": 1.0 / max(wall),
            "blocked_ms_per_token_max_rank": 1e3 * max(blocked), "blocked_ms_per_token_rank0": 1e3 * blocked[0],
            "blocked_fraction": max(blocked) / max(wall),
            "collectives_per_token": per_rank[0][0][2] / tokens,
            "per_rank_blocked_ms_per_token": [1e3 * b for b in blocked],
        }
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _print(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"model: {r['model']} | {r['dtype']} | --tp {r['tp']} over {r['backend']}, {r['threads_per_rank']} "
          f"thread{'' if r['threads_per_rank'] == 1 else 's'} per rank | {m['cpu']}, {m['cpu_cores']} cores")
    print(f"prompt {r['prompt_len']} tokens, {r['gen_len']} generated, best of {r['repeats']} runs per rank")
    print(f"{'variant':<34} {'ms/token':>9} {'blocked ms/token':>17} {'rank 0':>8} {'blocked':>8} {'colls/tok':>9}")
    for name, v in r["variants"].items():
        print(f"{name:<34} {v['ms_per_token']:>9.2f} {v['blocked_ms_per_token_max_rank']:>17.2f} "
              f"{v['blocked_ms_per_token_rank0']:>8.2f} {v['blocked_fraction']:>8.0%} "
              f"{v['collectives_per_token']:>9.1f}")
    print("blocked = time inside collective waits (all-reduce / all-gather), largest over ranks; a shared machine "
          "makes these numbers noisy")
