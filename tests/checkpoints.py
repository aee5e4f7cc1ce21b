"""Tiny random checkpoints written by `transformers` itself, for parity tests (no network needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# A small, fixed corpus so the test tokenizer is deterministic and covers code, prose and multi-byte text.
_CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n",
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?",
    "import os\nimport sys\n\nfor i in range(10):\n    print(i, os.path.join('a', 'b'))\n",
    "Ünïcödé text: café, naïve, 你好世界, こんにちは, emoji 🙂🚀 and math ∑ ∫ √.",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path, vocab_size: int = 384, chat_template: bool = True,
                    extra_tokens: tuple[str, ...] = ()) -> int:
    """Train a byte-level BPE tokenizer on the fixed corpus and save HF tokenizer files; returns its size.

    `extra_tokens` join the special tokens (markers such as FIM's <|fim_prefix|>)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *extra_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 4096,
    }
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()


TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


# Mixture-of-experts families: 8 experts, top-2, narrow experts; Qwen2-MoE has a shared expert and a dense
# middle layer (mlp_only_layers), Qwen3-MoE a dense first layer (decoder_sparse_step 2).
MOE = {
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=48),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, norm_topk_prob=False, num_hidden_layers=3,
                      mlp_only_layers=[1]),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                      head_dim=16, decoder_sparse_step=2),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False),
}


def hf_config(arch: str, vocab_size: int, **overrides):
    """A tiny transformers config of architecture `arch` ("llama", "mistral", "qwen2", "qwen3", "gemma2",
    "gemma3", "phi3", "phi4", "smollm3", or an MoE family: "mixtral", "qwen2_moe", "qwen3_moe", "olmoe").

    gemma3 alternates sliding and global layers, each with its own RoPE theta; smollm3's second layer is NoPE;
    phi4 is Phi-4-mini's layout: a Phi-3 whose RoPE rotates 3/4 of each head (partial_rotary_factor), tied
    embeddings.
    """
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        OlmoeConfig,
        Phi3Config,
        Qwen2Config,
        Qwen2MoeConfig,
        Qwen3Config,
        Qwen3MoeConfig,
        SmolLM3Config,
    )

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
           "gemma2": Gemma2Config, "gemma3": Gemma3TextConfig, "phi3": Phi3Config, "phi4": Phi3Config,
           "smollm3": SmolLM3Config,
           "mixtral": MixtralConfig, "qwen2_moe": Qwen2MoeConfig,
           "qwen3_moe": Qwen3MoeConfig, "olmoe": OlmoeConfig}[arch]
    kwargs = dict(TINY, vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                  initializer_range=0.2)
    if arch in ("qwen3", "gemma2", "gemma3", "mistral"):
        kwargs["head_dim"] = 16
    if arch in ("gemma2", "gemma3"):
        kwargs.update(sliding_window=8, query_pre_attn_scalar=16)
    if arch == "gemma3":
        # Global layers at theta 1e6 with linear scaling, sliding ones at 10000 (as gemma-3-4b): a RoPE table per
        # layer kind; the tiny model's two layers take one of each.
        kwargs.update(layer_types=["sliding_attention", "full_attention"],
                      rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    if arch == "smollm3":
        kwargs.update(no_rope_layer_interval=2)  # layer 1 has no position embeddings
    if arch in ("mistral", "phi3"):
        kwargs.update(sliding_window=8)
    if arch == "phi4":  # 12 of the 16 dims rotated
        kwargs.update(partial_rotary_factor=0.75, tie_word_embeddings=True)
    kwargs.update(MOE.get(arch, {}))
    kwargs.update(overrides)
    return cls(**kwargs)


def make_checkpoint(
    folder: Path,
    arch: str = "llama",
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    generation_config: dict | None = None,
    seed: int = 0,
    extra_tokens: tuple[str, ...] = (),
    **overrides,
) -> Path:
    """Write a tiny random `arch` checkpoint with `save_pretrained`, plus tokenizer files, into `folder`."""
    from transformers import AutoModelForCausalLM

    vocab = write_tokenizer(folder, extra_tokens=extra_tokens)
    config = hf_config(arch, vocab, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


def make_gemma3_image_text_checkpoint(folder: Path, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """A tiny Gemma3ForConditionalGeneration (gemma-3-4b's layout: a SigLIP vision tower beside the language
    model, whose config is text_config) written with `save_pretrained`, plus tokenizer files."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    vocab = write_tokenizer(folder)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=hf_config("gemma3", vocab).to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4, image_token_index=vocab - 1, boi_token_index=vocab - 2,
                          eoi_token_index=vocab - 3)
    torch.manual_seed(seed)
    Gemma3ForConditionalGeneration(config).to(dtype).save_pretrained(folder)
    return folder


def make_longrope_checkpoint(folder: Path, partial_rotary_factor: float = 1.0, **overrides) -> Path:
    """A tiny Phi-3 with LongRoPE: a 32-token original context stretched to 128 (attention factor ~1.18), short
    and long factors far apart so the two regimes give different tokens. `partial_rotary_factor` 0.75 makes it
    Phi-4-mini's layout (12 of the 16 dims of each head rotated, 6 factors each; tied embeddings)."""
    half = int(16 * partial_rotary_factor) // 2  # head_dim 16
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.05 * i for i in range(half)],
            "long_factor": [1.0 + 2.0 * i for i in range(half)]}
    if partial_rotary_factor != 1.0:
        overrides = dict(overrides, partial_rotary_factor=partial_rotary_factor, tie_word_embeddings=True)
    return make_checkpoint(folder, "phi3", max_position_embeddings=128, original_max_position_embeddings=32,
                           rope_parameters=rope, sliding_window=None, **overrides)


TINY_LANES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=16, max_position_embeddings=256)


def lane_raw_config(vocab_size: int, num_lanes: int = 4, delay: int = 1, **overrides) -> dict:
    """A tiny Laneformer config.json (the fields of ../shared/laneformer.md section 6)."""
    raw = dict(TINY_LANES, architectures=["LaneformerForCausalLM"], model_type="laneformer",
               vocab_size=vocab_size, num_lanes=num_lanes, broadcast_delay=delay, lm_head_type="replicate",
               use_early_comm=True, norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    raw.update(overrides)
    return raw


def make_lane_checkpoint(folder: Path, seed: int = 0, std: float = 0.2, **overrides) -> Path:
    """Write a tiny random Laneformer checkpoint (lane layout, Laneformer names) plus tokenizer files."""
    from safetensors.torch import save_file

    from solo.model.config import ModelConfig
    from solo.model.lanes import build_random_lane_model, laneformer_state_dict

    vocab = write_tokenizer(folder)
    raw = lane_raw_config(vocab, **overrides)
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    model = build_random_lane_model(ModelConfig.from_dict(raw), torch.float32, seed=seed, std=std)
    save_file(laneformer_state_dict(model), str(folder / "model.safetensors"))
    return folder


# Qwen3-Coder's prompt format (its template is not among the shared fixtures; this one renders its structure):
# the tools listed as XML, each call as <function=NAME> with one <parameter=KEY> element per argument, objects
# and lists as JSON and other values as Python writes them (True, None), as its template does.
QWEN3_CODER_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou have access to the following functions:\n\n<tools>"
    "{% for tool in tools %}\n<function>\n<name>{{ tool.function.name }}</name>\n<parameters>"
    "{% for name, p in (tool.function.parameters.properties or {}) | items %}\n<parameter>\n<name>{{ name }}</name>"
    "\n<type>{{ p.type }}</type>\n</parameter>{% endfor %}\n</parameters>\n</function>{% endfor %}\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format:\n<tool_call>\n<function=NAME>\n"
    "<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for call in m.tool_calls or [] %}\n<tool_call>\n<function={{ call.function.name }}>\n"
    "{% for k, v in call.function.arguments | items %}<parameter={{ k }}>\n"
    "{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}\n</parameter>\n"
    "{% endfor %}</function>\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def hf_greedy_ids(hf, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' `new_tokens` greedy token ids after the prompt `ids`, EOS an ordinary token.

    As Solo's `ignore_eos`: EOS may be the argmax and generation goes on after it. (`min_new_tokens` instead
    masks EOS out until the last token, so a prompt whose argmax is EOS would read as a divergence.)
    """
    config = copy.deepcopy(hf.generation_config)
    config.eos_token_id = None
    config.update(max_new_tokens=new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None)
    if config.pad_token_id is None:
        config.pad_token_id = 0
    # (an explicit mask: one inferred from the pad id would mask out prompt tokens equal to it)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          generation_config=config)
    assert out.shape[1] == len(ids) + new_tokens
    return out[0, len(ids):].tolist()
