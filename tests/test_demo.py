"""The main job: `python -m mla_dcp demo` runs, reports and fails when wrong."""

import subprocess
import sys

import pytest

from mla_dcp import demo
from mla_dcp.__main__ import main


def test_demo_runs_and_reports(capsys):
    assert main(["demo", "--seq-lens", "0", "3", "40", "--world", "3", "--kv-lora-rank", "32",
                 "--rope-dim", "8", "--max-model-len", "64"]) == 0
    text = capsys.readouterr().out
    assert "rank 2 row_lens:" in text and "merged vs global reference" in text and text.rstrip().endswith("OK")


def test_demo_fails_on_a_wrong_answer(capsys, monkeypatch):
    import mla_dcp.testing as testing

    real = testing.merge_partials

    def broken(partials):
        out, lse = real(partials)
        return out * 1.01, lse
    monkeypatch.setattr(demo, "merge_partials", broken)
    assert main(["demo", "--seq-lens", "30", "--kv-lora-rank", "32", "--rope-dim", "8",
                 "--max-model-len", "32", "--interleave", "1"]) == 1
    assert "WRONG" in capsys.readouterr().out


def test_cli_help():
    done = subprocess.run([sys.executable, "-m", "mla_dcp", "demo", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--interleave" in done.stdout and "--kv" in done.stdout
    done = subprocess.run([sys.executable, "-m", "mla_dcp", "nonsense"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown command" in done.stderr
    done = subprocess.run([sys.executable, "-m", "mla_dcp"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: python -m mla_dcp COMMAND" in done.stderr and "no command" in done.stderr
    done = subprocess.run([sys.executable, "-m", "mla_dcp", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: python -m mla_dcp COMMAND" in done.stdout


def test_demo_with_real_processes(capfd):
    assert main(["demo", "--ranks", "2", "--method", "all_to_all", "--seq-lens", "0", "3", "40",
                 "--kv-lora-rank", "32", "--rope-dim", "8", "--max-model-len", "64", "--interleave", "2"]) == 0
    captured = capfd.readouterr()
    text = captured.out
    # The collectives are the non-deprecated ones on every supported torch.
    assert "Warning" not in captured.err, captured.err[-2000:]
    assert "2 processes (gloo, method=all_to_all)" in text and "rank 1 row_lens:" in text
    assert "merged vs global reference" in text and text.rstrip().endswith("OK")


def test_demo_under_torchrun():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "mla_dcp.demo",
                           "--seq-lens", "7", "33", "--kv-lora-rank", "32", "--rope-dim", "8", "--max-model-len", "64",
                           "--interleave", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 processes (gloo, method=reduce_scatter)" in done.stdout and "OK" in done.stdout
