"""The benchmark's report side (runs without a GPU): table, plot, CLI errors."""

import json
import re

import pytest

from mla_dcp import bench


def synthetic_result():
    rows = []
    for index, name in enumerate(("C1", "C4")):
        b, q, h, length, block, kv = bench.CONFIGS[name]
        rows.append({"config": name, "shape": dict(B=b, q=q, H=h, L=length, block=block, kv=kv),
                     "floor_us": 100.0, "bytes": 1e8, "flops": 2e11 / (index + 1), "step_us": 300.0,
                     "step_graph_us": 250.0, "attention_graph_us": 240.0, "ratio": 3.0, "ratio_graph": 2.5,
                     "non_attention_share": 0.04, "decode_style_graph_us": 500.0, "pure_torch_us": 3000.0,
                     "target": bench.TARGETS.get(name), "segments": 2, "predicted_attention_us": 230.0,
                     "compiler": {}})
    return {"environment": {"date": "2026-11-29", "gpu": "Test GPU", "torch": "x", "triton": "y",
                            "multiprocessors": 132},
            "ceilings": {"copy_bytes_per_s": 4.2e12, "bf16_flops_per_s": 6.9e14}, "rows": rows}


def test_markdown_table_has_every_row_and_the_ratios():
    text = bench.markdown(synthetic_result())
    # A run without host timings shows "-" in its column.
    assert "| C1 | 32 | 3 | 128 | 8192 | 64 | bf16 | 100 | 300 | 3.00 | - | 250 | 2.50 | - | 240 | - | 2 (230) | 4% | 500 | 3000 | <= 1.5x |" in text
    assert "| C4 |" in text and "copy 4.20 TB/s" in text
    # A run that timed eight steps in one graph reports them per step, with their ratio.
    result = synthetic_result()
    result["rows"][0].update(step_graph_seq_us=245.0, ratio_graph_seq=2.45)
    result["rows"][0].update(host_us=41.4)
    assert "| 3.00 | 41 | 250 | 2.50 | 245 (2.45) | 240 | - |" in bench.markdown(result)
    # And a run that timed build_view alone, its metadata launches.
    result["rows"][0].update(view_graph_us=3.14)
    assert "| 245 (2.45) | 240 | 3.1 |" in bench.markdown(result)


def test_a_graph_sequence_cycles_through_the_inputs_in_order():
    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    bench._sequence(fns, 8)()
    assert calls == [0, 1, 2, 0, 1, 2, 0, 1]


def test_graph_replayers_keep_what_their_graphs_read(monkeypatch):
    """A CUDA graph holds no tensor: a replayer that dropped the closure it
    captured would free the closure's view and inputs, and the next
    allocation would overwrite what the replay reads (an illegal address
    on the H200 when a probe built eager closures beside graphed ones)."""
    import contextlib
    import gc
    import weakref

    import torch

    class FakeGraph:
        replays = 0

        def replay(self):
            FakeGraph.replays += 1

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Inputs:
        pass

    inputs = Inputs()
    held = weakref.ref(inputs)
    runs = []
    replayers = bench._graphed([lambda inputs=inputs: runs.append(id(inputs))])
    del inputs
    gc.collect()
    assert held() is not None
    replayers[0]()
    assert FakeGraph.replays == 1 and len(runs) == 3    # two warm-ups and the capture ran it; the replay did not
    sequence = bench._graphed_sequence([lambda: None], 2)
    gc.collect()
    sequence()
    assert FakeGraph.replays == 2


def test_plot_only_writes_table_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(synthetic_result()))
    assert bench.main(["--plot-only", str(results), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "roofline.png").stat().st_size > 1000
    assert "| C4 |" in (tmp_path / "o" / "results.md").read_text()


def test_work_counts_match_the_issue():
    kv_bytes, io_bytes, flops = bench.work("C1")
    assert kv_bytes == 32 * 8192 * 576 * 2
    assert io_bytes == 32 * 3 * 128 * (576 + 512) * 2
    # The issue quotes C1's floor as 316 us at 694 TFLOP/s (compute bound).
    assert abs(flops / 694e12 * 1e6 - 316) < 1
    assert bench.work("C2")[0] == kv_bytes // 2   # an fp8 cache moves half the bytes


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message printed without a GPU")
def test_bench_without_a_gpu_says_so(tmp_path, capsys, monkeypatch):
    from mla_dcp.__main__ import main
    assert main(["bench", "--configs", "C1", "--out", str(tmp_path / "out")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    # Refused before anything is made: no results folder, not even the default one.
    monkeypatch.chdir(tmp_path)
    assert main(["bench"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("segments", [1, 2])
def test_attention_alone_is_the_kernel_verify_launches(segments):
    """With one segment verify runs the normalising kernel and no merge, so
    the "attention alone" timing must be that kernel, not the partials one."""
    import dataclasses

    import torch

    import mla_dcp
    from mla_dcp.testing import make_problem

    problem = make_problem([5, 40], qlen=2, num_heads=4, kv_lora_rank=32, rope_dim=16, block_size=16,
                           max_model_len=64, dtype=torch.float32, seed=1)
    shard = problem.shards[0]
    cfg = dataclasses.replace(shard.cfg, num_segments=segments)
    case = bench.Case("test", cfg, [(problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)],
                      0, 0, 0)
    got = bench.attention_fns(case)[0]()
    if segments == 1:
        want = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table), problem.q,
                              shard.kv_cache)
        assert len(got) == 2 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    else:
        assert len(got) == 3 and got[0].shape[2] == segments


def test_repeats_report_medians_and_keep_every_value():
    """`--repeat`: each timing and ceiling is the median over the repeats,
    the floor and ratios come from those medians, and every value is kept."""
    base = synthetic_result()["rows"][0]
    rows = [dict(base, step_us=s, step_graph_us=g, attention_graph_us=a)
            for s, g, a in ((300.0, 250.0, 240.0), (330.0, 260.0, 200.0), (310.0, 400.0, 245.0))]
    ceilings = [{"copy_bytes_per_s": c, "bf16_flops_per_s": m} for c, m in ((4e12, 7e14), (5e12, 6e14), (4.5e12, 8e14))]
    merged = bench.median_ceilings(ceilings)
    row = bench.median_over_repeats(rows, merged)
    assert merged == {"copy_bytes_per_s": 4.5e12, "bf16_flops_per_s": 7e14}
    assert (row["step_us"], row["step_graph_us"], row["attention_graph_us"]) == (310.0, 260.0, 240.0)
    assert row["repeats"]["step_graph_us"] == [250.0, 260.0, 400.0]
    floor = max(1e8 / 4.5e12, 2e11 / 7e14) * 1e6
    assert row["floor_us"] == pytest.approx(floor)
    assert row["ratio_graph"] == pytest.approx(260.0 / floor)
    assert row["non_attention_share"] == pytest.approx(1 - 240.0 / 260.0)
    assert rows[0]["step_us"] == 300.0          # the repeats themselves are not modified


def test_repeat_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0"])
    assert "--repeat must be at least 1, got 0" in capsys.readouterr().err


def test_markdown_says_whether_eager_rows_took_the_native_plans():
    result = synthetic_result()
    assert "Native plans" not in bench.markdown(result)       # a run recorded before they existed
    result["environment"]["native_plans"] = "built"
    assert "Native plans (eager launches from C++): built." in bench.markdown(result)


def test_markdown_says_how_many_repeats():
    result = dict(synthetic_result(), repeats=3)
    assert "medians over 3 repeats" in bench.markdown(result)
    assert "repeats" not in bench.markdown(synthetic_result())


def test_ab_summary_reads_the_timing_asked_for(tmp_path, capsys, import_script):
    ab_summary = import_script("ab_summary")

    for label, graph, seq in (("base", 470.0, 462.0), ("old", 468.0, None)):
        row = {"config": "C1", "step_graph_us": graph, "ratio_graph": graph / 313}
        if seq is not None:
            row.update(step_graph_seq_us=seq, ratio_graph_seq=seq / 313)
        (tmp_path / label).mkdir()
        (tmp_path / label / "results.json").write_text(json.dumps(
            {"rows": [row], "ceilings": {"copy_bytes_per_s": 4.2e12, "bf16_flops_per_s": 7e14}}))
    runs = [f"base={tmp_path / 'base'}", f"old={tmp_path / 'old'}"]
    ab_summary.main(runs)
    assert "| C1 | 470.0 (1.502x) | 468.0 (1.495x) |" in capsys.readouterr().out
    # A run from before the eight-step timing shows "-" for it.
    ab_summary.main(["--timing", "step_graph_seq_us", *runs])
    assert "| C1 | 462.0 (1.476x) | - |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--timing must be one of"):
        ab_summary.main(["--timing", "step_graph_seqs_us", *runs])


def test_ncu_sass_summary_adds_up_each_opcode_over_predicates_and_suffixes(tmp_path, import_script):
    import gzip
    ncu_sass_summary = import_script("ncu_sass_summary")

    header = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"Instructions Executed"',
              '"L1 Wavefronts Shared Excessive"', '"L1 Wavefronts Shared"', '"L1 Wavefronts Shared Ideal"',
              '"stall_short_sb"', '"stall_wait"', '"stall_short_sb (Not Issued)"']
    rows = [
        ["0x10", "LDS.128 R12, [R232+0xc000]", "4", "49,152", "196,608", "393,216", "196,608", "0", "4", "0"],
        ["0x20", "@!P0 LDS.128 R16, [R231+0xc000]", "6", "49,152", "196,608", "393,216", "196,608", "1", "5", "9"],
        ["0x30", "F2FP.F16.E4M3.UNPACK_B R1, R12", "30", "1,000", "0", "0", "0", "25", "5", "0"],
    ]
    path = tmp_path / "sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","seesaw_attention_kernel",\n')
        f.write(",".join(header) + "\n")
        for row in rows:
            f.write(",".join(f'"{cell}"' for cell in row) + "\n")
    text = ncu_sass_summary.summarize(str(path)).splitlines()
    assert "L1 Wavefronts Shared Excessive=393216" in text[0]
    assert text[1].split()[0] == "F2FP" and "short_sb:25" in text[1]
    # Both loads count as one opcode, the predicate and the width dropped; the not-issued column is not a reason.
    assert text[2].split()[0] == "LDS" and re.search(r"samples=\s*10 ", text[2]) and "wavefronts=   786432" in text[2]
    assert "short_sb:1" in text[2] and "wait:9" in text[2]
    # The hottest single instructions, in program order, each placed between its landmarks.
    rows = [["0x10", "HGMMA.64x64x16.F32 gdesc[UR4], RZ", "2", "1", "0", "0", "0", "0", "0", "0"],
            ["0x20", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1], R2", "9", "1", "0", "0", "0", "0", "0", "0"],
            ["0x30", "@!P0 BRA 0x20", "40", "1", "0", "0", "0", "0", "0", "0"],
            ["0x40", "F2FP.F16.E4M3.UNPACK_B R1, R12", "7", "1", "0", "0", "0", "0", "0", "0"]]
    with gzip.open(path, "wt") as f:
        f.write(",".join(header) + "\n")
        for row in rows:
            f.write(",".join(f'"{cell}"' for cell in row) + "\n")
    lines = ncu_sass_summary.hottest_lines(str(path), 2, around=2).splitlines()
    assert [line.split()[:3] for line in lines] == [["1", "9", "SYNCS.PHASECHK.TRANS64.TRYWAIT"], ["2", "40", "@!P0"]]
    assert lines[1].endswith("after [0:HGMMA 1:SYNCS] before [3:F2FP]")
    # Runs of one opcode: instances close together sum into one site, a far one starts another.
    runs = ncu_sass_summary.opcode_runs(str(path), "SYNCS", gap=1).splitlines()
    assert runs == ["SYNCS 1-1 count=1 samples=9 after [0:HGMMA]"]
    assert ncu_sass_summary.opcode_runs(str(path), "F2FP", gap=1) == "F2FP 3-3 count=1 samples=7 after [0:HGMMA 1:SYNCS]"


def test_ragged_configs_and_their_uniform_twins():
    """R1-R5 carry the issue's exact lengths; each twin has the same batch
    and total tokens, spread evenly; floors count the real tokens."""
    from mla_dcp import bench

    assert bench.lengths_of("R1") == [4641, 45118, 1730, 1696]
    assert bench.lengths_of("R4") == [131072] + [2000] * 7
    assert len(bench.lengths_of("R3")) == 64 and min(bench.lengths_of("R3")) == 315
    for name in bench.RAGGED:
        ragged, twin = bench.lengths_of(name), bench.lengths_of(name + "u")
        assert len(twin) == len(ragged) and sum(twin) == sum(ragged) and max(twin) - min(twin) <= 1
        assert bench.work(name) == bench.work(name + "u")
    kv_bytes, _, flops = bench.work("R1")
    assert kv_bytes == sum(bench.lengths_of("R1")) * 576 * 2
    assert flops == 2 * 4 * 16 * sum(bench.lengths_of("R1")) * (576 + 512)
    assert bench.work("R5")[0] * 2 == bench.work("R2")[0]       # e4m3: one byte a value
    assert set(bench.ALL_CONFIGS) >= {"C1", "R4", "R4u"}


def test_the_record_says_which_mode_it_timed():
    result = synthetic_result()
    assert "Batch-invariant mode" not in bench.markdown(result)
    result["batch_invariant"] = True
    assert "invariant_segment_tokens=None)`; None: 64 tokens a head" in bench.markdown(result)
    result["invariant_segment_tokens"] = 1024
    assert "invariant_segment_tokens=1024)`)." in bench.markdown(result)


def test_the_record_says_when_it_timed_one_piece_per_program():
    # The stream is the GPUs' default; a record of `--chunked` (or MLA_DCP_STREAM=0) must say so,
    # and records from before the flag (no "stream" key) say nothing.
    result = synthetic_result()
    assert "One piece per program" not in bench.markdown(result)
    result["stream"] = True
    assert "One piece per program" not in bench.markdown(result)
    result["stream"] = False
    assert "One piece per program on the GPU, not the stream schedule" in bench.markdown(result)


def test_the_record_says_which_route_it_timed():
    result = synthetic_result()
    text = bench.markdown(result)
    assert "Token trees" not in text and "Token-sparse rows" not in text
    result["route"] = "tree"
    assert "Token trees: `build_view(..., block_mask=tree_mask(parents))`" in bench.markdown(result)
    result.update(route="sparse", topk=512)
    assert "each row listing 512 random positions" in bench.markdown(result)


def test_sparse_rows_list_distinct_positions_of_their_window_and_the_floor_counts_what_a_rank_holds():
    import torch

    from mla_dcp import pure

    seq_lens = torch.tensor([5, 40, 3000], dtype=torch.int32)
    listed, held = bench.listed_positions(seq_lens, 3, 64, 8, 2, 1, seed=4)
    assert listed.shape == (9, 64) and listed.dtype == torch.int32
    for row, positions in enumerate(listed.tolist()):
        window = int(seq_lens[row // 3]) - (2 - row % 3)
        chosen = [p for p in positions if p >= 0]
        assert len(chosen) == len(set(chosen)) == min(64, window)
        assert all(0 <= p < window for p in chosen)
        assert all(p < 0 for p in positions[len(chosen):])      # listed first, then -1
    owners = pure.owner_rank(listed.clamp(min=0).long(), 8, 2)
    assert held == int(((listed >= 0) & (owners == 1)).sum()) > 0
    kv_bytes, io_bytes, flops = bench.sparse_work("C4", held)
    assert kv_bytes == held * 576 * 2 and flops == 2 * 16 * held * (576 + 512)
    assert io_bytes == bench.work("C4")[1]
    assert bench.sparse_work("C4f8", held)[0] * 2 == kv_bytes   # e4m3: one byte a value


def test_the_benchmark_tree_has_two_branches_from_the_context():
    import mla_dcp

    assert bench.tree_parents(5) == [-1, -1, 0, 1, 2]
    mask = mla_dcp.tree_mask(bench.tree_parents(4))
    assert mask.tolist() == [[True, False, False, False], [False, True, False, False],
                             [True, False, True, False], [False, True, False, True]]


def test_a_bad_topk_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--route", "sparse", "--topk", "0"])
    assert "--topk must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("route", ["causal", "tree", "sparse"])
def test_each_route_times_the_step_users_call(route):
    """The timed callables of a route (the step, build_view alone, the attention launches over a
    built view) return what the API returns for the same inputs (run on the CPU's path here)."""
    import torch

    import mla_dcp
    from mla_dcp.testing import make_problem

    problem = make_problem([5, 40, 70], qlen=3, num_heads=4, kv_lora_rank=32, rope_dim=16, world=2,
                           block_size=16, max_model_len=96, dtype=torch.float32, seed=2)
    shard = problem.shards[1]
    cfg, inputs = shard.cfg, [(problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)]
    extras = []
    if route == "tree":
        extras = [mla_dcp.tree_mask(bench.tree_parents(3))]
    elif route == "sparse":
        extras = [bench.listed_positions(problem.seq_lens, 3, 16, 2, 1, 1)[0]]
    case = bench.Case("C4", cfg, inputs, 0, 0, 0, route, extras)
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table, block_mask=extras[0] if extras and
                              route == "tree" else None)
    want = (mla_dcp.verify_sparse(cfg, view, problem.q, shard.kv_cache, extras[0]) if route == "sparse"
            else mla_dcp.verify(cfg, view, problem.q, shard.kv_cache))
    built = bench.view_fns(case)[0]()
    assert type(built) is type(view)
    timed = [bench.step_fns(case)] + ([bench.attention_fns(case)] if route != "causal" else [])
    for got in (fns[0]() for fns in timed):
        for g, w in zip(got, want):
            assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
    if route == "tree":     # and it is the tree's answer, not the causal one
        causal = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table), problem.q,
                                shard.kv_cache)
        assert not torch.equal(want[0].nan_to_num(), causal[0].nan_to_num())
