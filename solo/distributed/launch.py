"""Starting tensor-parallel ranks: `--tp N` spawns N - 1 follower processes itself, or runs under `torchrun`.

Under `torchrun` (or any launcher that sets the standard `RANK` / `WORLD_SIZE` / `MASTER_ADDR` /
`MASTER_PORT` variables, so several machines work the same way) every process runs the same `solo` command:
rank 0 does the command's work, the others load their shard and follow (`run_torchrun_follower`). The
backend is gloo on CPU and NCCL on CUDA (rank r on cuda:LOCAL_RANK); commands always go over a gloo group.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

# Imported before any process group exists: its functions take `group=group.WORLD` as a default argument,
# so a first import after `init_process_group` (torch imports it lazily, from torch._dynamo) would pin the
# default group forever and its gloo worker threads would outlive `destroy_process_group` into interpreter
# shutdown, where they can abort the process.
import torch.distributed.nn  # noqa: F401

from solo.cpus import affinity_cpus, threads_within_cpu_limit
from solo.env import EnvSettingError, env_int
from solo.errors import SoloError
from solo.model.config import ModelConfig

_log = logging.getLogger("solo.distributed")
TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class RankSpec:
    """What a spawned follower needs to load its shard.

    Attributes:
        folder: the resolved model folder.
        dtype: torch dtype name of the weights ("float32", ...).
        device_type: "cpu" or "cuda".
        world: number of ranks.
        init_method: the rendezvous URL ("tcp://127.0.0.1:PORT").
        threads: CPU threads per rank.
        context_length: the context rank 0 loaded the model with (`ModelConfig.with_context_length`).
    """

    folder: str
    dtype: str
    device_type: str
    world: int
    init_method: str
    threads: int
    context_length: int | None = None


def torchrun_world() -> tuple[int, int, int] | None:
    """(rank, world, local rank) from the standard environment variables, or None outside a launcher.

    Outside a launcher: WORLD_SIZE or RANK unset (or empty). LOCAL_RANK defaults to RANK.

    Raises:
        EnvSettingError: one of them is not a whole number, or RANK / LOCAL_RANK is not below WORLD_SIZE.
    """
    if not os.environ.get("WORLD_SIZE", "").strip() or not os.environ.get("RANK", "").strip():
        return None
    world = env_int("WORLD_SIZE", 1, 1, 1 << 20)
    rank = env_int("RANK", 0, 0, world - 1)
    return rank, world, env_int("LOCAL_RANK", rank, 0, world - 1)


def _env_rendezvous_group(device_type: str, world: int, rank: int) -> dist.ProcessGroup:
    # The launcher's rendezvous (MASTER_ADDR, MASTER_PORT: torchrun sets both), checked first: torch's own errors
    # for them are a ValueError traceback.
    if not os.environ.get("MASTER_ADDR", "").strip() or not os.environ.get("MASTER_PORT", "").strip():
        raise EnvSettingError("WORLD_SIZE and RANK are set but MASTER_ADDR or MASTER_PORT is not: start the ranks "
                              "with torchrun (which sets all four), or set MASTER_ADDR and MASTER_PORT")
    env_int("MASTER_PORT", 0, 1, 65535)
    return init_group(device_type, "env://", world, rank)


def default_threads(world: int) -> int:
    """CPU threads per rank when `world` ranks share the CPUs this process may use, at least 1.

    The CPUs: the affinity mask's, within the container's CPU quota (`solo.cpus`).
    """
    return max(1, threads_within_cpu_limit(affinity_cpus()) // world)


def rank_device(device_type: str, local_rank: int) -> torch.device:
    """The device of this rank: the CPU, or cuda:LOCAL_RANK."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_group(device_type: str, init_method: str, world: int, rank: int) -> dist.ProcessGroup:
    """Join the process group (gloo on CPU, NCCL on CUDA); returns the gloo group commands go over."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, world_size=world, rank=rank, timeout=TIMEOUT)
    return dist.new_group(backend="gloo", timeout=TIMEOUT) if backend != "gloo" else dist.group.WORLD


def load_shard(folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """Load this rank's shard of a checkpoint (each rank reads the checkpoint, keeps its slices).

    Raises:
        SoloError: the model cannot be split into this many ranks; checkpoint errors as `load_weights`.
    """
    from solo.distributed.comm import DistLanes
    from solo.distributed.sharding import attach_lane_cache_config, check_tp, lane_shard, shard_dense
    from solo.model.weights import load_lane_weights, load_weights

    comm = DistLanes(vocab_size=config.vocab_size)
    check_tp(config, comm.world)
    if config.lanes is not None:
        shard = lane_shard(config, comm.world, comm.rank)
        return attach_lane_cache_config(load_lane_weights(folder, config, dtype, device, shard, comm))
    return shard_dense(load_weights(folder, config, dtype, device), comm)


def follower_main(spec: RankSpec | dict, rank: int) -> int:
    """A spawned follower (forked by `solo.distributed.zygote`): join, load the shard, follow.

    Returns:
        The exit status: 0, or 1 when rank 0 went away or the shard could not load.
    """
    from solo.distributed.runtime import RankFailure, TPRuntime
    from solo.model.hub import resolve_dtype

    spec = spec if isinstance(spec, RankSpec) else RankSpec(**spec)
    logging.basicConfig(level=logging.WARNING, format=f"solo rank {rank}: %(message)s")
    torch.set_num_threads(spec.threads)
    host, port = spec.init_method.removeprefix("tcp://").rsplit(":", 1)
    store = dist.TCPStore(host, int(port), spec.world, is_master=False, timeout=TIMEOUT)
    store.set(f"ready{rank}", "1")
    backend = "nccl" if spec.device_type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=spec.world, timeout=TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend != "gloo" else dist.group.WORLD
    device = rank_device(spec.device_type, rank)
    try:
        config = _config(spec.folder, spec.context_length)
        model = load_shard(Path(spec.folder), config, resolve_dtype(spec.dtype, config.torch_dtype), device)
        runtime = TPRuntime(model, model.comm, control, exit_on_failure=False)
        runtime.follow()
    except (RankFailure, SoloError) as exc:
        _log.error("%s", exc)
        return 1
    control = None
    runtime.leave()
    return 0


def _spawn_followers(spec: RankSpec) -> tuple[dist.TCPStore, list]:
    # Rank 0 waits for the followers to join while watching that they are alive (never a silent hang).
    from solo.distributed.zygote import fork

    store = dist.TCPStore("127.0.0.1", 0, spec.world, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    payload = asdict(replace(spec, init_method=f"tcp://127.0.0.1:{store.port}"))
    procs = [fork("solo.distributed.launch:follower_main", [payload, rank]) for rank in range(1, spec.world)]
    _SPAWNED.extend(procs)
    keys = [f"ready{rank}" for rank in range(1, spec.world)]
    deadline = time.monotonic() + TIMEOUT.total_seconds()
    while not store.check(keys):
        for rank, proc in enumerate(procs, start=1):
            if proc.poll() is not None:
                _stop(procs)
                raise SoloError(f"tensor-parallel rank {rank} exited (status {proc.returncode}) before joining; see "
                                "its message above")
        if time.monotonic() > deadline:
            _stop(procs)
            raise SoloError(f"tensor-parallel ranks did not join within {TIMEOUT.total_seconds():.0f} s")
        time.sleep(0.02)
    return store, procs


def _stop(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()


_SPAWNED: list = []  # every follower this process spawned (`stop_spawned_ranks`)


def stop_spawned_ranks() -> None:
    """Terminate every follower rank this process spawned that still runs.

    A server stopped while its model loads exits without the runtime's own shutdown.
    """
    _stop(_SPAWNED)


def start_ranks(folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: int,
                threads: int | None = None) -> object:
    """Become rank 0 of `tp` ranks (spawning the others, or joining a torchrun job) and load our shard.

    Args:
        folder: the resolved model folder (followers load it too).
        config: its config.
        dtype: weight dtype.
        device: "cpu" or a CUDA device (rank r uses cuda:r).
        tp: number of ranks.
        threads: CPU threads per rank (default: the cores divided by the ranks, at most torch's current
            thread count, so `--threads` is respected).

    Returns:
        The `TPRuntime` of rank 0 (its `followers` are the spawned processes).

    Raises:
        SoloError: a bad --tp, a model that cannot be split that way, a follower that died before joining, a
            torchrun job of another size, or this process is not rank 0 of the torchrun job.
    """
    from solo.distributed.runtime import TPRuntime
    from solo.distributed.sharding import check_tp

    if tp < 1:
        raise SoloError(f"--tp must be >= 1, got {tp}")
    check_tp(config, tp)
    if device.type == "cuda" and torch.cuda.device_count() < tp:
        raise SoloError(f"--tp {tp} needs {tp} GPUs; {torch.cuda.device_count()} are visible")
    launched = torchrun_world()
    procs: list = []
    if launched is not None:
        rank, world, local_rank = launched
        if world != tp:
            raise SoloError(f"--tp {tp} but the launcher started {world} processes (WORLD_SIZE); make them equal")
        if rank != 0:
            raise SoloError("only rank 0 runs the command; the other ranks follow (run_torchrun_follower)")
        control = _env_rendezvous_group(device.type, world, 0)
        device = rank_device(device.type, local_rank)
    else:
        threads = threads or min(torch.get_num_threads(), default_threads(tp))
        torch.set_num_threads(threads)
        spec = RankSpec(str(folder), str(dtype).removeprefix("torch."), device.type, tp, "", threads,
                        config.context_length)
        store, procs = _spawn_followers(spec)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=0, world_size=tp, timeout=TIMEOUT)
        control = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend != "gloo" else dist.group.WORLD
        device = rank_device(device.type, 0)
    try:
        model = load_shard(folder, config, dtype, device)
    except BaseException:
        _stop(procs)
        raise
    runtime = TPRuntime(model, model.comm, control)
    runtime.followers = procs
    atexit.register(runtime.close)  # the followers exit with us
    return runtime


def _config(folder: str | Path, context_length: int | None) -> ModelConfig:
    # The followers' RoPE tables must be rank 0's: the context picks a LongRoPE model's factors.
    config = ModelConfig.from_file(folder)
    return config if context_length is None else config.with_context_length(context_length)


def run_torchrun_follower(model: str | None, dtype: str, device: str, revision: str | None = None,
                          context_length: int | None = None) -> int:
    """Rank > 0 of a torchrun job: load this rank's shard and follow rank 0 until it stops; returns 0.

    `context_length` is the command's --max-model-len (rank 0 loads the model with it too).

    Raises:
        SoloError: as `start_ranks`, or rank 0 went away (exit status 1 from the CLI).
    """
    from solo.distributed.runtime import TPRuntime
    from solo.engine.engine import load_dtype
    from solo.model.hub import resolve_model_dir

    rank, world, local_rank = torchrun_world()
    folder = resolve_model_dir(model, revision)
    config = _config(folder, context_length)
    device_type = torch.device(device).type
    control = _env_rendezvous_group(device_type, world, rank)
    # (the dtype rank 0's Engine.load chooses: config.json's, else the weights' own)
    model_shard = load_shard(folder, config, load_dtype(dtype, config, folder, torch.device(device), tp=world),
                             rank_device(device_type, local_rank))
    runtime = TPRuntime(model_shard, model_shard.comm, control, exit_on_failure=False)
    runtime.follow()
    control = None
    runtime.leave()
    return 0
