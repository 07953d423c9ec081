"""The attention kernel's time against the SM clock and power it runs at.

    python benchmarks/probes/clocks.py OUT_DIR [C1,C3]

The profiler's per-kernel times (``kernel_times.py``: 20 eager steps after a
warm-up) and the benchmark's (``do_bench`` over ~100 ms of graph replays, a
256 MiB flush before each) differ on the compute-bound configs by more than
either's spread (C1's attention 349 us against 415 on the H200). This runs
the attention kernel of each config in phases of a few seconds each, with
``nvidia-smi`` sampling the SM clock, power and the clock-event reasons every
20 ms, and gives each phase's median time per call beside the median clock
and power of the samples inside it:

* ``burst``: after two idle seconds, 20 eager calls, each timed alone (first
  five and last five);
* ``graph_b2b``: graph replays back to back;
* ``graph_flush``: the benchmark's way, the flush before each replay;
* ``eager_b2b``: eager calls back to back;
* ``matmul``: the benchmark's ceiling, an 8192^3 bf16 matmul, back to back
  (its TFLOP/s beside the attention's, at the clock each ran at).

Writes OUT_DIR/clocks.json and OUT_DIR/smi.csv; prints one line per phase.
"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch

from mla_dcp import bench

PHASE_S = 3.0
FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def _sampler(path: pathlib.Path):
    fields = FIELDS
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    if probe.returncode != 0:   # older drivers name it clocks_throttle_reasons
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "20"],
                            stdout=path.open("w"), stderr=subprocess.DEVNULL)


def _samples(path: pathlib.Path) -> list[tuple[float, float, float, str]]:
    """(unix time, SM MHz, watts, reasons) per sample line."""
    rows = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            rows.append((stamp, float(parts[1]), float(parts[2]), parts[4]))
        except ValueError:
            continue
    return rows


def _events_per_call(fn, seconds: float, flush: torch.Tensor | None = None, group: int = 10) -> list[float]:
    """Seconds per call over ``seconds`` of back-to-back calls, timed in groups
    (or one call at a time after a flush)."""
    times, started = [], time.time()
    while not times or time.time() - started < seconds:
        pairs = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if flush is not None:
                flush.zero_()
                start.record()
                fn()
                end.record()
                pairs.append((start, end, 1))
            else:
                start.record()
                for _ in range(group):
                    fn()
                end.record()
                pairs.append((start, end, group))
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) * 1e-3 / n for s, e, n in pairs]
    return times


def main(argv):
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    names = (argv[1] if len(argv) > 1 else "C1,C3").split(",")
    smi_path = out / "smi.csv"
    sampler = _sampler(smi_path)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    phases = []

    def phase(label, run):
        started = time.time()
        value = run()
        phases.append({"phase": label, "start": started, "end": time.time(), **value})

    try:
        for name in names:
            case = bench.make_case(name, torch.bfloat16)
            graph = bench._rotating(bench._graphed(bench.attention_fns(case)))
            eager = bench._rotating(bench.attention_fns(case))
            flops = case.flops
            for fn in (eager, graph):
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            time.sleep(2.0)

            def burst():
                times = _events_per_call(eager, 0.0, flush=None, group=1)[:20]
                return {"first5_us": statistics.median(times[:5]) * 1e6, "last5_us": statistics.median(times[-5:]) * 1e6}
            phase(f"{name} burst", burst)
            for label, fn, flushed in (("graph_b2b", graph, None), ("graph_flush", graph, flush),
                                       ("eager_b2b", eager, None)):
                phase(f"{name} {label}", lambda fn=fn, flushed=flushed: {
                    "us": statistics.median(_events_per_call(fn, PHASE_S, flushed)) * 1e6})
            for p in phases:
                if p["phase"].startswith(name) and "us" in p:
                    p["tflops"] = flops / (p["us"] * 1e-6) * 1e-12
            del case, eager, graph
        phase("matmul", lambda: {"us": statistics.median(_events_per_call(lambda: a @ b, PHASE_S)) * 1e6})
        phases[-1]["tflops"] = 2 * 8192 ** 3 / (phases[-1]["us"] * 1e-6) * 1e-12
    finally:
        time.sleep(0.2)
        sampler.terminate()
        sampler.wait()
    samples = _samples(smi_path)
    for p in phases:
        inside = [s for s in samples if p["start"] <= s[0] <= p["end"]]
        if inside:
            p["sm_mhz"] = statistics.median(s[1] for s in inside)
            p["sm_mhz_min"] = min(s[1] for s in inside)
            p["watts"] = statistics.median(s[2] for s in inside)
            p["reasons"] = sorted({s[3] for s in inside})
        p["samples"] = len(inside)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) and k not in ("start", "end") else f"{k}={v}"
                       for k, v in p.items() if k not in ("start", "end")), flush=True)
    (out / "clocks.json").write_text(json.dumps({"env": bench.environment(), "phases": phases}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
