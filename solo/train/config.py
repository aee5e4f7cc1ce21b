"""Hyper-parameters of the training recipe and the named size presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

#: Model and tokenizer shape per preset. ``default`` is what Solo ships; ``tiny`` exists for
#: tests and smoke runs (finishes in seconds on two CPU cores).
SIZE_PRESETS: dict[str, dict[str, int]] = {
    "default": {
        "vocab_size": 8192,
        "hidden_size": 384,
        "num_layers": 8,
        "num_heads": 6,
        "num_kv_heads": 2,
        "head_dim": 64,
        "ffn_size": 1024,
        "context": 512,
        "batch_size": 8,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "ffn_size": 128,
        "context": 64,
        "batch_size": 4,
    },
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run's result (plus a few run-time knobs).

    Attributes:
        seed: seeds weight init, data order and evaluation sampling.
        vocab_size: BPE vocabulary size (tokens), including 3 special tokens.
        hidden_size: model width (features).
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention when < ``num_heads``).
        head_dim: features per head.
        ffn_size: SwiGLU intermediate width (features).
        context: training sequence length and ``max_position_embeddings`` (tokens).
        batch_size: sequences per optimiser step.
        lr: peak learning rate of AdamW.
        min_lr_ratio: final learning rate as a fraction of ``lr`` (cosine decay).
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW decoupled weight decay on matrices (not on norm gains).
        grad_clip: global gradient-norm clip.
        steps: optimiser steps (the schedule's length when the time budget does not bind).
        time_budget_min: wall-clock cap in minutes for the training loop; when set, the schedule
            runs on ``max(step / steps, elapsed / budget)`` so a slow machine still decays fully.
        heldout_permille: held-out share of files in parts per thousand.
        max_files: limit on train files (tests); ``None`` for the whole corpus.
        eval_every: steps between held-out loss estimates during training.
        eval_windows: held-out windows in each periodic estimate.
        checkpoint_every_min: minutes between checkpoints.
        log_every: steps between training-loss log lines.
        eval_stride: window advance of the final held-out evaluation (tokens); ``None`` for
            three quarters of the context, so every token after a file's first window is scored
            with at least a quarter of the context before it.
        sample_tokens: tokens generated per model-card sample.
        rope_theta: RoPE base.
        num_lanes: 0 for the dense Llama recipe; L > 0 trains a lane model (Laneformer, `solo.train.lanes`).
        broadcast_delay: DTP delay d in layers (lane models).
        use_early_comm: the first d layers all-reduce at once (lane models; else `sqrt(L) * own`).
    """

    seed: int = 1234
    vocab_size: int = 8192
    hidden_size: int = 384
    num_layers: int = 8
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 64
    ffn_size: int = 1024
    context: int = 512
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    steps: int = 3000
    time_budget_min: float | None = None
    heldout_permille: int = 30
    max_files: int | None = None
    eval_every: int = 250
    eval_windows: int = 16
    checkpoint_every_min: float = 10.0
    log_every: int = 25
    eval_stride: int | None = None
    sample_tokens: int = 64
    rope_theta: float = 10000.0
    num_lanes: int = 0
    broadcast_delay: int = 0
    use_early_comm: bool = True

    def to_dict(self) -> dict[str, object]:
        """Return the configuration as a JSON-serialisable dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> TrainConfig:
        """Build a config from a dict, ignoring unknown keys (older checkpoints).

        Args:
            values: field values, e.g. from :meth:`to_dict`.

        Returns:
            The :class:`TrainConfig`.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def with_preset(self, size: str) -> TrainConfig:
        """Return a copy with a size preset's model/tokenizer shape applied.

        Args:
            size: a key of :data:`SIZE_PRESETS`.

        Returns:
            The updated config.

        Raises:
            KeyError: for an unknown preset.
        """
        if size not in SIZE_PRESETS:
            raise KeyError(f"unknown size preset {size!r}; choose from {sorted(SIZE_PRESETS)}")
        return replace(self, **SIZE_PRESETS[size])

    def validate(self) -> None:
        """Check the shape constraints of the Llama architecture and the schedule.

        Raises:
            ValueError: on an inconsistent configuration.
        """
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_size",
                     "context", "batch_size", "eval_every", "eval_windows", "log_every"):
            if getattr(self, name) < 1:  # (0 divided by zero in the schedule, or wrote a model no one loads)
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.sample_tokens < 0:
            raise ValueError("--warmup-steps and --sample-tokens must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not self.checkpoint_every_min >= 0:  # (0: after every step)
            raise ValueError(f"--checkpoint-every-min must be >= 0, got {self.checkpoint_every_min}")
        if self.eval_stride is not None and not 1 <= self.eval_stride <= self.context:
            raise ValueError(f"eval_stride must be in [1, context ({self.context})], got {self.eval_stride}")
        if self.hidden_size % self.num_heads:  # (transformers' configs refuse it)
            raise ValueError(f"--hidden-size ({self.hidden_size}) must be a multiple of --num-heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        if self.steps < 1:
            raise ValueError("steps must be positive")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise ValueError("time_budget_min must be positive")
        if self.vocab_size >= 2**16:
            raise ValueError("vocab_size must be below 65536 (token stream is stored as uint16)")
        if self.num_lanes < 0 or self.broadcast_delay < 0 or self.broadcast_delay > self.num_layers:
            raise ValueError("--lanes must be >= 0 and --delay in [0, num_layers]")
        if self.num_lanes and (self.num_heads % self.num_lanes or self.num_kv_heads % self.num_lanes
                               or self.ffn_size % self.num_lanes):
            raise ValueError("--lanes must divide num_heads, num_kv_heads and ffn_size")

    @property
    def stride(self) -> int:
        """Window advance of the final held-out evaluation in tokens (see ``eval_stride``)."""
        return self.eval_stride if self.eval_stride is not None else self.context - self.context // 4
