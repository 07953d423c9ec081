"""Custom ops of every stage and their Triton kernels.

Importing this package registers the `mla_dcp::` ops; the Triton launchers
are registered as the CUDA kernels when Triton is importable.
"""

from mla_dcp.ops import library
from mla_dcp.ops.library import expand_pages, merge_ranks, merge_segments, row_lens, segmented_attention

__all__ = ["library", "expand_pages", "merge_ranks", "merge_segments", "row_lens", "segmented_attention"]
