import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()

# Without a GPU, the Triton kernels run under Triton's interpreter. It is read
# when a kernel is defined, and mla_dcp imports its kernels lazily, so setting
# it here (before any test imports them) is enough.
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA/ROCm device")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
