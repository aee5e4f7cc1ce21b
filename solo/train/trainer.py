"""Training loop for the default model: ``transformers.LlamaForCausalLM`` with AdamW.

The loop is plain PyTorch around the Hugging Face model so the architecture, initialisation and
``save_pretrained`` format are the library's, not ours. It logs training loss, tokens/s and a
held-out loss estimate, checkpoints model + optimiser + RNG + data position every few minutes,
and resumes bit-for-bit in data order from the last checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from solo.train.config import TrainConfig
from solo.train.data import BatchSchedule

CHECKPOINT_NAME = "checkpoint.pt"


def resolve_device(name: str) -> torch.device:
    """Turn ``auto|cpu|cuda`` (or ``cuda:N``) into a device.

    Args:
        name: requested device; ``auto`` picks CUDA when available.

    Returns:
        The :class:`torch.device`.

    Raises:
        RuntimeError: if CUDA is requested but unavailable.
        ValueError: a device other than cpu or cuda.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but CUDA is not available")
    return device


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """Choose the autocast dtype for training and evaluation forward passes.

    Weights and optimiser state always stay float32; only matmul inputs are cast.

    Args:
        device: the training device.
        precision: ``auto`` (bfloat16 where the hardware runs it natively), ``bf16`` or ``fp32``.

    Returns:
        ``torch.bfloat16`` or ``None`` (plain float32).

    Raises:
        ValueError: for an unknown precision.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"unknown precision {precision!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        # Without AVX512-BF16/AMX, bf16 matmuls are emulated and slower than float32.
        native = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return torch.bfloat16 if any(f is not None and f() for f in native) else None
    return None


def build_model(cfg: TrainConfig, bos_id: int, eos_id: int, pad_id: int) -> LlamaForCausalLM:
    """Create a freshly initialised Llama model (seed the RNG before calling).

    Args:
        cfg: shape hyper-parameters (``vocab_size`` must equal the tokenizer's).
        bos_id: BOS token id. eos_id: EOS token id. pad_id: padding token id.

    Returns:
        A float32 :class:`LlamaForCausalLM` with tied input/output embeddings and grouped-query
        attention, using PyTorch's fused scaled-dot-product attention; with ``cfg.num_lanes`` > 0 a lane
        model (:class:`solo.train.lanes.LaneTrainModel`) of the same shape instead.
    """
    if cfg.num_lanes:
        from solo.train.lanes import build_lane_model

        return build_lane_model(cfg, bos_id, eos_id, pad_id)
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.ffn_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Count unique parameters (tied embeddings counted once).

    Args:
        model: any module.

    Returns:
        Number of scalar parameters.
    """
    return sum(p.numel() for p in model.parameters())


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Learning rate for a step: linear warm-up, then cosine decay to ``min_lr_ratio * lr`` over progress.

    Cosine annealing as in Loshchilov & Hutter 2017 ("SGDR", without restarts); the warm-up factor
    multiplies the decayed rate.

    Args:
        cfg: schedule hyper-parameters.
        step: optimiser steps taken so far.
        progress: fraction of the run completed, in ``[0, 1]``.

    Returns:
        The learning rate (float).
    """
    warmup = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return warmup * (floor + (cfg.lr - floor) * cosine)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only (norm gains are not decayed).

    betas (0.9, 0.95), eps 1e-8.

    Args:
        model: the model to optimise.
        cfg: ``lr`` and ``weight_decay``.

    Returns:
        The optimiser.
    """
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def capture_rng() -> dict[str, object]:
    """Snapshot torch's CPU (and CUDA, if present) RNG states for a checkpoint."""
    state: dict[str, object] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, object]) -> None:
    """Restore RNG states captured by :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])  # type: ignore[arg-type]


@dataclass
class TrainState:
    """Progress counters saved in checkpoints.

    Attributes:
        step: optimiser steps taken (also the data position: the next batch index).
        tokens_seen: training tokens consumed (``step * batch * context``).
        elapsed_s: wall-clock seconds spent in the training loop (training steps, periodic held-out
            estimates and checkpoint writes), summed across resumes.
        history: log records (dicts) written so far.
    """

    step: int = 0
    tokens_seen: int = 0
    elapsed_s: float = 0.0
    history: list[dict[str, object]] = field(default_factory=list)


class Trainer:
    """Runs the optimisation loop with logging, periodic held-out estimates and checkpoints.

    Args:
        model: a float32 :class:`LlamaForCausalLM` on ``device``.
        cfg: the run's :class:`TrainConfig`.
        schedule: training batches.
        heldout_tokens: ``[n_tokens]`` packed held-out stream used for the periodic estimate.
        run_dir: folder for ``checkpoint.pt`` and ``train_log.jsonl``.
        device: training device.
        amp_dtype: autocast dtype (``None`` for float32).
        compile_model: wrap the training forward pass in ``torch.compile``.
        log: function receiving human-readable log lines.

    Raises:
        ValueError: if the held-out stream is shorter than one ``context + 1`` window.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        cfg: TrainConfig,
        schedule: BatchSchedule,
        heldout_tokens: np.ndarray,
        run_dir: Path,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        compile_model: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.schedule = schedule
        self.run_dir = Path(run_dir)
        self.device = device
        self.amp_dtype = amp_dtype
        self.log = log
        self.optimizer = make_optimizer(model, cfg)
        self.state = TrainState()
        self.forward = torch.compile(model) if compile_model else model
        self._compiled = compile_model
        self.eval_batch = self._eval_windows(heldout_tokens)

    def _eval_windows(self, tokens: np.ndarray) -> torch.Tensor:
        # Fixed, seeded windows so successive estimates are comparable.
        span = self.cfg.context + 1
        n = min(self.cfg.eval_windows, max(1, len(tokens) - span))
        if len(tokens) < span:
            raise ValueError(f"held-out stream ({len(tokens)} tokens) is shorter than one window")
        starts = np.random.default_rng([self.cfg.seed, 7]).choice(len(tokens) - span + 1, n, replace=False)
        return torch.from_numpy(np.stack([tokens[s : s + span] for s in np.sort(starts)]).astype(np.int64))

    def _loss(self, module: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats; ``inputs``/``targets`` are int64 ``[batch, seq]``."""
        dtype = self.amp_dtype or torch.float32
        with torch.autocast(self.device.type, dtype=dtype, enabled=self.amp_dtype is not None):
            logits = module(input_ids=inputs).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def heldout_estimate(self) -> float:
        """Mean held-out loss (nats/token) on the fixed evaluation windows, in batches."""
        self.model.eval()
        total, count = 0.0, 0
        for i in range(0, len(self.eval_batch), self.cfg.batch_size):
            chunk = self.eval_batch[i : i + self.cfg.batch_size].to(self.device)
            loss = self._loss(self.model, chunk[:, :-1], chunk[:, 1:])
            total += float(loss) * chunk.shape[0]
            count += chunk.shape[0]
        self.model.train()
        return total / count

    def progress(self) -> float:
        """Fraction of the run done: the larger of the step and time-budget fractions (may exceed 1)."""
        frac = self.state.step / self.cfg.steps
        if self.cfg.time_budget_min is not None:
            frac = max(frac, self.state.elapsed_s / (60.0 * self.cfg.time_budget_min))
        return frac

    def _record(self, record: dict[str, object]) -> None:
        self.state.history.append(record)
        with open(self.run_dir / "train_log.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def save_checkpoint(self) -> Path:
        """Atomically write model, optimiser, RNG and data position to ``run_dir``.

        Returns:
            Path of the checkpoint file.
        """
        path = self.run_dir / CHECKPOINT_NAME
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng": capture_rng(),
                "state": {
                    "step": self.state.step,
                    "tokens_seen": self.state.tokens_seen,
                    "elapsed_s": self.state.elapsed_s,
                    "history": self.state.history,
                },
                "data_position": {
                    "next_batch": self.state.step,
                    "epoch_and_index": self.schedule.position(self.state.step),
                },
                "config": self.cfg.to_dict(),
            },
            tmp,
        )
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint`.

        Args:
            path: the checkpoint file.

        Raises:
            FileNotFoundError: if it does not exist.
            ValueError: if it was written with a different configuration.
        """
        if not Path(path).is_file():
            raise FileNotFoundError(f"no checkpoint to resume from: {path}")
        # RNG states must stay CPU tensors; load_state_dict moves weights and optimiser state to the device.
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        saved = TrainConfig.from_dict(ckpt["config"])
        if saved != self.cfg:
            raise ValueError(f"checkpoint config differs from this run's config:\n{saved}\n{self.cfg}")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng(ckpt["rng"])
        s = ckpt["state"]
        self.state = TrainState(s["step"], s["tokens_seen"], s["elapsed_s"], list(s["history"]))

    def _train_step(self, inputs: torch.Tensor, targets: torch.Tensor, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        try:
            loss = self._loss(self.forward, inputs, targets)
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to eager
            if not self._compiled:
                raise
            self.log(f"torch.compile failed ({type(exc).__name__}: {exc}); continuing without it")
            self.forward, self._compiled = self.model, False
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(self.forward, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def train(self) -> TrainState:
        """Run until the step count or the time budget is reached.

        Returns:
            The final :class:`TrainState`.

        Ctrl-C (SIGINT, in the main thread) ends the run after the step in progress, with a checkpoint saved, as
        KeyboardInterrupt; a second Ctrl-C stops at once.

        Raises:
            FloatingPointError: if the training loss becomes NaN or infinite.
            KeyboardInterrupt: on Ctrl-C.
        """
        asked = []

        def on_sigint(signum: int, frame: object) -> None:
            if asked:
                raise KeyboardInterrupt
            asked.append(signum)

        if threading.current_thread() is not threading.main_thread():
            return self._train(asked)
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            return self._train(asked)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _train(self, asked: list[int]) -> TrainState:
        cfg = self.cfg
        tokens_per_step = cfg.batch_size * cfg.context
        self.model.train()
        last_ckpt = time.monotonic()
        window_loss, window_steps, window_time = 0.0, 0, 0.0
        if self.state.step == 0:
            est = self.heldout_estimate()
            self._record({"step": 0, "tokens": 0, "heldout_loss": est, "elapsed_s": 0.0})
            self.log(f"step 0 | held-out loss {est:.4f}")
        while self.progress() < 1.0:
            t0 = time.monotonic()
            lr = lr_at(cfg, self.state.step, self.progress())
            inputs, targets = (t.to(self.device, non_blocking=True) for t in self.schedule.batch(self.state.step))
            loss = self._train_step(inputs, targets, lr)
            if not math.isfinite(loss):
                raise FloatingPointError(f"training loss became {loss} at step {self.state.step}")
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.monotonic() - t0
            self.state.step += 1
            self.state.tokens_seen += tokens_per_step
            self.state.elapsed_s += dt
            window_loss, window_steps, window_time = window_loss + loss, window_steps + 1, window_time + dt

            done = self.progress() >= 1.0
            if self.state.step % cfg.log_every == 0 or done:
                record = {
                    "step": self.state.step,
                    "tokens": self.state.tokens_seen,
                    "train_loss": window_loss / window_steps,
                    "lr": lr,
                    "tokens_per_s": window_steps * tokens_per_step / window_time,
                    "elapsed_s": round(self.state.elapsed_s, 1),
                    "epoch": self.schedule.position(self.state.step)[0],
                }
                self._record(record)
                self.log(
                    f"step {record['step']} | loss {record['train_loss']:.4f} | lr {lr:.2e} | "
                    f"{record['tokens_per_s']:.0f} tok/s | {self.state.elapsed_s / 60:.1f} min | "
                    f"progress {100 * self.progress():.1f}%{_eta(self.state.elapsed_s, self.progress())}"
                )
                window_loss, window_steps, window_time = 0.0, 0, 0.0
            if self.state.step % cfg.eval_every == 0 or done:
                t_eval = time.monotonic()
                est = self.heldout_estimate()
                self.state.elapsed_s += time.monotonic() - t_eval
                self._record(
                    {
                        "step": self.state.step,
                        "tokens": self.state.tokens_seen,
                        "heldout_loss": est,
                        "elapsed_s": round(self.state.elapsed_s, 1),
                    }
                )
                self.log(f"step {self.state.step} | held-out loss {est:.4f}")
            if done or asked or time.monotonic() - last_ckpt >= 60.0 * cfg.checkpoint_every_min:
                t_ckpt = time.monotonic()
                self.save_checkpoint()
                self.state.elapsed_s += time.monotonic() - t_ckpt
                last_ckpt = time.monotonic()
                self.log(f"checkpoint saved at step {self.state.step}")
            if asked:  # (after the step and its checkpoint: an optimizer step cut in two would be saved half-done)
                raise KeyboardInterrupt
        return self.state


def _eta(elapsed_s: float, progress: float) -> str:
    """" | about N min left" from the pace so far (training only; the final evaluation comes on top)."""
    if progress <= 0.0 or progress >= 1.0:
        return ""
    return f" | about {elapsed_s * (1.0 - progress) / progress / 60:.1f} min left"
