#!/usr/bin/env python3
"""Interleaved timing of several ferry-agent binaries on one tree (stdlib only).

  ab.py ROUNDS SRC DST OUT.json NAME=BINARY...

Each round copies SRC to DST once with every binary, in an order shuffled per round (fixed
seed), after `rm -rf DST` and `sync`; round 0 is a warmup and is not kept. Interleaving is
what makes a comparison between revisions fair on a noisy machine: hyperfine times one
command's runs back to back, so drift of the machine (a neighbour on the VM host, writeback)
lands on whichever tool ran at that moment, and moved the ratio by 5-7% between runs here.
OUT.json: {"rounds": N, "times": {NAME: [seconds, ...]}, "cmd": {NAME: "..."}}.
"""
import json
import os
import random
import subprocess
import sys
import time


def main():
    rounds, src, dst, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    bins = dict(a.split("=", 1) for a in sys.argv[5:])
    args = ["copy", "--no-progress", "--verify", "none", src, dst]
    times = {name: [] for name in bins}
    rng = random.Random(1)
    for r in range(rounds + 1):
        order = list(bins)
        rng.shuffle(order)
        for name in order:
            subprocess.run(["rm", "-rf", dst], check=True)
            os.sync()
            start = time.perf_counter()
            subprocess.run([bins[name], *args], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r > 0:
                times[name].append(time.perf_counter() - start)
    subprocess.run(["rm", "-rf", dst], check=True)
    with open(out, "w") as f:
        json.dump({"rounds": rounds, "times": times,
                   "cmd": {n: " ".join(["ferry-agent", *args[:-2], "SRC", "DST"]) for n in bins}}, f)


if __name__ == "__main__":
    main()
