"""Per-opcode totals of an Nsight Compute SASS source page, to see which instructions stall and why.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass | gzip > sass.csv.gz
    python benchmarks/probes/ncu_sass_summary.py sass.csv.gz [TOP] [--lines N] [--runs OPCODE]

Prints the report's totals (warp-state samples by reason, shared-memory wavefronts and their
excess), then the TOP opcodes (default 18) by samples with their three largest stall reasons.
``--lines N``: then the N single instructions with the most samples, in program order, each with
the landmarks before and after it (matrix products, barriers, mbarrier waits, conversions), to
tell which wait or which conversion site the samples belong to. ``--runs OPCODE``: then each run
of that opcode (instances at most 60 instructions apart; e.g. F2FP: one run per conversion site
and warpgroup) with its instruction count, summed samples and the landmarks before it.
"""
import argparse
import collections
import csv
import gzip


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _read(path: str):
    """The SASS page's header (column name -> index) and rows."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    header, *rows = csv.reader(lines[start:])
    return {name: i for i, name in enumerate(header)}, rows


def _opcode(source: str) -> str:
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def summarize(path: str, top: int = 18) -> str:
    col, rows = _read(path)
    header = list(col)
    stalls = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    counted = ["L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "Instructions Executed"]
    total = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for row in rows:
        op = _opcode(row[col["Source"]])
        for name in ["Warp Stall Sampling (All Samples)", *stalls, *counted]:
            value = _number(row[col[name]])
            total[name] += value
            by_op[op][name] += value
    out = ["total " + ", ".join(f"{k}={int(v)}" for k, v in total.items() if v)]
    samples = "Warp Stall Sampling (All Samples)"
    for op, c in sorted(by_op.items(), key=lambda kv: -kv[1][samples])[:top]:
        reasons = sorted(((c[n], n[len("stall_"):]) for n in stalls), reverse=True)[:3]
        out.append(f"{op:10s} samples={int(c[samples]):6d} inst={int(c['Instructions Executed']):9d} "
                   f"wavefronts={int(c['L1 Wavefronts Shared']):9d} "
                   f"excessive={int(c['L1 Wavefronts Shared Excessive']):8d} "
                   + " ".join(f"{name}:{int(v)}" for v, name in reasons))
    return "\n".join(out)


_LANDMARKS = ("HGMMA", "BAR", "SYNCS", "F2FP", "UTMALDG", "WARPGROUP")


def _instructions(path: str):
    """Each instruction's text, warp samples and opcode, in program order."""
    col, rows = _read(path)
    sources = [row[col["Source"]].strip() for row in rows]
    return sources, [_number(row[col["Warp Stall Sampling (All Samples)"]]) for row in rows], list(map(_opcode, sources))


def hottest_lines(path: str, count: int, around: int = 3) -> str:
    """The ``count`` instructions with the most warp samples, in program order: index, samples,
    the instruction, and the ``around`` nearest landmark opcodes on each side (index:opcode)."""
    sources, samples, ops = _instructions(path)
    marks = [i for i, op in enumerate(ops) if op in _LANDMARKS]
    hottest = sorted(sorted(range(len(ops)), key=lambda i: -samples[i])[:count])
    out = []
    for i in hottest:
        before = [f"{j}:{ops[j]}" for j in marks if j < i][-around:]
        after = [f"{j}:{ops[j]}" for j in marks if j > i][:around]
        out.append(f"{i:6d} {int(samples[i]):6d} {sources[i][:56]:56s} "
                   f"after [{' '.join(before)}] before [{' '.join(after)}]")
    return "\n".join(out)


def opcode_runs(path: str, opcode: str, gap: int = 60, around: int = 3) -> str:
    """Runs of ``opcode`` (each instance within ``gap`` instructions of the previous) in program
    order: first and last index, instances, their summed samples, and the landmarks before."""
    _, samples, ops = _instructions(path)
    marks = [i for i, op in enumerate(ops) if op in _LANDMARKS and op != opcode]
    runs = []
    for i, op in enumerate(ops):
        if op != opcode:
            continue
        if runs and i - runs[-1][1] <= gap:
            runs[-1][1] = i
            runs[-1][2].append(i)
        else:
            runs.append([i, i, [i]])
    out = []
    for first, last, members in runs:
        before = [f"{j}:{ops[j]}" for j in marks if j < first][-around:]
        out.append(f"{opcode} {first}-{last} count={len(members)} samples={int(sum(samples[i] for i in members))} "
                   f"after [{' '.join(before)}]")
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", help="the SASS source page as CSV (.gz or plain)")
    parser.add_argument("top", nargs="?", type=int, default=18, help="opcodes to list")
    parser.add_argument("--lines", type=int, default=0, help="also the N hottest single instructions")
    parser.add_argument("--runs", default="", metavar="OPCODE", help="also each run of OPCODE with its samples")
    args = parser.parse_args()
    print(summarize(args.page, args.top))
    if args.lines:
        print(hottest_lines(args.page, args.lines))
    if args.runs:
        print(opcode_runs(args.page, args.runs))
