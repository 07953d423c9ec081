"""Ragged verify blocks: requests with different numbers of query tokens in one step.

Engines pack a step's query tokens request after request, ``[T, H, D]`` with
``query_start_loc`` int [B + 1] (request ``b``'s tokens are
``query_start_loc[b] .. query_start_loc[b + 1] - 1``), as FlashAttention's
variable-length API and vLLM do; a drafter that proposes no tokens for some
requests and several for others makes such a batch. :func:`verify` takes
``qlen`` rows per request. A request with ``q_b <= qlen`` tokens takes the
*last* ``q_b`` rows of its block: row ``t`` of request ``b`` sees the keys up
to global position ``seq_lens[b] - (qlen - t)`` (DESIGN.md stage 1), so its
``j``-th token, at position ``seq_lens[b] - q_b + j``, lands on row
``qlen - q_b + j`` with exactly its own causal window (``seq_lens[b]`` counts
the request's own ``q_b`` tokens, as always). The rows in front are padding
(a zero query; their results are dropped). Nothing else changes: the
schedule, every kernel, the rank merges and the modes run as for a uniform
block, and in batch-invariant mode a token's bits equal those of its request
verified alone with ``qlen = q_b``.

Both functions are gathers on the device: no host sync, one shape per
``(B, T, qlen)``, so they compile into the step's graph and replay in a
captured one while the counts change.
"""

from __future__ import annotations

import torch

from mla_dcp import _checks

__all__ = ["ragged_to_rows", "rows_to_ragged"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _require_starts(query_start_loc: object) -> torch.Tensor:
    starts = _checks.require_tensor("query_start_loc", query_start_loc)
    _checks.require_dtype("query_start_loc", starts, _INDEX_DTYPES)
    if starts.dim() != 1 or starts.shape[0] < 1:
        raise ValueError(f"query_start_loc must have shape [B + 1] (B >= 0: request b's tokens are "
                         f"query_start_loc[b] .. query_start_loc[b + 1] - 1), got {list(starts.shape)}")
    return starts


def _rows_of(starts: torch.Tensor, batch: int, qlen: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the ``batch * qlen`` rows, the token it holds and whether it holds one."""
    rows = torch.arange(batch * qlen, device=starts.device, dtype=starts.dtype)
    request = torch.div(rows, qlen, rounding_mode="floor")
    end = starts[1:][request]
    token = end - qlen + rows % qlen
    return token, token >= starts[:-1][request]


def ragged_to_rows(q: torch.Tensor, query_start_loc: torch.Tensor, qlen: int, *,
                   check: bool = False) -> torch.Tensor:
    """Packed query tokens as :func:`verify`'s rows: ``[B*qlen, ...]``, each request's tokens on the
    last rows of its block, zeros in front of them.

    Parameters
    ----------
    q : [T, H, D] (any trailing dims)
        The step's query tokens, request after request.
    query_start_loc : int32 or int64 [B + 1]
        Where each request's tokens start, then where the last one's end; on q's device.
        Tokens outside ``[query_start_loc[0], query_start_loc[B])`` (an engine's padding) are
        not placed.
    qlen : int
        The verify block (``VerifyConfig.qlen``): no request may have more tokens; such a
        request's earliest tokens find no row, and :func:`rows_to_ragged` gives them NaN.
    check : bool
        Also validate the values (a host sync; ``MLA_DCP_CHECK=1`` turns it on): a ValueError
        names the first entry out of ``[0, T]``, out of order, or a request of more than
        ``qlen`` tokens.

    >>> import torch, mla_dcp
    >>> q = torch.arange(1.0, 5.0)[:, None, None]            # tokens 1, 2, 3, 4
    >>> starts = torch.tensor([0, 1, 4, 4])                    # 1, 3 and 0 tokens
    >>> mla_dcp.ragged_to_rows(q, starts, qlen=3).flatten().tolist()
    [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0]
    """
    q = _checks.require_tensor("q", q)
    starts = _require_starts(query_start_loc)
    if q.dim() < 1:
        raise ValueError(f"q must have shape [T, ...] (the step's tokens first), got {list(q.shape)}")
    if not isinstance(qlen, int) or qlen < 1:
        raise ValueError(f"qlen must be an int >= 1 (VerifyConfig.qlen), got {qlen!r}")
    _checks.require_same_device(q=q, query_start_loc=starts)
    _checks.check_query_starts(starts, q.shape[0], qlen, check)
    batch = starts.shape[0] - 1
    if q.shape[0] == 0 or batch == 0:
        return q.new_zeros(batch * qlen, *q.shape[1:])
    token, holds = _rows_of(starts, batch, qlen)
    holds &= token < q.shape[0]
    rows = q.index_select(0, token.clamp(0, q.shape[0] - 1))
    return rows.masked_fill_(~holds.view(-1, *[1] * (q.dim() - 1)), 0)


def rows_to_ragged(out: torch.Tensor, lse: torch.Tensor, query_start_loc: torch.Tensor, num_tokens: int, *,
                   check: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`verify`'s (or a rank merge's) rows back as the step's packed tokens: (out ``[T, ...]``,
    lse ``[T, ...]``), the inverse of :func:`ragged_to_rows`.

    Parameters
    ----------
    out : [B*qlen, ...], lse : [B*qlen, ...]
        Rows request-major, as :func:`verify`, :func:`merge_ranks` and ``distributed.verify``
        give them (all heads or this rank's).
    query_start_loc : int32 or int64 [B + 1]
        As given to :func:`ragged_to_rows`; ``qlen`` is ``out.shape[0] // B``.
    num_tokens : int
        ``T``, the packed length (static; reading ``query_start_loc[B]`` would sync).
    check : bool
        As :func:`ragged_to_rows`.

    Returns
    -------
    A token of no request (outside ``[query_start_loc[0], query_start_loc[B])``, an engine's
    padding) gives output 0 and LSE -inf, an empty row's; a token its request's ``qlen``
    rows cannot hold (a request of more than ``qlen`` tokens) gives NaN in both, a poisoned
    row's: never another token's answer.
    """
    out = _checks.require_tensor("out", out)
    lse = _checks.require_tensor("lse", lse)
    starts = _require_starts(query_start_loc)
    batch = starts.shape[0] - 1
    if out.dim() < 1 or (batch and out.shape[0] % batch) or (not batch and out.shape[0]):
        raise ValueError(f"out must have shape [B*qlen, ...] with B = {batch} (query_start_loc's length - 1), "
                         f"got {list(out.shape)}")
    if lse.dim() < 1 or lse.shape[0] != out.shape[0]:
        raise ValueError(f"lse must have shape [B*qlen, ...] with B*qlen = {out.shape[0]} (out's rows), "
                         f"got {list(lse.shape)}")
    if not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an int >= 0 (the packed tokens' count), got {num_tokens!r}")
    _checks.require_same_device(out=out, lse=lse, query_start_loc=starts)
    qlen = out.shape[0] // batch if batch else 1
    if qlen < 1:
        raise ValueError(f"out must have at least one row per request (B = {batch}), got {list(out.shape)}")
    _checks.check_query_starts(starts, num_tokens, qlen, check)
    tokens = torch.arange(num_tokens, device=starts.device, dtype=starts.dtype)
    if batch == 0:
        return (out.new_zeros(num_tokens, *out.shape[1:]),
                lse.new_full((num_tokens, *lse.shape[1:]), float("-inf")))
    # The request holding each token: the first whose end is past it (B: none).
    request = torch.searchsorted(starts[1:], tokens, right=True)
    inside = request < batch
    request = request.clamp(max=batch - 1)
    back = starts[1:][request] - tokens                       # 1 for a request's last token
    inside &= tokens >= starts[:-1][request]
    fits = back <= qlen
    row = (request + 1) * qlen - back
    row = torch.where(inside & fits, row, 0)
    shape = (-1, *[1] * (out.dim() - 1))
    lse_shape = (-1, *[1] * (lse.dim() - 1))
    got = out.index_select(0, row)
    got_lse = lse.index_select(0, row)
    got = got.masked_fill_(~inside.view(shape), 0).masked_fill_((inside & ~fits).view(shape), float("nan"))
    got_lse = got_lse.masked_fill_(~inside.view(lse_shape), float("-inf"))
    return got, got_lse.masked_fill_((inside & ~fits).view(lse_shape), float("nan"))
