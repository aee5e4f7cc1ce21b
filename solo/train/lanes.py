"""Training lane models (`solo train --lanes L --delay d`): the eager `LaneTransformer` with a training forward.

The model is `solo.model.lanes.LaneTransformer` itself (no KV cache: causal attention over the batch), so
what is trained is exactly what `solo run` later serves. Initialisation follows transformers' Llama
(`initializer_range` 0.02 normal for matrices and the embedding, norm scales 1); the LM head is tied to the
embedding (`lm_head_type` replicate) as in the dense recipe, so a lane model has the dense model's parameter
count. The export writes a Laneformer folder (../shared/laneformer.md section 6 config fields, Laneformer
tensor names).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from torch import nn

from solo.model.config import ModelConfig
from solo.model.lanes import LaneTransformer, laneformer_state_dict


def lane_raw_config(cfg: object, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """The Laneformer config.json of a `TrainConfig` with `num_lanes` > 0."""
    return {
        "architectures": ["LaneformerForCausalLM"], "model_type": "laneformer",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.ffn_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "max_position_embeddings": cfg.context,
        "rope_theta": cfg.rope_theta, "norm_eps": 1e-5, "tie_word_embeddings": True,
        "num_lanes": cfg.num_lanes, "broadcast_delay": cfg.broadcast_delay, "use_early_comm": cfg.use_early_comm,
        "lm_head_type": "replicate", "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }


class LaneTrainModel(nn.Module):
    """A `LaneTransformer` whose `forward(input_ids=[batch, seq])` returns an object with `.logits`.

    The logits are [batch, seq, vocab] (float32 in training), as the recipe's `Trainer` and
    `evaluate_documents` expect.

    Args:
        raw: the Laneformer config.json dict.
    """

    def __init__(self, raw: dict) -> None:
        super().__init__()
        self.raw = raw
        config = ModelConfig.from_dict(raw)
        self.config = SimpleNamespace(bos_token_id=raw["bos_token_id"], eos_token_id=raw["eos_token_id"],
                                      pad_token_id=raw["pad_token_id"], max_position_embeddings=config.context_length,
                                      model_config=config)
        self.lanes = LaneTransformer(config)
        with torch.no_grad():
            for name, param in self.lanes.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, 0.02)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        """Causal logits of every position: `.logits` [batch, seq, vocab] (`use_cache` is accepted and unused)."""
        del use_cache
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        return SimpleNamespace(logits=self.lanes(input_ids, positions))


def build_lane_model(cfg: object, bos_id: int, eos_id: int, pad_id: int) -> LaneTrainModel:
    """A freshly initialised lane model for a `TrainConfig` with `num_lanes` > 0 (seed the RNG first).

    Raises:
        SoloError subclasses: the lane fields do not fit the shape (e.g. lanes that do not divide the heads).
    """
    return LaneTrainModel(lane_raw_config(cfg, bos_id, eos_id, pad_id))


def export_lane_model(model: LaneTrainModel, folder: Path) -> None:
    """Write config.json and bfloat16 model.safetensors of a trained lane model (Laneformer layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.raw, indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
               for k, v in laneformer_state_dict(model.lanes).items()}
    save_file(tensors, str(folder / "model.safetensors"))


def load_lane_model(folder: Path, device: torch.device | str = "cpu") -> LaneTrainModel:
    """Load an exported lane model in float32 for evaluation (`.logits` interface)."""
    from solo.model.weights import load_lane_weights

    raw = json.loads((Path(folder) / "config.json").read_text())
    model = LaneTrainModel.__new__(LaneTrainModel)
    nn.Module.__init__(model)
    model.raw = raw
    config = ModelConfig.from_dict(raw)
    model.config = SimpleNamespace(bos_token_id=raw["bos_token_id"], eos_token_id=raw["eos_token_id"],
                                   pad_token_id=raw["pad_token_id"], max_position_embeddings=config.context_length,
                                   model_config=config)
    model.lanes = load_lane_weights(Path(folder), config, torch.float32, device)
    return model
