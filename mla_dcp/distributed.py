"""DCP across real processes: the rank merge (DESIGN.md stage 5) as collectives.

One process per GPU (or CPU process with gloo) of a DCP group. Each rank has
its partial ``(out, lse)`` from :func:`mla_dcp.verify`; these functions merge
them over ``torch.distributed`` without gathering every rank's output, with
no host sync, and with the empty-rank rules of the stacked merge (a rank with
no keys, or a NaN/+inf LSE, contributes exactly nothing; rows empty on every
rank give 0 and -inf).

Heads are split rank-major, as after a DCP head all-gather: with ``W`` ranks
and ``H`` heads, rank ``r`` owns heads ``[r*H/W, (r+1)*H/W)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mla_dcp import _checks
from mla_dcp.api import MaskedView, VerifyView
from mla_dcp.api import verify as verify_local
from mla_dcp.api import verify_sparse as sparse_local
from mla_dcp.config import VerifyConfig
from mla_dcp.ops import library as ops
from mla_dcp.pure.attention import rank_weights, weighted_sum

__all__ = ["METHODS", "merge", "verify", "verify_sparse"]

METHODS = ("reduce_scatter", "all_reduce", "all_to_all")

# torch 2.13 renamed the flat collectives (the old names warn there); older
# torch (>= 2.6, this package's floor) has only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _require_group_and_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("mla_dcp.distributed needs an initialized process group "
                           "(torch.distributed.init_process_group)")


def _validate_merge(out: object, lse: object, group, method: str) -> tuple[int, int]:
    _require_group_and_method(method)
    _checks.require_tensor("out", out)
    _checks.require_tensor("lse", lse)
    _checks.require_dtype("out", out, _checks.QUERY_DTYPES)
    _checks.require_dtype("lse", lse, (torch.float32,))
    _checks.require_shape("out", out, ["T", "H", "Dl"])
    _checks.require_shape("lse", lse, list(out.shape[:2]))
    _checks.require_same_device(out=out, lse=lse)
    world = dist.get_world_size(group)
    _check_head_split("out", out.shape[1], world, method)
    return world, dist.get_rank(group)


def _check_head_split(name: str, heads: int, world: int, method: str) -> None:
    if method != "all_reduce" and heads % world != 0:
        raise ValueError(
            f"{name} has {heads} heads, which method={method!r} cannot split over the group's {world} ranks "
            f"(heads must be divisible by the group size); use method='all_reduce'")


def _head_major_chunks(x: torch.Tensor, world: int) -> torch.Tensor:
    """[T, H, ...] -> [W, T, H/W, ...]: chunk r holds rank r's heads."""
    rows, heads = x.shape[:2]
    return x.reshape(rows, world, heads // world, *x.shape[2:]).transpose(0, 1).contiguous()


def merge(out: torch.Tensor, lse: torch.Tensor, group: dist.ProcessGroup | None = None,
          method: str = "reduce_scatter") -> tuple[torch.Tensor, torch.Tensor]:
    """Merge this rank's partial attention with the other ranks' of ``group``.

    Parameters
    ----------
    out : [T, H, Dl], float32 / float16 / bfloat16
        This rank's partial output (``mla_dcp.verify``'s first result).
    lse : float32 [T, H], natural log
        Its log-sum-exp; -inf (or NaN, +inf) for rows with no key here.
    group : ProcessGroup or None
        The DCP group (default: the world). Gloo on CPUs, NCCL on GPUs.
    method : ``"reduce_scatter"`` | ``"all_reduce"`` | ``"all_to_all"``
        - ``"reduce_scatter"``: all-gather the LSEs, rescale the local partial
          in float32, reduce-scatter over heads. Returns this rank's heads.
        - ``"all_reduce"``: the same rescale, then all-reduce. Returns all heads.
        - ``"all_to_all"``: send every rank its head slice with the LSE packed
          alongside (one all-to-all), combine in float32. Returns this rank's heads.

    Returns
    -------
    out : [T, H/W, Dl] (all heads for ``"all_reduce"``) in out's dtype.
    lse : float32 [T, H/W] (or [T, H]), natural log; -inf where no rank has a key.

    Raises
    ------
    ValueError
        Bad shapes or dtypes, an unknown method, or ``H`` not divisible by the
        group size for the slicing methods; all before any collective.
    """
    world, rank = _validate_merge(out, lse, group, method)
    rows, heads, width = out.shape
    if method == "all_to_all":
        packed = torch.cat([out.float(), lse.float()[..., None]], dim=-1)         # [T, H, Dl+1]
        send = _head_major_chunks(packed, world)                                    # [W, T, H/W, Dl+1]
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)                        # [W, T, H/W, Dl+1]
        merged, merged_lse = ops.stage.merge_ranks(received[..., :width].contiguous(),
                                             received[..., width].contiguous())
        return merged.to(out.dtype), merged_lse

    lses = torch.empty(world, rows, heads, dtype=torch.float32, device=lse.device)
    # Flat along dim 0: gloo accepts only that layout for the gathered tensor.
    all_gather_single(lses.view(world * rows, heads), lse.float().contiguous(), group=group)
    weight, merged_lse = rank_weights(lses)
    # Only this rank's term of the weighted sum; the collective adds the rest.
    scaled = weighted_sum(weight[rank:rank + 1], out[None])                        # f32 [T, H, Dl]
    if method == "all_reduce":
        dist.all_reduce(scaled, group=group)
        return scaled.to(out.dtype), merged_lse
    slice_heads = heads // world
    mine = torch.empty(rows, slice_heads, width, dtype=torch.float32, device=out.device)
    send = _head_major_chunks(scaled, world).view(world * rows, slice_heads, width)
    reduce_scatter_single(mine, send, group=group)
    return mine.to(out.dtype), merged_lse[:, rank * slice_heads:(rank + 1) * slice_heads].contiguous()


def verify(cfg: VerifyConfig, view: VerifyView | MaskedView, q: torch.Tensor, kv_cache: torch.Tensor,
           kv_scale: torch.Tensor | None = None, group: dist.ProcessGroup | None = None,
           method: str = "reduce_scatter") -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's :func:`mla_dcp.verify`, then :func:`merge` over ``group``.

    ``cfg.dcp_world_size`` and ``cfg.dcp_rank`` must be the group's size and
    this process's rank in it. Returns what :func:`merge` returns.
    """
    _require_group_config(cfg, group, method)
    out, lse = verify_local(cfg, view, q, kv_cache, kv_scale)
    return merge(out, lse, group=group, method=method)


def verify_sparse(cfg: VerifyConfig, view: VerifyView, q: torch.Tensor, kv_cache: torch.Tensor,
                  indices: torch.Tensor, kv_scale: torch.Tensor | None = None, group: dist.ProcessGroup | None = None,
                  method: str = "reduce_scatter") -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's :func:`mla_dcp.verify_sparse` (token-sparse rows), then :func:`merge` over ``group``;
    ``cfg`` as :func:`verify` takes it."""
    _require_group_config(cfg, group, method)
    out, lse = sparse_local(cfg, view, q, kv_cache, indices, kv_scale)
    return merge(out, lse, group=group, method=method)


def _require_group_config(cfg: VerifyConfig, group, method: str) -> None:
    """The group and method exist, the config is this process's rank of it, the heads split: all
    before any collective, so no rank hangs."""
    _require_group_and_method(method)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world != cfg.dcp_world_size or rank != cfg.dcp_rank:
        raise ValueError(
            f"cfg must match the process group: group size {world} and rank {rank}, "
            f"got cfg.dcp_world_size={cfg.dcp_world_size}, cfg.dcp_rank={cfg.dcp_rank}")
    _check_head_split("cfg.num_heads", cfg.num_heads, world, method)
