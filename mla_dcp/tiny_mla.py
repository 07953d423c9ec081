"""A tiny MLA decoder to show that DCP verification is exact at the model level.

DeepSeek-V2/V3 style multi-head latent attention with random weights: each
token's KV is one latent ``c`` (``kv_lora_rank`` wide, RMS-normed) plus a
rope key shared by all heads; queries are absorbed into the latent space
(``q_latent = W_uk^T q_nope``) so attention runs against the cached latents,
and the value path applies ``W_uv`` after attention. Two ways to run it:

- :meth:`TinyMLA.decode_step`: one token per request on one device, with the
  plain (non-absorbed) attention over a dense cache: the reference.
- :meth:`TinyMLA.verify_step`: ``q`` tokens per request in one pass, with the
  KV cache sharded over ``W`` DCP ranks in paged caches and attention done
  by :func:`mla_dcp.verify` on each rank plus :func:`mla_dcp.merge_ranks`.

:func:`speculative_generate` drives the verify step as an engine would:
draft, verify, accept the longest matching prefix plus one bonus token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

import mla_dcp
from mla_dcp.pure.placement import local_position, owner_rank

__all__ = ["TinyMLAConfig", "TinyMLA", "DenseCache", "ShardedPagedCache", "speculative_generate"]


@dataclasses.dataclass(frozen=True)
class TinyMLAConfig:
    vocab: int = 97
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    q_nope_dim: int = 16
    rope_dim: int = 8
    kv_lora_rank: int = 32
    v_head_dim: int = 16
    max_len: int = 256
    rope_theta: float = 10000.0

    @property
    def softmax_scale(self) -> float:
        return (self.q_nope_dim + self.rope_dim) ** -0.5

    @property
    def cache_width(self) -> int:
        return self.kv_lora_rank + self.rope_dim


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on the last dim; ``positions`` broadcasts against x[..., 0]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.float()[..., None] * freqs
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class DenseCache:
    """Per layer, every request's latent KV in global order: the reference's cache."""

    def __init__(self, cfg: TinyMLAConfig, batch: int):
        self.kv = torch.zeros(cfg.layers, batch, cfg.max_len, cfg.cache_width)


class ShardedPagedCache:
    """Per layer and DCP rank, a paged cache and block table, as engines hold them.

    Position ``p`` of a request lives on rank ``owner_rank(p)`` at rank-local
    position ``local_position(p)``; blocks are handed out in a random order,
    and unused slots hold NaN so a wrong read cannot pass unnoticed.
    """

    def __init__(self, cfg: TinyMLAConfig, batch: int, world: int, interleave: int = 1, block_size: int = 4,
                 seed: int = 0):
        self.world, self.interleave, self.block_size = world, interleave, block_size
        per_rank = mla_dcp.pure.local_len(cfg.max_len, world, 0, interleave)
        blocks_per_request = -(-per_rank // block_size)
        gen = torch.Generator().manual_seed(seed)
        self.block_tables = [torch.randperm(batch * blocks_per_request, generator=gen).to(torch.int32)
                             .view(batch, blocks_per_request) for _ in range(world)]
        self.kv = torch.full((cfg.layers, world, batch * blocks_per_request, block_size, cfg.cache_width), math.nan)

    def write(self, layer: int, positions: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``values`` [B, n, width] at global ``positions`` [B, n]."""
        ranks = owner_rank(positions, self.world, self.interleave)
        local = local_position(positions, self.world, self.interleave)
        for rank in range(self.world):
            b, j = (ranks == rank).nonzero(as_tuple=True)
            blocks = self.block_tables[rank][b, local[b, j] // self.block_size].long()
            self.kv[layer, rank, blocks, local[b, j] % self.block_size] = values[b, j]


class TinyMLA(torch.nn.Module):
    def __init__(self, cfg: TinyMLAConfig = TinyMLAConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed)

        def param(*shape: int, scale: float | None = None) -> torch.nn.Parameter:
            fan_in = shape[-2] if len(shape) > 1 else 1
            std = scale if scale is not None else fan_in ** -0.5
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) * std, requires_grad=False)

        c, h = cfg, cfg.hidden
        self.embed = param(c.vocab, h, scale=1.0)
        self.lm_head = param(h, c.vocab, scale=3 * h ** -0.5)   # peaked logits: clear greedy choices
        self.final_norm = torch.nn.Parameter(torch.ones(h), requires_grad=False)
        self.layer_params = torch.nn.ModuleList()
        for _ in range(c.layers):
            layer = torch.nn.Module()
            layer.attn_norm = torch.nn.Parameter(torch.ones(h), requires_grad=False)
            layer.mlp_norm = torch.nn.Parameter(torch.ones(h), requires_grad=False)
            layer.kv_norm = torch.nn.Parameter(torch.ones(c.kv_lora_rank), requires_grad=False)
            layer.w_q = param(h, c.heads * (c.q_nope_dim + c.rope_dim))
            layer.w_dkv = param(h, c.kv_lora_rank + c.rope_dim)
            layer.w_uk = param(c.heads, c.q_nope_dim, c.kv_lora_rank, scale=c.kv_lora_rank ** -0.5)
            layer.w_uv = param(c.heads, c.v_head_dim, c.kv_lora_rank, scale=c.kv_lora_rank ** -0.5)
            layer.w_o = param(c.heads * c.v_head_dim, h)
            layer.w_up = param(h, 4 * h)
            layer.w_down = param(4 * h, h)
            self.layer_params.append(layer)

    # -- the parts both paths share -------------------------------------------------
    def _queries_and_kv(self, layer, x: torch.Tensor, positions: torch.Tensor):
        """x [B, n, hidden] at positions [B, n] -> q_nope [B,n,H,dn], q_rope [B,n,H,dr], latent KV [B,n,Dl+dr]."""
        c = self.cfg
        h = _rms_norm(x, layer.attn_norm)
        q = (h @ layer.w_q).view(*x.shape[:2], c.heads, c.q_nope_dim + c.rope_dim)
        q_nope, q_rope = q[..., :c.q_nope_dim], _rope(q[..., c.q_nope_dim:], positions[..., None], c.rope_theta)
        kv = h @ layer.w_dkv
        latent = _rms_norm(kv[..., :c.kv_lora_rank], layer.kv_norm)
        k_rope = _rope(kv[..., c.kv_lora_rank:], positions, c.rope_theta)
        return q_nope, q_rope, torch.cat([latent, k_rope], dim=-1)

    def _finish_layer(self, layer, x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """values [B, n, H, dv] -> residual stream after attention and MLP."""
        x = x + values.flatten(-2) @ layer.w_o
        return x + torch.relu(_rms_norm(x, layer.mlp_norm) @ layer.w_up) @ layer.w_down

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.final_norm) @ self.lm_head

    # -- reference: one token at a time, plain attention, one device --------------
    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: DenseCache) -> torch.Tensor:
        """tokens [B] at positions [B] -> logits [B, vocab]; writes their KV."""
        c = self.cfg
        x = self.embed[tokens][:, None]
        batch = torch.arange(tokens.shape[0])
        for index, layer in enumerate(self.layer_params):
            q_nope, q_rope, kv = self._queries_and_kv(layer, x, positions[:, None])
            cache.kv[index, batch, positions] = kv[:, 0]
            keys = cache.kv[index]                                               # [B, max_len, Dl+dr]
            latent, k_rope = keys[..., :c.kv_lora_rank], keys[..., c.kv_lora_rank:]
            k_nope = torch.einsum("hdl,bnl->bnhd", layer.w_uk, latent)          # explicit, not absorbed
            v = torch.einsum("hdl,bnl->bnhd", layer.w_uv, latent)
            scores = (torch.einsum("bhd,bnhd->bhn", q_nope[:, 0], k_nope)
                      + torch.einsum("bhd,bnd->bhn", q_rope[:, 0], k_rope)) * c.softmax_scale
            visible = torch.arange(c.max_len)[None, :] <= positions[:, None]
            scores = scores.masked_fill(~visible[:, None, :], -math.inf)
            values = torch.einsum("bhn,bnhd->bhd", scores.softmax(-1), v)
            x = self._finish_layer(layer, x, values[:, None])
        return self._logits(x)[:, 0]

    # -- verify: q tokens per request, DCP-sharded cache, mla_dcp ------------------
    @torch.no_grad()
    def verify_step(self, tokens: torch.Tensor, start: torch.Tensor, cache: ShardedPagedCache,
                    merge: Callable | None = None) -> torch.Tensor:
        """tokens [B, q] at positions start[b] + t -> logits [B, q, vocab].

        Writes the tokens' KV into the sharded cache, then every rank runs
        :func:`mla_dcp.verify` on its own shard and the partials are merged
        (``merge`` defaults to the stacked :func:`mla_dcp.merge_ranks`).
        """
        c = self.cfg
        batch, qlen = tokens.shape
        positions = start[:, None] + torch.arange(qlen)
        seq_lens = (start + qlen).to(torch.int32)
        x = self.embed[tokens]
        for index, layer in enumerate(self.layer_params):
            q_nope, q_rope, kv = self._queries_and_kv(layer, x, positions)
            cache.write(index, positions, kv)
            q_latent = torch.einsum("bthd,hdl->bthl", q_nope, layer.w_uk)       # absorbed
            queries = torch.cat([q_latent, q_rope], dim=-1).reshape(batch * qlen, c.heads, c.cache_width)
            partials = []
            for rank in range(cache.world):
                cfg = mla_dcp.VerifyConfig(
                    num_heads=c.heads, qlen=qlen, block_size=cache.block_size, max_model_len=c.max_len,
                    dcp_world_size=cache.world, dcp_rank=rank, interleave=cache.interleave,
                    kv_lora_rank=c.kv_lora_rank, rope_dim=c.rope_dim, softmax_scale=c.softmax_scale)
                view = mla_dcp.build_view(cfg, seq_lens, cache.block_tables[rank], q_dtype=queries.dtype,
                                          kv_dtype=cache.kv.dtype)
                partials.append(mla_dcp.verify(cfg, view, queries, cache.kv[index, rank]))
            outs, lses = torch.stack([p[0] for p in partials]), torch.stack([p[1] for p in partials])
            latent_out, _ = (merge or mla_dcp.merge_ranks)(outs, lses)
            values = torch.einsum("rhl,hdl->rhd", latent_out, layer.w_uv).view(batch, qlen, c.heads, -1)
            x = self._finish_layer(layer, x, values)
        return self._logits(x)


def speculative_generate(model: TinyMLA, prompt: torch.Tensor, steps: int, draft: Callable, world: int,
                         interleave: int = 1, block_size: int = 4) -> dict:
    """Greedy speculative decoding with a DCP-sharded cache.

    Prefills ``prompt`` [B, P] as one verify pass, then for ``steps`` steps:
    ``draft(step, committed)`` proposes ``k`` tokens [B, k]; one verify pass
    over ``[last token, drafts]`` scores them; each request accepts the
    longest prefix of drafts that match its greedy choices plus one bonus
    token. Returns the committed tokens, per-step accepted counts and the
    logits of every committed position (for comparison with
    one-at-a-time decoding).
    """
    batch, prompt_len = prompt.shape
    cache = ShardedPagedCache(model.cfg, batch, world, interleave, block_size)
    logits = model.verify_step(prompt, torch.zeros(batch, dtype=torch.long), cache)
    committed = [list(row) for row in prompt.tolist()]
    kept_logits = [list(row) for row in logits]                       # logits after each committed token
    accepted_counts = []
    for step in range(steps):
        next_token = torch.stack([row[-1] for row in kept_logits]).argmax(-1)
        drafts = draft(step, committed)                               # [B, k]
        tokens = torch.cat([next_token[:, None], drafts], dim=1)
        start = torch.tensor([len(row) for row in committed])
        step_logits = model.verify_step(tokens, start, cache)         # [B, k+1, vocab]
        greedy = step_logits.argmax(-1)
        counts = []
        for b in range(batch):
            accepted = 0
            while accepted < drafts.shape[1] and int(drafts[b, accepted]) == int(greedy[b, accepted]):
                accepted += 1
            # next_token, the accepted drafts; the bonus token comes from the
            # logits of the last accepted row at the next step.
            new_tokens = tokens[b, :accepted + 1].tolist()
            committed[b].extend(new_tokens)
            kept_logits[b].extend(step_logits[b, :accepted + 1])
            counts.append(accepted)
        accepted_counts.append(counts)
    return {"tokens": committed, "logits": kept_logits, "accepted": accepted_counts}


def greedy_reference(model: TinyMLA, prompt: torch.Tensor, total_len: int) -> dict:
    """One token at a time on one device: tokens and logits after each position."""
    batch, prompt_len = prompt.shape
    cache = DenseCache(model.cfg, batch)
    tokens = prompt.tolist()
    logits_after = [[] for _ in range(batch)]
    for pos in range(total_len):
        current = torch.tensor([row[pos] for row in tokens])
        logits = model.decode_step(current, torch.full((batch,), pos), cache)
        for b in range(batch):
            logits_after[b].append(logits[b])
            if pos + 1 >= len(tokens[b]):
                tokens[b].append(int(logits[b].argmax()))
    return {"tokens": tokens, "logits": logits_after}
