#!/usr/bin/env python3
"""Interleaved benchmark: every round runs every config once (order rotated each round),
removing DST before each run (untimed). Wall from perf_counter around fork/exec/wait,
user/sys from wait4 rusage. Appends rows to a CSV; summarise with summary.py."""
import csv, os, re, shutil, subprocess, sys, time

B = "/work/uring-exp/target/release/uexp"
T = "/work/uring-exp/tmpfs"
SRC, DST = f"{T}/src", f"{T}/dst"
FERRY = "/work/main/target/release/ferry-agent"
CPZ = "/var/cache/ferry-tools/cargo/bin/cpz"

CONFIGS = {
    "plain t1 cfr": [B, "plain", SRC, DST, "-t", "1"],
    "plain t1 rw": [B, "plain", SRC, DST, "-t", "1", "--data", "rw"],
    "plain t2 cfr": [B, "plain", SRC, DST, "-t", "2"],
    "plain t2 rw": [B, "plain", SRC, DST, "-t", "2", "--data", "rw"],
}
for k in (8, 32, 128):
    for m in ("phased", "linked", "hybrid"):
        CONFIGS[f"{m} t2 k{k}"] = [B, m, SRC, DST, "-t", "2", "-k", str(k)]
for m in ("phased", "linked", "hybrid"):
    CONFIGS[f"{m} t1 k32"] = [B, m, SRC, DST, "-t", "1", "-k", "32"]
for k in (32, 128):
    CONFIGS[f"closes t2 k{k}"] = [B, "closes", SRC, DST, "-t", "2", "-k", str(k)]
CONFIGS["closes t1 k32"] = [B, "closes", SRC, DST, "-t", "1", "-k", "32"]
CONFIGS["phased t2 k32 statx-uring"] = [B, "phased", SRC, DST, "-t", "2", "-k", "32", "--statx", "uring"]
CONFIGS["linked t2 k32 statx-uring"] = [B, "linked", SRC, DST, "-t", "2", "-k", "32", "--statx", "uring"]
CONFIGS["cpz"] = [CPZ, SRC, DST]
CONFIGS["ferry --verify none"] = [FERRY, "copy", "--no-progress", "--verify", "none", SRC, DST]


def main():
    rounds = int(sys.argv[1])
    out = sys.argv[2]
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    names = [n for n in CONFIGS if only is None or n in only]
    assert only is None or len(names) == len(only), (only, names)
    new = not os.path.exists(out)
    with open(out, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["round", "config", "wall_s", "user_s", "sys_s", "copy_ms", "rc"])
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for n in order:
                if os.path.exists(DST):
                    subprocess.run(["rm", "-rf", DST], check=True)
                t0 = time.perf_counter()
                p = subprocess.Popen(CONFIGS[n], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                _, status, ru = os.wait4(p.pid, 0)
                wall = time.perf_counter() - t0
                err = p.stderr.read().decode()
                p.returncode = os.waitstatus_to_exitcode(status)
                m = re.search(r"copy=([0-9.]+)ms", err)
                w.writerow([r, n, f"{wall:.4f}", f"{ru.ru_utime:.4f}", f"{ru.ru_stime:.4f}", m.group(1) if m else "", p.returncode])
                f.flush()
                if p.returncode != 0:
                    print(n, "rc", p.returncode, err[-300:], file=sys.stderr)
            print(f"round {r} done", file=sys.stderr, flush=True)
    if os.path.exists(DST):
        subprocess.run(["rm", "-rf", DST], check=True)


main()
