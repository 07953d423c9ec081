"""mla_dcp: exact, fast speculative-decoding verification for MLA under DCP.

>>> import torch, mla_dcp
>>> cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=2, block_size=16, max_model_len=64,
...                            kv_lora_rank=32, rope_dim=8, softmax_scale=24 ** -0.5)
>>> seq_lens = torch.tensor([5, 0], dtype=torch.int32)
>>> view = mla_dcp.build_view(cfg, seq_lens, torch.zeros(2, 4, dtype=torch.int32))
>>> q = torch.randn(4, 4, 40)
>>> out, lse = mla_dcp.verify(cfg, view, q, torch.randn(1, 16, 40))
>>> out.shape, lse.shape, lse[2:].isneginf().all().item()
(torch.Size([4, 4, 32]), torch.Size([4, 4]), True)
"""

from mla_dcp import pure
from mla_dcp.api import (MaskedView, VerifyView, build_view, merge_ranks, num_segments_for, schedule_shape, verify,
                         verify_sparse)
from mla_dcp.cache import cache_slots, fp8_ds_mla_width, write_cache
from mla_dcp.config import VerifyConfig, softmax_scale_for
from mla_dcp.ragged import RaggedBlocks, ragged_blocks
from mla_dcp.tree import TREE_CONTEXT, TREE_ROOT, tree_mask

__version__ = "0.1.0"

__all__ = ["MaskedView", "RaggedBlocks", "TREE_CONTEXT", "TREE_ROOT", "VerifyConfig", "VerifyView", "build_view",
           "cache_slots", "fp8_ds_mla_width", "merge_ranks", "num_segments_for", "pure", "ragged_blocks", "schedule_shape",
           "softmax_scale_for", "tree_mask", "verify", "verify_sparse", "write_cache"]
