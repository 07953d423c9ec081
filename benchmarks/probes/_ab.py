"""What the host-time probes share: arguments, turns, their report, a profile."""
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
