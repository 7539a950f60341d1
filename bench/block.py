#!/usr/bin/env python3
"""make bench-block: issue 36's block-device benchmark in one interleaved run.

A 4 GiB source loop device (BLOCK_GIB), half random data and half zeros (alternating 64
MiB runs, the zeros written out: a device holds no holes), over a file on the machine's
disk; the destination a loop device over a fresh sparse file on the same disk, made anew
for every run outside the timing. Rows, warm (source in the page cache) and cold (caches
dropped before each run):
  - ferry-agent copy-block with its defaults (direct I/O, every written chunk read back
    and hashed, of the punched ones the first), with --verify none, with --verify full
    (every punched chunk read back too), through the page cache (--cache buffered), and
    with 1, 2 and 8 workers (the default is 4);
  - dd bs=4M conv=sparse,fsync, buffered and direct; blkdiscard of the destination then
    the same dd; qemu-img convert -n -W (out-of-order writes, its zero detection and
    write-zeroes), buffered and direct (-t none -T none).
Every command's result is compared with the source (cmp, outside the timing) in the
first round, and the wall time of each includes a final `sync`, so no tool leaves its
writes in the page cache for the next.
Then the re-run: the source's backing file copied to an image and onto the destination
device; BLOCK_CHANGED chunks' worth of the source changed (0.1% of its 4 MiB chunks,
at least one: 64 KiB written into each, at spread offsets); and, warm and cold,
ferry-agent copy-block --overwrite if-changed --compare checksum with the first run's
--kept manifest (the destination not read), with it and the changed ranges as a driver's
changed-block tracking reports them (--changed: the source read only there), and without
it (read), against
rsync --inplace --no-whole-file on the same bytes as image files (VolSync's diskrsync
approach: rsync's delta algorithm). Ratios against the first copy's median.

Disk: 3 x BLOCK_GIB in BLOCK_DIR while it runs; the source (BLOCK_GIB) is kept for the
next run, the rest removed. Writes bench/BLOCK.md. Env: BLOCK_RUNS (rounds, default 3), BLOCK_GIB (default 4),
BLOCK_DIR (default /var/cache/ferry-bench/block: on the disk, not a tmpfs),
BLOCK_MD (out), BLOCK_ONLY (a focused run: see below). Root (loop devices, drop_caches).
"""
import datetime
import os
import random
import shutil
import statistics
import subprocess
import sys

from timed import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = int(os.environ.get("BLOCK_RUNS", "3"))
# BLOCK_ONLY: comma-separated words; only the first-copy rows whose names have one, and no
# re-run (a focused run with more rounds, e.g. "defaults,verify none,-t none,oflag").
ONLY = [w for w in os.environ.get("BLOCK_ONLY", "").split(",") if w]
GIB = int(os.environ.get("BLOCK_GIB", "4"))
DIR = os.environ.get("BLOCK_DIR", "/var/cache/ferry-bench/block")
OUT = os.environ.get("BLOCK_MD", os.path.join(REPO, "bench", "BLOCK.md"))
MIB = 1 << 20
CHUNK = 4 * MIB
SIZE = GIB << 30
RUN = 64 * MIB


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def out(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Loop:
    def __init__(self, path):
        self.dev = out("losetup", "--find", "--show", path)

    def close(self):
        subprocess.run(["losetup", "-d", self.dev], check=False)


def make_source(path):
    """Half random, half zeros, in alternating 64 MiB runs; reused when present."""
    if os.path.exists(path) and os.path.getsize(path) == SIZE:
        return
    rng = random.Random(36)
    with open(path + ".tmp", "wb") as f:
        for i in range(SIZE // RUN):
            if i % 2 == 0:
                f.write(rng.randbytes(RUN))
            else:
                f.write(bytes(RUN))
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def fresh_dest(path):
    if os.path.exists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.truncate(SIZE)
    return Loop(path)


def timed(cmd, cold, pre=None):
    if cold:
        drop_caches()
    wall, cpu, rss = run(["sh", "-c", " ".join(cmd) + " && sync"])
    if os.environ.get("BLOCK_TRACE"):
        print(f"  {wall:7.2f} s  {' '.join(cmd)[:100]}", file=sys.stderr)
    return wall, cpu, rss


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    if os.geteuid() != 0:
        sys.exit("bench-block: run as root (loop devices, drop_caches)")
    for tool in ["qemu-img", "rsync", "blkdiscard", "losetup", "cmp"]:
        if shutil.which(tool) is None:
            sys.exit(f"bench-block: {tool} is not installed (make bench-block installs it)")
    sh("cargo", "build", "-q", "--release", "-p", "ferry-agent", cwd=REPO)
    ferry = os.path.join(REPO, "target", "release", "ferry-agent")
    os.makedirs(DIR, exist_ok=True)
    src_file, dst_file = os.path.join(DIR, "src.img"), os.path.join(DIR, "dst.img")
    make_source(src_file)
    src = Loop(src_file)
    manifest = os.path.join(DIR, "first.manifest")
    first = [
        ("ferry copy-block (defaults: direct I/O, written chunks read back, 4 workers)",
         lambda d: [ferry, "copy-block", src.dev, d]),
        ("ferry copy-block --verify none",
         lambda d: [ferry, "copy-block", "--verify", "none", src.dev, d]),
        ("ferry copy-block --verify full (punched chunks read back too)",
         lambda d: [ferry, "copy-block", "--verify", "full", src.dev, d]),
        ("ferry copy-block --cache buffered",
         lambda d: [ferry, "copy-block", "--cache", "buffered", src.dev, d]),
        ("ferry copy-block --cache buffered --verify none",
         lambda d: [ferry, "copy-block", "--cache", "buffered", "--verify", "none", src.dev, d]),
        ("ferry copy-block -w 1", lambda d: [ferry, "copy-block", "-w", "1", src.dev, d]),
        ("ferry copy-block -w 2", lambda d: [ferry, "copy-block", "-w", "2", src.dev, d]),
        ("ferry copy-block -w 8", lambda d: [ferry, "copy-block", "-w", "8", src.dev, d]),
        ("dd bs=4M conv=sparse,fsync",
         lambda d: ["dd", f"if={src.dev}", f"of={d}", "bs=4M", "conv=sparse,fsync",
                    "status=none"]),
        ("dd bs=4M conv=sparse,fsync iflag=direct oflag=direct",
         lambda d: ["dd", f"if={src.dev}", f"of={d}", "bs=4M", "conv=sparse,fsync",
                    "iflag=direct", "oflag=direct", "status=none"]),
        ("blkdiscard + dd bs=4M conv=sparse,fsync",
         lambda d: ["blkdiscard", d, "&&", "dd", f"if={src.dev}", f"of={d}", "bs=4M",
                    "conv=sparse,fsync", "status=none"]),
        ("qemu-img convert -n -W",
         lambda d: ["qemu-img", "convert", "-n", "-W", "-f", "raw", "-O", "raw", src.dev, d]),
        ("qemu-img convert -n -W -t none -T none (direct I/O)",
         lambda d: ["qemu-img", "convert", "-n", "-W", "-t", "none", "-T", "none", "-f", "raw",
                    "-O", "raw", src.dev, d]),
    ]
    if ONLY:
        first = [(n, c) for n, c in first if any(w in n for w in ONLY)]
    results = {}
    checked = set()
    try:
        for temp in ["warm", "cold"]:
            cold = temp == "cold"
            for r in range(RUNS):
                order = first[r % len(first):] + first[:r % len(first)]
                for name, cmd in order:
                    dst = fresh_dest(dst_file)
                    try:
                        if not cold:
                            sh("cat", src.dev, stdout=subprocess.DEVNULL)
                        results.setdefault((temp, name), []).append(timed(cmd(dst.dev), cold))
                        if name not in checked:
                            sh("cmp", "-n", str(SIZE), src.dev, dst.dev)
                            checked.add(name)
                        alloc = os.stat(dst_file).st_blocks * 512
                        results.setdefault(("alloc", name), []).append(alloc)
                    finally:
                        dst.close()
                print(f"{temp} round {r + 1}/{RUNS} done", file=sys.stderr)
        rerun = {} if ONLY else rerun_rows(ferry, src, src_file, dst_file, manifest)
    finally:
        src.close()
        # The destinations (2 x BLOCK_GIB) go; the source stays, reused by the next run.
        for f in [dst_file, os.path.join(DIR, "rsync-dst.img"), manifest]:
            if os.path.exists(f):
                os.remove(f)
    write(results, rerun, first)


def change_source(src_file, seed, ranges_file):
    """0.1% of the chunks (at least one) get 64 KiB of new random bytes each; the byte
    ranges written go to `ranges_file` (`offset length` lines), as a CSI driver's
    changed-block tracking would report them between a snapshot before and one after."""
    rng = random.Random(seed)
    chunks = SIZE // CHUNK
    n = max(1, chunks // 1000)
    picked = sorted(rng.sample(range(chunks), n))
    with open(src_file, "r+b") as f, open(ranges_file, "w") as ranges:
        for c in picked:
            off = c * CHUNK + rng.randrange(0, CHUNK - 65536, 4096)
            f.seek(off)
            f.write(rng.randbytes(65536))
            ranges.write(f"{off} 65536\n")
        f.flush()
        os.fsync(f.fileno())
    return n


def rerun_rows(ferry, src, src_file, dst_file, manifest):
    """Each round: the destination (device and image) brought to the source, the source
    changed, then each re-run timed on its own fresh copy of the same state."""
    img = os.path.join(DIR, "rsync-dst.img")
    rows = {}
    changed = 0
    for temp in ["warm", "cold"]:
        cold = temp == "cold"
        for r in range(RUNS):
            dst = fresh_dest(dst_file)
            try:
                sh(ferry, "copy-block", "--verify", "none", "--manifest", manifest,
                   src.dev, dst.dev, stdout=subprocess.DEVNULL)
                sh("cp", "--sparse=always", src_file, img)
                ranges = os.path.join(DIR, "changed.ranges")
                changed = change_source(src_file, 1000 + r + (100 if cold else 0), ranges)
                # The source loop device reads its file through the page cache of the
                # file, not its own: drop the device's stale pages.
                sh("blockdev", "--flushbufs", src.dev)
                if not cold:
                    sh("cat", src.dev, stdout=subprocess.DEVNULL)
                    sh("cat", img, stdout=subprocess.DEVNULL)
                base = ["--overwrite", "if-changed", "--compare", "checksum"]
                cmds = [
                    ("ferry copy-block, only changed chunks, --kept manifest",
                     [ferry, "copy-block"] + base + ["--kept", manifest, src.dev, dst.dev]),
                    ("ferry copy-block, only changed chunks, destination read",
                     [ferry, "copy-block"] + base + [src.dev, dst.dev]),
                    ("rsync -I --inplace --no-whole-file (image files)",
                     ["rsync", "--ignore-times", "--inplace", "--no-whole-file", src_file, img]),
                    # Last: the rows before it brought the destination to the source; the
                    # chunks the ranges name still differ from the kept manifest, so it
                    # reads and writes them as on the destination before the change.
                    ("ferry copy-block, changed-block tracking's ranges (--changed), --kept manifest",
                     [ferry, "copy-block"] + base
                     + ["--kept", manifest, "--changed", ranges, src.dev, dst.dev]),
                ]
                for name, cmd in cmds:
                    if not cold:
                        sh("cat", dst.dev, stdout=subprocess.DEVNULL)
                    rows.setdefault((temp, name), []).append(timed(cmd, cold))
                sh("cmp", "-n", str(SIZE), src.dev, dst.dev)
                sh("cmp", src_file, img)
            finally:
                dst.close()
            print(f"re-run {temp} round {r + 1}/{RUNS} done", file=sys.stderr)
    rows["changed"] = changed
    return rows


def write(results, rerun, first):
    rev = out("git", "-C", REPO, "rev-parse", "--short=12", "HEAD")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Block devices: Ferry against dd and qemu-img",
        "",
        f"Generated by `make bench-block` (bench/block.py) on {when}, revision {rev}, "
        f"nproc {os.cpu_count()}. A {GIB} GiB source loop device, half random data and half "
        "zeros (alternating 64 MiB runs, the zeros written out), over a file on the "
        "machine's disk (ext4 on a virtio disk); the destination a loop device over a fresh "
        "sparse file on the same disk, made for every run outside the timing. Warm: the "
        "source read once before the run; cold: caches dropped. Every row's wall time "
        "includes a final `sync`. Each result was compared with the source (`cmp`). "
        f"{RUNS} rounds in an order rotated each round; medians, and ratios against the "
        "fastest peer's median in the same table."
        + (f" Only the rows matching BLOCK_ONLY={','.join(ONLY)}, no re-run." if ONLY else ""),
        "",
    ]
    peers = [n for n, _ in first if not n.startswith("ferry")]
    for temp in ["warm", "cold"]:
        best = min(median([w for w, _, _ in results[(temp, p)]]) for p in peers)
        lines += [f"## First copy, {temp}", "",
                  "| tool | median (s) | min-max (s) | GB/s | ratio to the best peer | "
                  "CPU (s) | destination allocated (GiB) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, _ in first:
            rs = results[(temp, name)]
            walls = [w for w, _, _ in rs]
            m = median(walls)
            alloc = median(results[("alloc", name)]) / (1 << 30)
            lines.append(
                f"| {name} | {m:.2f} | {min(walls):.2f}-{max(walls):.2f} | "
                f"{SIZE / m / 1e9:.2f} | {m / best:.2f} | "
                f"{median([c for _, c, _ in rs]):.2f} | {alloc:.2f} |")
        lines.append("")
    if not rerun:
        with open(OUT, "w") as f:
            f.write("\n".join(lines))
        print(f"wrote {OUT}", file=sys.stderr)
        return
    changed = rerun.pop("changed")
    lines += [
        f"## Re-run after {changed} of {SIZE // CHUNK} chunks changed (0.1%)", "",
        "The destination device first brought to the source (`copy-block --verify none "
        "--manifest`) and an image copy of the source made for rsync; then 64 KiB written "
        "into each of the changed chunks of the source. `--changed`: those ranges, as a "
        "CSI driver's changed-block tracking reports them between a snapshot before the "
        "change and one after (what the agent asks the driver's snapshot-metadata sidecar "
        "for); the other chunks are read on neither side. Ratios against the first copy "
        "(Ferry's defaults, same temperature).",
        "",
        "| tool | median (s) | min-max (s) | ratio to the first copy | CPU (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for temp in ["warm", "cold"]:
        base = median([w for w, _, _ in results[(temp, first[0][0])]])
        for (t, name), rs in rerun.items():
            if t != temp:
                continue
            walls = [w for w, _, _ in rs]
            m = median(walls)
            lines.append(
                f"| {name}, {temp} | {m:.2f} | {min(walls):.2f}-{max(walls):.2f} | "
                f"{m / base:.3f} | {median([c for _, c, _ in rs]):.2f} |")
    lines.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
