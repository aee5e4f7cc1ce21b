"""One decode step from the fused Triton kernels, over static buffers (llama2.c's RunState, on the GPU).

Per layer, for the common architectures (Llama, Mistral, Qwen2):

    qkv_rope      x -> rmsnorm -> q | k | v -> RoPE -> q buffer, k/v cache     (1 launch)
    attention     flash-decoding over the live positions (+ combine)          (1-2 launches)
    gemv          x += o_proj(attention)                                      (1 launch)
    gated_mlp     x -> rmsnorm -> act(gate) * up                               (1 launch)
    gemv          x += down_proj(a)                                           (1 launch)

In a mixture-of-experts layer the MLP is `moe.moe_mlp` instead (router + top-k on the device, then the
selected experts' gate/up and down GEMVs reading the expert ids from device memory; 3 launches, no host
sync); a shared expert (Qwen2-MoE) runs as torch ops in the same captured step.

then `rmsnorm_gemv` for the final norm and the LM head into float32 logits. Features the fused kernels
do not cover fall back to torch ops inside the same captured step: per-head q/k norms (Qwen3: the QKV
projection runs as `rmsnorm_gemv`, then eager norms and RoPE), Gemma 2's sandwich norms (the projections
run without the residual epilogue, then eager norm + add), the embedding scale and final logit
soft-capping. Dynamic-NTK RoPE recomputes the step's cos/sin row on the device.
"""

from __future__ import annotations

import torch

from solo.model.rope import apply_rope, dynamic_ntk_inv_freq
from solo.model.transformer import KVCache, Transformer
from solo.runtime.cuda.state import STATE_POS, STATE_ROW, STATE_TOKEN
from solo.runtime.cuda.torch_step import store_kv
from solo.runtime.cuda.weights import FusedLayer, fused_layers
from solo.runtime.triton import attention, gemv, moe, qkv_rope, rmsnorm_gemv, swiglu, tuning
from solo.runtime.triton.common import interpreting, next_power_of_2, pdl_mode
from solo.runtime.triton.gemv import SplitKWorkspace


class TritonStep:
    """A decode step from the fused kernels (see the module docstring).

    Args:
        model: the eager model (its weights are fused in place, see `weights.fused_layers`).
        cache: the static KV cache.
        state: int64 decode state [STATE_SIZE] (token, position, row are read).
        logits: float32 [vocab] output buffer.
        sm_count: streaming multiprocessors (sizes the attention split and default launch configs).
        pdl: launch every kernel with programmatic dependent launch (Hopper), so each kernel's CTAs are
            scheduled while the previous one drains; kernels wait for their predecessor before reading.
    """

    def __init__(self, model: Transformer, cache: KVCache, state: torch.Tensor, logits: torch.Tensor,
                 sm_count: int = 132, pdl: bool = False) -> None:
        cfg = model.config
        self.pdl = pdl
        self.model, self.config, self.cache, self.state, self.logits = model, cfg, cache, state, logits
        self.fused: list[FusedLayer] = fused_layers(model)
        dtype, device = model.dtype, model.device
        hidden, q_dim = cfg.hidden_size, cfg.num_heads * cfg.head_dim
        self.x = torch.zeros(hidden, dtype=dtype, device=device)  # residual stream
        self.h = torch.zeros(hidden, dtype=dtype, device=device)  # sandwich-norm scratch
        self.q = torch.zeros(q_dim, dtype=dtype, device=device)
        self.attn_out = torch.zeros(q_dim, dtype=dtype, device=device)
        self.act = torch.zeros(cfg.intermediate_size, dtype=dtype, device=device)
        self.qkv = torch.zeros(self.fused[0].w_qkv.shape[0], dtype=dtype, device=device) if cfg.qk_norm else None
        self.moe_scratch = None
        if cfg.is_moe:
            self.moe_scratch = moe.MoeScratch.allocate(cfg.num_experts_per_tok, cfg.moe_intermediate_size, dtype,
                                                       device)
        self.embed_scale = None
        if cfg.embedding_scale is not None:
            # Eager rounds the scale to the activation dtype before multiplying.
            self.embed_scale = torch.tensor(cfg.embedding_scale).to(dtype).to(device)
        self.head_w = model.lm_head_weight()
        interpreted = interpreting()
        # The interpreter runs programs one after another: few, large ones are fastest there.
        self.attn_plan = attention.AttentionPlan(
            cache.max_seq, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, device, sm_count,
            partition=max(16, next_power_of_2(cache.max_seq)) if interpreted else None)
        self._rope_tables(cache.max_seq)
        if interpreted:
            wide = min(1024, next_power_of_2(hidden))
            self.configs: dict[str, object] = {
                "qkv": qkv_rope.QkvRopeConfig(64, wide), "qkv_proj": rmsnorm_gemv.RmsNormGemvConfig(64, wide),
                "o": gemv.GemvConfig(64, min(1024, next_power_of_2(q_dim))), "gate_up": swiglu.GatedMlpConfig(64, wide),
                "down": gemv.GemvConfig(64, min(1024, next_power_of_2(cfg.intermediate_size))),
                "head": rmsnorm_gemv.RmsNormGemvConfig(64, wide),
                "moe": moe.MoeGemvConfig(64, 64, wide),
            }
        else:
            elem = self.x.element_size()
            block_k = 16 // elem * 32 * 4  # one 16-byte vector per thread of 4 warps
            self.configs = {
                "qkv": qkv_rope.QkvRopeConfig(4, block_k),
                "qkv_proj": rmsnorm_gemv.default_config(self.fused[0].w_qkv.shape[0], hidden, sm_count, elem),
                "o": gemv.default_config(hidden, q_dim, sm_count, elem),
                "gate_up": swiglu.GatedMlpConfig(4, block_k),
                "down": gemv.default_config(hidden, cfg.intermediate_size, sm_count, elem),
                "head": rmsnorm_gemv.default_config(cfg.vocab_size, hidden, sm_count, elem),
                "moe": moe.MoeGemvConfig(4, 8, block_k),
            }
        self._workspaces: dict[str, SplitKWorkspace] = {}
        self._make_workspaces()

    # ------------------------------------------------------------------------------------------ setup

    def _rope_tables(self, max_seq: int) -> None:
        model, device = self.model, self.model.device
        half = self.config.head_dim // 2
        self.dynamic_rope = self.config.rope.rope_type == "dynamic"
        if self.dynamic_rope:
            # One row, recomputed each step for the current length (dynamic NTK scaling).
            self.cos = torch.zeros(1, half, dtype=torch.float32, device=device)
            self.sin = torch.zeros(1, half, dtype=torch.float32, device=device)
            self.cos_tables, self.sin_tables = [self.cos], [self.sin]  # one table (per-layer RoPE refuses dynamic)
            return
        # The eager model's own float32 tables, one per entry of config.rope_tables (Gemma 3: global, local; a
        # NoPE layer's is the identity); the kernel reads the first half of each row (both halves are the same).
        positions = torch.arange(max_seq, device=device).view(1, -1)
        tables = model.rotary.layer_tables(positions, torch.float32)
        self.cos_tables = [cos[0, :, :half].contiguous() for cos, _ in tables]
        self.sin_tables = [sin[0, :, :half].contiguous() for _, sin in tables]

    def _make_workspaces(self) -> None:
        self._workspaces = {}
        for site, n in (("o", self.config.hidden_size), ("down", self.config.hidden_size)):
            config = self.configs[site]
            if config.split_k > 1:
                # One per call site: launches run one after another, so layers can share it.
                self._workspaces[site] = SplitKWorkspace(n, config, self.model.device)

    def tune(self) -> dict[str, object]:
        """Pick each call site's launch configuration on the device (cached per shape and GPU).

        Checks each candidate's output on layer 0's weights and scratch inputs, then times it as the step
        runs it: one launch per layer's weights back to back in a CUDA graph, in the step's launch mode
        (PDL or not; `tuning.tune`). Runs before graph capture.

        Returns:
            The chosen configuration per call site.
        """
        cfg, layer0, device, dtype = self.config, self.fused[0], self.model.device, self.model.dtype
        hidden, pdl = cfg.hidden_size, self.pdl
        key_pdl = pdl_mode(pdl)  # the release point too (SOLO_PDL_RELEASE): configurations are timed in it
        layers = self.fused

        def randn(n: int) -> torch.Tensor:
            return torch.randn(n, device=device).to(dtype)

        x, norm_w = randn(hidden), self.model.layers[0].attn_norm.weight
        eps, unit = cfg.rms_norm_eps, cfg.norm_unit_offset
        q_in, act_in, res = randn(self.q.numel()), randn(cfg.intermediate_size), randn(hidden)
        out_h = torch.empty(hidden, dtype=dtype, device=device)
        dt = str(dtype).removeprefix("torch.")

        if not cfg.qk_norm:
            scratch_state = self.state.clone()
            scratch_state[STATE_POS] = 0
            scratch_state[STATE_ROW] = self.cache.rows - 1  # the runtime's scratch row
            k_cache, v_cache = self.cache.k[0], self.cache.v[0]

            def launch_qkv(c: qkv_rope.QkvRopeConfig, layer: FusedLayer = layer0, pdl: bool = False) -> torch.Tensor:
                t = cfg.layer_rope_table(0)
                qkv_rope.qkv_rope(x, norm_w, layer.w_qkv, eps, self.cos_tables[t], self.sin_tables[t],
                                  scratch_state, self.q, k_cache, v_cache, num_heads=cfg.num_heads,
                                  num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, bias=layer.b_qkv,
                                  unit_offset=unit, per_step_table=self.dynamic_rope, config=c, pdl=pdl)
                return self.q

            self.configs["qkv"] = tuning.tune(
                tuning.make_key("qkv_rope", hidden=hidden, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                                head_dim=cfg.head_dim, dtype=dt, pdl=key_pdl),
                qkv_rope.CANDIDATES, launch_qkv, self.configs["qkv"],
                graph_launches=lambda c: [lambda f=f: launch_qkv(c, f, pdl) for f in layers])
        else:
            qkv_out = torch.empty_like(self.qkv)

            def launch_qkv_proj(c: rmsnorm_gemv.RmsNormGemvConfig, layer: FusedLayer = layer0,
                                pdl: bool = False) -> torch.Tensor:
                return rmsnorm_gemv.rmsnorm_gemv(x, norm_w, layer.w_qkv, eps, qkv_out, bias=layer.b_qkv,
                                                 unit_offset=unit, config=c, pdl=pdl)

            self.configs["qkv_proj"] = tuning.tune(
                tuning.make_key("rmsnorm_gemv", n=qkv_out.numel(), k=hidden, dtype=dt, pdl=key_pdl),
                rmsnorm_gemv.CANDIDATES, launch_qkv_proj, self.configs["qkv_proj"],
                graph_launches=lambda c: [lambda f=f: launch_qkv_proj(c, f, pdl) for f in layers])

        sites = [("o", [f.w_o for f in layers], q_in, not cfg.sandwich_norm)]
        if layer0.w_down is not None:  # an MoE layer 0 has no dense MLP to tune on
            sites.append(("down", [f.w_down for f in layers if f.w_down is not None], act_in, not cfg.sandwich_norm))
        for site, ws, inp, residual in sites:
            # Workspaces made up front, so no allocation or memset is timed.
            workspaces = {c: SplitKWorkspace(ws[0].shape[0], c, device)
                          for c in (self.configs[site], *gemv.CANDIDATES) if c.split_k > 1}

            def launch_gemv(c: gemv.GemvConfig, w: torch.Tensor = ws[0], pdl: bool = False, inp=inp,
                            residual=residual, workspaces=workspaces) -> torch.Tensor:
                return gemv.gemv(w, inp, out_h, residual=res if residual else None, config=c,
                                 workspace=workspaces.get(c), pdl=pdl)

            self.configs[site] = tuning.tune(
                tuning.make_key("gemv", n=ws[0].shape[0], k=ws[0].shape[1], residual=residual, dtype=dt, pdl=key_pdl),
                gemv.CANDIDATES, launch_gemv, self.configs[site],
                graph_launches=lambda c, ws=ws, launch=launch_gemv: [lambda w=w: launch(c, w, pdl) for w in ws])

        act_out = torch.empty_like(self.act)
        if layer0.w_gate_up is not None:
            mlp_layers = [f for f in layers if f.w_gate_up is not None]

            def launch_gate_up(c: swiglu.GatedMlpConfig, layer: FusedLayer = layer0, pdl: bool = False) -> torch.Tensor:
                return swiglu.gated_mlp(x, layer.w_gate_up, act_out, norm_weight=norm_w, eps=eps, bias=layer.b_gate_up,
                                        activation=cfg.hidden_act, unit_offset=unit, config=c, pdl=pdl)

            self.configs["gate_up"] = tuning.tune(
                tuning.make_key("gated_mlp", f=cfg.intermediate_size, hidden=hidden, act=cfg.hidden_act, dtype=dt,
                                pdl=key_pdl),
                swiglu.CANDIDATES, launch_gate_up, self.configs["gate_up"],
                graph_launches=lambda c: [lambda f=f: launch_gate_up(c, f, pdl) for f in mlp_layers])
        logits = torch.empty_like(self.logits)

        def launch_head(c: rmsnorm_gemv.RmsNormGemvConfig, pdl: bool = False) -> torch.Tensor:
            return rmsnorm_gemv.rmsnorm_gemv(x, self.model.norm.weight, self.head_w, eps, logits, unit_offset=unit,
                                             config=c, pdl=pdl)

        self.configs["head"] = tuning.tune(
            tuning.make_key("rmsnorm_gemv", n=cfg.vocab_size, k=hidden, dtype=dt, pdl=key_pdl),
            rmsnorm_gemv.CANDIDATES, launch_head, self.configs["head"],
            graph_launches=lambda c: [lambda: launch_head(c, pdl)])
        self._make_workspaces()
        return dict(self.configs)

    # ------------------------------------------------------------------------------------------- step

    def _attention_input(self, i: int, fused: FusedLayer) -> None:
        """Norm, QKV projection and RoPE; q into self.q, k/v into the cache."""
        cfg, layer = self.config, self.model.layers[i]
        k_cache, v_cache = self.cache.k[i], self.cache.v[i]
        if not cfg.qk_norm:
            t = cfg.layer_rope_table(i)
            qkv_rope.qkv_rope(self.x, layer.attn_norm.weight, fused.w_qkv, cfg.rms_norm_eps, self.cos_tables[t],
                              self.sin_tables[t], self.state, self.q, k_cache, v_cache, num_heads=cfg.num_heads,
                              num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, bias=fused.b_qkv,
                              unit_offset=cfg.norm_unit_offset, per_step_table=self.dynamic_rope,
                              config=self.configs["qkv"], pdl=self.pdl)
            return
        # q/k norms need whole heads (or whole projections) before RoPE: project, then eager norms and RoPE.
        rmsnorm_gemv.rmsnorm_gemv(self.x, layer.attn_norm.weight, fused.w_qkv, cfg.rms_norm_eps, self.qkv,
                                  bias=fused.b_qkv, unit_offset=cfg.norm_unit_offset,
                                  config=self.configs["qkv_proj"], pdl=self.pdl)
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k = self.qkv[:q_dim], self.qkv[q_dim:q_dim + kv_dim]
        if cfg.qk_norm_full_width:  # OLMoE: one norm over the whole q (k) projection
            q, k = layer.attn.q_norm(q), layer.attn.k_norm(k)
        q = q.view(1, cfg.num_heads, 1, cfg.head_dim)
        k = k.view(1, cfg.num_kv_heads, 1, cfg.head_dim)
        if not cfg.qk_norm_full_width:
            q, k = layer.attn.q_norm(q), layer.attn.k_norm(k)
        v = self.qkv[q_dim + kv_dim:].view(cfg.num_kv_heads, cfg.head_dim)
        pos = self.state[STATE_POS:STATE_POS + 1]
        cos, sin = self.model.rotary(pos.view(1, 1), self.x.dtype, cfg.layer_rope_table(i))
        self.q.copy_(apply_rope(q, cos, sin).reshape(-1))
        k = apply_rope(k, cos, sin)
        store_kv(k_cache, v_cache, self.state[STATE_ROW:STATE_ROW + 1], pos, k[0, :, 0], v)

    def _moe_mlp(self, layer: torch.nn.Module) -> None:
        """Add the MoE block of `layer` (and its shared expert) to the residual stream, without a host sync."""
        cfg, mlp = self.config, layer.mlp
        shared = mlp.shared_expert is not None
        direct = not shared and not cfg.sandwich_norm
        moe.moe_mlp(self.x, mlp.router.weight, mlp.gate_up_proj, mlp.down_proj, cfg.num_experts_per_tok,
                    norm_weight=layer.mlp_norm.weight, eps=cfg.rms_norm_eps, unit_offset=cfg.norm_unit_offset,
                    norm_topk_prob=cfg.norm_topk_prob, weights_fp32=cfg.router_weights_fp32,
                    activation=cfg.hidden_act, residual=self.x if direct else None,
                    out=self.x if direct else self.h, scratch=self.moe_scratch, config=self.configs["moe"])
        if shared:
            # As SparseMoeBlock.forward: routed + sigmoid(gate(n)) * shared(n), each rounded by torch.
            n = layer.mlp_norm(self.x.view(1, -1))
            self.h.copy_((self.h + torch.sigmoid(mlp.shared_expert_gate(n)) * mlp.shared_expert(n)).view(-1))
        if cfg.sandwich_norm:
            self._add_normed(layer.mlp_out_norm, self.h)
        elif not direct:
            self.x.copy_(self.x + self.h)

    def _add_normed(self, norm: torch.nn.Module, h: torch.Tensor) -> None:
        # Gemma 2: x = x + post_norm(h), as DecoderLayer.forward computes it.
        self.x.copy_(self.x + norm(h.view(1, 1, -1)).view(-1))

    def __call__(self) -> None:
        """Run one step: reads the state, writes this token's k/v into the cache and the logits."""
        cfg, model = self.config, self.model
        token = self.state[STATE_TOKEN:STATE_TOKEN + 1]
        torch.index_select(model.embed.weight, 0, token, out=self.x.view(1, -1))
        if self.embed_scale is not None:
            self.x.mul_(self.embed_scale)
        if self.dynamic_rope:
            pos = self.state[STATE_POS:STATE_POS + 1]
            freqs = pos.float()[:, None] * dynamic_ntk_inv_freq(cfg, pos + 1)
            self.cos.copy_(freqs.cos())
            self.sin.copy_(freqs.sin())
        sandwich = cfg.sandwich_norm
        for i, fused in enumerate(self.fused):
            layer = model.layers[i]
            self._attention_input(i, fused)
            attention.decode_attention(
                self.q, self.cache.k[i], self.cache.v[i], self.state, self.attn_out,
                num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                scale=cfg.attn_scale, window=cfg.layer_sliding_windows[i], softcap=cfg.attn_logit_softcap,
                plan=self.attn_plan, pdl=self.pdl)
            gemv.gemv(fused.w_o, self.attn_out, self.h if sandwich else self.x, bias=fused.b_o,
                      residual=None if sandwich else self.x, config=self.configs["o"],
                      workspace=self._workspaces.get("o"), pdl=self.pdl)
            if sandwich:
                self._add_normed(layer.attn_out_norm, self.h)
            if fused.w_down is None:
                self._moe_mlp(layer)
                continue
            swiglu.gated_mlp(self.x, fused.w_gate_up, self.act, norm_weight=layer.mlp_norm.weight,
                             eps=cfg.rms_norm_eps, bias=fused.b_gate_up, activation=cfg.hidden_act,
                             unit_offset=cfg.norm_unit_offset, config=self.configs["gate_up"], pdl=self.pdl)
            gemv.gemv(fused.w_down, self.act, self.h if sandwich else self.x, bias=fused.b_down,
                      residual=None if sandwich else self.x, config=self.configs["down"],
                      workspace=self._workspaces.get("down"), pdl=self.pdl)
            if sandwich:
                self._add_normed(layer.mlp_out_norm, self.h)
        rmsnorm_gemv.rmsnorm_gemv(self.x, model.norm.weight, self.head_w, cfg.rms_norm_eps, self.logits,
                                  unit_offset=cfg.norm_unit_offset, config=self.configs["head"], pdl=self.pdl)
        cap = cfg.final_logit_softcap
        if cap is not None:
            # Eager soft-caps the logits in the activation dtype.
            capped = torch.tanh(self.logits.to(model.dtype) / cap) * cap
            self.logits.copy_(capped.float())
