import importlib
import importlib.util
import os
import pathlib
import sys

import pytest
import torch

HAS_GPU = torch.cuda.is_available()

# Without a GPU, the Triton kernels run under Triton's interpreter. It is read
# when a kernel is defined, and mla_dcp imports its kernels lazily, so setting
# it here (before any test imports them) is enough.
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


# A custom op's outputs may alias nothing: torch.compile checks them on a compiled function's first
# call and only warns by default (PyTorch's own CI, and any run with CI set, makes it an error).
# Here it is always an error, so an op that returns outputs over one storage fails its test.
try:
    import torch._functorch.config as _functorch_config
    if hasattr(_functorch_config, "error_on_custom_op_aliasing"):
        _functorch_config.error_on_custom_op_aliasing = True
except ImportError:
    pass


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA/ROCm device")
    # `interpret`: Triton kernels run by its interpreter on CPU tensors.
    skip_interpret = None
    if importlib.util.find_spec("triton") is None:
        skip_interpret = pytest.mark.skip(reason="triton is not installed")
    elif os.environ.get("TRITON_INTERPRET") != "1":
        skip_interpret = pytest.mark.skip(reason="runs under Triton's interpreter only")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "interpret" in item.keywords and skip_interpret is not None:
            item.add_marker(skip_interpret)


SCRIPTS = str(pathlib.Path(__file__).resolve().parents[1] / "scripts")
PROBES = str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "probes")


@pytest.fixture
def import_script():
    """Imports a module of scripts/ or benchmarks/probes/ by name. They import
    their siblings as top-level modules, so the folder is on sys.path for the
    import, and only then."""
    def load(name):
        folder = SCRIPTS if (pathlib.Path(SCRIPTS) / f"{name}.py").exists() else PROBES
        sys.path.insert(0, folder)
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(folder)
    return load


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Each test starts without the launchers' plans (and compiled-kernel
    handles): tests that patch a launcher's choices (a constant, a fits
    check, a recorder in place of ``launch``) must see the full path, not a
    plan another test made."""
    if importlib.util.find_spec("triton") is not None:
        from mla_dcp.ops import fast_launch
        fast_launch.clear()
    yield


@pytest.fixture
def exact_e4m3_interpreter():
    """:func:`mla_dcp.testing.exact_e4m3_interpreter` for the test."""
    pytest.importorskip("triton.runtime.interpreter")
    from mla_dcp.testing import exact_e4m3_interpreter as patched

    with patched():
        yield


@pytest.fixture
def many_threads():
    """16 CPU threads for the test: CPU kernels split their work by the threads they have, so a
    row whose bits followed the batch shows with many (the GPU hosts' count), not on two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(16)
    yield
    torch.set_num_threads(before)
