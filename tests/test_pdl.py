"""Programmatic dependent launch: which launches ask for it (the kernels'
in-kernel wait is checked in their sm_90 PTX by tests/test_seesaw.py, the
bits on and off by tests/test_gpu.py)."""

import pytest
import torch

from mla_dcp.ops import launch_args
from mla_dcp.ops.triton_kernels import helpers as triton_helpers

CUDA0 = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def _fresh_devices():
    # The options are cached per device: none of this file's fakes may outlive it.
    yield
    launch_args.forget_devices()


def _gpu(monkeypatch, capability):
    launch_args.forget_devices()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MLA_DCP_PDL", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(launch_args, "_capability", lambda device: capability)


def test_hopper_and_later_launch_dependent(monkeypatch):
    _gpu(monkeypatch, (9, 0))
    assert launch_args.pdl_options(CUDA0) == {"PDL": True, "launch_pdl": True}
    _gpu(monkeypatch, (10, 0))
    assert launch_args.pdl_options(CUDA0)["launch_pdl"]


def test_off_before_hopper_on_the_cpu_under_the_interpreter_on_rocm_and_when_asked(monkeypatch):
    off = {"PDL": False, "launch_pdl": False}
    _gpu(monkeypatch, (8, 0))
    assert launch_args.pdl_options(CUDA0) == off
    _gpu(monkeypatch, (9, 0))
    assert launch_args.pdl_options(torch.device("cpu")) == off
    monkeypatch.setenv("MLA_DCP_PDL", "0")
    launch_args.forget_devices()
    assert launch_args.pdl_options(CUDA0) == off
    _gpu(monkeypatch, (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert launch_args.pdl_options(CUDA0) == off
    _gpu(monkeypatch, (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert launch_args.pdl_options(CUDA0) == off
    _gpu(monkeypatch, (9, 0))
    monkeypatch.setattr(triton_helpers, "HAS_GRID_DEPENDENCY_CONTROL", False)
    assert launch_args.pdl_options(CUDA0) == off
