"""Token trees: verify blocks whose rows see their ancestors, not every earlier row.

Drafters that propose several continuations at once (EAGLE-2/3 trees,
Medusa, SpecInfer) send the target a tree of tokens: the block of request
``b`` holds its nodes in topological order, and each node must attend to the
context and to its own ancestors only. :func:`tree_mask` gives that block
mask from each node's parent; ``build_view(cfg, seq_lens, block_table,
block_mask=mask)`` builds the step's :class:`mla_dcp.MaskedView`, and
``verify`` runs it: the context through the segmented stages (every row sees
all of it), each row's at most ``qlen`` block keys in one more kernel, the two
merged by stage 5's rule. Ranks, interleave, pages, fp8, graphs, compile and
the rank merges are those of any step.

>>> import torch, mla_dcp
>>> mla_dcp.tree_mask([-1, 0, 0, 1]).int().tolist()   # a root, its two children, a grandchild
[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mla_dcp import _checks
from mla_dcp.pure.tree import TREE_CONTEXT, TREE_ROOT
from mla_dcp.pure.tree import tree_mask as _tree_mask

__all__ = ["TREE_ROOT", "TREE_CONTEXT", "tree_mask"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def tree_mask(parents: torch.Tensor | Sequence[int], *, check: bool = False) -> torch.Tensor:
    """The block mask (bool ``[..., n, n]``, for ``build_view(block_mask=...)``) of token trees.

    Parameters
    ----------
    parents : int32/int64 [n] or [B, n], or a list of ints
        One tree per request (or one for all), ``n = qlen`` entries: node
        ``i``'s parent, a node before it (topological order: a node follows
        its parent), or ``TREE_ROOT`` (-1) for a node whose parent is the
        context (the tree's root, the token the previous step accepted). A
        tree of fewer than ``n`` nodes starts with ``TREE_CONTEXT`` (-2)
        entries: a shorter request's block begins with its own context tokens
        (as :func:`mla_dcp.ragged_blocks` places it), which every node sees.
    check : bool
        Also check the values (syncs the host with the device; ``MLA_DCP_CHECK=1``
        does it for every call): every entry -2, -1 or a node before it, the
        -2 entries first. A ValueError names the first bad entry.

    Returns
    -------
    bool [n, n] or [B, n, n]: row ``t`` sees block key ``j`` where ``j`` is
    ``t`` or an ancestor of ``t``, or a context entry; a context entry's row
    sees the entries up to itself (it is a context token). A chain
    ``[-1, 0, 1, ...]`` gives the causal mask. No host sync without ``check``.
    """
    if not isinstance(parents, torch.Tensor):
        parents = torch.as_tensor(list(parents), dtype=torch.int64)
    _checks.require_dtype("parents", parents, _INDEX_DTYPES)
    if parents.dim() not in (1, 2) or parents.shape[-1] == 0:
        raise ValueError(f"parents must have shape [n] or [B, n] with n >= 1 (n = qlen), got {list(parents.shape)}")
    if _checks.values_checked(check):
        _check_parents(parents)
    return _tree_mask(parents)


def _check_parents(parents: torch.Tensor) -> None:
    rows = parents.reshape(-1, parents.shape[-1]).long().cpu()
    index = torch.arange(rows.shape[1])
    context = rows == TREE_CONTEXT
    node_parent = rows >= 0
    bad = (rows < TREE_CONTEXT) | (node_parent & (rows >= index))
    # A node's parent must be a node, not a context entry.
    bad |= node_parent & context.gather(1, rows.clamp(0, rows.shape[1] - 1))
    # Context entries first: none after the first node.
    bad |= context & ((~context).long().cumsum(1) > 0)
    if bad.any():
        tree, i = bad.nonzero()[0].tolist()
        where = f"parents[{tree}, {i}]" if parents.dim() == 2 else f"parents[{i}]"
        raise ValueError(f"{where} = {int(rows[tree, i])}: each entry must be TREE_CONTEXT (-2, before every node), "
                         f"TREE_ROOT (-1) or a node before it (0 .. {i - 1}) that is not a context entry")
