"""Stage 1: where DCP puts each token, and each verify row's rank-local length.

DESIGN.md, stage 1. Global position ``p`` lives on rank ``(p // I) % W`` at
rank-local position ``(p // (W*I)) * I + p % I``.
"""

from __future__ import annotations

from typing import overload

import torch

__all__ = ["local_len", "local_lens", "verify_row_lens", "owner_rank", "local_position"]


def _check_placement(world: int, rank: int, interleave: int) -> None:
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world={world}), got {rank}")
    if interleave < 1:
        raise ValueError(f"interleave must be >= 1, got {interleave}")


@overload
def local_len(length: int, world: int, rank: int, interleave: int) -> int: ...
@overload
def local_len(length: torch.Tensor, world: int, rank: int, interleave: int) -> torch.Tensor: ...


def local_len(length, world, rank, interleave):
    """Number of global positions ``p < length`` stored on ``rank``.

    Works on Python ints (static bounds) and on integer tensors alike, so the
    static bound and the device-side lengths come from one formula.
    """
    stride = world * interleave
    full_rounds = length // stride
    tail = length - full_rounds * stride - rank * interleave
    if isinstance(tail, torch.Tensor):
        tail = tail.clamp(0, interleave)
    else:
        tail = min(max(tail, 0), interleave)
    return full_rounds * interleave + tail


def local_lens(lengths: torch.Tensor, world: int, rank: int, interleave: int = 1) -> torch.Tensor:
    """Rank-local lengths of global lengths.

    Parameters
    ----------
    lengths : int32 tensor, any shape
        Global lengths (>= 0).
    world, rank, interleave : int
        DCP group size, this rank, interleave size.

    Returns
    -------
    int32 tensor, same shape: how many of the first ``lengths`` global
    positions rank ``rank`` holds.

    >>> local_lens(torch.tensor([0, 1, 5, 8], dtype=torch.int32), 2, 1, 2).tolist()
    [0, 0, 2, 4]
    """
    _check_placement(world, rank, interleave)
    return local_len(lengths, world, rank, interleave).to(torch.int32)


def verify_row_lens(seq_lens: torch.Tensor, qlen: int, world: int, rank: int,
                    interleave: int = 1, *, causal: bool = True) -> torch.Tensor:
    """Rank-local KV length of every verify row.

    Row ``(b, t)`` sees ``max(0, L_b - qlen + 1 + t)`` global keys; its local
    length is :func:`local_len` of that window. (Subtracting ``qlen - 1 - t``
    from the committed local length is wrong: the dropped tail tokens live on
    different ranks.) With ``causal=False`` (a non-causal draft block) every
    row of request ``b`` sees all ``L_b`` keys.

    Parameters
    ----------
    seq_lens : int32 [B]
        Global lengths, the ``qlen`` verify tokens included.
    qlen : int
        Verify rows per request.

    Returns
    -------
    int32 [B * qlen], rows request-major (``row = b * qlen + t``).

    >>> verify_row_lens(torch.tensor([10, 12], dtype=torch.int32), 4, 2, 0).tolist()
    [4, 4, 5, 5, 5, 5, 6, 6]
    """
    _check_placement(world, rank, interleave)
    if qlen < 1:
        raise ValueError(f"qlen must be >= 1, got {qlen}")
    offsets = torch.arange(1 - qlen, 1, device=seq_lens.device, dtype=seq_lens.dtype)
    if not causal:
        offsets = torch.zeros_like(offsets)
    visible = (seq_lens[:, None] + offsets[None, :]).clamp_min(0)
    return local_len(visible, world, rank, interleave).to(torch.int32).reshape(-1)


def owner_rank(positions: torch.Tensor, world: int, interleave: int = 1) -> torch.Tensor:
    """Rank that stores each global position."""
    return (positions // interleave) % world


def local_position(positions: torch.Tensor, world: int, interleave: int = 1) -> torch.Tensor:
    """Rank-local position of each global position on its owner rank."""
    return (positions // (world * interleave)) * interleave + positions % interleave
