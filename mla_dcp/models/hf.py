"""Hugging Face DeepSeek-V2/V3 (and Kimi-K2) models with attention through mla_dcp.

:class:`MLAVerifier` wraps a ``DeepseekV2ForCausalLM`` or
``DeepseekV3ForCausalLM`` (random weights from a config, or a checkpoint
loaded with ``from_pretrained``; Kimi-K2 checkpoints load as DeepSeek-V3).
Everything but the attention core is the model's own code: embeddings,
norms, the query LoRA, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, rope (YaRN
included), MLP and MoE, ``o_proj``, the lm head. The attention runs in the
absorbed decode form: ``kv_b_proj``'s key part is folded into the query,
its value part applied to the latent output, and each DCP rank keeps a paged
cache of ``[normed c_kv, rotated k_pe]`` holding only the tokens DCP places
on it. The softmax scale is the model's own (``self_attn.scaling``, YaRN's
mscale included).

The DCP group is simulated in one process (``dcp_world_size`` ranks merged
with :func:`mla_dcp.merge_ranks`), or is a real ``torch.distributed`` group
(``group=``): each process then holds only its own rank's cache and merges
with :func:`mla_dcp.distributed.merge`.

>>> import torch
>>> from mla_dcp.models import hf
>>> model = hf.tiny_model("deepseek_v3", seed=0)
>>> verifier = hf.MLAVerifier(model, dcp_world_size=2, block_size=4, max_len=64)
>>> logits = verifier.prefill(torch.tensor([[5, 6, 7, 8]]))
>>> logits.shape
torch.Size([1, 4, 128])
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Sequence

import torch

import mla_dcp
from mla_dcp.pure.placement import local_len

__all__ = ["MLAVerifier", "tiny_config", "tiny_model", "prompt_lookup_drafts", "prompt_lookup_tree",
           "speculative_generate_tree", "speculative_generate",
           "speculative_generate_batch", "SpecResult", "StepTimes", "load_model"]

_FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")


def _require_transformers():
    try:
        import transformers
    except ImportError as missing:  # pragma: no cover - the extra is installed in tests
        raise ImportError("mla_dcp.models.hf needs transformers: pip install 'mla_dcp[hf]'") from missing
    return transformers


def tiny_config(family: str = "deepseek_v3", **overrides):
    """A small random-weight config of ``family`` (``"deepseek_v3"``,
    ``"deepseek_v2"``, ``"kimi_k2"``, a DeepSeek-V3 config shaped like
    Kimi-K2's: more heads, YaRN factor 32, ``"deepseek_v32"``, DeepSeek-V3.2
    with its sparse attention's indexer keeping the top 8 positions a token,
    so that contexts past 8 tokens are read sparsely, or ``"glm_moe_dsa"``,
    GLM-5's: the same sparse attention, its second layer sharing the first's
    picks): query LoRA, YaRN rope
    with its mscale, a dense layer then an MoE layer, so every part of the
    real model code runs on a CPU in milliseconds."""
    transformers = _require_transformers()
    if family not in _FAMILIES:
        raise ValueError(f"family must be one of {_FAMILIES}, got {family!r}")
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                  n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
                  q_lora_rank=24, qk_rope_head_dim=16, v_head_dim=16, qk_nope_head_dim=16,
                  max_position_embeddings=1024,
                  # Large enough that attention moves the logits far beyond float32 rounding, and
                  # greedy choices are not near-ties.
                  initializer_range=0.2)
    yarn = {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
    if family == "deepseek_v2":
        kwargs = {**common, "n_group": 2, "topk_group": 1, "topk_method": "group_limited_greedy"}
        return transformers.DeepseekV2Config(**{**kwargs, **overrides})
    if family in ("deepseek_v32", "glm_moe_dsa"):
        # 16 index heads: a key scores exactly 0 (every head's relu at 0) rarely enough that the top 8
        # hold no tie (with 4, one key in 16 did, and which tied key a top-k keeps is implementation-
        # defined: the adapter's call of the indexer and the model's own may keep different ones).
        kwargs = {**common, "n_group": 2, "topk_group": 1, "rope_parameters": yarn, "index_topk": 8,
                  "index_head_dim": 32, "index_n_heads": 16}
        if family == "glm_moe_dsa":
            return transformers.GlmMoeDsaConfig(**{**kwargs, "indexer_types": ["full", "shared"], **overrides})
        return transformers.DeepseekV32Config(**{**kwargs, **overrides})
    kwargs = {**common, "n_group": 2, "topk_group": 1, "rope_scaling": yarn}
    if family == "kimi_k2":
        kwargs.update(num_attention_heads=8, num_key_value_heads=8, n_group=1, topk_group=1,
                      rope_scaling={**yarn, "factor": 32.0})
    return transformers.DeepseekV3Config(**{**kwargs, **overrides})


def tiny_model(family: str = "deepseek_v3", seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """:func:`tiny_config`'s model with seeded random weights, in eval mode."""
    transformers = _require_transformers()
    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    cls = {"deepseek_v2": transformers.DeepseekV2ForCausalLM, "deepseek_v32": transformers.DeepseekV32ForCausalLM,
           "glm_moe_dsa": transformers.GlmMoeDsaForCausalLM}.get(family, transformers.DeepseekV3ForCausalLM)
    model = cls(config).eval().to(dtype)
    if dtype == torch.float64 and hasattr(model.config, "_experts_implementation"):
        # The grouped-matmul experts have no float64 kernel; the reference model takes the plain loop.
        model.config._experts_implementation = "eager"
    return model


def load_model(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """A local checkpoint folder (``save_pretrained``'s, or a downloaded
    DeepSeek-V2/V3 / Kimi-K2 one) through ``AutoModelForCausalLM``."""
    transformers = _require_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def _rope_fn(attn) -> Callable:
    """The model family's own rope for (q_pe, k_pe, position_embeddings)."""
    module = inspect.getmodule(type(attn))
    if hasattr(module, "apply_rotary_emb"):                    # DeepSeek-V2: complex frequencies
        return lambda q, k, emb: module.apply_rotary_emb(q, k, emb.to(q.device))
    # DeepSeek-V3.2's attention always rotates interleaved pairs (its config has no switch).
    interleave = getattr(attn.config, "rope_interleave", False) or hasattr(attn, "indexer")
    fn = module.apply_rotary_pos_emb_interleave if interleave else module.apply_rotary_pos_emb
    return lambda q, k, emb: fn(q, k, *emb)


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Mean time per verify step (prefill excluded), in microseconds:
    ``attention`` the :func:`mla_dcp.verify` calls of every layer (every
    simulated rank's, one after another, where the group is simulated),
    ``merge`` the DCP merges of every layer, ``rest`` everything else of the
    step (the model's own layers, cache writes, metadata), ``step`` the whole
    :meth:`MLAVerifier.forward`."""
    steps: int
    attention_us: float
    merge_us: float
    rest_us: float
    step_us: float


class _PhaseTimer:
    """Wall time spent in named phases: CUDA events on a GPU (recorded on the
    current stream, read once by :meth:`totals_us`, so timing adds no host
    sync to a step), the host clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = {}

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        start = self._mark()
        try:
            yield
        finally:
            self.spans.setdefault(name, []).append((start, self._mark()))

    def totals_us(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {name: sum(a.elapsed_time(b) for a, b in spans) * 1e3 for name, spans in self.spans.items()}
        return {name: sum(b - a for a, b in spans) * 1e6 for name, spans in self.spans.items()}


@dataclasses.dataclass
class _Step:
    """What the attention of every layer needs for one call: where the new
    tokens go, and the step's views (one per rank held here)."""
    slots: dict                   # rank -> int64 [N]: each new token's slot there (mla_dcp.cache_slots)
    views: dict                   # rank -> VerifyView
    # Ragged calls (tokens packed request after request): where they sit among the views' rows;
    # None where every request has the views' qlen tokens.
    blocks: mla_dcp.RaggedBlocks | None = None
    # Tree calls: each layer's latent rows of the step's tokens (layer -> [N, Dl+Dr]), kept to write
    # the accepted path again after the step; None otherwise.
    latents: dict | None = None
    # Sparse models (DeepSeek-V3.2, GLM-5): each packed token's request and position (int64 [T] each),
    # and the last indexer's picks (int32 [T, topk]) for the layers that share them.
    tokens: tuple | None = None
    shared_indices: torch.Tensor | None = None
    # Sparse models' tree calls: the positions each packed token's indexer may pick (bool [T, max_len]:
    # the committed tokens and its own ancestors); None: up to its own position.
    pickable: torch.Tensor | None = None


class MLAVerifier:
    """Decoding and speculative verification of an HF DeepSeek model through mla_dcp.

    Parameters
    ----------
    model : DeepseekV2ForCausalLM | DeepseekV3ForCausalLM
    dcp_world_size, interleave : int
        DCP group size ``W`` and interleave ``I`` (token ``p`` on rank ``(p // I) % W``).
    block_size : int
        Tokens per physical cache block.
    max_len : int
        Longest sequence (prompt, generated tokens and drafts) a request may reach.
    batch : int
        Requests decoded together.
    group : torch.distributed.ProcessGroup or None
        A real DCP group: this process is rank ``group.rank()`` and holds only
        its cache; ``dcp_world_size`` is then the group's size.
    verify_fn : callable or None
        Replaces :func:`mla_dcp.verify` (e.g. a ``torch.compile``'d one).
    batch_invariant : bool
        ``VerifyConfig(batch_invariant=True)`` for every step: each row's
        attention bits are independent of the batch and of the step's ``s``.
    kv_scale : float or None
        An e4m3fn cache with this per-tensor scale (each latent stored as
        ``latent / kv_scale`` rounded to e4m3, as an engine's fp8 cache);
        None: a cache of the model's dtype.
    fp8_products : bool
        ``VerifyConfig(fp8_products=True)`` (needs ``kv_scale``).
    fp8_ds_mla : bool
        A sparse model's caches in DeepSeek's fp8 layout (:func:`mla_dcp.fp8_ds_mla_width`: e4m3 latent
        with a scale per 128 values, bf16 rope), as DeepSeek-V3.2 deployments keep them.
    stream : bool or None
        ``VerifyConfig.stream`` for every step: None the default schedule,
        False one piece per program (see :class:`mla_dcp.VerifyConfig`).
    timed : bool
        Time each verify step's attention, DCP merge and the rest
        (:meth:`step_times`; CUDA events on a GPU, no host sync per step).
        A diagnostic: two events per layer and phase are kept until
        :meth:`reset_times` (each :func:`speculative_generate` starts with one).

    Every unused cache slot holds NaN and every unused block-table entry an
    out-of-range id, so a read of anything a row must not see is loud.
    """

    def __init__(self, model, *, dcp_world_size: int = 1, interleave: int = 1, block_size: int = 16,
                 max_len: int = 512, batch: int = 1, group=None, verify_fn: Callable | None = None, seed: int = 0,
                 batch_invariant: bool = False, kv_scale: float | None = None, fp8_products: bool = False,
                 stream: bool | None = None, timed: bool = False, fp8_ds_mla: bool = False):
        if fp8_products and kv_scale is None:
            raise ValueError("fp8_products=True needs an e4m3 cache: pass kv_scale (the cache's per-tensor scale)")
        if fp8_ds_mla and (kv_scale is not None or fp8_products):
            raise ValueError("fp8_ds_mla=True keeps its scales in the cache: pass no kv_scale and no fp8_products")
        self.model = model
        self.batch_invariant, self.fp8_products, self.stream = batch_invariant, fp8_products, stream
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_lora_rank = config.kv_lora_rank
        self.rope_dim = config.qk_rope_head_dim
        self.nope_dim = config.qk_nope_head_dim
        self.v_dim = config.v_head_dim
        self.group = group
        if group is not None:
            import torch.distributed as dist

            dcp_world_size, self.ranks = dist.get_world_size(group), [dist.get_rank(group)]
        else:
            self.ranks = list(range(dcp_world_size))
        self.world, self.interleave, self.block_size = dcp_world_size, interleave, block_size
        self.max_len, self.batch = max_len, batch
        self.verify_fn = verify_fn or mla_dcp.verify
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kv_scale = None if kv_scale is None else torch.tensor([float(kv_scale)], device=self.device)
        self.cache_dtype = torch.uint8 if fp8_ds_mla else self.dtype if kv_scale is None else torch.float8_e4m3fn
        self.layers = [layer.self_attn for layer in model.model.layers]
        # Absorbed weights: kv_b_proj [H*(nope+v), Dl] -> key part [H, nope, Dl], value part [H, v, Dl].
        self._w_uk, self._w_uv = [], []
        for attn in self.layers:
            w = attn.kv_b_proj.weight.view(self.heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
            self._w_uk.append(w[:, :self.nope_dim])
            self._w_uv.append(w[:, self.nope_dim:])
        self._rope = _rope_fn(self.layers[0])
        self._scale = float(self.layers[0].scaling)
        # DeepSeek-V3.2's sparse attention: its indexer picks each token's top-k positions per layer
        # from index keys of its own, kept here whole for every request (each DCP rank then reads
        # the picked positions it holds: mla_dcp.verify_sparse).
        indexers = [attn.indexer for attn in self.layers if getattr(attn, "indexer", None) is not None]
        self.sparse = bool(indexers)
        if self.sparse:
            self._index_keys = torch.full((len(self.layers), batch, max_len, indexers[0].head_dim), math.nan,
                                          device=self.device, dtype=self.dtype)
        if fp8_ds_mla and not self.sparse:
            raise ValueError("fp8_ds_mla=True: DeepSeek's fp8 layout is read by mla_dcp.verify_sparse, a sparse "
                             f"model's attention (DeepSeek-V3.2, GLM-5); {type(model).__name__} has none")
        # GLM-5's attention also returns its picks for the next (shared) layer.
        self._returns_picks = "prev_topk_indices" in inspect.signature(type(self.layers[0]).forward).parameters
        # Paged caches: per rank held here, [layers, num_blocks, block_size, Dl + Dr], blocks in random order.
        gen = torch.Generator().manual_seed(seed)
        blocks_per_request = -(-local_len(max_len, self.world, 0, interleave) // block_size)
        num_blocks = batch * blocks_per_request + 1
        width = (mla_dcp.fp8_ds_mla_width(self.kv_lora_rank, self.rope_dim) if fp8_ds_mla
                 else self.kv_lora_rank + self.rope_dim)
        self.caches, self.block_tables = {}, {}
        for rank in self.ranks:
            order = torch.randperm(num_blocks, generator=gen)[:batch * blocks_per_request]
            self.block_tables[rank] = order.view(batch, blocks_per_request).to(torch.int32).to(self.device)
            shape = (len(self.layers), num_blocks, block_size, width)
            # Bytes of all ones read as NaN in DeepSeek's layout (e4m3 and float32 alike).
            self.caches[rank] = (torch.full(shape, 255, dtype=torch.uint8, device=self.device) if fp8_ds_mla
                                 else torch.full(shape, math.nan, device=self.device).to(self.cache_dtype))
        self.lengths = torch.zeros(batch, dtype=torch.int64)
        self._step: _Step | None = None
        self._timer = _PhaseTimer(self.device) if timed else None
        self._prefilling = False
        self._tree = None            # the last tree step's latents and packing (commit_tree)
        self._tree_parents: list[list[int]] = []

    # -- the cache -------------------------------------------------------

    def _config(self, qlen: int, rank: int) -> mla_dcp.VerifyConfig:
        return mla_dcp.VerifyConfig(
            num_heads=self.heads, qlen=qlen, block_size=self.block_size, max_model_len=self.max_len,
            dcp_world_size=self.world, dcp_rank=rank, interleave=self.interleave,
            kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim, softmax_scale=self._scale,
            batch_invariant=self.batch_invariant, fp8_products=self.fp8_products, stream=self.stream)

    def _write(self, layer: int, latent: torch.Tensor) -> None:
        """latent [N, Dl+Dr] of the step's tokens, each into the cache of the rank DCP places it on."""
        for rank in self.ranks:
            mla_dcp.write_cache(self.caches[rank][layer], self._step.slots[rank], latent, self.kv_scale)

    # -- attention ---------------------------------------------------------

    def _attention(self, layer: int, attn, hidden_states: torch.Tensor, position_embeddings) -> torch.Tensor:
        batch, qlen, _ = hidden_states.shape
        if attn.q_lora_rank is None:
            q_resid, q = None, attn.q_proj(hidden_states)
        else:
            q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
            q = attn.q_b_proj(q_resid)
        q = q.view(batch, qlen, self.heads, self.nope_dim + self.rope_dim).transpose(1, 2)   # [B, H, s, nope+r]
        q_nope, q_pe = torch.split(q, [self.nope_dim, self.rope_dim], dim=-1)
        kv_nope, k_pe = torch.split(attn.kv_a_proj_with_mqa(hidden_states), [self.kv_lora_rank, self.rope_dim], -1)
        kv_nope = attn.kv_a_layernorm(kv_nope)
        q_pe, k_pe = self._rope(q_pe, k_pe.view(batch, 1, qlen, self.rope_dim), position_embeddings)
        latent = torch.cat([kv_nope, k_pe[:, 0]], dim=-1).flatten(0, 1)
        self._write(layer, latent)
        if self._step.latents is not None:
            self._step.latents[layer] = latent
        # Absorbed query: q_nope [B, H, s, nope] . w_uk [H, nope, Dl] -> [B, H, s, Dl].
        q_latent = torch.einsum("bhsn,hnl->bhsl", q_nope, self._w_uk[layer])
        queries = torch.cat([q_latent, q_pe], dim=-1).transpose(1, 2).reshape(batch * qlen, self.heads, -1)
        queries = queries.to(self.dtype).contiguous()
        blocks = self._step.blocks
        indices = self._index_topk(layer, attn, hidden_states, q_resid, position_embeddings) if self.sparse else None
        if blocks is not None:
            # Packed tokens of requests with different counts: each on the last rows of its block.
            queries = blocks.rows(queries)
            indices = None if indices is None else blocks.rows(indices)
        partials = []
        with self._phase("attention"):
            for rank in self.ranks:
                cfg = self._step.views[rank].cfg
                if indices is None:
                    partials.append(self.verify_fn(cfg, self._step.views[rank], queries, self.caches[rank][layer],
                                                   self.kv_scale))
                else:
                    partials.append(mla_dcp.verify_sparse(cfg, self._step.views[rank], queries,
                                                          self.caches[rank][layer], indices, self.kv_scale))
        if self.group is not None:
            from mla_dcp import distributed

            with self._phase("merge"):
                latent_out, lse = distributed.merge(*partials[0], group=self.group, method="all_reduce")
        elif len(partials) == 1:
            latent_out, lse = partials[0]
        else:
            with self._phase("merge"):
                latent_out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]),
                                                      torch.stack([l for _, l in partials]))
        if blocks is not None:
            latent_out, _ = blocks.tokens(latent_out, lse)
        # Value up-projection: [B*s, H, Dl] . w_uv [H, v, Dl] -> [B, s, H*v].
        out = torch.einsum("thl,hvl->thv", latent_out.to(self.dtype), self._w_uv[layer])
        return attn.o_proj(out.reshape(batch, qlen, self.heads * self.v_dim))

    def _index_topk(self, layer: int, attn, hidden_states: torch.Tensor, q_resid: torch.Tensor,
                    position_embeddings) -> torch.Tensor:
        """Each of this step's tokens' top-k positions by the model's own indexer (DeepSeek-V3.2,
        GLM-5): called with every token as a batch of one against its request's index keys (kept
        here, this step's written first), masked to the positions up to its own. int32 [T, topk],
        tokens as packed. A layer without an indexer (GLM-5's shared layers) reuses the previous
        one's picks."""
        if attn.indexer is None:
            return self._step.shared_indices
        requests, positions = self._step.tokens
        count = requests.shape[0]
        store = self._index_keys[layer]
        cos, sin = position_embeddings

        class Keys:     # the indexer's cache: this step's keys in, each token's request's keys out
            @staticmethod
            def update_indexer(k, layer_idx):
                store[requests, positions] = k[:, 0].to(store.dtype)
                return store[requests]

        if self._step.pickable is not None:
            visible = self._step.pickable[:, None, :]
        else:
            visible = torch.arange(store.shape[1], device=positions.device)[None, None, :] <= positions[:, None, None]
        picks = attn.indexer(hidden_states.reshape(count, 1, -1), q_resid.reshape(count, 1, -1),
                             (cos.reshape(count, 1, -1), sin.reshape(count, 1, -1)), visible, None, cache=Keys())
        self._step.shared_indices = picks[:, 0]
        return self._step.shared_indices

    @contextlib.contextmanager
    def _routed(self):
        """Every layer's attention through :meth:`_attention` for the block,
        the model's own attention again after it (so HF's ``generate`` and
        forward stay the reference)."""
        originals = []
        for index, attn in enumerate(self.layers):
            originals.append(attn.forward)

            def forward(*args, _index=index, _attn=attn, **kwargs):
                hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                out = self._attention(_index, _attn, hidden, kwargs["position_embeddings"])
                if self._returns_picks:
                    picks = self._step.shared_indices
                    return out, None, None if picks is None else picks.view(*hidden.shape[:2], -1)
                return out, None
            attn.forward = forward
        try:
            yield
        finally:
            for attn, original in zip(self.layers, originals):
                attn.forward = original

    # -- timing --------------------------------------------------------------

    @property
    def timed(self) -> bool:
        """Whether verify steps are timed (``timed=True``)."""
        return self._timer is not None

    def _phase(self, name: str):
        """The timer's phase ``name`` where this step is timed (a verify step of a timed verifier)."""
        if self._timer is None or self._prefilling:
            return contextlib.nullcontext()
        return self._timer.phase(name)

    def step_times(self) -> StepTimes:
        """Mean :class:`StepTimes` of the verify steps since construction or
        :meth:`reset_times` (waits for the device once). Needs ``timed=True``."""
        if not self.timed:
            raise RuntimeError("step_times() needs MLAVerifier(..., timed=True)")
        totals = self._timer.totals_us()
        steps = len(self._timer.spans.get("step", ()))
        mean = {name: totals.get(name, 0.0) / max(steps, 1) for name in ("attention", "merge", "step")}
        return StepTimes(steps, mean["attention"], mean["merge"],
                         mean["step"] - mean["attention"] - mean["merge"], mean["step"])

    def reset_times(self) -> None:
        """Forget the steps timed so far."""
        if self._timer is not None:
            self._timer.spans.clear()

    # -- steps ---------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` [B, s] as the next ``s`` tokens of every request:
        their KV goes into the cache at positions ``lengths .. lengths+s-1``
        and every row attends causally to the cache. Returns logits [B, s, V].
        ``lengths`` is not advanced: :meth:`commit` says how many stay."""
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.dim() != 2 or tokens.shape[0] != self.batch:
            raise ValueError(f"tokens must have shape [{self.batch}, s], got {list(tokens.shape)}")
        qlen = tokens.shape[1]
        seq_lens = self.lengths + qlen
        if int(seq_lens.max()) > self.max_len:
            raise ValueError(f"a request would reach {int(seq_lens.max())} tokens, past max_len={self.max_len}")
        positions = self.lengths[:, None] + torch.arange(qlen)[None, :]
        return self._run(tokens, positions, seq_lens, qlen, None)

    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor, qlen: int,
             starts: torch.Tensor | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The model over ``input_ids`` (``positions`` of its shape, on the host: rotary positions),
        every layer's attention through the views of ``seq_lens`` and ``qlen`` (and the block
        ``mask`` of a tree step, whose latents are kept: :meth:`commit_tree`), its tokens written
        to the caches. A sparse model's tree step takes causal views: each token's indexer picks
        only among the committed tokens and its own ancestors, so its picks carry the tree."""
        sparse_tree = mask is not None and self.sparse
        with self._phase("step"):
            positions = positions.to(self.device)
            seq_lens_dev = seq_lens.to(torch.int32).to(self.device)
            blocks = None if starts is None else mla_dcp.ragged_blocks(starts.to(self.device), qlen,
                                                                        input_ids.shape[1])
            views, slots = {}, {}
            for rank in self.ranks:
                cfg = self._config(qlen, rank)
                views[rank] = mla_dcp.build_view(cfg, seq_lens_dev, self.block_tables[rank], q_dtype=self.dtype,
                                                 kv_dtype=self.dtype if self.cache_dtype == torch.uint8
                                                 else self.cache_dtype,
                                                 block_mask=None if mask is None or sparse_tree
                                                 else mask.to(self.device))
                slots[rank] = mla_dcp.cache_slots(cfg, seq_lens_dev, self.block_tables[rank], blocks=blocks)
            self._step = _Step(slots, views, blocks, None if mask is None else {})
            if self.sparse:
                counts = (positions.new_full((positions.shape[0],), positions.shape[1]) if starts is None
                          else starts.diff().to(positions.device))
                requests = torch.repeat_interleave(torch.arange(counts.shape[0], device=positions.device), counts)
                if starts is not None:
                    requests = requests[None].expand_as(positions)
                requests = requests.flatten().to(self.device)
                # Where each token's index key goes: its cache position (a tree node's is its place
                # in the tree's order behind the committed tokens, not its rotary position).
                first = (seq_lens.to(self.device) - counts.to(self.device))[requests]
                nodes = (torch.arange(requests.shape[0], device=self.device)
                         - (0 if starts is None else starts.to(self.device)[requests]))
                if starts is None:
                    nodes = nodes % qlen
                self._step.tokens = (requests, first + nodes)
                if sparse_tree:
                    self._step.pickable = _tree_pickable(mask.to(self.device), requests, nodes, first,
                                                         counts.to(self.device)[requests], qlen, self.max_len)
            try:
                with self._routed():
                    logits = self.model(input_ids=input_ids, position_ids=positions, use_cache=False).logits
                self._tree = None if mask is None else (self._step.latents, starts)
                return logits
            finally:
                self._step = None

    @torch.inference_mode()
    def forward_ragged(self, tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Run ``tokens[b]`` as the next tokens of request ``b``, as many as each has (none
        for a request that sits this step out): one call, the tokens packed as an engine
        packs them (:func:`mla_dcp.ragged_blocks`; the verify block is the longest count).
        Returns each request's logits [len(tokens[b]), V]; ``lengths`` is not advanced."""
        if len(tokens) != self.batch:
            raise ValueError(f"tokens must hold {self.batch} requests' tokens, got {len(tokens)}")
        counts = torch.tensor([len(t) for t in tokens], dtype=torch.int64)
        seq_lens = self.lengths + counts
        if int(seq_lens.max()) > self.max_len:
            raise ValueError(f"a request would reach {int(seq_lens.max())} tokens, past max_len={self.max_len}")
        qlen, total = int(counts.max()), int(counts.sum())
        if qlen == 0:
            return [torch.empty(0, self.model.config.vocab_size, device=self.device) for _ in tokens]
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        requests = torch.repeat_interleave(torch.arange(self.batch), counts)
        positions = self.lengths[requests] + torch.arange(total) - starts[requests]
        ids = torch.tensor([[t for request in tokens for t in request]], device=self.device)
        logits = self._run(ids, positions[None, :], seq_lens, qlen, starts)
        return list(logits[0].split(counts.tolist()))

    @torch.inference_mode()
    def forward_tree(self, trees: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[torch.Tensor]:
        """Run each request's token tree as its next tokens (a tree drafter's step: EAGLE, Medusa).

        ``trees[b] = (tokens, parents)``: node ``i`` is ``tokens[i]``, its parent ``parents[i]``
        a node before it or -1 for a root (a node that follows the request's last committed
        token); empty for a request that sits the step out. Node ``i`` goes into the cache at
        position ``lengths[b] + i``, its rotary position is ``lengths[b]`` + its depth, and it
        attends to the committed tokens and its own ancestors (``build_view(block_mask=...)``
        with :func:`mla_dcp.tree_mask`; the trees packed as :meth:`forward_ragged` packs
        tokens). Returns each request's logits [nodes, V]; :meth:`commit_tree` keeps a path.
        """
        if len(trees) != self.batch:
            raise ValueError(f"trees must hold {self.batch} requests' trees, got {len(trees)}")
        for b, (tokens, parents) in enumerate(trees):
            if len(tokens) != len(parents) or any(not -1 <= p < i for i, p in enumerate(parents)):
                raise ValueError(f"trees[{b}]: parents must hold one entry per token, each -1 or an earlier "
                                 f"node, got {len(tokens)} tokens and parents {list(parents)}")
        counts = torch.tensor([len(tokens) for tokens, _ in trees], dtype=torch.int64)
        seq_lens = self.lengths + counts
        if int(seq_lens.max()) > self.max_len:
            raise ValueError(f"a request would reach {int(seq_lens.max())} tokens, past max_len={self.max_len}")
        qlen = int(counts.max())
        if qlen == 0:
            return [torch.empty(0, self.model.config.vocab_size, device=self.device) for _ in trees]
        # Each tree on the last rows of its block, behind the request's own context tokens.
        padded, positions = [], []
        for b, (_, parents) in enumerate(trees):
            front = qlen - len(parents)
            padded.append([mla_dcp.TREE_CONTEXT] * front + [p + front if p >= 0 else p for p in parents])
            depth = []
            for p in parents:
                depth.append(0 if p < 0 else depth[p] + 1)
            positions += [int(self.lengths[b]) + d for d in depth]
        mask = mla_dcp.tree_mask(torch.tensor(padded))
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        ids = torch.tensor([[t for tokens, _ in trees for t in tokens]], device=self.device)
        logits = self._run(ids, torch.tensor([positions]), seq_lens, qlen, starts, mask)
        self._tree_parents = [list(parents) for _, parents in trees]
        return list(logits[0].split(counts.tolist()))

    def commit_tree(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each request's accepted path of the last :meth:`forward_tree`: ``paths[b]`` its
        nodes from a root down (each the previous one's child; empty: none). Their latents are
        written again at ``lengths[b]``, ``lengths[b] + 1``, ... in every rank's cache (where DCP
        places those positions: :func:`mla_dcp.cache_slots`, :func:`mla_dcp.write_cache`), so
        the next step reads the path as committed tokens; ``lengths`` grows by each path's length."""
        if self._tree is None:
            raise RuntimeError("commit_tree() follows forward_tree()")
        latents, starts = self._tree
        if len(paths) != self.batch:
            raise ValueError(f"paths must hold {self.batch} requests' paths, got {len(paths)}")
        for b, path in enumerate(paths):
            parents = self._tree_parents[b]
            if any(not 0 <= node < len(parents) for node in path) or (path and parents[path[0]] != -1) or any(
                    parents[child] != node for node, child in zip(path, path[1:])):
                raise ValueError(f"paths[{b}] must run from a root down the tree's edges, got {list(path)}")
        self._tree = None
        counts = torch.tensor([len(path) for path in paths], dtype=torch.int64)
        if int(counts.sum()) == 0:
            return
        rows = torch.tensor([int(starts[b]) + node for b, path in enumerate(paths) for node in path],
                            device=self.device)
        qlen, total = int(counts.max()), int(counts.sum())
        seq_lens = (self.lengths + counts).to(torch.int32).to(self.device)
        blocks = mla_dcp.ragged_blocks(torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(self.device), qlen,
                                       total)
        with torch.inference_mode():
            for rank in self.ranks:
                slots = mla_dcp.cache_slots(self._config(qlen, rank), seq_lens, self.block_tables[rank],
                                            blocks=blocks)
                for layer, latent in latents.items():
                    mla_dcp.write_cache(self.caches[rank][layer], slots, latent[rows], self.kv_scale)
            if self.sparse:
                # The path's index keys, at its nodes' places in the tree, move up behind the context.
                for b, path in enumerate(paths):
                    if path:
                        first = int(self.lengths[b])
                        nodes = torch.tensor(path, device=self.device)
                        self._index_keys[:, b, first:first + len(path)] = self._index_keys[:, b, first + nodes]
        self.commit(counts)

    def commit(self, counts: torch.Tensor | Sequence[int] | int) -> None:
        """Keep the first ``counts`` tokens of the last :meth:`forward` of
        each request; the others' cache entries are overwritten later."""
        self.lengths = self.lengths + torch.as_tensor(counts, dtype=torch.int64).expand(self.batch)

    def prefill(self, prompt: torch.Tensor | Sequence[Sequence[int]]) -> torch.Tensor | list[torch.Tensor]:
        """The prompts into an empty cache: [B, n] (equal lengths), logits [B, n, V]; or one
        token list per request (any lengths, :meth:`forward_ragged`), a logits tensor each."""
        self.lengths.zero_()
        self._prefilling = True      # not a verify step: untimed
        ragged = not isinstance(prompt, torch.Tensor)
        try:
            logits = self.forward_ragged(prompt) if ragged else self.forward(prompt)
        finally:
            self._prefilling = False
        self.commit([len(p) for p in prompt] if ragged else prompt.shape[1])
        return logits


def _tree_pickable(mask: torch.Tensor, requests: torch.Tensor, nodes: torch.Tensor, first: torch.Tensor,
                   counts: torch.Tensor, qlen: int, max_len: int) -> torch.Tensor:
    """Bool [T, max_len]: the cache positions packed token ``k`` (node ``nodes[k]`` of request
    ``requests[k]``'s tree, whose nodes sit at ``first[k]``, ``first[k] + 1``, ... behind its
    committed tokens) may attend to: every committed one, and the nodes its row of the block mask
    (``mask`` [B, qlen, qlen], the tree on the block's last ``counts[k]`` rows) sees."""
    position = torch.arange(max_len, device=mask.device)[None, :]
    node = position - first[:, None]                                                     # [T, max_len]
    in_tree = (node >= 0) & (node < counts[:, None])
    front = qlen - counts
    seen = mask[requests[:, None], (front + nodes)[:, None], (front[:, None] + node).clamp(0, qlen - 1)]
    return (node < 0) | (in_tree & seen)


def prompt_lookup_drafts(context: Sequence[int], k: int, max_ngram: int = 3, pad: bool = True) -> list[int]:
    """Draft ``k`` tokens by prompt lookup: find the latest earlier
    occurrence of the context's last n-gram (n = max_ngram down to 1) and
    propose what followed it. Pads with the last token when fewer follow
    (``pad``); otherwise proposes only what it found, none without a match
    (as an engine's n-gram proposer does)."""
    context = list(context)
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == tail:
                follow = context[start + n:start + n + k]
                if follow:
                    return follow + [follow[-1]] * (k - len(follow)) if pad else follow
    return [context[-1]] * k if pad else []


def prompt_lookup_tree(context: Sequence[int], k: int, max_ngram: int = 3) -> tuple[list[int], list[int]]:
    """Draft a tree of up to ``k`` tokens by prompt lookup: every earlier occurrence of the
    context's last n-gram (the longest n up to ``max_ngram`` that has one), latest first,
    proposes what followed it; the proposals share their common prefixes (a trie), so a
    context that continued several ways drafts each way, nodes taken breadth first (every
    branch's first token before any second one). Returns ``(tokens, parents)`` in
    topological order, a parent -1 for a node that follows the context; empty without a match."""
    context = list(context)
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        follows = [context[start + n:start + n + k] for start in range(len(context) - n - 1, -1, -1)
                   if context[start:start + n] == tail]
        follows = [f for f in follows if f]
        if not follows:
            continue
        # Breadth first over the proposals, so the budget goes to every branch's first tokens
        # (the likeliest to be accepted) before any branch's deep ones.
        tokens, parents, children = [], [], {}
        ends = [-1] * len(follows)
        for depth in range(k):
            for i, follow in enumerate(follows):
                if depth >= len(follow):
                    continue
                child = children.get((ends[i], follow[depth]))
                if child is None:
                    if len(tokens) == k:
                        return tokens, parents
                    child = children[(ends[i], follow[depth])] = len(tokens)
                    tokens.append(follow[depth])
                    parents.append(ends[i])
                ends[i] = child
        return tokens, parents
    return [], []


@dataclasses.dataclass
class SpecResult:
    tokens: list[int]             # the generated tokens (prompt excluded)
    verify_steps: int             # verify calls made
    drafted: int                  # draft tokens proposed
    accepted: int                 # draft tokens accepted
    times: StepTimes | None = None  # per verify step, where the verifier is timed

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / self.verify_steps if self.verify_steps else 0.0


def speculative_generate(verifier: MLAVerifier, prompt: Sequence[int], max_new_tokens: int, drafts: int = 3,
                         draft_fn: Callable[[list[int], int], list[int]] | None = None,
                         eos_token_id: int | Sequence[int] | None = None) -> SpecResult:
    """Greedy speculative decoding of one request (``verifier.batch == 1``).

    Each step verifies ``[last token] + drafts`` in one call (qlen = drafts
    + 1), accepts drafts up to the first mismatch with the model's own
    greedy choice and takes that choice as the next token: the output equals
    plain greedy decoding, token for token (HF's ``generate(do_sample=False)``),
    stopping after an ``eos_token_id`` as it does. Drafts come from
    ``draft_fn`` (context, k) -> k tokens, or prompt lookup. A timed verifier
    (``timed=True``) fills ``times`` with this generation's verify steps.
    """
    if verifier.batch != 1:
        raise ValueError(f"speculative_generate decodes one request; the verifier holds batch={verifier.batch}")
    return speculative_generate_batch(verifier, [prompt], max_new_tokens, drafts, draft_fn or prompt_lookup_drafts,
                                      eos_token_id)[0]


def speculative_generate_batch(verifier: MLAVerifier, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                               drafts: int = 3, draft_fn: Callable[[list[int], int], list[int]] | None = None,
                               eos_token_id: int | Sequence[int] | None = None) -> list[SpecResult]:
    """Greedy speculative decoding of ``verifier.batch`` requests together, each with its own
    prompt length and its own number of drafts a step.

    Every step verifies, in one ragged call (:meth:`MLAVerifier.forward_ragged`), each
    unfinished request's ``[last token] + drafts``, its drafts from ``draft_fn`` (context, k)
    -> up to k tokens (default: prompt lookup proposing only what it finds, so a request
    without a match verifies its next token alone); a finished request sits the step out.
    Each request's tokens equal its own greedy decoding (HF's ``generate(do_sample=False)``
    on that prompt alone). Returns a :class:`SpecResult` per request (``times``, where the
    verifier is timed, are the whole batch's steps).
    """
    draft_fn = draft_fn or (lambda context, k: prompt_lookup_drafts(context, k, pad=False))

    def step(contexts: list) -> list:
        blocks = []
        for b, context in enumerate(contexts):
            if context is None:
                blocks.append([])
                continue
            room = max(0, min(drafts, verifier.max_len - int(verifier.lengths[b]) - 1))   # after the next token
            blocks.append([context[-1]] + [int(t) for t in draft_fn(context, drafts)][:room])
        logits = verifier.forward_ragged(blocks)
        kept, made = [], []
        for b, block in enumerate(blocks):
            if not block:
                kept.append(0)
                made.append(None)
                continue
            guess, choice = block[1:], logits[b].argmax(dim=-1).tolist()
            taken = 0
            while taken < len(guess) and guess[taken] == choice[taken]:
                taken += 1
            made.append((guess[:taken] + [choice[taken]], len(guess), taken))
            kept.append(1 + taken)          # the step's first token and the accepted drafts stay in the cache
        verifier.commit(kept)
        return made

    return _greedy_decode(verifier, prompts, max_new_tokens, eos_token_id, step)


def _greedy_decode(verifier: MLAVerifier, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   eos_token_id: int | Sequence[int] | None, step: Callable[[list], list]) -> list[SpecResult]:
    """The speculative loop both drafters share: prefill, then ``step(contexts)`` (each request's
    tokens so far, None for a finished one) -> per request (its new tokens, drafts proposed,
    drafts accepted) or None, until every request has ``max_new_tokens`` or an end token."""
    stops = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [])
    if len(prompts) != verifier.batch:
        raise ValueError(f"prompts must hold the verifier's {verifier.batch} requests, got {len(prompts)}")
    prompts = [list(p) for p in prompts]
    verifier.reset_times()
    logits = verifier.prefill(prompts)
    outs = [[int(request[-1].argmax())] for request in logits]
    steps, drafted, accepted = ([0] * len(prompts) for _ in range(3))

    def running(b: int) -> bool:
        return len(outs[b]) < max_new_tokens and not stops.intersection(outs[b])

    while any(running(b) for b in range(len(prompts))):
        made = step([prompts[b] + outs[b] if running(b) else None for b in range(len(prompts))])
        for b, result in enumerate(made):
            if result is not None:
                tokens, proposed, taken = result
                steps[b], drafted[b], accepted[b] = steps[b] + 1, drafted[b] + proposed, accepted[b] + taken
                outs[b] += tokens
    times = verifier.step_times() if verifier.timed else None
    results = []
    for b, out in enumerate(outs):
        ended = next((i + 1 for i, token in enumerate(out) if token in stops), len(out))
        results.append(SpecResult(out[:min(max_new_tokens, ended)], steps[b], drafted[b], accepted[b], times))
    return results


def speculative_generate_tree(verifier: MLAVerifier, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                              nodes: int = 6, tree_fn: Callable[[list[int], int], tuple] | None = None,
                              eos_token_id: int | Sequence[int] | None = None) -> list[SpecResult]:
    """Greedy speculative decoding with token trees, ``verifier.batch`` requests together.

    Each step verifies, per unfinished request, a tree rooted at its last token with up to
    ``nodes - 1`` drafts below it from ``tree_fn`` (context, k) -> (tokens, parents), a parent
    -1 for a child of the root (default :func:`prompt_lookup_tree`), all requests in one call
    (:meth:`MLAVerifier.forward_tree`). From the root it follows the child whose token is the
    model's greedy choice as long as one is, takes the choice after the last such node, and
    keeps that path (:meth:`MLAVerifier.commit_tree`): each request's tokens equal its own
    greedy decoding (HF's ``generate(do_sample=False)``), whatever the drafts.
    """
    tree_fn = tree_fn or prompt_lookup_tree

    def step(contexts: list) -> list:
        trees = []
        for b, context in enumerate(contexts):
            if context is None:
                trees.append(([], []))
                continue
            room = max(0, min(nodes - 1, verifier.max_len - int(verifier.lengths[b]) - 1))
            tokens, parents = tree_fn(context, room)
            tokens = [int(t) for t in tokens][:room]
            trees.append(([context[-1]] + tokens, [-1] + [p + 1 if p >= 0 else 0 for p in parents[:len(tokens)]]))
        logits = verifier.forward_tree(trees)
        paths, made = [], []
        for b, (tokens, parents) in enumerate(trees):
            if not tokens:
                paths.append([])
                made.append(None)
                continue
            choices = logits[b].argmax(dim=-1).tolist()
            path = [0]
            while True:
                child = next((i for i in range(len(tokens)) if parents[i] == path[-1]
                              and tokens[i] == choices[path[-1]]), None)
                if child is None:
                    break
                path.append(child)
            made.append(([tokens[i] for i in path[1:]] + [choices[path[-1]]], len(tokens) - 1, len(path) - 1))
            paths.append(path)
        verifier.commit_tree(paths)
        return made

    return _greedy_decode(verifier, prompts, max_new_tokens, eos_token_id, step)
