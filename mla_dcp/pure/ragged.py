"""Ragged verify blocks in plain torch: requests with different numbers of query tokens.

Request ``b`` with ``q_b <= qlen`` tokens (``query_start_loc[b] ..
query_start_loc[b + 1] - 1`` of the packed ones) takes the last ``q_b`` rows
of its block of ``qlen`` (DESIGN.md, "Ragged blocks"). The maps hold, per row,
the token it holds (-1: a padding row) and, per token, the row holding it
(-1: a token of no request, whose results are an empty row's; -2: a token no
row holds, a request of more than ``qlen`` tokens, whose results are NaN).
"""

from __future__ import annotations

import torch

from mla_dcp._shapes import RAGGED_NO_REQUEST, RAGGED_NO_ROW

__all__ = ["RAGGED_NO_REQUEST", "RAGGED_NO_ROW", "ragged_map", "ragged_rows", "ragged_tokens"]


def ragged_map(query_start_loc: torch.Tensor, qlen: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_of_row int32 [B*qlen], row_of_token int32 [T]) of ``query_start_loc`` [B + 1]."""
    starts = query_start_loc
    batch, device, dtype = starts.shape[0] - 1, starts.device, starts.dtype
    first, end = starts[:-1], starts[1:]
    # Row r of request b = r // qlen holds the token qlen - r % qlen before its request's end.
    row = torch.arange(batch * qlen, device=device, dtype=dtype)
    request = torch.div(row, qlen, rounding_mode="floor")
    token = end[request] - qlen + row % qlen
    holds = (token >= first[request]) & (token >= 0) & (token < num_tokens)
    token_of_row = torch.where(holds, token, -1).to(torch.int32)
    tokens = torch.arange(num_tokens, device=device, dtype=dtype)
    if batch == 0:
        return token_of_row, torch.full((num_tokens,), RAGGED_NO_REQUEST, dtype=torch.int32, device=device)
    # The request of each token: the first whose end is past it (B where none is).
    owner = torch.searchsorted(end, tokens, right=True)
    inside = owner < batch
    owner = owner.clamp(max=batch - 1)
    back = end[owner] - tokens                                 # 1 for a request's last token
    inside &= tokens >= first[owner]
    row_of_token = torch.where(back <= qlen, (owner + 1) * qlen - back, RAGGED_NO_ROW)
    return token_of_row, torch.where(inside, row_of_token, RAGGED_NO_REQUEST).to(torch.int32)


def _per_row(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *[1] * (like.dim() - 1))


def ragged_rows(q: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """``q`` [T, ...] as rows [B*qlen, ...]: row r holds token ``token_of_row[r]``, zeros where -1."""
    if q.shape[0] == 0:
        return q.new_zeros(token_of_row.shape[0], *q.shape[1:])
    rows = q.index_select(0, token_of_row.clamp(min=0))
    return rows.masked_fill_(_per_row(token_of_row < 0, rows), 0)


def ragged_tokens(out: torch.Tensor, lse: torch.Tensor,
                  row_of_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (out, lse [B*qlen, ...]) as tokens [T, ...]: token i takes row ``row_of_token[i]``; 0 and
    -inf where it is RAGGED_NO_REQUEST, NaN in both where RAGGED_NO_ROW."""
    none, nan = row_of_token == RAGGED_NO_REQUEST, row_of_token == RAGGED_NO_ROW
    results = []
    for tensor, empty in ((out, 0.0), (lse, float("-inf"))):
        if tensor.shape[0] == 0:
            got = tensor.new_full((row_of_token.shape[0], *tensor.shape[1:]), empty)
        else:
            got = tensor.index_select(0, row_of_token.clamp(min=0)).masked_fill_(_per_row(none, tensor), empty)
        results.append(got.masked_fill_(_per_row(nan, got), float("nan")))
    return results[0], results[1]
