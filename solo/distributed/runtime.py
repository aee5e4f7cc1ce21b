"""The tensor-parallel decode runtime: rank 0 drives, the other ranks follow.

Rank 0 owns the tokenizer, sampling and the API; its `TPRuntime` is an ordinary `DecodeRuntime` to the
engine. Each call first broadcasts a small command (reserve / prefill / decode, with the token ids) on a
gloo control group, then every rank runs its shard of the model and the collectives inside it; rank 0
gets the full logits. Followers sit in `TPRuntime.follow`. While idle, rank 0 pings the followers every few
seconds, so a rank that died is noticed without a request; a failed collective marks the runtime dead,
raises a `SoloError`, and ends the process shortly after (a server reports unhealthy and exits rather than
hanging). A rank that stops without dying (stopped, frozen) would leave a call blocked until gloo's timeout
(minutes): each follower beats a counter in the process group's store every second, and rank 0 marks the
runtime dead when a call has been blocked for `STALL_S` while a rank's counter stood still as long.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import threading
import time

import torch
import torch.distributed as dist

from solo.distributed.sharding import kv_heads_in_memory
from solo.errors import EngineFailedError, SoloError
from solo.model.transformer import KVCache

_log = logging.getLogger("solo.distributed")

OP_STOP, OP_RESERVE, OP_PREFILL, OP_DECODE, OP_PING = range(5)
PING_INTERVAL_S = 5.0
EXIT_AFTER_FAILURE_S = 3.0
HEARTBEAT_S = 1.0
STALL_S = 15.0
"""A call blocked this long, with a rank whose heartbeat stood still as long: that rank stopped answering."""


def _default_store() -> dist.Store | None:
    # The process group's rendezvous store (a TCPStore every rank reaches), or None where there is none.
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 (private API: without it, gloo's own timeout is the bound)
        return None


def _beat_key(rank: int) -> str:
    return f"solo/heartbeat/{rank}"


class RankFailure(EngineFailedError):
    """A tensor-parallel rank stopped answering (it died, or its connection broke)."""


class TPRuntime:
    """A decode runtime over N ranks (see the module docstring).

    Args:
        model: this rank's shard (`TPTransformer` or a `LaneTransformer` shard), with `cache_config`.
        comm: its `DistLanes` (its `stats` count blocked time).
        control: the gloo group commands go over.
        exit_on_failure: rank 0 ends its own process after a rank failure (SIGTERM, then exit status 1).

    Attributes:
        failed: why the runtime stopped, or None while healthy.
        kv_heads_in_memory: KV heads per layer whose cache the memory of `device` holds, for sizing the KV
            cache (`sharding.kv_heads_in_memory`: every local rank's on the CPU, rank 0's on CUDA); None for
            lane models (the model's count).
    """

    batch_invariant = False

    def __init__(self, model: torch.nn.Module, comm: object, control: dist.ProcessGroup,
                 exit_on_failure: bool = True) -> None:
        self.model = model
        self.config = model.config
        self.device = model.device
        self.comm = comm
        self.control = control
        self.rank, self.world = comm.rank, comm.world
        self.name = f"eager-tp{self.world}"
        self.kv_heads_in_memory: int | None = None
        if self.config.lanes is None:
            local = os.environ.get("LOCAL_WORLD_SIZE")  # torchrun: the ranks on this host
            self.kv_heads_in_memory = kv_heads_in_memory(self.config, self.world, self.device.type,
                                                         int(local) if local and local.isdigit() else None)
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        self.failed: str | None = None
        self.exit_on_failure = exit_on_failure
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._call_since: float | None = None  # when the call in progress started (rank 0)
        self._closed = False
        if self.rank == 0:
            threading.Thread(target=self._keepalive, name="solo-tp-ping", daemon=True).start()
            store = _default_store() if self.world > 1 else None
            if store is not None:
                threading.Thread(target=self._watchdog, args=(store,), name="solo-tp-watchdog", daemon=True).start()

    # --------------------------------------------------------------------------------------- rank 0

    def _send(self, op: int, a: int = 0, b: int = 0, c: int = 0, payload: torch.Tensor | None = None) -> None:
        header = torch.tensor([op, a, b, c], dtype=torch.int64)
        dist.broadcast(header, 0, group=self.control)
        if payload is not None:
            dist.broadcast(payload.to(torch.int64).contiguous().cpu(), 0, group=self.control)

    def _call(self, op: int, a: int, b: int, c: int, payload: torch.Tensor | None, local):  # noqa: ANN001, ANN202
        if self.failed is not None:
            raise RankFailure(f"tensor parallelism stopped: {self.failed}")
        with self._lock:
            if self._closed:
                # close() may have destroyed the process group while the keep-alive thread waited for the
                # lock; a collective on a destroyed group aborts the process instead of raising.
                raise SoloError("tensor parallelism is closed")
            self._call_since = time.monotonic()
            try:
                self._send(op, a, b, c, payload)
                out = local()
            except (RuntimeError, dist.DistError) as exc:
                if self.failed is not None:  # the watchdog named the rank already
                    raise RankFailure(f"tensor parallelism stopped: {self.failed}") from None
                self._fail(exc)
            finally:
                self._call_since = None
            self._last = time.monotonic()
            return out

    def _fail(self, exc: BaseException) -> None:
        # Which rank, where rank 0 started them (`followers`: their processes); gloo says only "Connection
        # closed by peer [address]:port" behind its source location.
        gone = [rank for rank, proc in enumerate(getattr(self, "followers", []), start=1) if proc.poll() is not None]
        detail = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
        who = f"rank {', '.join(map(str, gone))} exited" if gone else "a rank stopped answering"
        self._mark_failed(f"{who} ({detail})")
        raise RankFailure(f"tensor parallelism stopped: {self.failed}") from None

    def _watchdog(self, store: dist.Store) -> None:
        # Rank 0: a call blocked for STALL_S while a rank's heartbeat stood still as long (see the module
        # docstring). Ranks that never beat (another launcher's) are not watched.
        seen: dict[int, tuple[int, float]] = {}
        previous = time.monotonic()
        while not self._closed and self.failed is None:
            time.sleep(HEARTBEAT_S)
            now = time.monotonic()
            if now - previous > 3 * HEARTBEAT_S:  # this process was not running either (a stopped process
                seen.clear()  # group, a paused container): what stood still meanwhile says nothing of a rank
            previous = now
            for rank in range(1, self.world):
                try:
                    beat = store.add(_beat_key(rank), 0)
                except Exception:  # noqa: BLE001 (the store went away: the collectives report it)
                    return
                last = seen.get(rank)
                if last is None or beat != last[0]:
                    seen[rank] = (beat, now)
                    continue
                since = self._call_since
                if beat > 0 and now - last[1] >= STALL_S and since is not None and now - since >= STALL_S:
                    self._mark_failed(f"rank {rank} stopped answering: its heartbeat stood still for "
                                      f"{now - last[1]:.0f} s while a call waited for it (a stopped or hung process)")
                    return

    def _heartbeat(self, store: dist.Store) -> None:
        # Followers: one beat a second while the process runs (see `_watchdog`).
        key = _beat_key(self.rank)
        while not self._closed:
            try:
                store.add(key, 1)
            except Exception:  # noqa: BLE001 (rank 0 went away: the next collective reports it)
                return
            time.sleep(HEARTBEAT_S)

    def _mark_failed(self, reason: str) -> None:
        self.failed = reason
        _log.error("tensor parallelism failed: %s; exiting", self.failed)
        if self.exit_on_failure:
            def end() -> None:
                # SIGTERM: a server drains (health 503) and shuts down; the exit status is 1 either way.
                atexit.register(os._exit, 1)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30.0)
                os._exit(1)

            timer = threading.Timer(EXIT_AFTER_FAILURE_S, end)
            timer.daemon = True  # a `solo run` that already reported the failure exits with its own status
            timer.start()

    def _keepalive(self) -> None:
        while not self._closed and self.failed is None:
            time.sleep(1.0)
            if time.monotonic() - self._last < PING_INTERVAL_S or self._closed:
                continue
            try:
                self._call(OP_PING, 0, 0, 0, None, lambda: None)
            except SoloError:
                return

    def reserve(self, rows: int, max_seq: int) -> None:
        """See `DecodeRuntime.reserve` (every rank allocates its KV heads' share)."""
        self._call(OP_RESERVE, rows, max_seq, 0, None, lambda: self._reserve(rows, max_seq))

    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """See `DecodeRuntime.prefill`: float32 [vocab] logits of the last position (on rank 0)."""
        ids = token_ids.view(-1).to(torch.int64).cpu()
        self._check(row, start_pos + ids.numel())
        return self._call(OP_PREFILL, row, start_pos, ids.numel(), ids, lambda: self._prefill(row, ids, start_pos))

    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """See `DecodeRuntime.decode`: float32 [batch, vocab] logits (on rank 0)."""
        packed = torch.stack([rows.view(-1).cpu(), token_ids.view(-1).cpu(), positions.view(-1).cpu()]).to(torch.int64)
        self._check(int(packed[0].max()), int(packed[2].max()) + 1)
        return self._call(OP_DECODE, packed.shape[1], 0, 0, packed, lambda: self._decode(packed))

    def close(self) -> None:
        """Rank 0: tell the followers to exit and leave the process group (idempotent)."""
        if self._closed or self.rank != 0:
            return
        self._closed = True
        with self._lock:
            if self.failed is None:
                try:
                    self._send(OP_STOP)
                except (RuntimeError, dist.DistError):
                    pass
            if dist.is_initialized():
                dist.destroy_process_group()
            # Our references kept the gloo group, and so its worker threads, alive into interpreter
            # shutdown, where a worker releasing the last reference to a tensor needs the GIL and aborts
            # the process ("terminate called without an active exception"); the last reference goes here,
            # which joins those threads while Python still runs.
            self.control = None
            self.comm.group = None

    def _check(self, row: int, end: int) -> None:
        if self.cache is None:
            raise SoloError("no KV cache reserved; call reserve(rows, max_seq) first")
        if not 0 <= row < self.rows or end > self.max_seq:
            raise SoloError(f"row {row} / position {end - 1} is outside the reserved cache ({self.rows} rows of "
                            f"{self.max_seq} tokens)")

    # ---------------------------------------------------------------------------------- every rank

    def _reserve(self, rows: int, max_seq: int) -> None:
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        rows, max_seq = max(rows, self.rows), max(max_seq, self.max_seq)
        self.cache = None  # free the old cache before allocating the new one
        self.cache = KVCache(self.model.cache_config, rows, max_seq, self.model.dtype, self.device)
        self.rows, self.max_seq = rows, max_seq  # (after it: a failed allocation leaves the old sizes)

    @torch.inference_mode()
    def _prefill(self, row: int, ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        ids = ids.to(self.device).view(1, -1)
        positions = torch.arange(start_pos, start_pos + ids.shape[1], device=self.device).view(1, -1)
        rows = torch.tensor([row], device=self.device)
        return self.model(ids, positions, self.cache, rows, last_only=True)[0, -1].float()

    @torch.inference_mode()
    def _decode(self, packed: torch.Tensor) -> torch.Tensor:
        packed = packed.to(self.device)
        rows, ids, positions = packed[0], packed[1].view(-1, 1), packed[2].view(-1, 1)
        return self.model(ids, positions, self.cache, rows, last_only=True)[:, -1].float()

    def follow(self) -> None:
        """Followers (rank > 0): run rank 0's commands until it says stop.

        Raises:
            RankFailure: rank 0 (or another rank) went away.
        """
        header = torch.empty(4, dtype=torch.int64)
        store = _default_store()
        if store is not None:
            self._heartbeat_thread = threading.Thread(target=self._heartbeat, args=(store,), name="solo-tp-heartbeat",
                                                      daemon=True)
            self._heartbeat_thread.start()
        try:
            self._follow(header)
        finally:
            self._closed = True  # (the heartbeat stops)

    def leave(self) -> None:
        """Followers, after `follow` returned: leave the process group and let go of it while Python runs.

        As rank 0's `close`: references to the gloo group kept its worker threads alive into interpreter
        shutdown, where one can abort the process ("terminate called without an active exception", exit -6:
        a torchrun job's follower failed that way about one run in seven).
        """
        self._closed = True
        beat = getattr(self, "_heartbeat_thread", None)
        if beat is not None:
            beat.join(timeout=HEARTBEAT_S + 1.0)  # (it holds the store the group was made from)
        if dist.is_initialized():
            dist.destroy_process_group()
        self.control = None
        self.comm.group = None

    def _follow(self, header: torch.Tensor) -> None:
        while True:
            try:
                dist.broadcast(header, 0, group=self.control)
                op, a, b, c = header.tolist()
                if op == OP_STOP:
                    return
                if op == OP_RESERVE:
                    self._reserve(a, b)
                elif op == OP_PREFILL:
                    ids = torch.empty(c, dtype=torch.int64)
                    dist.broadcast(ids, 0, group=self.control)
                    self._prefill(a, ids, b)
                elif op == OP_DECODE:
                    packed = torch.empty(3, a, dtype=torch.int64)
                    dist.broadcast(packed, 0, group=self.control)
                    self._decode(packed)
            except (RuntimeError, dist.DistError) as exc:
                raise RankFailure(f"rank {self.rank}: lost rank 0 ({str(exc).splitlines()[0]})") from None
