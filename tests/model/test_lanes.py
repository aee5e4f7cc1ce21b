"""Lane models (Laneformer) against identities, since transformers has no lane model.

- num_lanes 1 is a dense Llama with interleaved RoPE: equal to transformers' Llama with q/k rows permuted;
- a lane model with every layer all-reduced at once (delay 0) equals the dense model it shards;
- the DTP residual update equals a direct, per-lane transcription of the spec's equations
  (../shared/laneformer.md section 4), for every delay mode, the per-layer broadcast flags, sliding windows
  and each lm_head_type.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from checkpoints import hf_greedy_ids, lane_raw_config, make_checkpoint, make_lane_checkpoint, write_tokenizer
from safetensors.torch import load_file, save_file

from solo import Engine, SamplingParams
from solo.errors import CheckpointError, UnsupportedArchitectureError
from solo.model.config import ModelConfig
from solo.model.lanes import build_random_lane_model
from solo.model.transformer import KVCache

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n"
ATOL = 1e-4  # float32: only summation order differs


def _greedy(engine, prompt, n):
    return engine.complete(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)).token_ids


def _prefill_logits(model, ids):
    """All positions' logits of one prompt through the cache path: [seq, vocab] float32."""
    cache = KVCache(model.config, 1, len(ids) + 1, model.dtype)
    positions = torch.arange(len(ids))[None]
    with torch.no_grad():
        return model(torch.tensor([ids]), positions, cache, torch.tensor([0]))[0].float()


def _meta_rows(w, heads):
    # transformers' rotate_half rows -> Meta's interleaved pairs (inverse of convert_llama_weights_to_hf's permute).
    out, inp = w.shape
    return w.view(heads, 2, out // heads // 2, inp).transpose(1, 2).reshape(out, inp)


def test_one_lane_equals_transformers_llama(tmp_path):
    from transformers import AutoModelForCausalLM

    hf_dir = make_checkpoint(tmp_path / "hf", "llama", head_dim=16, num_attention_heads=4, num_key_value_heads=2)
    hf_cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))
    names = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
             "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}
    lane = {"model.tok_embeddings.weight": sd["model.embed_tokens.weight"],
            "model.norm.weight": sd["model.norm.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for i in range(hf_cfg["num_hidden_layers"]):
        for hf_name, lane_name in names.items():
            w = sd[f"model.layers.{i}.{hf_name}.weight"]
            if hf_name == "self_attn.q_proj":
                w = _meta_rows(w, hf_cfg["num_attention_heads"])
            elif hf_name == "self_attn.k_proj":
                w = _meta_rows(w, hf_cfg["num_key_value_heads"])
            lane[f"model.layers.{i}.{lane_name}.weight"] = w.contiguous()
    folder = tmp_path / "lane"
    write_tokenizer(folder)
    raw = lane_raw_config(hf_cfg["vocab_size"], num_lanes=1, delay=0, hidden_size=64, intermediate_size=160,
                          num_hidden_layers=hf_cfg["num_hidden_layers"], num_attention_heads=4,
                          num_key_value_heads=2, norm_eps=hf_cfg["rms_norm_eps"],
                          rope_theta=ModelConfig.from_file(hf_dir).rope.theta)
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(lane, str(folder / "model.safetensors"))

    engine = Engine.load(folder, dtype="float32", backend="eager")
    ids = engine.encode_prompt(PROMPT)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        hf_logits = hf(torch.tensor([ids])).logits[0].float()
    hf_tokens = hf_greedy_ids(hf, ids, 24)
    assert torch.allclose(_prefill_logits(engine.model, ids), hf_logits, atol=ATOL, rtol=0)
    assert _greedy(engine, PROMPT, 24) == hf_tokens
    assert _greedy(Engine.load(folder, dtype="float32"), PROMPT, 24) == hf_tokens  # the native CPU lane runtime


def _dense_state(model):
    """A lane model's tensors as dense [out, in] matrices (lanes concatenated, lane-major)."""
    out = {}
    for name, t in model.state_dict().items():
        if t.ndim == 3:
            row = any(k in name for k in ("wq", "wk", "wv", "w1", "w3"))
            t = t.reshape(-1, t.shape[-1]) if row else t.transpose(0, 1).reshape(t.shape[1], -1)
        out[name if name.startswith("lm_head") else "model." + name] = t.contiguous()
    return out


def test_all_reduce_every_layer_equals_the_dense_model_it_shards(tmp_path):
    sharded = make_lane_checkpoint(tmp_path / "sharded", num_lanes=4, delay=0)
    raw = json.loads((sharded / "config.json").read_text())
    lane_engine = Engine.load(sharded, dtype="float32")
    dense = tmp_path / "dense"
    write_tokenizer(dense)
    (dense / "config.json").write_text(json.dumps(dict(raw, num_lanes=1)))
    save_file(_dense_state(lane_engine.model), str(dense / "model.safetensors"))
    dense_engine = Engine.load(dense, dtype="float32")
    ids = lane_engine.encode_prompt(PROMPT)
    assert torch.allclose(_prefill_logits(lane_engine.model, ids), _prefill_logits(dense_engine.model, ids),
                          atol=ATOL, rtol=0)
    assert _greedy(lane_engine, PROMPT, 24) == _greedy(dense_engine, PROMPT, 24)
    # The dense [out, in] layout of lane matrices loads too, as the same lane model.
    flat = tmp_path / "flat"
    write_tokenizer(flat)
    (flat / "config.json").write_text(json.dumps(raw))
    save_file(_dense_state(lane_engine.model), str(flat / "model.safetensors"))
    flat_engine = Engine.load(flat, dtype="float32")
    assert torch.equal(_prefill_logits(flat_engine.model, ids), _prefill_logits(lane_engine.model, ids))


# ------------------------------------------------------------------ a direct transcription of the spec


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope_complex(x, theta):
    # Meta's apply_rotary_emb: pairs as complex numbers times e^{i pos freq}. x: [seq, heads, hd].
    seq, _, hd = x.shape
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    rot = torch.polar(torch.ones(seq, hd // 2), torch.outer(torch.arange(seq).float(), freqs))
    xc = torch.view_as_complex(x.float().reshape(seq, -1, hd // 2, 2))
    return torch.view_as_real(xc * rot[:, None]).reshape(x.shape)


def _reference_logits(model, ids):
    """Per lane, per layer, exactly the equations of spec section 4: logits [seq, vocab]."""
    cfg, lc = model.config, model.config.lanes
    sd = {k: v.float() for k, v in model.state_dict().items()}
    big_l, d, n, eps = lc.num_lanes, lc.broadcast_delay, cfg.num_layers, cfg.rms_norm_eps
    seq, hd = len(ids), cfg.head_dim
    hq, hkv = cfg.num_heads // big_l, cfg.num_kv_heads // big_l
    emb = sd["tok_embeddings.weight"][torch.tensor(ids)]
    h = [emb.clone() for _ in range(big_l)]
    hist = {"attn": [], "mlp": []}
    flags = {"attn": lc.broadcast_attention_to_future, "mlp": lc.broadcast_mlp_to_future}

    def attention(i, lane, x):
        p = f"layers.{i}.attention."
        q = _rope_complex((x @ sd[p + "wq.weight"][lane].T).view(seq, hq, hd), cfg.rope.theta)
        k = _rope_complex((x @ sd[p + "wk.weight"][lane].T).view(seq, hkv, hd), cfg.rope.theta)
        v = (x @ sd[p + "wv.weight"][lane].T).view(seq, hkv, hd)
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        qi, ki = torch.arange(seq)[:, None], torch.arange(seq)[None]
        allowed = ki <= qi
        window = cfg.layer_sliding_windows[i]
        if window is not None:
            allowed &= ki > qi - window
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        out = torch.einsum("hqk,khd->qhd", probs, v).reshape(seq, hq * hd)
        return out @ sd[p + "wo.weight"][lane].T

    def mlp(i, lane, x):
        p = f"layers.{i}.feed_forward."
        g = torch.nn.functional.silu(x @ sd[p + "w1.weight"][lane].T) * (x @ sd[p + "w3.weight"][lane].T)
        return g @ sd[p + "w2.weight"][lane].T

    def update(kind, i, partials):
        hist[kind].append(partials)
        for lane in range(big_l):
            if i >= d:
                own = partials[lane]
                if flags[kind][i - d]:
                    old = hist[kind][i - d]
                    h[lane] = h[lane] + own + sum(old[j] for j in range(big_l) if j != lane)
                else:
                    h[lane] = h[lane] + own
            elif lc.use_early_comm:
                h[lane] = h[lane] + sum(partials)
            else:
                h[lane] = h[lane] + math.sqrt(big_l) * partials[lane]

    for i in range(n):
        pre = f"layers.{i}."
        update("attn", i, [attention(i, lane, _rms(h[lane], sd[pre + "attention_norm.weight"], eps))
                           for lane in range(big_l)])
        update("mlp", i, [mlp(i, lane, _rms(h[lane], sd[pre + "ffn_norm.weight"], eps)) for lane in range(big_l)])
    w_norm = sd["norm.weight"]
    head = sd.get("lm_head.weight", sd["tok_embeddings.weight"])
    kind = lc.lm_head_type
    if kind == "replicate":
        return sum(_rms(x, w_norm, eps) for x in h) / big_l @ head.T
    if kind == "pre_norm_lane_agg":
        return _rms(sum(h), w_norm, eps) @ head.T
    if kind == "lane":
        return torch.cat([_rms(x, w_norm, eps) for x in h], -1) @ head.T
    per = cfg.vocab_size // big_l
    return torch.cat([_rms(h[lane], w_norm, eps) @ head[lane * per:(lane + 1) * per].T for lane in range(big_l)], -1)


CASES = [
    dict(delay=1),
    dict(delay=2),
    dict(delay=2, use_early_comm=False),
    dict(delay=1, broadcast_attention_to_future=[True] * 4, broadcast_mlp_to_future=[True] * 4),  # older semantics
    dict(delay=1, use_early_comm=False, broadcast_mlp_to_future=[True, False, True, False]),
    dict(delay=0),
    dict(delay=2, sliding_window=3, sliding_window_n_layers=2),
    dict(delay=1, lm_head_type="pre_norm_lane_agg"),
    dict(delay=1, lm_head_type="lane"),
    dict(delay=2, lm_head_type="vocab_parallel"),
    dict(delay=1, lm_head_type="vocab_parallel", tie_word_embeddings=True),
    dict(delay=1, num_lanes=2, lm_head_type="replicate", tie_word_embeddings=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_dtp_matches_a_direct_transcription_of_the_spec(case):
    config = ModelConfig.from_dict(lane_raw_config(384, **case))
    model = build_random_lane_model(config, torch.float32, seed=3, std=0.2)
    ids = list(range(5, 17))
    ref = _reference_logits(model, ids)
    assert torch.allclose(_prefill_logits(model, ids), ref, atol=ATOL, rtol=0)
    # Training path (no cache) gives the same logits.
    with torch.no_grad():
        train_logits = model(torch.tensor([ids]), torch.arange(len(ids))[None])[0]
    assert torch.allclose(train_logits, ref, atol=ATOL, rtol=0)


def test_default_broadcast_flags_follow_the_spec():
    cfg = ModelConfig.from_dict(lane_raw_config(384, delay=1, num_hidden_layers=4)).lanes
    assert cfg.broadcast_attention_to_future == (False, True, True, False)
    cfg = ModelConfig.from_dict(lane_raw_config(384, delay=1, use_early_comm=False)).lanes
    assert cfg.broadcast_mlp_to_future == (True, True, True, False)


def test_sliding_window_layers_and_decode_match_prefill(tmp_path):
    folder = make_lane_checkpoint(tmp_path / "m", delay=2, sliding_window=4, sliding_window_n_layers=2)
    engine = Engine.load(folder)
    assert engine.config.layer_sliding_windows == (4, 4, None, None)
    ids = engine.encode_prompt(PROMPT)
    tokens = _greedy(engine, PROMPT, 12)
    # Re-scoring prompt + generated tokens in one prefill gives the same greedy choices.
    logits = _prefill_logits(engine.model, ids + tokens)
    assert logits[len(ids) - 1:-1].argmax(-1).tolist() == tokens


@pytest.mark.parametrize("field, value, message", [
    ("lm_head_type", "mixture", "lm_head_type 'mixture'"),
    ("use_attention_comm", False, "use_attention_comm"),
    ("replicated_rmsn_scale", False, "replicated_rmsn_scale"),
    ("num_lanes", 3, "not a multiple of num_lanes"),
    ("broadcast_mlp_to_future", [True], "broadcast_mlp_to_future"),
    ("broadcast_delay", 9, "broadcast_delay"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "dynamic"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "yarn"),  # the lane RoPE has no attention factor
])
def test_unimplemented_values_are_refused_by_name(field, value, message):
    with pytest.raises((UnsupportedArchitectureError, CheckpointError), match=message):
        ModelConfig.from_dict(lane_raw_config(384, **{field: value}))


def test_fast_backends_are_refused_and_quantize_too(tmp_path):
    from solo.errors import SoloError

    folder = make_lane_checkpoint(tmp_path / "m")
    with pytest.raises(SoloError, match="lane models"):
        Engine.load(folder, backend="cuda-graph")
    with pytest.raises(SoloError, match="quantize"):
        Engine.load(folder, quantize="int8")


def test_bad_checkpoint_tensor_is_named(tmp_path):
    folder = make_lane_checkpoint(tmp_path / "m")
    sd = load_file(str(folder / "model.safetensors"))
    sd["model.layers.0.attention.wq.weight"] = sd["model.layers.0.attention.wq.weight"][:, :3].contiguous()
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="attention.wq"):
        Engine.load(folder)
    sd.pop("model.layers.0.attention.wq.weight")
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(1)
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="self_attn.q_proj"):
        Engine.load(folder)


def test_half_precision_lane_linear_matches_the_batched_product():
    from solo.model.lanes import LaneLinear

    layer = LaneLinear(4, 32, 24).to(torch.bfloat16)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(2, 3, 4, 32, dtype=torch.bfloat16)
    expected = torch.einsum("bsli,loi->bslo", x.float(), layer.weight.float())
    assert torch.allclose(layer(x).float(), expected, atol=0.1, rtol=0.02)


def test_parameter_count_of_a_lane_head():
    replicate = ModelConfig.from_dict(lane_raw_config(384))
    lane = ModelConfig.from_dict(lane_raw_config(384, lm_head_type="lane"))
    assert lane.num_parameters() - replicate.num_parameters() == 3 * 384 * 64
    model = build_random_lane_model(lane, torch.float32)
    assert sum(p.numel() for p in model.parameters()) == lane.num_parameters()
