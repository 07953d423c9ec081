"""The public API: validate, then compose the `mla_dcp::` ops.

`build_view` turns a step's lengths and block table into the immutable
metadata view; `verify` runs this rank's segmented attention and segment
merge; `merge_ranks` combines ranks' partials. Validation reads shapes,
dtypes and devices only, and is done before any op runs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mla_dcp import _checks
from mla_dcp._dtypes import layout_facts
from mla_dcp._shapes import STREAM_WORK_COLUMNS, WORK_COLUMN_COUNTS, WORK_COLUMNS
from mla_dcp.config import VerifyConfig
from mla_dcp.ops import library as ops
from mla_dcp.ops import tiles
from mla_dcp.pure.attention import default_num_segments

__all__ = ["VerifyView", "MaskedView", "build_view", "verify", "verify_sparse", "merge_ranks", "num_segments_for",
           "schedule_shape"]


class VerifyView(NamedTuple):
    """One step's metadata, built once by :func:`build_view`.

    Attributes
    ----------
    row_lens : int32 [B*qlen]
        Rank-local visible length of every verify row (row = b*qlen + t).
    page_table : int32 [B, max_pages]
        Expanded page table; its width is static (from ``max_model_len``).
    work : int32 [NI, 3] or [NI, 5]
        The step's work schedule, computed on the device from the lengths
        (:func:`mla_dcp.pure.build_schedule`): per piece, the request and its
        page range; with 5 columns (the stream, :func:`schedule_shape`), per
        attention program the run of pieces it works through. ``NI`` is
        static; the pages are balanced over the programs, so one long request
        among short ones is split into many pieces and the short ones into
        few.
    segments : int32 [B, 3]
        Per request, where its items lie (the segment merge's input): items
        ``first .. first + full - 1``, then item ``tail`` if ``tail >= 0``
        (the schedule runs the longest items first).
    cfg : VerifyConfig
        The configuration the view was built for: :func:`verify` refuses a
        view built for another one (another rank, say), whose lengths would
        be silently wrong.
    """

    row_lens: torch.Tensor
    page_table: torch.Tensor
    work: torch.Tensor
    segments: torch.Tensor
    cfg: VerifyConfig

    @property
    def batch(self) -> int:
        return self.page_table.shape[0]

    @property
    def qlen(self) -> int:
        return self.row_lens.shape[0] // max(self.page_table.shape[0], 1)

    @property
    def route(self) -> str:
        """``"decode"`` (one row per request) or ``"verify"`` (segmented, q > 1)."""
        return "decode" if self.qlen == 1 else "verify"


class MaskedView(NamedTuple):
    """One step's metadata for masked blocks (token trees), built by :func:`build_view` with a
    ``block_mask``; :func:`verify` takes it as it takes a :class:`VerifyView`.

    Attributes
    ----------
    context : VerifyView
        Every row's view of its request's context, the keys before its block
        (``seq_lens - qlen`` of them, each row all of them): the fast
        non-causal stages serve it.
    block_table : int32 [B, max_blocks]
        This rank's block table (where the block's keys are).
    mask : bool [B, qlen, qlen]
        Row ``t`` of request ``b`` sees the block's key ``j`` (global position
        ``seq_lens[b] - qlen + j``) where ``mask[b, t, j]`` (a view of the
        caller's mask, broadcast over the batch where it was one for all).
    seq_lens : int32 [B]
    cfg : VerifyConfig
    """

    context: VerifyView
    block_table: torch.Tensor
    mask: torch.Tensor
    seq_lens: torch.Tensor
    cfg: VerifyConfig

    @property
    def batch(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def qlen(self) -> int:
        return self.mask.shape[-1]

    @property
    def route(self) -> str:
        """``"verify"``: the segmented stages, then each row's block keys."""
        return "verify"


class _Facts(NamedTuple):
    """What a step reads of its config's derived properties (each a computation)."""

    cfg: VerifyConfig
    max_pages: int
    min_table_blocks: int
    page_size: int
    head_dim: int
    scale: float
    schedule_chunk: int


# id(cfg) -> its _Facts (holding the config, so that an id is never another's) in eager calls: the
# properties cost ~10 us of host time a step. Compiled code reads the properties (traced once).
_FACTS: dict[int, _Facts] = {}
_MAX_MEMO = 256


def _facts(cfg: VerifyConfig) -> _Facts:
    compiling = torch.compiler.is_compiling()
    if not compiling:
        facts = _FACTS.get(id(cfg))
        if facts is not None and facts.cfg is cfg:
            return facts
    facts = _Facts(cfg, cfg.max_pages, cfg.min_table_blocks, cfg.page_size, cfg.head_dim, cfg.scale,
                   cfg.schedule_chunk)
    if not compiling:
        if len(_FACTS) >= _MAX_MEMO:
            _FACTS.clear()
        _FACTS[id(cfg)] = facts
    return facts


def _schedule_shape_memo(cfg: VerifyConfig, batch: int, device: torch.device, q_dtype: torch.dtype,
                         kv_dtype: torch.dtype | None) -> tuple[int, int]:
    """:func:`schedule_shape`, remembered per config object and static facts in eager calls (not while a
    forced tile plan is active: the tests' and tuner's)."""
    if torch.compiler.is_compiling() or tiles._FORCED:
        return schedule_shape(cfg, batch, device, q_dtype, kv_dtype)
    # Kept with the tile plans' memo (tiles._EAGER_MEMO), which forgetting device facts empties.
    key = (_schedule_shape_memo, id(cfg), batch, device, q_dtype, kv_dtype, tiles.STREAM_ON_GPU)
    memo = tiles._EAGER_MEMO.get(key)
    if memo is None or memo[0] is not cfg:
        if len(tiles._EAGER_MEMO) >= tiles.EAGER_MEMO_LIMIT:
            tiles._EAGER_MEMO.clear()
        memo = tiles._EAGER_MEMO[key] = (cfg, schedule_shape(cfg, batch, device, q_dtype, kv_dtype))
    return memo[1]


class _EagerPlan(NamedTuple):
    """An eager verify call's launches for one layout, and the config they were chosen for."""

    cfg: VerifyConfig
    sequence: object     # fast_launch.Sequence


class _ViewPlan(NamedTuple):
    """An eager build_view call's launches (native only), and the config they were chosen for."""

    cfg: VerifyConfig
    sequence: object     # fast_launch.Sequence with a native plan (its last result the page table)

    def run(self, seq_lens: torch.Tensor, block_table: torch.Tensor):
        # The page table is the plan's last result: its expansion, or the block table's first
        # columns as a view (sliced in C++: a Python slice costs more than the rest of the call).
        made = self.sequence.run_native((seq_lens, block_table))
        if made is None:
            return None
        return VerifyView(made[0], made[3], made[1], made[2], self.cfg)


# (fast_launch, verify's plans, verify's native plans, build_view's native plans) once a
# launcher has served an eager call. The native ones are keyed by the config and the batch's
# shape alone: the latest layout each served, which the native plan checks itself (a call of
# another layout takes the keyed path).
_EAGER: tuple | None = None


def _eager_plans() -> tuple:
    global _EAGER
    if _EAGER is None:
        from mla_dcp.ops import fast_launch   # imports Triton: only once a launcher serves a call
        _EAGER = (fast_launch, fast_launch.plan_cache(), fast_launch.plan_cache(), fast_launch.plan_cache())
    return _EAGER


def _native_first(check: bool) -> bool:
    """Whether an eager call may try a native plan: no value check asked, the launchers serve calls
    (not compiling); the checks of the tensors and of the dispatch and function modes and the
    profiler the plan's C++ call makes itself. A Python plan also needs ``ops.plain_eager_cuda``."""
    # Compiling first: a traced call then reads none of the eager state, so no guard of the
    # compiled graph depends on it (the first eager call sets _EAGER up: a recompile otherwise).
    return ops.launchers_may_serve() and not check and not tiles._FORCED and not _checks.check_requested()


def _planned(kind: str, cfg: VerifyConfig, inputs: tuple):
    """An eager call's outputs from its plan, or the key to record its full path under.

    ``inputs`` are the call's tensors (``None`` where an optional one is absent), ``inputs[0]`` the
    queries; ``kind`` names the entry point (its plans are its own). Returns ``(outputs, None)`` where
    a plan served the call; else ``(None, key)``: the full path follows, under :func:`_recorded` with
    ``key`` (``None``: not a call a plan may serve, so nothing is recorded). The caller checked
    :func:`_native_first` and that the view is ``cfg``'s own. A plan's key holds every input's layout,
    so validation and every choice the full path makes (functions of those layouts and ``cfg``) are
    the recorded call's; the native plan, keyed by the queries' shape alone, checks every layout in
    C++ and declines another."""
    coarse = (kind, id(cfg), inputs[0].shape)
    fast = None if _EAGER is None else _EAGER[2].get(coarse)
    if fast is not None and fast.cfg is cfg:
        made = fast.sequence.run_native(inputs)
        if made is not None:
            return made, None
    # The Python plans: plain eager CUDA tensors only.
    if not (all(t is None or type(t) is torch.Tensor for t in inputs) and ops.plain_eager_cuda(inputs[0])):
        return None, None
    fast_launch, plans, natives, _ = _eager_plans()
    key = (kind, id(cfg), *[None if t is None else layout_facts(t) for t in inputs])
    plan = plans.get(key)
    if plan is not None and plan.cfg is cfg and plan.sequence.usable():
        if plan.sequence.native is not None:
            fast_launch.keep(natives, coarse, plan, _MAX_MEMO)
        return plan.sequence.run(inputs), None
    return None, key


def _recorded(key, cfg: VerifyConfig, inputs: tuple, call) -> tuple:
    """``call()``'s outputs (the full path); recorded as ``key``'s plan where :func:`_planned` gave one
    (none is kept where the call does not fit a Sequence: it takes the full path each time)."""
    if key is None:
        return call()
    fast_launch = _EAGER[0]
    with fast_launch.recording_step() as (records, scratch):
        made = call()
    sequence = fast_launch.Sequence.of(records, (*inputs, *made), scratch, made)
    if sequence is not None:
        sequence.separate = False    # the API's outputs are no op's: one block for all of them
    fast_launch.keep(_EAGER[1], key, None if sequence is None else _EagerPlan(cfg, sequence), _MAX_MEMO * 4)
    return made


def build_view(cfg: VerifyConfig, seq_lens: torch.Tensor, block_table: torch.Tensor, *,
               check: bool = False, q_dtype: torch.dtype = torch.bfloat16,
               kv_dtype: torch.dtype | None = None,
               block_mask: torch.Tensor | None = None) -> VerifyView | MaskedView:
    """Build the step's metadata: row lengths (stage 1) and page table (stage 2).

    Parameters
    ----------
    cfg : VerifyConfig
    seq_lens : int32 [B]
        Global lengths of the requests, the ``qlen`` verify tokens included;
        0 marks a padding request.
    block_table : int32 [B, max_blocks]
        This rank's physical blocks per request, rank-local order, with
        ``max_blocks >= cdiv(local_len(max_model_len, rank 0), block_size)``.
        Unused entries may hold anything.
    check : bool
        Also validate the values (this syncs the host with the device, so it
        is off by default; ``MLA_DCP_CHECK=1`` in the environment turns it
        on for every call): ``seq_lens`` in ``[0, max_model_len]`` and the
        block ids every row reads ``>= 0``. A ValueError names the first bad
        entry. Skipped while compiling or capturing a CUDA graph.
    q_dtype, kv_dtype : torch.dtype
        The dtypes ``verify`` will get (kv_dtype None: q's): they pick the
        static number of work items on a GPU, as :func:`num_segments_for`.
    block_mask : bool [qlen, qlen] or [B, qlen, qlen], or None
        A masked block (a token tree, :func:`mla_dcp.tree_mask`): row ``t``
        of request ``b`` sees every key before its block and the block's key
        ``j`` (global position ``seq_lens[b] - qlen + j``) where
        ``block_mask[b, t, j]`` (``[qlen, qlen]``: one mask for every
        request). It replaces ``cfg.causal`` inside the block. Returns a
        :class:`MaskedView`.

    Returns
    -------
    VerifyView with ``row_lens`` int32 [B*qlen] and ``page_table`` int32
    [B, cfg.max_pages]. Shapes depend only on ``cfg`` and ``B``: a captured
    graph stays valid while the device-side lengths change. When
    ``block_size`` is itself a page size (a power of two up to 128),
    ``page_table`` is a view of ``block_table``'s first columns, so it sees
    later in-place updates of the block table (as a captured graph wants).

    >>> import torch, mla_dcp
    >>> cfg = mla_dcp.VerifyConfig(num_heads=16, qlen=4, block_size=2, max_model_len=32,
    ...                            dcp_world_size=2, kv_lora_rank=8, rope_dim=0, softmax_scale=0.25)
    >>> view = mla_dcp.build_view(cfg, torch.tensor([10, 12], dtype=torch.int32),
    ...                           torch.arange(16, dtype=torch.int32).view(2, 8))
    >>> view.row_lens.tolist()
    [4, 4, 5, 5, 5, 5, 6, 6]
    """
    _checks.require_config(cfg)
    if block_mask is not None:
        return _build_masked_view(cfg, seq_lens, block_table, check, q_dtype, kv_dtype, block_mask)
    return _view(cfg, seq_lens, block_table, check, q_dtype, kv_dtype, cfg.causal)


def _check_layout(cfg: VerifyConfig, seq_lens, block_table) -> None:
    """:func:`_checks.check_view_layout` after one expression that passes every good layout (its
    checks one by one, by name, cost several us of an eager step's host time)."""
    if not (isinstance(seq_lens, torch.Tensor) and isinstance(block_table, torch.Tensor)
            and seq_lens.dtype == torch.int32 and block_table.dtype == torch.int32 and seq_lens.dim() == 1
            and block_table.dim() == 2 and block_table.shape[0] == seq_lens.shape[0]
            and block_table.shape[1] >= _facts(cfg).min_table_blocks and seq_lens.device == block_table.device):
        _checks.check_view_layout(cfg, seq_lens, block_table)   # the conditions above, one by one, by name


def _build_masked_view(cfg: VerifyConfig, seq_lens, block_table, check: bool, q_dtype, kv_dtype,
                       block_mask) -> MaskedView:
    _check_layout(cfg, seq_lens, block_table)
    batch, qlen = seq_lens.shape[0], cfg.qlen
    mask = block_mask
    if type(mask) is not torch.Tensor or mask.dtype != torch.bool:
        mask = _checks.require_tensor("block_mask", block_mask)
        _checks.require_dtype("block_mask", mask, (torch.bool,))
    # By rank first: a traced batch compared with qlen would guard on it (torch.export refuses).
    if not ((mask.dim() == 2 and mask.shape[0] == qlen and mask.shape[1] == qlen)
            or (mask.dim() == 3 and mask.shape[0] == batch and mask.shape[1] == qlen and mask.shape[2] == qlen)):
        raise ValueError(f"block_mask must have shape [qlen, qlen] = [{qlen}, {qlen}] (one mask for every request) "
                         f"or [B, qlen, qlen] = [{batch}, {qlen}, {qlen}], got {list(mask.shape)}")
    if mask.device != seq_lens.device:
        _checks.require_same_device(seq_lens=seq_lens, block_mask=mask)
    if _checks.values_checked(check):
        # The block's keys are read up to each request's last position, as a causal step's last row reads.
        _checks.check_view_inputs(cfg, seq_lens, block_table)
    # The context, keys before the block, seen whole by every row: a non-causal view of max(L - qlen, 0)
    # keys, which the metadata launch computes from seq_lens itself (recorded with the caller's config:
    # its attention reads only the lengths the view holds).
    context = _view(cfg, seq_lens, block_table, False, q_dtype, kv_dtype, False, True)
    return MaskedView(context, block_table, mask.expand(batch, qlen, qlen), seq_lens, cfg)


def _view(cfg: VerifyConfig, seq_lens, block_table, check: bool, q_dtype, kv_dtype, causal: bool,
          context: bool = False) -> VerifyView:
    """build_view's causal or non-causal view (``causal``; with ``context`` of each request's keys before
    its block, a masked view's context), through its native plan where one fits."""
    # A repeated eager layout launches from its native plan (the Python path's
    # checks and choices are functions of the layouts it checks).
    record = None
    if not check and _native_first(False) and _EAGER is not None and type(seq_lens) is torch.Tensor:
        key = (id(cfg), seq_lens.shape, q_dtype, kv_dtype, causal, context)
        plan = _EAGER[3].get(key, _NO_PLAN)
        if plan is not None and plan is not _NO_PLAN and plan.cfg is cfg:
            # The C++ call checks block_table's exact type and layout.
            made = plan.run(seq_lens, block_table)
            if made is not None:
                return made
            # Recorded again only for another layout (not for a hook, a mode, a recording, the plans off).
            again = not plan.sequence.native.matches((seq_lens, block_table))
        else:
            again = plan is not None   # None: a layout seen not to fit
        # Only what can go native is recorded, and only from plain eager CUDA tensors.
        native = _EAGER[0].native
        if again and native.enabled and native.module() is not None and ops.plain_eager_cuda(seq_lens):
            record = key
    if record is not None:
        with _EAGER[0].recording_step() as (records, scratch):
            view = _build_view(cfg, seq_lens, block_table, check, q_dtype, kv_dtype, causal, context)
        _remember_view(record, cfg, view, records, scratch, seq_lens, block_table)
        return view
    return _build_view(cfg, seq_lens, block_table, check, q_dtype, kv_dtype, causal, context)


_NO_PLAN = object()


def _remember_view(key, cfg, view, records, scratch, seq_lens, block_table) -> None:
    """Keep the native plan of a build_view call just made (None where it has none: not asked again)."""
    sliced = _facts(cfg).page_size == cfg.block_size and block_table.stride(-1) == 1   # as _build_view decides
    outputs = (view.row_lens, view.work, view.segments) + (() if sliced else (view.page_table,))
    fast_launch = _EAGER[0]
    sequence = fast_launch.Sequence.of(records, (seq_lens, block_table, *outputs), scratch, outputs)
    plan = None
    if sequence is not None and sequence.fast:
        sequence.separate = False    # the view's tensors are no op's: one block for them
        sequence.make_native((seq_lens, block_table, *outputs), 2)
        if sequence.native is not None:
            if sliced:
                sequence.native.add_slice(1, 1, view.page_table.shape[1])
            plan = _ViewPlan(cfg, sequence)
    fast_launch.keep(_EAGER[3], key, plan, _MAX_MEMO)


def _build_view(cfg: VerifyConfig, seq_lens, block_table, check: bool, q_dtype, kv_dtype,
                causal: bool, context: bool = False) -> VerifyView:
    check = _checks.values_checked(check)
    facts = _facts(cfg)
    _check_layout(cfg, seq_lens, block_table)
    batch = seq_lens.shape[0]
    if check:
        _checks.check_view_inputs(cfg, seq_lens, block_table)
    if facts.page_size == cfg.block_size and block_table.stride(-1) == 1:
        # Blocks are already pages: the page table is the block table's
        # first columns. A view, not a launch (one kernel less per step).
        page_table = block_table[:, :facts.max_pages]
    else:
        page_table = ops.stage.expand_pages(block_table, cfg.block_size, cfg.max_local_len)
    device = seq_lens.device
    if torch.compiler.is_compiling() and not cfg.batch_invariant and cfg.num_segments is None:
        # A traced step holds no choice that follows the batch: a GPU's segment count is a cost
        # model's argmin over it, different at nearly every size, so a graph computing it from a
        # dynamic batch would guard on dozens of float comparisons (tens of us a call) and be
        # traced again at each new size until its recompile limit fails the step. The op's fake
        # fixes the shape of a static batch's schedule and leaves a dynamic one's to the run.
        row_lens, work, segments = ops.stage.step_metadata_auto(
            seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, causal, facts.page_size,
            facts.max_pages, facts.schedule_chunk, cfg.num_heads, cfg.kv_lora_rank, q_dtype, kv_dtype or q_dtype,
            ops.stream_code(cfg.stream), context)
        return VerifyView(row_lens, page_table, work, segments, cfg)
    num_items, programs = _schedule_shape_memo(cfg, batch, device, q_dtype, kv_dtype)
    row_lens, work, segments = ops.stage.step_metadata(seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank,
                                                       cfg.interleave, causal, facts.page_size, facts.max_pages,
                                                       num_items, facts.schedule_chunk, programs, context)
    return VerifyView(row_lens, page_table, work, segments, cfg)


def num_segments_for(cfg: VerifyConfig, batch: int, device: torch.device,
                     q_dtype: torch.dtype = torch.bfloat16, kv_dtype: torch.dtype | None = None) -> int:
    """Static segment count: ``cfg.num_segments`` or the backend's choice.

    Depends on the static bound, the batch size, the dtypes and the device
    only, never on tensor values.
    """
    if cfg.batch_invariant:
        # The fixed segments of every request (DESIGN.md stage 3): the same
        # count on every device, for every batch and dtype.
        return -(-cfg.max_pages // cfg.invariant_chunk_pages)
    if cfg.num_segments is not None:
        return min(cfg.num_segments, cfg.max_pages)
    if device.type == "cuda":
        return tiles.gpu_num_segments(cfg.max_pages, batch, cfg.qlen * cfg.num_heads, cfg.kv_lora_rank,
                                      q_dtype, kv_dtype or q_dtype, cfg.page_size, device)
    return default_num_segments(cfg.max_pages, cfg.page_size)


def schedule_shape(cfg: VerifyConfig, batch: int, device: torch.device, q_dtype: torch.dtype = torch.bfloat16,
                   kv_dtype: torch.dtype | None = None) -> tuple[int, int]:
    """(num_items, programs) of the step's schedule (:func:`mla_dcp.pure.build_schedule`), from static facts.

    ``programs = B * num_segments_for(...)`` attention programs over the
    stream of the step's pages, so that a ragged step costs what a uniform
    one of the same total does, where the attention kernel runs several
    pieces per program: not the Hopper seesaw kernel, whose programs run
    one piece each, nor batch-invariant mode (fixed segments), a fixed
    ``cfg.num_segments`` or one segment per request (normalised in the
    kernel), which keep ``programs == 0`` and ``B * segments`` pieces, as
    do steps of more than ``STREAM_MAX_PROGRAMS`` programs.
    ``cfg.stream=False`` keeps one piece per program (faster by 5-7% on
    exactly uniform steps, slower by 10-27% on ragged ones:
    docs/performance.md), as ``MLA_DCP_STREAM=0`` in the environment does
    on GPUs where ``cfg.stream`` is None.
    """
    fixed = (num_segments_for(cfg, batch, device, q_dtype, kv_dtype)
             if cfg.batch_invariant or cfg.num_segments is not None else None)
    return ops.schedule_shape_of(batch, device, q_dtype, kv_dtype or q_dtype, cfg.max_pages, cfg.page_size,
                                 cfg.qlen * cfg.num_heads, cfg.kv_lora_rank, cfg.stream, fixed)


def _verify_inputs_fit(cfg: VerifyConfig, view: object, q: object, kv_cache: object, kv_scale: object) -> bool:
    """Whether :func:`_validate_verify` would pass, in one expression: the
    common case costs a few us of host time, and anything else takes the
    checks that name what is wrong. Conservative: False only sends a call
    to those checks."""
    tensor = torch.Tensor
    if (type(view) is not VerifyView or not (view.cfg is cfg or view.cfg == cfg)
            or not isinstance(q, tensor) or not isinstance(kv_cache, tensor)):
        return False
    facts = _facts(cfg)
    page_table, row_lens, work, segments = view.page_table, view.row_lens, view.work, view.segments
    batch = page_table.shape[0]
    int32 = torch.int32
    kv_shape = kv_cache.shape
    if kv_scale is None:
        scale_ok = kv_cache.dtype == q.dtype
    else:
        scale_ok = (isinstance(kv_scale, tensor) and kv_cache.dtype in _checks.FP8_CACHE_DTYPES
                    and kv_scale.dtype == torch.float32 and kv_scale.shape == (1,)
                    and kv_scale.device == q.device)
    device = q.device
    # A traced step's schedule columns are chosen when its op runs (step_metadata_auto): the
    # attention op's fake checks any the graph fixes.
    compiling = torch.compiler.is_compiling()
    return (scale_ok and (not cfg.fp8_products or _checks.fp8_products_ok(kv_cache))
            and page_table.shape == (batch, facts.max_pages) and row_lens.shape == (batch * cfg.qlen,)
            and segments.shape == (batch, 3) and work.dim() == 2
            and (compiling or work.shape[1] in WORK_COLUMN_COUNTS)
            and row_lens.dtype == int32 and page_table.dtype == int32 and work.dtype == int32
            and segments.dtype == int32 and q.dtype in _checks.QUERY_DTYPES
            and q.shape == (batch * cfg.qlen, cfg.num_heads, facts.head_dim)
            and len(kv_shape) == 3 and kv_shape[0] > 0 and kv_shape[1] == cfg.block_size
            and kv_shape[2] == facts.head_dim and q.stride(-1) == 1 and kv_cache.stride(-1) == 1
            and kv_cache.stride(0) == kv_shape[1] * kv_cache.stride(1)
            and kv_cache.device == device and row_lens.device == device and page_table.device == device
            and work.device == device)


def _validate_verify(cfg: VerifyConfig, view: object, q: object, kv_cache: object,
                     kv_scale: object) -> None:
    if _verify_inputs_fit(cfg, view, q, kv_cache, kv_scale):
        return
    if not isinstance(view, VerifyView):
        raise TypeError(f"view must be the mla_dcp.VerifyView or MaskedView from build_view, got "
                        f"{type(view).__name__}")
    _require_view_config(cfg, view)
    _checks.require_tensor("q", q)
    _checks.require_tensor("kv_cache", kv_cache)
    if kv_cache.dtype == torch.uint8:
        raise TypeError("kv_cache of dtype torch.uint8 (DeepSeek's fp8 layout for sparse MLA) is read by "
                        "mla_dcp.verify_sparse only; verify takes q's dtype or an fp8 e4m3 cache with its kv_scale")
    batch = view.page_table.shape[0]
    _checks.require_shape("view.page_table", view.page_table, [batch, cfg.max_pages])
    _checks.require_shape("view.row_lens", view.row_lens, [batch * cfg.qlen])
    _checks.require_dtype("view.row_lens", view.row_lens, (torch.int32,))
    _checks.require_dtype("view.page_table", view.page_table, (torch.int32,))
    _checks.require_shape("view.segments", view.segments, [batch, 3])
    if view.work.dim() != 2 or not (torch.compiler.is_compiling() or view.work.shape[1] in WORK_COLUMN_COUNTS):
        raise ValueError(f"view.work must have shape [num_items, {WORK_COLUMNS}] or [num_items, "
                         f"{STREAM_WORK_COLUMNS}] (build_view's schedule), got {list(view.work.shape)}")
    _checks.require_dtype("view.work", view.work, (torch.int32,))
    _checks.require_dtype("view.segments", view.segments, (torch.int32,))
    _checks.require_dtype("q", q, _checks.QUERY_DTYPES)
    _checks.require_shape("q", q, [batch * cfg.qlen, cfg.num_heads, cfg.head_dim])
    _checks.require_shape("kv_cache", kv_cache, ["num_blocks", cfg.block_size, cfg.head_dim])
    if kv_cache.shape[0] == 0:
        raise ValueError(f"kv_cache must hold at least one block (num_blocks >= 1), got {list(kv_cache.shape)}")
    if kv_cache.dtype != q.dtype and kv_cache.dtype not in _checks.FP8_CACHE_DTYPES:
        raise TypeError(f"kv_cache must have q's dtype ({q.dtype}) or an fp8 e4m3 dtype "
                        f"({' or '.join(map(str, _checks.FP8_CACHE_DTYPES))}), got {kv_cache.dtype}")
    _checks.require_kv_scale(kv_scale, kv_cache)
    if cfg.fp8_products:
        _checks.require_fp8_products(kv_cache)
    _checks.require_kernel_layout(q, kv_cache)
    _checks.require_same_device(q=q, kv_cache=kv_cache, kv_scale=kv_scale,
                                view_row_lens=view.row_lens, view_page_table=view.page_table, view_work=view.work)


def _require_view_config(cfg: VerifyConfig, view: VerifyView | MaskedView) -> None:
    if view.cfg is not cfg and view.cfg != cfg:
        differ = ", ".join(f"{name}={getattr(view.cfg, name)!r} vs {getattr(cfg, name)!r}"
                           for name in cfg.__dataclass_fields__ if getattr(view.cfg, name) != getattr(cfg, name))
        raise ValueError(f"view was built by build_view for another cfg than verify's ({differ}): "
                         f"build each rank's view with the config it is verified with")


def _verify_masked(cfg: VerifyConfig, view: MaskedView, q, kv_cache, kv_scale, backend: str,
                   check: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A masked block: the context through the segmented stages, then each row's block keys; a
    repeated eager layout from one plan of all of it (the context's partial its scratch)."""
    key = inputs = None
    if (backend == "auto" and type(view.context) is VerifyView and view.cfg is cfg and view.context.cfg is cfg
            and type(q) is torch.Tensor and _native_first(check)):
        inputs = (q, kv_cache, kv_scale, *view.context[:4], view.block_table, view.mask, view.seq_lens)
        made, key = _planned("masked", cfg, inputs)
        if made is not None:
            return made
    return _recorded(key, cfg, inputs, lambda: _masked_anew(cfg, view, q, kv_cache, kv_scale, backend, check))


def _masked_anew(cfg: VerifyConfig, view: MaskedView, q, kv_cache, kv_scale, backend: str,
                 check: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _require_view_config(cfg, view)
    batch, qlen = view.seq_lens.shape[0], cfg.qlen
    if view.mask.shape != (batch, qlen, qlen) or view.block_table.shape[0] != batch:
        raise ValueError(f"view.mask must have shape [{batch}, {qlen}, {qlen}] and view.block_table {batch} rows "
                         f"(build_view's MaskedView), got {list(view.mask.shape)}, "
                         f"{list(view.block_table.shape)}")
    if isinstance(q, torch.Tensor):
        _checks.require_same_device(q=q, view_mask=view.mask, view_block_table=view.block_table,
                                    view_seq_lens=view.seq_lens)
    # verify validates the rest (q, the cache, the context's view) before its launch, hence before this one's.
    out, lse = verify(cfg, view.context, q, kv_cache, kv_scale, backend=backend, check=check)
    if _EAGER is not None:
        _EAGER[0].note_scratch(out, lse)    # consumed by the block launch: a plan's scratch
    return ops.stage.block_attention(q, kv_cache, kv_scale, out, lse, view.block_table, view.mask, view.seq_lens,
                                     qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.max_model_len,
                                     cfg.kv_lora_rank, _facts(cfg).scale, cfg.batch_invariant)


BACKENDS = ("auto", "aiter")


def verify(cfg: VerifyConfig, view: VerifyView | MaskedView, q: torch.Tensor, kv_cache: torch.Tensor,
           kv_scale: torch.Tensor | None = None, *, backend: str = "auto",
           check: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's causal MLA attention of every verify row (stages 3 and 4).

    Parameters
    ----------
    cfg : VerifyConfig
    view : VerifyView or MaskedView from :func:`build_view` for this step.
        A MaskedView (a token tree) runs the context through stages 3 and 4
        and then each row's block keys (``mla_dcp::block_attention``), merged
        into the row's partial by stage 5's rule.
    q : [B*qlen, H, Dl+Dr], float32 / float16 / bfloat16
        Absorbed queries, rows request-major (row = b*qlen + t).
    kv_cache : [num_blocks, block_size, Dl+Dr]
        q's dtype, or fp8 (e4m3fn / e4m3fnuz) with ``kv_scale``.
    kv_scale : float32 [1] or None
        Per-tensor dequantization scale of an fp8 cache (required there,
        refused for a 16- or 32-bit cache).
    backend : ``"auto"`` or ``"aiter"``
        ``"auto"``: Triton kernels on CUDA/ROCm, the pure functions elsewhere.
        ``"aiter"``: AMD AITER's split-KV MLA kernel for the segmented stage
        (ROCm only; its partials are converted to the same contract).
    check : bool
        Also validate the values before any launch (syncs the host with the
        device: off by default; ``MLA_DCP_CHECK=1`` turns it on for every
        call): the page ids every row reads in range of ``kv_cache``, row
        lengths within the static bound, ``kv_scale`` finite and > 0, ``q``
        finite on rows that have keys. A ValueError names the first bad
        entry. Skipped while compiling or capturing a CUDA graph.

    Returns
    -------
    out : [B*qlen, H, Dl] in q's dtype; 0 for rows with no key on this rank;
        NaN for poisoned rows (DESIGN.md: NaN or inf in the row's query or
        in a key it reads, scores that overflow, rows longer than
        ``max_model_len`` allows, which the host cannot check without a
        sync). The NaN survives every merge.
    lse : float32 [B*qlen, H], **natural log**; -inf for rows with no key;
        NaN for poisoned rows. With ``dcp_world_size == 1`` this is the whole
        answer; otherwise merge ranks with :func:`merge_ranks` or
        :mod:`mla_dcp.distributed`.

    Inference only: the outputs have no gradient (a backward raises).
    """
    _checks.require_config(cfg)
    if type(view) is MaskedView:
        return _verify_masked(cfg, view, q, kv_cache, kv_scale, backend, check)
    # A repeated eager layout launches from its plan (validation and every
    # choice below are functions of the key, made when the plan was).
    key = None
    if (backend == "auto" and type(view) is VerifyView and view.cfg is cfg and type(q) is torch.Tensor
            and _native_first(check)):
        made, key = _planned("verify", cfg, (q, kv_cache, kv_scale, *view[:4]))
        if made is not None:
            return made
    check = _checks.values_checked(check)
    _validate_verify(cfg, view, q, kv_cache, kv_scale)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if check:
        _checks.check_verify_inputs(cfg, view.row_lens, view.page_table, q, kv_cache, kv_scale)
    batch = view.page_table.shape[0]
    facts = _facts(cfg)
    if backend == "auto":
        # One op for stages 3 and 4: with one item per request (the view's
        # schedule fixes it) the attention kernel normalises in its epilogue,
        # without partials or a merge launch.
        args = (q, kv_cache, kv_scale, view.row_lens, view.page_table, view.work, view.segments, cfg.qlen,
                cfg.kv_lora_rank, facts.scale, facts.schedule_chunk, cfg.fp8_products)
        return _recorded(key, cfg, args[:7], lambda: ops.stage.merged_attention(*args))
    if backend == "aiter":
        if cfg.batch_invariant:
            raise ValueError("backend='aiter' splits every request its own way: batch_invariant=True needs "
                             "backend='auto'")
        if cfg.fp8_products:
            raise ValueError("backend='aiter' multiplies in its own precision: fp8_products=True needs "
                             "backend='auto'")
        from mla_dcp.ops import aiter_backend   # lazily: AITER refuses to import without ROCm
        aiter_backend.require_available()
        # AITER splits every request into the same number of parts; its partials come with their own table.
        *partials, segments = aiter_backend.segmented_attention(
            q, kv_cache, kv_scale, view.row_lens, view.page_table, cfg.qlen, cfg.kv_lora_rank,
            max(1, _pieces_per_request(view.work, batch)), cfg.scale)
        return ops.stage.merge_segments(*partials, segments, q.dtype)


def verify_sparse(cfg: VerifyConfig, view: VerifyView, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                  kv_scale: torch.Tensor | None = None, *, check: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's token-sparse attention of every verify row (DeepSeek Sparse Attention).

    Row ``(b, t)`` attends to the global positions ``indices[b*qlen + t]`` lists (a layer's
    indexer top-k; negative entries list nothing) that lie in its window (the view's: causal, or
    the whole request with ``causal=False``) and that this rank holds; every rank is called with
    the same ``indices`` and the partials merge as :func:`verify`'s do (:func:`merge_ranks`,
    :mod:`mla_dcp.distributed`). The view is the step's own (:func:`build_view`, once a step);
    the indices change per layer.

    Parameters
    ----------
    cfg, view, q, kv_cache, kv_scale : as :func:`verify` (``view`` a :class:`VerifyView`); or
        ``kv_cache`` uint8 [num_blocks, block_size, :func:`mla_dcp.fp8_ds_mla_width`] in DeepSeek's
        fp8 layout for sparse MLA (written by :func:`mla_dcp.write_cache`), ``kv_scale`` None
    indices : int32 [B*qlen, topk], topk >= 1
        Each position at most once a row (a repeated one counts twice). A listed position at or
        past the row's window is not read: the causal mask still holds, as in the model's own
        attention (an indexer asked for more positions than a short window has, Hugging Face's
        DeepSeek-V3.2 one, returns some past it).
    check : bool
        Also check the values before any launch (a host sync; ``MLA_DCP_CHECK=1``): every entry
        negative or below ``max_model_len``, no position twice in a row; and :func:`verify`'s.

    Returns
    -------
    out [B*qlen, H, Dl] in q's dtype, lse float32 [B*qlen, H] natural log: 0 and -inf for a row
    that lists no key of this rank, NaN for a poisoned one. Products are exact (fp8 caches
    dequantized), whatever ``cfg.fp8_products`` says.
    """
    _checks.require_config(cfg)
    key = inputs = None
    if type(view) is VerifyView and view.cfg is cfg and type(q) is torch.Tensor and _native_first(check):
        inputs = (q, kv_cache, kv_scale, *view[:2], indices)
        made, key = _planned("sparse", cfg, inputs)
        if made is not None:
            return made
    return _recorded(key, cfg, inputs, lambda: _sparse_anew(cfg, view, q, kv_cache, indices, kv_scale, check))


def _sparse_anew(cfg: VerifyConfig, view, q, kv_cache, indices, kv_scale, check: bool):
    """:func:`verify_sparse`'s full path: validation, then the op."""
    if isinstance(view, MaskedView):
        raise TypeError("verify_sparse takes the step's VerifyView (build_view without block_mask): a sparse row's "
                        "listed positions take the place of a block mask, got a MaskedView")
    if isinstance(kv_cache, torch.Tensor) and kv_cache.dtype == torch.uint8:
        _validate_ds_step(cfg, view, q, kv_cache, kv_scale)
    else:
        _validate_verify(cfg, view, q, kv_cache, kv_scale)
    indices = _checks.require_tensor("indices", indices)
    _checks.require_dtype("indices", indices, (torch.int32,))
    if indices.dim() != 2 or indices.shape[0] != q.shape[0] or indices.shape[1] < 1:
        raise ValueError(f"indices must have shape [B*qlen, topk] = [{q.shape[0]}, topk] with topk >= 1, "
                         f"got {list(indices.shape)}")
    _checks.require_same_device(q=q, indices=indices)
    if _checks.values_checked(check):
        _checks.check_verify_inputs(cfg, view.row_lens, view.page_table, q, kv_cache, kv_scale)
        _checks.check_sparse_indices(indices, cfg.max_model_len)
    return ops.stage.sparse_attention(q, kv_cache, kv_scale, view.row_lens, view.page_table, indices, cfg.qlen,
                                      cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.kv_lora_rank,
                                      _facts(cfg).scale, cfg.batch_invariant)


def _validate_ds_step(cfg: VerifyConfig, view, q, kv_cache: torch.Tensor, kv_scale) -> None:
    """verify_sparse's checks for a cache in DeepSeek's fp8 layout (uint8 rows): the view and q as
    verify checks them, the cache's rows for the config's widths, no per-tensor scale."""
    if not isinstance(view, VerifyView):
        raise TypeError(f"view must be the mla_dcp.VerifyView from build_view, got {type(view).__name__}")
    _require_view_config(cfg, view)
    _checks.require_tensor("q", q)
    _checks.require_dtype("q", q, _checks.QUERY_DTYPES)
    _checks.require_shape("q", q, [view.page_table.shape[0] * cfg.qlen, cfg.num_heads, cfg.head_dim])
    from mla_dcp import _fp8_ds_mla

    _checks.require_shape("kv_cache", kv_cache, ["num_blocks", cfg.block_size,
                                                 _fp8_ds_mla.width(cfg.kv_lora_rank, cfg.rope_dim)])
    _checks.require_ds_layout("kv_cache", kv_cache, cfg.head_dim)
    if kv_cache.shape[0] == 0:
        raise ValueError(f"kv_cache must hold at least one block (num_blocks >= 1), got {list(kv_cache.shape)}")
    if kv_scale is not None:
        raise ValueError("kv_scale must be None for a cache in DeepSeek's fp8 layout (its scales are in the rows), "
                         f"got a {type(kv_scale).__name__}")
    _checks.require_kernel_layout(q, kv_cache)
    _checks.require_same_device(q=q, kv_cache=kv_cache, view_row_lens=view.row_lens,
                                view_page_table=view.page_table)


def _pieces_per_request(work: torch.Tensor, batch: int) -> int:
    """The static segment count a schedule was built for (the stream's has B rows more)."""
    rows = work.shape[0] - (batch if work.shape[1] == STREAM_WORK_COLUMNS else 0)
    return rows // max(batch, 1)


def merge_ranks(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the partial results of the ranks of a DCP group (stage 5).

    Parameters
    ----------
    outs : [W, T, H, Dl], float32 / float16 / bfloat16, W >= 1
    lses : float32 [W, T, H], natural log. -inf and +inf (another kernel's
        convention, e.g. FlashMLA's) count as "no keys"; NaN is a poisoned
        partial, never dropped.

    Returns
    -------
    out : [T, H, Dl] in outs' dtype; exactly 0 where no rank has a key; NaN
        where any rank's lse is NaN.
    lse : float32 [T, H], natural log; -inf where no rank has a key; NaN
        where any rank's lse is NaN.
    """
    _checks.require_tensor("outs", outs)
    _checks.require_tensor("lses", lses)
    _checks.require_dtype("outs", outs, _checks.QUERY_DTYPES)
    _checks.require_dtype("lses", lses, (torch.float32,))
    _checks.require_shape("outs", outs, ["W", "T", "H", "Dl"])
    _checks.require_shape("lses", lses, list(outs.shape[:3]))
    if outs.shape[0] == 0:
        raise ValueError(f"outs must hold at least one rank's partial (W >= 1), got shape {list(outs.shape)}")
    _checks.require_same_device(outs=outs, lses=lses)
    return ops.stage.merge_ranks(outs, lses)
