"""Side-by-side table of `python -m mla_dcp.bench` runs made in turns.

    python benchmarks/probes/ab_summary.py [--timing step_graph_seq_us] LABEL=DIR [LABEL=DIR ...]

Each DIR holds a results.json; prints, per config, every run's graphed step
(us; ``--timing``: another of the bench's timings with a ratio, e.g. the
eight-step graph's per-step time) and its ratio to the floor of that run's
own ceilings, then the medians per label, so a candidate is read against its baseline from the
same machine, in turns (the benchmark drifts by several percent within a process).
"""
import json
import pathlib
import statistics
import sys

# A timing of the bench's rows and the ratio to the floor derived from it.
RATIOS = {"step_graph_us": "ratio_graph", "step_graph_seq_us": "ratio_graph_seq", "step_us": "ratio"}


def main(argv):
    timing = "step_graph_us"
    if argv[:1] == ["--timing"]:
        timing, argv = argv[1], argv[2:]
        if timing not in RATIOS:
            raise SystemExit(f"--timing must be one of {', '.join(RATIOS)}, got {timing!r}")
    ratio = RATIOS[timing]
    runs = []
    for arg in argv:
        label, _, folder = arg.partition("=")
        result = json.loads((pathlib.Path(folder) / "results.json").read_text())
        runs.append((label, {row["config"]: row for row in result["rows"]}, result["ceilings"]))
    configs = list(dict.fromkeys(name for _, rows, _ in runs for name in rows))
    labels = list(dict.fromkeys(label for label, _, _ in runs))
    print("| config | " + " | ".join(f"{label} ({i})" for i, (label, _, _) in enumerate(runs)) + " | "
          + " | ".join(f"median {label}" for label in labels) + " |")
    print("| --- |" + " ---: |" * (len(runs) + len(labels)))
    for name in configs:
        cells, by_label = [], {}
        for label, rows, _ in runs:
            row = rows.get(name)
            if row is None or timing not in row:
                cells.append("-")
                continue
            cells.append(f"{row[timing]:.1f} ({row[ratio]:.3f}x)")
            by_label.setdefault(label, []).append((row[timing], row[ratio]))
        medians = []
        for label in labels:
            values = by_label.get(label)
            medians.append("-" if not values else f"{statistics.median(v[0] for v in values):.1f} "
                           f"({statistics.median(v[1] for v in values):.3f}x)")
        print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(medians) + " |")
    for label, _, ceilings in runs:
        print(f"{label}: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
              f"matmul {ceilings['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")


if __name__ == "__main__":
    main(sys.argv[1:])
