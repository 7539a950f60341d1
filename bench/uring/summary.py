#!/usr/bin/env python3
import csv, statistics as st, sys
from collections import defaultdict

rows = defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    if r["rc"] != "0":
        continue
    rows[r["config"]].append(r)
base = sys.argv[2] if len(sys.argv) > 2 else "plain t2 rw"


def s(v):
    return f"{st.mean(v):.3f} ± {st.stdev(v) if len(v) > 1 else 0:.3f}"


bw = st.mean(float(r["wall_s"]) for r in rows[base]) if base in rows else None
print(f"| config | runs | wall mean ± σ (s) | wall min | wall median | copy phase mean (ms) | copy min (ms) | user (s) | sys (s) | user+sys (s) | wall / {base} |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, rs in rows.items():
    wall = [float(r["wall_s"]) for r in rs]
    cp = [float(r["copy_ms"]) for r in rs if r["copy_ms"]]
    u = [float(r["user_s"]) for r in rs]
    sy = [float(r["sys_s"]) for r in rs]
    cps = f"{st.mean(cp):.0f}" if cp else "-"
    cpm = f"{min(cp):.0f}" if cp else "-"
    ratio = f"{st.mean(wall) / bw:.2f}" if bw else "-"
    print(f"| {n} | {len(rs)} | {s(wall)} | {min(wall):.3f} | {st.median(wall):.3f} | {cps} | {cpm} | {st.mean(u):.3f} | {st.mean(sy):.3f} | {st.mean(u) + st.mean(sy):.3f} | {ratio} |")
