"""Writing a step's new tokens into each DCP rank's paged cache, where verify reads them.

A verify step's tokens (the last ``qlen`` positions of each request; with
:func:`mla_dcp.ragged_blocks`, each request's own count) must land in the
cache of the rank DCP gives them, at their rank-local position through that
rank's block table (DESIGN.md stage 1). :func:`cache_slots` gives each token's
slot on this rank (-1 where another rank holds it), on the device and with
no host sync; :func:`write_cache` writes the latent rows there (an fp8 cache
through its scale, saturated as an engine's e4m3 write), one kernel on a GPU.

>>> import torch, mla_dcp
>>> cfg = mla_dcp.VerifyConfig(num_heads=1, qlen=3, block_size=2, max_model_len=8, dcp_world_size=2,
...                            kv_lora_rank=4, rope_dim=0, softmax_scale=0.5)
>>> table = torch.tensor([[3, 7]], dtype=torch.int32)
>>> mla_dcp.cache_slots(cfg, torch.tensor([5], dtype=torch.int32), table).tolist()   # positions 2, 3, 4
[7, -1, 14]
"""

from __future__ import annotations

import torch

from mla_dcp import _checks, _fp8_ds_mla, pure
from mla_dcp.config import VerifyConfig
from mla_dcp.ops import library as ops
from mla_dcp.ragged import RaggedBlocks

__all__ = ["cache_slots", "write_cache", "fp8_ds_mla_width"]


def cache_slots(cfg: VerifyConfig, seq_lens: torch.Tensor, block_table: torch.Tensor, *,
                blocks: RaggedBlocks | None = None) -> torch.Tensor:
    """The slot of each of the step's new tokens in this rank's cache (``cfg.dcp_rank``).

    Parameters
    ----------
    cfg : VerifyConfig
    seq_lens : int32 [B]
        Global lengths, the step's tokens included (as :func:`build_view` takes them).
    block_table : int32 [B, max_blocks]
        This rank's block table, ``max_blocks >= cfg.min_table_blocks``.
    blocks : RaggedBlocks or None
        A ragged step's blocks (:func:`mla_dcp.ragged_blocks` with ``cfg.qlen``): the slots of
        its packed tokens instead of the verify rows'.

    Returns
    -------
    int64 [B*qlen] (a row's token, at position ``seq_lens[b] - qlen + t``) or [T] (each packed
    token): ``block * block_size + offset`` in this rank's ``kv_cache.view(-1, D)``, -1 where
    another rank holds the token, where it has no position (a row in front of a short request,
    a padding token) or where its position is ``max_model_len`` or more.
    """
    _checks.require_config(cfg)
    _checks.check_view_layout(cfg, seq_lens, block_table)
    slots = pure.cache_slots(seq_lens, block_table, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave,
                             cfg.block_size, cfg.max_model_len)
    if blocks is None:
        return slots
    if not isinstance(blocks, RaggedBlocks) or blocks.qlen != cfg.qlen \
            or blocks.token_of_row.shape[0] != slots.shape[0]:
        raise ValueError(f"blocks must be mla_dcp.ragged_blocks(query_start_loc, qlen={cfg.qlen}, T) of "
                         f"{seq_lens.shape[0]} requests, got {type(blocks).__name__} "
                         f"{getattr(blocks, 'qlen', None)!r}")
    _checks.require_same_device(seq_lens=seq_lens, blocks=blocks.row_of_token)
    held = blocks.row_of_token >= 0
    return torch.where(held, slots[blocks.row_of_token.clamp(min=0).long()], -1)


def fp8_ds_mla_width(kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    """Bytes a token takes in DeepSeek's fp8 layout for sparse MLA (``fp8_ds_mla``, FlashMLA's and
    vLLM's): ``kv_lora_rank`` e4m3 values, a float32 scale per 128 of them, ``rope_dim`` bf16 values
    (656 for DeepSeek-V3.2's 512 + 64). A uint8 cache ``[num_blocks, block_size, width]`` in it is
    written by :func:`write_cache` and read by :func:`mla_dcp.verify_sparse`.

    >>> fp8_ds_mla_width()
    656
    """
    if kv_lora_rank < 128 or kv_lora_rank % 128 or rope_dim < 0:
        raise ValueError(f"fp8_ds_mla needs kv_lora_rank a positive multiple of 128 and rope_dim >= 0, got "
                         f"{kv_lora_rank} and {rope_dim}")
    return _fp8_ds_mla.width(kv_lora_rank, rope_dim)


def write_cache(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor,
                kv_scale: torch.Tensor | None = None) -> None:
    """Write the step's new latent rows into this rank's cache at ``slots``, in place.

    Parameters
    ----------
    kv_cache : [num_blocks, block_size, D]
        This rank's cache: fp32/fp16/bf16, or fp8 (e4m3fn, e4m3fnuz) with ``kv_scale``, or uint8
        rows of DeepSeek's fp8 layout for sparse MLA (:func:`mla_dcp.fp8_ds_mla_width` bytes: the
        latent in e4m3 with a float32 scale per 128 values, each 128's largest magnitude over 448,
        the rope part in bf16; read by :func:`mla_dcp.verify_sparse`); rows of a unit inner
        stride, blocks of ``block_size`` rows apart.
    slots : int64 [N]
        From :func:`cache_slots`; a row with -1 is skipped (another rank's token).
    latent : [N, D], fp32/fp16/bf16
        Each token's ``[normed c_kv, rotated k_pe]``.
    kv_scale : float32 [1] or None
        An fp8 cache's dequantization scale: stored values are ``latent / kv_scale``, rounded to
        nearest and saturated to the format's largest finite value (NaN stays NaN).
    """
    kv_cache = _checks.require_tensor("kv_cache", kv_cache)
    slots = _checks.require_tensor("slots", slots)
    latent = _checks.require_tensor("latent", latent)
    _checks.require_dtype("kv_cache", kv_cache, _checks.QUERY_DTYPES + _checks.FP8_CACHE_DTYPES + (torch.uint8,))
    _checks.require_dtype("slots", slots, (torch.int64,))
    _checks.require_dtype("latent", latent, _checks.QUERY_DTYPES)
    _checks.require_shape("kv_cache", kv_cache, ["num_blocks", "block_size", "D"])
    _checks.require_shape("slots", slots, ["N"])
    if kv_cache.dtype == torch.uint8:
        _checks.require_shape("latent", latent, [slots.shape[0], "D"])
        _checks.require_ds_layout("kv_cache", kv_cache, latent.shape[1])
    else:
        _checks.require_shape("latent", latent, [slots.shape[0], kv_cache.shape[2]])
    _checks.require_kv_scale(kv_scale, kv_cache)
    _checks.require_same_device(kv_cache=kv_cache, slots=slots, latent=latent, kv_scale=kv_scale)
    if kv_cache.stride(2) != 1 or kv_cache.stride(0) != kv_cache.shape[1] * kv_cache.stride(1):
        raise ValueError(f"kv_cache must hold its rows at a unit inner stride, block after block (strides "
                         f"[block_size * s, s, 1]), got strides {list(kv_cache.stride())}")
    ops.stage.write_cache(kv_cache, slots, latent, kv_scale)
