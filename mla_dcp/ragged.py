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

:func:`ragged_blocks` maps tokens to rows once a step (a few small device
ops); its :meth:`RaggedBlocks.rows` and :meth:`RaggedBlocks.tokens` move each
layer's queries and results, one kernel each on a GPU (custom ops
``mla_dcp::ragged_rows`` and ``ragged_tokens``; traced, plain torch that
inductor fuses). All of it is gathers on the device: no host sync, shapes
from ``(B, T, qlen)`` only, so it compiles into the step's graph and replays
in a captured one while the counts change.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mla_dcp import _checks, pure
from mla_dcp.ops import library as ops

__all__ = ["RaggedBlocks", "ragged_blocks"]

_INDEX_DTYPES = (torch.int32, torch.int64)


class RaggedBlocks(NamedTuple):
    """Where a step's packed tokens sit among :func:`verify`'s rows (from :func:`ragged_blocks`).

    Attributes
    ----------
    token_of_row : int32 [B*qlen]
        The token each row holds; -1 for a padding row (in front of its request's tokens).
    row_of_token : int32 [T]
        The row holding each token; ``RAGGED_NO_REQUEST`` (-1) for a token of no request
        (outside ``[query_start_loc[0], query_start_loc[B])``: an engine's padding; its results
        are an empty row's, 0 and -inf), ``RAGGED_NO_ROW`` (-2) for a token no row holds (a
        request of more than ``qlen`` tokens; its results are NaN).
    qlen : int
    """

    token_of_row: torch.Tensor
    row_of_token: torch.Tensor
    qlen: int

    def rows(self, q: torch.Tensor) -> torch.Tensor:
        """The packed tokens ``q`` [T, ...] as :func:`verify`'s rows [B*qlen, ...]: each request's
        tokens on the last rows of its block, zeros in front of them. One launch on a GPU."""
        q = _checks.require_tensor("q", q)
        tokens = self.row_of_token.shape[0]
        if q.dim() < 1 or q.shape[0] != tokens:
            raise ValueError(f"q must have shape [T, ...] with T = {tokens} (the tokens these blocks place), "
                             f"got {list(q.shape)}")
        _checks.require_same_device(q=q, blocks=self.token_of_row)
        if torch.compiler.is_compiling():
            return pure.ragged_rows(q, self.token_of_row)     # inductor fuses it into a kernel of its own
        return ops.stage.ragged_rows(q, self.token_of_row)

    def tokens(self, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows as :func:`verify`, :func:`merge_ranks` or ``distributed.verify`` give them (out, lse:
        [B*qlen, ...], all heads or this rank's) back as the packed tokens [T, ...]: a token of no
        request gives 0 and -inf, one no row holds NaN in both (never another token's answer).
        One launch on a GPU."""
        out = _checks.require_tensor("out", out)
        lse = _checks.require_tensor("lse", lse)
        rows = self.token_of_row.shape[0]
        for name, tensor in (("out", out), ("lse", lse)):
            if tensor.dim() < 1 or tensor.shape[0] != rows:
                raise ValueError(f"{name} must have shape [B*qlen, ...] with B*qlen = {rows} (these blocks' rows), "
                                 f"got {list(tensor.shape)}")
        _checks.require_same_device(out=out, lse=lse, blocks=self.row_of_token)
        if torch.compiler.is_compiling():
            return pure.ragged_tokens(out, lse, self.row_of_token)
        return ops.stage.ragged_tokens(out, lse, self.row_of_token)


def ragged_blocks(query_start_loc: torch.Tensor, qlen: int, num_tokens: int, *,
                  check: bool = False) -> RaggedBlocks:
    """Where a step's packed tokens go among :func:`verify`'s rows, once a step.

    Parameters
    ----------
    query_start_loc : int32 or int64 [B + 1]
        Where each request's tokens start, then where the last one's end (FlashAttention's
        ``cu_seqlens``, vLLM's ``query_start_loc``), on the step's device.
    qlen : int
        The verify block (``VerifyConfig.qlen``): no request may have more tokens (such a
        request's earliest tokens find no row and come back NaN).
    num_tokens : int
        ``T``, the packed length (static: reading ``query_start_loc[B]`` would sync).
    check : bool
        Also validate the values (a host sync; ``MLA_DCP_CHECK=1`` turns it on): a ValueError
        names the first entry out of ``[0, T]`` or out of order, or a request of more than
        ``qlen`` tokens.

    >>> import torch, mla_dcp
    >>> blocks = mla_dcp.ragged_blocks(torch.tensor([0, 1, 4, 4]), qlen=3, num_tokens=5)   # 1, 3, 0 tokens
    >>> rows = blocks.rows(torch.arange(1.0, 6.0)[:, None])    # tokens 1-4, then an engine's padding
    >>> rows.flatten().tolist()
    [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0]
    >>> out, lse = blocks.tokens(rows * 10, rows[:, 0])
    >>> out.flatten().tolist(), lse.tolist()
    ([10.0, 20.0, 30.0, 40.0, 0.0], [1.0, 2.0, 3.0, 4.0, -inf])
    """
    starts = _checks.require_tensor("query_start_loc", query_start_loc)
    _checks.require_dtype("query_start_loc", starts, _INDEX_DTYPES)
    if starts.dim() != 1 or starts.shape[0] < 1:
        raise ValueError(f"query_start_loc must have shape [B + 1] (B >= 0: request b's tokens are "
                         f"query_start_loc[b] .. query_start_loc[b + 1] - 1), got {list(starts.shape)}")
    if not isinstance(qlen, int) or qlen < 1:
        raise ValueError(f"qlen must be an int >= 1 (VerifyConfig.qlen), got {qlen!r}")
    # A traced size (torch.export's or a dynamic graph's) is a SymInt.
    if not isinstance(num_tokens, (int, torch.SymInt)) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an int >= 0 (the packed tokens' count), got {num_tokens!r}")
    _checks.check_query_starts(starts, num_tokens, qlen, check)
    if torch.compiler.is_compiling():
        return RaggedBlocks(*pure.ragged_map(starts, qlen, num_tokens), qlen)   # inductor fuses its ops
    # One launch on a GPU (the torch path's ~25 took 54 us under a CUDA graph on the H200).
    return RaggedBlocks(*ops.stage.ragged_map(starts, qlen, num_tokens), qlen)
