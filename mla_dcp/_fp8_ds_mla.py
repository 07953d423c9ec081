"""DeepSeek's fp8 cache layout for sparse MLA ("fp8_ds_mla", FlashMLA's and vLLM's).

One token a row of bytes: the latent's ``Dl`` values as e4m3 (``Dl`` bytes), one
float32 scale per 128 of them (``Dl / 32`` bytes: value = e4m3 * scale), then the
rope part's ``Dr`` values as bf16, unquantized (``2 * Dr`` bytes): 656 bytes at
DeepSeek-V3.2's 512 + 64. Each 128-value tile's scale is its largest magnitude
over 448 (e4m3's largest finite value), so the tile's largest value is stored
exactly at the format's top; an all-zero tile takes scale 1. NaN or inf in a
tile makes the whole tile NaN when read back (its scale is not finite): a row
that reads the key is poisoned either way.

Plain torch, shared by the pure oracle and the launchers (neither imports the
other's layer).
"""

from __future__ import annotations

import torch

__all__ = ["TILE", "E4M3_MAX", "width", "split", "encode", "decode"]

TILE = 128          # latent values per scale
E4M3_MAX = 448.0


def width(kv_lora_rank: int, rope_dim: int) -> int:
    """Bytes a token takes: ``Dl + 4 * Dl / 128 + 2 * Dr``."""
    return kv_lora_rank + 4 * (kv_lora_rank // TILE) + 2 * rope_dim


def split(row_bytes: int, head_dim: int) -> tuple[int, int] | None:
    """``(kv_lora_rank, rope_dim)`` of a layout ``row_bytes`` wide holding ``head_dim``-wide
    latents (``Dl + Dr``), or None where no such split exists (``Dl`` a positive multiple of 128)."""
    # row_bytes - 2 * head_dim = Dl / 32 - Dl: Dl = 32 * (2 * head_dim - row_bytes) / 31.
    twice = 32 * (2 * head_dim - row_bytes)
    if twice <= 0 or twice % 31:
        return None
    latent = twice // 31
    if latent % TILE or latent > head_dim or width(latent, head_dim - latent) != row_bytes:
        return None
    return latent, head_dim - latent


def encode(latent: torch.Tensor, kv_lora_rank: int) -> torch.Tensor:
    """uint8 [N, width]: ``latent`` [N, Dl + Dr] (any float dtype) in the layout."""
    rows, dim = latent.shape
    values = latent.float()
    tiles = values[:, :kv_lora_rank].reshape(rows, kv_lora_rank // TILE, TILE)
    amax = tiles.abs().amax(dim=-1, keepdim=True)
    # NaN stays NaN (amax is NaN); inf gives an inf scale, read back as NaN.
    scale = torch.where(amax == 0, 1.0, amax / E4M3_MAX)
    quantised = (tiles / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    rope = values[:, kv_lora_rank:].to(torch.bfloat16)
    return torch.cat([quantised.reshape(rows, kv_lora_rank).view(torch.uint8),
                      scale.reshape(rows, -1).contiguous().view(torch.uint8).reshape(rows, -1),
                      rope.contiguous().view(torch.uint8).reshape(rows, -1)], dim=1)


def decode(rows: torch.Tensor, kv_lora_rank: int, rope_dim: int) -> torch.Tensor:
    """float32 [..., Dl + Dr]: the layout's rows (uint8 [..., width]) read back."""
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, rows.shape[-1])
    tiles = kv_lora_rank // TILE
    values = flat[:, :kv_lora_rank].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, kv_lora_rank:kv_lora_rank + 4 * tiles].contiguous().view(torch.float32)
    rope = flat[:, kv_lora_rank + 4 * tiles:kv_lora_rank + 4 * tiles + 2 * rope_dim].contiguous()
    latent = (values.reshape(-1, tiles, TILE) * scales[:, :, None]).reshape(-1, kv_lora_rank)
    out = torch.cat([latent, rope.view(torch.bfloat16).float()], dim=1)
    return out.reshape(*lead, kv_lora_rank + rope_dim)
