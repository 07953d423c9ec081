"""Per-opcode totals of an Nsight Compute SASS source page, to see which instructions stall and why.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass | gzip > sass.csv.gz
    python scripts/ncu_sass_summary.py sass.csv.gz [TOP]

Prints the report's totals (warp-state samples by reason, shared-memory wavefronts and their
excess), then the TOP opcodes (default 18) by samples with their three largest stall reasons.
"""
import collections
import csv
import gzip
import sys


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(path: str, top: int = 18) -> str:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    header, *rows = csv.reader(lines[start:])
    col = {name: i for i, name in enumerate(header)}
    stalls = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    counted = ["L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "Instructions Executed"]
    total = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for row in rows:
        words = [w for w in row[col["Source"]].split() if not w.startswith("@")]
        op = words[0].split(".")[0] if words else "?"
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


if __name__ == "__main__":
    print(summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 18))
