"""`python -m mla_dcp.bench --distributed` on the CPU: two gloo processes, the tiny shape."""

import json

import pytest

from mla_dcp import bench, bench_distributed


def test_a_two_rank_run_writes_every_method_and_width_beside_the_collectives(tmp_path):
    assert bench.main(["--distributed", "--ranks", "2", "--configs", "tiny", "--iters", "2", "--device", "cpu",
                       "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["world"] == 2 and result["backend"] == "gloo"
    assert set(result["collectives"]) == set(bench_distributed.METHODS)
    assert all(c["alg_bytes_per_s"] > 0 and c["bus_bytes_per_s"] > 0 for c in result["collectives"].values())
    rows = result["rows"]
    assert {(r["method"], r["width"]) for r in rows} == {(m, w) for m in bench_distributed.METHODS
                                                         for w in bench_distributed.WIDTHS}
    batch, qlen, heads, _, _ = bench_distributed.SHAPES["tiny"]
    for r in rows:
        assert r["payload_bytes"] == batch * qlen * heads * (r["width"] + (r["method"] == "all_to_all")) * 4
        bandwidth = result["collectives"][r["method"]]["alg_bytes_per_s"]
        assert r["floor_us"] == pytest.approx(r["payload_bytes"] / bandwidth * 1e6)
        assert r["merge_us"] > 0 and r["verify_us"] > 0
    text = (tmp_path / "results.md").read_text()
    assert "| tiny | all_to_all | 128 |" in text and "GB/s (bus)" in text


def test_bad_options_are_refused_before_any_process_starts(capsys):
    with pytest.raises(SystemExit):
        bench_distributed.main(["--configs", "C9"])
    assert "unknown configs ['C9']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_distributed.main(["--configs", "tiny", "--ranks", "3", "--device", "cpu"])
    assert "not divisible by 3 ranks" in capsys.readouterr().err
