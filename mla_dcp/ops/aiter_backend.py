"""Optional AITER backend (AMD ROCm) for the segmented-attention stage.

AMD's AITER (`pip install amd-aiter`; it refuses to import without ROCm) has
its own split-KV MLA decode kernel. This module, imported only when a caller
asks for ``backend="aiter"``, feeds it one verify row per AITER request and
converts its partials to DESIGN.md's stage-3 contract, so the rest of the
pipeline (segment merge, rank merge) is shared.

AITER's partials, per row ``t`` and split ``s``:

- ``logits[t, s, h, :]``: the split's *normalised* output,
- ``lse[t, s, h, 0]``: its log-sum-exp in **base 2** (``m + log2(l)`` of the
  split's scaled scores),
- nothing at all written for splits past the row's active count. A split is
  active while it starts before the row's end: with ``L`` the row's length
  and ``g`` the split granule (the page size), a split spans
  ``max(g, cdiv(L, NS))`` tokens, so ``active = cdiv(L, max(g, cdiv(L, NS)))``
  (0 for an empty row).

What was not run here: no ROCm machine was available, so the call into AITER
(:func:`segmented_attention`) has never executed; the metadata builder and the
conversion are plain torch and are tested on the CPU with AITER-shaped
partials holding garbage in the unwritten splits.
"""

from __future__ import annotations

import importlib
import importlib.util
import math

import torch

__all__ = ["availability_problem", "require_available", "active_splits", "aiter_metadata",
           "partials_to_segments", "segmented_attention"]


def availability_problem() -> str | None:
    """Why the AITER backend cannot run here, or None when it can."""
    if torch.version.hip is None:
        return (f"backend='aiter' needs a ROCm build of PyTorch (torch.version.hip is None; this is torch "
                f"{torch.__version__}) and an AMD GPU")
    if importlib.util.find_spec("aiter") is None:
        return "backend='aiter' needs AMD's AITER: pip install amd-aiter (the package 'aiter' is not importable)"
    if not torch.cuda.is_available():
        return "backend='aiter' needs an AMD GPU visible to PyTorch (torch.cuda.is_available() is False)"
    return None


def require_available() -> None:
    problem = availability_problem()
    if problem is not None:
        raise RuntimeError(problem)


def active_splits(row_lens: torch.Tensor, num_splits: int, granule: int) -> torch.Tensor:
    """int32 [T]: splits AITER writes for each row (``cdiv(L, max(g, cdiv(L, NS)))``, 0 if L = 0)."""
    lens = row_lens.long()
    split_len = torch.clamp((lens + num_splits - 1) // num_splits, min=granule)
    return torch.where(lens > 0, (lens + split_len - 1) // split_len, 0).to(torch.int32)


def aiter_metadata(row_lens: torch.Tensor, page_table: torch.Tensor, qlen: int, page: int):
    """One AITER request per verify row, without a host sync.

    Returns ``kv_indptr`` int32 [T+1] (page offsets), ``kv_indices`` int32
    [T*max_pages + 1] (each row's pages packed at its offset; the last entry
    is a dump slot for the unused ones) and ``kv_last_page_lens`` int32 [T].
    """
    rows = row_lens.shape[0]
    max_pages = page_table.shape[1]
    lens = row_lens.long()
    n_pages = (lens + page - 1) // page                                            # [T]
    kv_indptr = torch.zeros(rows + 1, dtype=torch.long, device=row_lens.device)
    kv_indptr[1:] = torch.cumsum(n_pages, dim=0)
    k = torch.arange(max_pages, device=row_lens.device)
    rows_pages = page_table.repeat_interleave(qlen, dim=0).long()                   # [T, max_pages]
    dump = rows * max_pages
    target = torch.where(k[None, :] < n_pages[:, None], kv_indptr[:-1, None] + k[None, :], dump)
    kv_indices = torch.zeros(dump + 1, dtype=torch.long, device=row_lens.device)
    kv_indices.scatter_(0, target.reshape(-1), rows_pages.reshape(-1))
    last = torch.where(lens > 0, lens - (n_pages - 1) * page, 0)
    return kv_indptr.to(torch.int32), kv_indices.to(torch.int32), last.to(torch.int32)


def partials_to_segments(logits: torch.Tensor, lse2: torch.Tensor, row_lens: torch.Tensor,
                         granule: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AITER's partials -> DESIGN.md stage 3 (seg_out, seg_max, seg_sum), base 2.

    Parameters
    ----------
    logits : float32 [T, NS, H, Dl], normalised split outputs (garbage in unwritten splits)
    lse2 : float32 [T, NS, H, 1], base-2 log-sum-exp (garbage in unwritten splits)
    row_lens : int32 [T]
    granule : int, AITER's split granule (the page size)

    Returns
    -------
    seg_out [T, H, NS, Dl], seg_max [T, H, NS], seg_sum [T, H, NS], float32.
    An active split becomes ``seg_max = lse2``, ``seg_sum = 1``,
    ``seg_out = logits`` (a normalised output is the unnormalised one relative
    to its own log-sum-exp); an unwritten one ``seg_max = -inf``, ``seg_sum =
    0``, its ``seg_out`` left as garbage, which the merge never reads; an
    active one whose log-sum-exp is not finite is poisoned (NaN statistics).
    """
    rows, num_splits, heads, _ = logits.shape
    active = torch.arange(num_splits, device=logits.device)[None, :] < active_splits(
        row_lens, num_splits, granule)[:, None].long()                              # [T, NS]
    active = active[:, None, :].expand(rows, heads, num_splits)
    stats = lse2[..., 0].transpose(1, 2).float()                                    # [T, H, NS]
    # An active split holds keys, so a non-finite log-sum-exp there (inf or
    # NaN reached its scores) is DESIGN's poisoned row: NaN, never "empty".
    # Only unwritten splits are masked, and those by the statistics alone.
    seg_max = torch.where(active, torch.where(torch.isfinite(stats), stats, math.nan), -math.inf)
    seg_sum = torch.where(active, torch.where(torch.isfinite(stats), 1.0, math.nan), 0.0)
    return logits.transpose(1, 2).float(), seg_max, seg_sum


def stacked_to_slots(seg_out: torch.Tensor, seg_max: torch.Tensor, seg_sum: torch.Tensor, qlen: int):
    """Per-row partials [T, H, NS, ...] (NS per request) -> the schedule's
    slot layout [B*NS, H, qlen, ...] and its segments table int32 [B, 3]
    (request b's items ``b*NS .. b*NS + NS - 1``, no tail)."""
    rows, heads, splits = seg_max.shape
    batch = rows // qlen

    def slots(x):
        x = x.reshape(batch, qlen, heads, splits, *x.shape[3:])
        return x.permute(0, 3, 2, 1, *range(4, x.dim())).reshape(batch * splits, heads, qlen, *x.shape[4:])

    first = torch.arange(batch, device=seg_max.device, dtype=torch.int32) * splits
    segments = torch.stack([first, torch.full_like(first, splits), torch.full_like(first, -1)], dim=1)
    return slots(seg_out), slots(seg_max), slots(seg_sum), segments


def segmented_attention(q, kv_cache, kv_scale, row_lens, page_table, qlen, kv_lora_rank, num_segments,
                        softmax_scale):
    """Stage 3 through AITER's split-KV MLA kernel (unrun here: see the module docstring):
    (seg_out, seg_max, seg_sum, segments) in the schedule's slot layout."""
    require_available()
    aiter = importlib.import_module("aiter")
    if kv_scale is not None:
        raise NotImplementedError("backend='aiter' with an fp8 kv_scale is not wired yet; use the Triton backend")
    rows, heads, _ = q.shape
    page = kv_cache.shape[1]
    kv_indptr, kv_indices, last_page_lens = aiter_metadata(row_lens, page_table, qlen, page)
    logits = torch.empty(rows, num_segments, heads, kv_lora_rank, dtype=torch.float32, device=q.device)
    lse2 = torch.empty(rows, num_segments, heads, 1, dtype=torch.float32, device=q.device)
    # AITER's layout: [num_pages, page_size, kv_heads = 1, Dl + Dr].
    aiter.mla_stage1_asm_fwd(q, kv_cache.unsqueeze(2), kv_indptr, kv_indices, last_page_lens, softmax_scale,
                             logits, lse2)
    return stacked_to_slots(*partials_to_segments(logits, lse2, row_lens, page), qlen)
