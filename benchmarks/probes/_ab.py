"""What the probes share: arguments, turns, their report, a profile, timing a step, saving a run."""
import json
import pathlib


def arguments(argv: list, names: list, turns: int = 6) -> tuple:
    """(out_dir, config names, turns) of ``OUT_DIR [NAMES ...] [--turns N]``; out_dir made."""
    out_dir = pathlib.Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    args = argv[2:]
    if "--turns" in args:
        at = args.index("--turns")
        turns = int(args[at + 1])
        del args[at:at + 2]
    return out_dir, args or names, turns


def modes(turn: int) -> tuple:
    """The turn's order: each mode goes first in every other turn, so neither
    gains from running second (warm caches, clocks)."""
    return ("without", "with") if turn % 2 == 0 else ("with", "without")


def report(result: dict, name: str, times: dict, equal: bool, width: int = 40) -> None:
    """Medians of each label's turns into ``result`` (us_per_call, bitwise_equal), printed."""
    import statistics

    rows = {label: round(statistics.median(values), 2) for label, values in times.items()}
    result["us_per_call"][name] = rows
    result["bitwise_equal"][name] = equal
    for label, value in rows.items():
        print(f"{name} {label:{width}s} {value:8.2f} us", flush=True)
    print(f"{name} bitwise equal: {equal}", flush=True)


def profile_text(fn, calls: int = 300, top: int = 30) -> str:
    """cProfile of ``calls`` calls of ``fn`` (the GPU synchronised at the end),
    by own time, then by cumulative time."""
    import cProfile
    import io
    import pstats

    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def step_pieces(name: str) -> tuple:
    """(eager step, {label: piece}, compiled step, case) of config ``name`` (bf16): the step
    (build_view + verify), build_view alone, verify alone on one view, the step under
    torch.compile(fullgraph=True) without CUDA graphs, and the case whose first inputs they use."""
    import torch

    import mla_dcp
    from mla_dcp import bench

    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]
    step = bench.step_fns(case)[0]
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    pieces = {
        "eager step": step,
        "build_view": lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
        "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
    }
    return step, pieces, torch.compile(step, fullgraph=True), case


def timed_turns(step, pieces: dict, compiled, turns: int, set_mode) -> tuple:
    """(times, outputs): ``bench.host_time`` of each piece and of the compiled step in both
    modes, in turns (:func:`modes`), under inference mode; ``set_mode(mode)`` before each mode's
    calls and ``set_mode(None)`` after; ``outputs[mode]`` the step's outputs in that mode."""
    import torch

    from mla_dcp import bench

    times = {f"{label} {mode}": [] for label in (*pieces, "compiled step") for mode in ("without", "with")}
    outputs = {}
    with torch.inference_mode():
        for turn in range(turns):
            for mode in modes(turn):
                set_mode(mode)
                try:
                    outputs[mode] = step()
                    for label, fn in pieces.items():
                        times[f"{label} {mode}"].append(bench.host_time(fn) * 1e6)
                    times[f"compiled step {mode}"].append(bench.host_time(compiled) * 1e6)
                finally:
                    set_mode(None)
    return times, outputs


def time_step(row: dict, label: str, fn, host: bool = True) -> None:
    """``fn`` in a CUDA graph of one call (do_bench's median) and, with ``host``, its host time
    per eager call (1,000 back-to-back calls), into ``row`` as ``label_graph_us``, ``label_host_us``."""
    from mla_dcp import bench

    (graphed,) = bench._graphed([fn])
    row[label + "_graph_us"] = bench.time_fn(graphed) * 1e6
    if host:
        row[label + "_host_us"] = bench.host_time(fn) * 1e6


def print_row(name: str, row: dict) -> None:
    print(name, json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)


def run_variants(argv: list, prefix: str, run_case, setup=None, finish=None) -> None:
    """``OUT_DIR VARIANT CASES``: ``setup(variant)``, the ceilings, then ``run_case(case, variant)`` of
    each comma-separated case, printed as run (a case that fails, a variant that does not build, is a
    row with its error) and completed by ``finish(case, row, ceilings)``; all written to
    OUT_DIR/{prefix}_{VARIANT}.json."""
    from mla_dcp import bench

    out_dir, variant, cases = pathlib.Path(argv[1]), argv[2], argv[3].split(",")
    out_dir.mkdir(parents=True, exist_ok=True)
    if setup is not None:
        setup(variant)
    # The native plans build in a background thread on first use: nothing is timed beside it.
    bench.wait_for_native_plans()
    ceilings = bench.measure_ceilings()
    rows = []
    for case in cases:
        try:
            row = run_case(case, variant)
        except Exception as failure:   # a variant that does not build is a result too
            row = {"case": case, "error": f"{type(failure).__name__}: {str(failure).splitlines()[0][:300]}"}
        if finish is not None:
            finish(case, row, ceilings)
        print(variant, json.dumps(row), flush=True)
        rows.append(row)
    (out_dir / f"{prefix}_{variant}.json").write_text(json.dumps(
        {"env": bench.environment(), "ceilings": ceilings, "variant": variant, "rows": rows}, indent=1))


def save(out_dir: str, filename: str, results: dict) -> None:
    path = pathlib.Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / filename).write_text(json.dumps(results, indent=1))


def cpu_fakes():
    """The library's ops registered for the CPU as their fake (shape-only) kernels, so a step's host
    cost (dispatch, torch.compile's guards and wrapper) is measured on a machine with no GPU. Keep the
    returned Library alive while they should stay registered."""
    import torch

    from mla_dcp.ops import library

    lib = torch.library.Library("mla_dcp", "FRAGMENT")
    for name in library.__all__[:-1]:
        if name != "step_metadata_auto":     # it chooses a shape, then calls step_metadata (faked here)
            lib.impl(name, getattr(library, name)._abstract_fn, "CPU")
    return lib


def cpu_c7_case(softmax_scale: float = 192 ** -0.5) -> tuple:
    """C7's shapes on the CPU (one request of 8 x 4096 keys, 16 heads, q = 2): (cfg, seq_lens,
    table, q, kv), for host-cost probes under cpu_fakes()."""
    import torch

    import mla_dcp

    world, length, block = 8, 4096, 64
    cfg = mla_dcp.VerifyConfig(num_heads=16, qlen=2, block_size=block, max_model_len=world * length,
                               dcp_world_size=world, kv_lora_rank=512, rope_dim=64, softmax_scale=softmax_scale)
    seq_lens = torch.full((1,), world * length, dtype=torch.int32)
    table = torch.zeros(1, cfg.min_table_blocks, dtype=torch.int32)
    q = torch.randn(2, 16, 576, dtype=torch.bfloat16)
    kv = torch.randn(64, block, 576, dtype=torch.bfloat16)
    return cfg, seq_lens, table, q, kv
