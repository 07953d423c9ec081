"""Input validation of the public API.

By default only shapes, dtypes and devices: nothing reads a tensor's
values, so validation never syncs the host with the device and stays valid
inside a captured CUDA graph. The opt-in value checks (``check=True`` or
``MLA_DCP_CHECK=1``) read values, once, before any launch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from mla_dcp._dtypes import cuda_capability, is_fp8, require_kernel_layout  # noqa: F401  (re-exported)
from mla_dcp.config import VerifyConfig
from mla_dcp.pure.placement import local_len

QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The fp8 caches the kernels read: e4m3fn (NVIDIA) and e4m3fnuz (AMD). e5m2
# is refused rather than half-supported: its conversion path is not
# exercised by any kernel's tests.
FP8_CACHE_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz")
                         if hasattr(torch, name))


def fp8_products_ok(kv_cache: torch.Tensor) -> bool:
    """Whether ``VerifyConfig(fp8_products=True)`` can run on this cache: an
    e4m3fn cache (NVIDIA's format; the kernels quantise q and P to it), on
    the CPU (the pure path emulates the mode) or on a CUDA GPU with fp8 tensor
    cores (compute capability 8.9 or later)."""
    if kv_cache.dtype is not getattr(torch, "float8_e4m3fn", None):
        return False
    if kv_cache.device.type != "cuda":
        return kv_cache.device.type == "cpu"
    return torch.version.hip is None and cuda_capability(kv_cache.device) >= (8, 9)


def require_fp8_products(kv_cache: torch.Tensor) -> None:
    """The named error where :func:`fp8_products_ok` is False."""
    if fp8_products_ok(kv_cache):
        return
    if kv_cache.dtype is not getattr(torch, "float8_e4m3fn", None):
        raise ValueError(f"VerifyConfig.fp8_products=True needs a torch.float8_e4m3fn kv_cache (with its "
                         f"kv_scale); got a {kv_cache.dtype} kv_cache: use the default exact mode")
    raise ValueError(f"VerifyConfig.fp8_products=True needs fp8 tensor cores (an NVIDIA GPU of compute "
                     f"capability 8.9 or later) or the CPU; {kv_cache.device} has none: use the default "
                     f"exact mode")


def _shape_text(dims: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype], what: str | None = None) -> None:
    if tensor.dtype not in allowed:
        expected = what or " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must have dtype {expected}, got {tensor.dtype}")


def require_shape(name: str, tensor: torch.Tensor, expected: Sequence[object]) -> None:
    """``expected`` holds ints (exact) and strings (free, named in the message)."""
    ok = tensor.dim() == len(expected) and all(
        not isinstance(want, int) or have == want for have, want in zip(tensor.shape, expected))
    if not ok:
        raise ValueError(f"{name} must have shape {_shape_text(expected)}, got {list(tensor.shape)}")


def require_same_device(**tensors: torch.Tensor | None) -> None:
    present = {name: t for name, t in tensors.items() if t is not None}
    first_name, first = next(iter(present.items()))
    for name, tensor in present.items():
        if tensor.device != first.device:
            raise ValueError(
                f"{name} must be on the same device as {first_name} ({first.device}), got {tensor.device}")


def require_kv_scale(kv_scale: torch.Tensor | None, kv_cache: torch.Tensor) -> None:
    if kv_scale is None:
        if is_fp8(kv_cache.dtype):
            raise ValueError(
                f"kv_scale is required for an fp8 kv_cache ({kv_cache.dtype}): pass the float32 [1] "
                f"per-tensor dequantization scale, got None")
        return
    if not is_fp8(kv_cache.dtype):
        raise ValueError(
            f"kv_scale must be None for a {kv_cache.dtype} kv_cache (it dequantizes fp8 caches only), "
            f"got a {type(kv_scale).__name__}")
    require_tensor("kv_scale", kv_scale)
    require_dtype("kv_scale", kv_scale, (torch.float32,))
    require_shape("kv_scale", kv_scale, [1])


def require_config(cfg: object) -> VerifyConfig:
    if not isinstance(cfg, VerifyConfig):
        raise TypeError(f"cfg must be a mla_dcp.VerifyConfig, got {type(cfg).__name__}")
    return cfg


def check_view_layout(cfg: VerifyConfig, seq_lens: object, block_table: object) -> None:
    """``seq_lens`` int32 [B] and a block table int32 [B, >= cfg.min_table_blocks] on its device
    (what build_view and cache_slots take)."""
    require_tensor("seq_lens", seq_lens)
    require_tensor("block_table", block_table)
    require_dtype("seq_lens", seq_lens, (torch.int32,))
    require_dtype("block_table", block_table, (torch.int32,))
    require_shape("seq_lens", seq_lens, ["B"])
    require_shape("block_table", block_table, [seq_lens.shape[0], "max_blocks"])
    if block_table.shape[1] < cfg.min_table_blocks:
        raise ValueError(
            f"block_table must have at least {cfg.min_table_blocks} columns (cdiv(max_local_len="
            f"{cfg.max_local_len}, block_size={cfg.block_size}) for max_model_len={cfg.max_model_len}), "
            f"got {list(block_table.shape)}")
    require_same_device(seq_lens=seq_lens, block_table=block_table)


def _env_reader(name: str, value: str):
    """A function returning whether ``os.environ[name] == value`` now. ``os.environ.get``
    costs 0.6-2 us (it encodes the key and goes through the Mapping methods), twice a
    step on the eager hot path; the dict ``os.environ`` keeps in sync with its writes
    (``_data``, keyed and valued as ``encodekey`` and ``encodevalue`` make them) answers in
    a lookup. Where an interpreter's ``os.environ`` lacks either, the public read."""
    environ = os.environ
    data, encodekey, encodevalue = (getattr(environ, a, None) for a in ("_data", "encodekey", "encodevalue"))
    if not (isinstance(data, dict) and callable(encodekey) and callable(encodevalue)):
        return lambda: os.environ.get(name) == value
    key, wanted = encodekey(name), encodevalue(value)
    # os.environ itself may be replaced (a test's or a launcher's mapping): then the public read.
    return lambda: data.get(key) == wanted if os.environ is environ else os.environ.get(name) == value


# Whether MLA_DCP_CHECK=1 is set now (every call reads it: it may be set at any time).
check_requested = _env_reader("MLA_DCP_CHECK", "1")


def values_checked(check: bool) -> bool:
    """Whether this call validates values: ``check`` or ``MLA_DCP_CHECK=1``,
    and never while compiling or capturing a CUDA graph (a value check syncs
    the host with the device, which neither allows)."""
    # Compiling first: a traced call that read the environment would guard its graph on
    # the environment dict's size (any variable set later recompiled it).
    if torch.compiler.is_compiling() or not (check or check_requested()):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _first_bad(name: str, bad: torch.Tensor, values: torch.Tensor, expected: str) -> None:
    """ValueError naming the first True entry of ``bad`` (same shape as ``values``)."""
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        position = ", ".join(str(i) for i in index)
        raise ValueError(f"{name}[{position}] must be {expected}, got {values[index].item()!r} "
                         f"({int(bad.sum())} bad entries)")


def _has_values(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.device.type != "meta" for t in tensors)


def check_view_inputs(cfg, seq_lens: torch.Tensor, block_table: torch.Tensor) -> None:
    """``build_view``'s value checks: lengths within the static bound, and
    non-negative block ids where a request has tokens on this rank."""
    if not _has_values(seq_lens, block_table):
        return
    lens = seq_lens.cpu().long()
    _first_bad("seq_lens", (lens < 0) | (lens > cfg.max_model_len), lens, f"in [0, max_model_len={cfg.max_model_len}]")
    local = local_len(lens, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave)
    blocks = (local + cfg.block_size - 1) // cfg.block_size                               # [B]
    table = block_table.cpu().long()
    read = torch.arange(table.shape[1])[None, :] < blocks[:, None]
    _first_bad("block_table", read & (table < 0), table,
               f">= 0 where a request reads it (its first cdiv(local_len, block_size={cfg.block_size}) columns)")


def check_verify_inputs(cfg, row_lens: torch.Tensor, page_table: torch.Tensor, q: torch.Tensor,
                        kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> None:
    """``verify``'s value checks: page ids in range of the cache where rows
    read them, row lengths within the static bound, a finite positive
    ``kv_scale`` and finite queries on rows that have keys."""
    if not _has_values(row_lens, page_table, q, kv_cache, kv_scale):
        return
    lens = row_lens.cpu().long()
    _first_bad("view.row_lens", (lens < 0) | (lens > cfg.max_local_len), lens,
               f"in [0, max_local_len={cfg.max_local_len}] (seq_lens beyond max_model_len={cfg.max_model_len}?)")
    pages_per_block = cfg.block_size // cfg.page_size
    num_pages = kv_cache.shape[0] * pages_per_block
    longest = lens.view(-1, cfg.qlen).amax(dim=1) if lens.numel() else lens               # [B]
    table = page_table.cpu().long()
    read = torch.arange(table.shape[1])[None, :] < (longest[:, None] + cfg.page_size - 1) // cfg.page_size
    _first_bad("view.page_table", read & ((table < 0) | (table >= num_pages)), table,
               f"a page id in [0, {num_pages}) where a row reads it (block ids in [0, num_blocks="
               f"{kv_cache.shape[0]}) of kv_cache, {pages_per_block} pages per block)")
    if kv_scale is not None:
        scale = kv_scale.cpu()
        _first_bad("kv_scale", ~(torch.isfinite(scale) & (scale > 0)), scale, "finite and > 0")
    rows_with_keys = (lens > 0)[:, None, None]
    queries = q.detach().cpu()
    _first_bad("q", rows_with_keys & ~torch.isfinite(queries), queries,
               "finite on rows that have keys (NaN or inf there poisons the row)")


def check_query_starts(starts: torch.Tensor, num_tokens: int, qlen: int, check: bool) -> None:
    """The ragged helpers' value checks (``check`` or ``MLA_DCP_CHECK=1``; a host sync):
    ``query_start_loc`` in ``[0, num_tokens]``, non-decreasing, at most ``qlen`` tokens a request."""
    if not values_checked(check) or not _has_values(starts):
        return
    values = starts.cpu().long()
    _first_bad("query_start_loc", (values < 0) | (values > num_tokens), values, f"in [0, num_tokens={num_tokens}]")
    counts = values[1:] - values[:-1]
    _first_bad("query_start_loc", torch.cat([counts.new_zeros(1), counts]) < 0, values,
               ">= the entry before it (tokens request after request)")
    over = (counts > qlen).nonzero()
    if over.numel():
        b = int(over[0])
        raise ValueError(f"query_start_loc gives request {b} {int(counts[b])} tokens (query_start_loc[{b + 1}] - "
                         f"query_start_loc[{b}]); a request may have at most qlen={qlen}, the rows of its "
                         f"block ({over.numel()} requests over)")


def check_sparse_indices(indices: torch.Tensor, max_model_len: int) -> None:
    """Value checks of verify_sparse's indices (a host sync): entries negative or below the
    static bound, no position twice in a row."""
    if not _has_values(indices):
        return
    listed = indices.cpu().long()
    _first_bad("indices", listed >= max_model_len, listed,
               f"a position below max_model_len={max_model_len} (or negative for none)")
    ordered = listed.sort(dim=1).values
    twice = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if twice.any():
        row, column = twice.nonzero()[0].tolist()
        raise ValueError(f"indices[{row}] lists position {int(ordered[row, column + 1])} twice: each position "
                         f"at most once a row")


def require_ds_layout(name: str, kv_cache: torch.Tensor, head_dim: int) -> None:
    """A uint8 cache must hold DeepSeek's fp8 layout for ``head_dim``-wide latents (``Dl + Dr``,
    ``Dl`` a multiple of 128): rows of ``Dl + Dl / 32 + 2 * Dr`` bytes."""
    from mla_dcp import _fp8_ds_mla

    if _fp8_ds_mla.split(kv_cache.shape[-1], head_dim) is None:
        raise ValueError(f"{name} of dtype torch.uint8 holds DeepSeek's fp8 layout (fp8_ds_mla): rows of Dl + Dl/32 + "
                         f"2*Dr bytes for {head_dim}-wide latents (656 for 512 + 64), got rows of {kv_cache.shape[-1]}")
