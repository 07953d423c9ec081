"""The static arguments of a verify step.

`VerifyConfig` plays the role of JAX's static arguments: frozen and hashable,
so a compiled graph or a captured CUDA graph is keyed by it, and every shape
in the pipeline is a function of it and of the batch size alone.
"""

from __future__ import annotations

import dataclasses
import math

from mla_dcp._shapes import (INVARIANT_MAX_SEGMENT_TOKENS, cdiv, invariant_chunk_pages, invariant_segment_tokens_for,
                             page_size_for)
from mla_dcp.pure.placement import local_len


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    """Static configuration of one DCP rank's verify step.

    Parameters
    ----------
    num_heads : int
        Query heads seen by the attention, after the DCP head all-gather.
    qlen : int
        Verify rows per request: number of draft tokens + 1. ``qlen == 1`` is
        plain decode.
    block_size : int
        Tokens per physical KV-cache block.
    max_model_len : int
        Longest global sequence a request may reach. Fixes the static bound on
        the rank-local length, hence every metadata shape.
    dcp_world_size, dcp_rank, interleave : int
        DCP group size ``W``, this rank ``r`` and the interleave size ``I``:
        global position ``p`` lives on rank ``(p // I) % W``.
    kv_lora_rank, rope_dim : int
        ``Dl`` (latent width, also value/output width) and ``Dr``.
    softmax_scale : float, keyword-only, required
        The model's own softmax scale. For DeepSeek-V2/V3 and Kimi-K2 it is
        ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5`` times YaRN's
        ``mscale ** 2`` (see :func:`mla_dcp.softmax_scale_for`), never
        ``(kv_lora_rank + rope_dim) ** -0.5``: the absorbed query is 576 wide,
        but the scale belongs to the model's 192-wide heads. There is no
        default because every default is silently wrong for some model.
    num_segments : int or None
        Static number of KV segments per request in the segmented stage.
        ``None`` lets the backend choose from the static bound and the device.
    causal : bool
        True (verification): row ``t`` sees keys up to its own position.
        False: a non-causal draft block (DSpark/DFlash-style drafters): every
        row of request ``b`` sees all ``L_b`` keys. Static: one graph per value.
    batch_invariant : bool
        True: a row's output and LSE bits depend only on its own query, its
        own window and this configuration's static fields (not on the other
        requests, the batch size, the lengths or ``qlen``): every request is
        cut into segments at the same token positions
        (:attr:`invariant_tokens`-token segments from position 0), the
        attention kernel's tiles do not depend on ``qlen * num_heads``, and
        the merge reads a fixed number of segments per step. So a verify row
        equals, bit for bit, a ``qlen = 1`` decode step at that row's
        position. ``num_segments`` must stay None.
    invariant_segment_tokens : int or None
        Segment length of the batch-invariant mode (a power of two in
        [128, 2^20]). None (the default): 64 tokens a head, a power of two in
        [1024, 4096] (1024 at 16 heads or fewer, 4096 at 64 or more; see
        :attr:`invariant_tokens`). Part of the static configuration: rows
        are bitwise equal across batches of one value, not across values.
        Shorter segments give a small batch more parallel work (a latency-
        bound step runs about as many programs as segments); longer ones
        write and merge fewer partials (a full, compute-bound batch). See
        docs/performance.md for measured costs.
    fp8_products : bool
        Opt-in, e4m3 caches only (``torch.float8_e4m3fn``; a GPU with fp8
        tensor cores, compute capability 8.9 or later): the latent part of
        the scores and ``P @ V`` multiply e4m3 operands on the fp8 tensor
        cores, ``q``'s latent part quantised per (row, head) with a power-of-
        two scale and ``P`` per KV tile with a fixed one; the rope part, the
        softmax and the sums stay exact. The pure path applies the same
        roundings. Less accurate than the default exact mode (about 20x on
        Gaussian inputs); about 10% faster where Hopper's seesaw kernel
        serves (64 (row, head) pairs a tile), slower elsewhere
        (docs/design.md and docs/kernels.md, "fp8 products"): prefer the
        default unless those 10% matter more than the error.
    stream : bool or None
        How a step's pages are laid out over the attention programs
        (:func:`mla_dcp.schedule_shape`). ``None``: the stream schedule (equal
        runs of pages that may cross requests) wherever the attention kernel
        runs several pieces a program, on GPUs unless ``MLA_DCP_STREAM=0``.
        ``True``: the same whatever that variable says. ``False``: one piece
        per program, never spanning two requests (on the H200 5-7% faster on
        exactly uniform steps, 10-27% slower on ragged ones). Must not be
        True with ``batch_invariant`` or a fixed ``num_segments``, which keep
        one piece per program.

    >>> cfg = VerifyConfig(num_heads=16, qlen=3, block_size=64, max_model_len=4096,
    ...                    dcp_world_size=4, dcp_rank=1, kv_lora_rank=64, rope_dim=16,
    ...                    softmax_scale=192 ** -0.5)
    >>> cfg.max_local_len, cfg.page_size, cfg.max_pages
    (1024, 64, 16)
    """

    num_heads: int
    qlen: int
    block_size: int
    max_model_len: int
    dcp_world_size: int = 1
    dcp_rank: int = 0
    interleave: int = 1
    kv_lora_rank: int = 512
    rope_dim: int = 64
    num_segments: int | None = None
    causal: bool = True
    batch_invariant: bool = False
    invariant_segment_tokens: int | None = None
    fp8_products: bool = False
    stream: bool | None = None
    # Keyword-only and without a default: a missing scale is Python's own
    # TypeError naming ``softmax_scale``, raised before anything runs.
    softmax_scale: float = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        for name in ("num_heads", "qlen", "block_size", "max_model_len",
                     "dcp_world_size", "interleave", "kv_lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"VerifyConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.rope_dim, int) or isinstance(self.rope_dim, bool) or self.rope_dim < 0:
            raise ValueError(f"VerifyConfig.rope_dim must be an int >= 0, got {self.rope_dim!r}")
        if (not isinstance(self.dcp_rank, int) or isinstance(self.dcp_rank, bool)
                or not 0 <= self.dcp_rank < self.dcp_world_size):
            raise ValueError(
                f"VerifyConfig.dcp_rank must be an int in [0, dcp_world_size={self.dcp_world_size}), "
                f"got {self.dcp_rank!r}")
        if (not isinstance(self.softmax_scale, (int, float)) or isinstance(self.softmax_scale, bool)
                or not math.isfinite(self.softmax_scale) or self.softmax_scale <= 0):
            raise ValueError(
                f"VerifyConfig.softmax_scale must be a finite float > 0 (the model's own scale, e.g. "
                f"mla_dcp.softmax_scale_for(...)), got {self.softmax_scale!r}")
        if self.max_model_len < self.qlen:
            raise ValueError(
                f"VerifyConfig.max_model_len must be >= qlen={self.qlen} (a request holds its qlen verify "
                f"tokens), got {self.max_model_len!r}")
        for name in ("causal", "batch_invariant", "fp8_products"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"VerifyConfig.{name} must be a bool, got {getattr(self, name)!r}")
        tokens = self.invariant_segment_tokens
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 128
                                   or tokens & (tokens - 1) or tokens > INVARIANT_MAX_SEGMENT_TOKENS):
            raise ValueError(
                f"VerifyConfig.invariant_segment_tokens must be None or a power of two in [128, "
                f"{INVARIANT_MAX_SEGMENT_TOKENS}] (a whole number of pages and of the kernels' 128-token "
                f"tile pairs), got {tokens!r}")
        if self.batch_invariant and self.num_segments is not None:
            raise ValueError(
                f"VerifyConfig.num_segments must be None with batch_invariant=True (the segments are fixed "
                f"{self.invariant_chunk_pages}-page spans), got {self.num_segments!r}")
        if self.stream is not None and not isinstance(self.stream, bool):
            raise ValueError(f"VerifyConfig.stream must be None, True or False, got {self.stream!r}")
        if self.stream and (self.batch_invariant or self.num_segments is not None):
            raise ValueError(
                "VerifyConfig.stream=True needs batch_invariant=False and num_segments=None (both keep one piece "
                f"per program), got batch_invariant={self.batch_invariant}, num_segments={self.num_segments!r}")
        if self.num_segments is not None and (
                not isinstance(self.num_segments, int) or isinstance(self.num_segments, bool)
                or self.num_segments < 1):
            raise ValueError(
                f"VerifyConfig.num_segments must be an int >= 1 or None, got {self.num_segments!r}")

    @property
    def head_dim(self) -> int:
        """``Dqk = Dl + Dr``: width of queries and cached keys."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def scale(self) -> float:
        """The softmax scale applied to ``q . k``, as a Python float."""
        return float(self.softmax_scale)

    @property
    def max_local_len(self) -> int:
        """Static bound on any rank's local length: rank 0 holds the most."""
        return local_len(self.max_model_len, self.dcp_world_size, 0, self.interleave)

    @property
    def page_size(self) -> int:
        """``P``: the power-of-two page kernels walk the cache in."""
        return page_size_for(self.block_size)

    @property
    def max_pages(self) -> int:
        """Width of the expanded page table."""
        return cdiv(self.max_local_len, self.page_size)

    @property
    def min_table_blocks(self) -> int:
        """Fewest block-table columns that can hold ``max_local_len`` tokens."""
        return cdiv(self.max_local_len, self.block_size)

    @property
    def invariant_tokens(self) -> int:
        """The batch-invariant mode's segment length in tokens:
        ``invariant_segment_tokens``, or when None 64 a head, a power of two
        in [1024, 4096] (:func:`mla_dcp._shapes.invariant_segment_tokens_for`)."""
        tokens = self.invariant_segment_tokens
        return invariant_segment_tokens_for(self.num_heads) if tokens is None else tokens

    @property
    def invariant_chunk_pages(self) -> int:
        """Pages per segment in batch-invariant mode (:attr:`invariant_tokens`)."""
        return invariant_chunk_pages(self.page_size, self.invariant_tokens)

    @property
    def schedule_chunk(self) -> int:
        """The schedule's fixed pages per segment: ``invariant_chunk_pages``
        in batch-invariant mode, else 0 (balanced over the step's items)."""
        return self.invariant_chunk_pages if self.batch_invariant else 0

    @property
    def route(self) -> str:
        """``"decode"`` for one row per request, ``"verify"`` otherwise."""
        return "decode" if self.qlen == 1 else "verify"


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature factor: ``0.1 * mscale * ln(scale) + 1``
    for a context-extension ``scale > 1``, else 1 (DeepSeek-V2/V3's
    ``yarn_get_mscale``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale_for(qk_nope_head_dim: int, qk_rope_head_dim: int, rope_scaling: dict | None = None) -> float:
    """The softmax scale of a DeepSeek-V2/V3 (or Kimi-K2) style MLA model.

    ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale ** 2``
    when the model uses YaRN rope scaling with ``mscale_all_dim`` (as in the
    model's Hugging Face config: ``rope_scaling = {"type": "yarn", "factor":
    40, "mscale": 1.0, "mscale_all_dim": 1.0, ...}``). The absorbed query is
    ``kv_lora_rank + rope`` wide, but the scale belongs to the model's own
    query-key heads: DeepSeek-V3 uses 128 + 64 = 192, not 576.

    >>> round(softmax_scale_for(128, 64), 6)          # DeepSeek-V3 without YaRN
    0.072169
    >>> yarn = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}
    >>> round(softmax_scale_for(128, 64, yarn), 6)    # DeepSeek-V3 as shipped (factor 40)
    0.135234
    >>> round(softmax_scale_for(128, 64, {**yarn, "factor": 32}), 6)   # Kimi-K2 (factor 32)
    0.130861
    """
    for name, value in (("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if qk_nope_head_dim + qk_rope_head_dim < 1:
        raise ValueError("qk_nope_head_dim + qk_rope_head_dim must be >= 1, got 0")
    scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
    if rope_scaling:
        kind = rope_scaling.get("type", rope_scaling.get("rope_type"))
        all_dim = rope_scaling.get("mscale_all_dim", 0)
        if kind == "yarn" and all_dim:
            factor = yarn_mscale(float(rope_scaling["factor"]), float(all_dim))
            scale *= factor * factor
    return scale
