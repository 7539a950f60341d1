#!/usr/bin/env python3
"""Paired per-round differences (rounds are interleaved, so a round shares the machine's state)."""
import csv, statistics as st, sys
from collections import defaultdict
d = defaultdict(dict)
for r in csv.DictReader(open(sys.argv[1])):
    if r["rc"] == "0":
        d[r["config"]][r["round"]] = r
base = sys.argv[2]
print(f"| config vs {base} | pairs | Δwall mean ± SE (ms) | Δwall median (ms) | Δcopy-phase median (ms) | Δ(user+sys) mean ± SE (ms) | Δ(user+sys) % |")
print("|---|---:|---:|---:|---:|---:|---:|")
cpu = lambda r: float(r["user_s"]) + float(r["sys_s"])
for n in d:
    if n == base: continue
    rs = [k for k in d[n] if k in d[base]]
    dw = [1e3 * (float(d[n][k]["wall_s"]) - float(d[base][k]["wall_s"])) for k in rs]
    dc = [float(d[n][k]["copy_ms"]) - float(d[base][k]["copy_ms"]) for k in rs if d[n][k]["copy_ms"] and d[base][k]["copy_ms"]]
    du = [1e3 * (cpu(d[n][k]) - cpu(d[base][k])) for k in rs]
    se = lambda v: st.stdev(v) / len(v) ** 0.5
    bc = st.mean(cpu(d[base][k]) for k in rs) * 1e3
    print(f"| {n} | {len(rs)} | {st.mean(dw):+.0f} ± {se(dw):.0f} | {st.median(dw):+.0f} | {(f'{st.median(dc):+.0f}' if dc else '-')} | {st.mean(du):+.0f} ± {se(du):.0f} | {100*st.mean(du)/bc:+.1f}% |")
