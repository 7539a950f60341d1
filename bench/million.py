#!/usr/bin/env python3
"""make bench-million: a million files, and what grows faster than the file count.

Warm, on one tmpfs (size=10g, nr_inodes=8M), three trees, one at a time (each removed
before the next is made): `1m`, ftzz -n 1,000,000 -b 200 MB --seed 3 (about 1M files of
~200 bytes in ~900 directories); `100k`, the same with a tenth of the files and bytes (the
per-file baseline); `flat`, 1,000,000 files of 0-400 bytes in ONE directory (where rsync's
--files-from listing stalls, rsync#695). Per tree: one untimed run of each row, then rounds;
each round runs every row once, in an order rotated each round, the destination removed
and the page cache dropped between runs outside the timing. Each run is reaped with wait4:
wall time, user+sys CPU and peak RSS. The last round's destinations are counted against
the source. Rows: Ferry with its defaults (checksum), with --verify none, cpz, rsync -a.
Writes bench/MILLION.md: a table per tree, and the cost per file of each row on 100k, 1m
and flat.

Env: MILLION_RUNS (rounds, default 3), MILLION_FILES (trees 1m and flat, default 1000000;
100k is a tenth of it), MILLION_MD (out). Root (the tmpfs mount).
"""
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

from timed import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS_DIR = os.environ.get("FERRY_TOOLS", "/var/cache/ferry-tools")
BIN = os.path.join(TOOLS_DIR, "cargo", "bin")
RUNS = int(os.environ.get("MILLION_RUNS", "3"))
FILES = int(os.environ.get("MILLION_FILES", "1000000"))
OUT = os.environ.get("MILLION_MD", os.path.join(REPO, "bench", "MILLION.md"))
MEAN = 200  # bytes per file, every tree


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def say(*args):
    print("bench-million:", *args, file=sys.stderr, flush=True)


def count(root):
    """(files, directories, bytes) under root, root itself not counted."""
    files = dirs = size = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    dirs += 1
                    stack.append(e.path)
                else:
                    files += 1
                    size += e.stat(follow_symlinks=False).st_size
    return files, dirs, size


def make_flat(root, n):
    """n files named 0..n-1 in root alone, file i holding its index as text repeated,
    cut to (i * 7919) % 401 bytes (0-400, mean 200)."""
    os.mkdir(root)
    fd_dir = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    step = max(n // 10, 1)
    try:
        for i in range(n):
            size = (i * 7919) % 401
            fd = os.open(str(i), flags, 0o644, dir_fd=fd_dir)
            try:
                if size:
                    rep = b"%d\n" % i
                    # One bytes object per file, written through a view: no second copy.
                    os.write(fd, memoryview(rep * (size // len(rep) + 1))[:size])
            finally:
                os.close(fd)
            if (i + 1) % step == 0:
                say(f"flat: {i + 1:,}/{n:,} files")
    finally:
        os.close(fd_dir)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def remove(path):
    # shutil.rmtree is slow on a million files; rm -rf is not.
    sh("rm", "-rf", path)


def bench_tree(rows, src, dst, want):
    """The untimed runs, then RUNS rotated rounds; {row name: [(wall, cpu, rss)]}."""
    res = {name: [] for name, _ in rows}
    for name, argv in rows:
        say(f"  untimed: {name}")
        run(argv(src, dst))
        remove(dst)
    for r in range(RUNS):
        order = rows[r % len(rows):] + rows[:r % len(rows)]
        for name, argv in order:
            drop_caches()
            res[name].append(run(argv(src, dst)))
            w, c, m = res[name][-1]
            say(f"  round {r + 1}/{RUNS}: {name}: {w:.3f} s wall, {c:.3f} s CPU, "
                f"{m / 1024:.0f} MiB")
            if r == RUNS - 1:
                got = count(dst)
                if got != want:
                    raise RuntimeError(
                        f"{name}: the destination has {got[0]:,} files, {got[1]:,} "
                        f"directories, {got[2]:,} bytes; the source {want[0]:,}, "
                        f"{want[1]:,}, {want[2]:,}")
            remove(dst)
    return res


def main():
    if os.geteuid() != 0:
        sys.exit("bench-million: run as root (a tmpfs mount)")
    ftzz, cpz = os.path.join(BIN, "ftzz"), os.path.join(BIN, "cpz")
    for tool in (ftzz, cpz):
        if not os.access(tool, os.X_OK):
            sys.exit(f"bench-million: no {tool}: run bench/install-tools.sh "
                     "(or make bench-million, which does)")
    sh("cargo", "build", "-q", "--release", "-p", "ferry-agent", cwd=REPO)
    ferry = os.path.join(REPO, "target", "release", "ferry-agent")
    rows = [
        ("ferry (defaults: checksum)",
         lambda s, d: [ferry, "copy", "--no-progress", s, d]),
        ("ferry --verify none",
         lambda s, d: [ferry, "copy", "--no-progress", "--verify", "none", s, d]),
        ("cpz", lambda s, d: [cpz, s, d]),
        ("rsync -a", lambda s, d: ["rsync", "-a", s + "/", d]),
    ]
    small = FILES // 10
    trees = [
        ("1m", f"ftzz -n {FILES:,} -b {FILES * MEAN:,} --seed 3",
         lambda p: sh(ftzz, p, "-n", str(FILES), "-b", str(FILES * MEAN), "--seed", "3",
                      stdout=subprocess.DEVNULL)),
        ("100k", f"ftzz -n {small:,} -b {small * MEAN:,} --seed 3",
         lambda p: sh(ftzz, p, "-n", str(small), "-b", str(small * MEAN), "--seed", "3",
                      stdout=subprocess.DEVNULL)),
        ("flat", f"{FILES:,} files of 0-400 bytes in one directory",
         lambda p: make_flat(p, FILES)),
    ]
    results, counts = {}, {}
    work = tempfile.mkdtemp(prefix="ferry-million-")
    sh("mount", "-t", "tmpfs", "-o", "size=10g,nr_inodes=8M", "tmpfs", work)
    try:
        src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
        for tree, how, make in trees:
            say(f"{tree}: generating ({how})")
            t = time.perf_counter()
            make(src)
            counts[tree] = count(src)
            f, d, b = counts[tree]
            say(f"{tree}: {f:,} files, {d:,} directories, {b:,} bytes "
                f"in {time.perf_counter() - t:.1f} s")
            results[tree] = bench_tree(rows, src, dst, counts[tree])
            remove(src)
    finally:
        subprocess.run(["umount", work])
        os.rmdir(work)

    # What /bin/true reads, spawned the same way: the floor of the RSS column.
    floor = run(["true"])[2] * 1024 / 1e6
    report(rows, trees, results, counts, floor)
    print(open(OUT).read())


def report(rows, trees, results, counts, floor):
    """Write OUT from {tree: {row: [(wall, cpu, rss KiB)]}} and {tree: (files, dirs, bytes)}."""

    def med(tree, name, i):
        return statistics.median(x[i] for x in results[tree][name])

    rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    described = "; ".join(
        f"`{tree}`, {how}: {counts[tree][0]:,} files, {counts[tree][1]:,} subdirectories, "
        f"{counts[tree][2]:,} bytes" for tree, how, _ in trees)
    with open(OUT, "w") as w:
        w.write("# A million files\n\n")
        w.write(
            f"Generated by `make bench-million` (bench/million.py) on {when}, revision "
            f"{rev}, nproc {os.cpu_count()}. Warm: each tree on a tmpfs (size=10g, "
            "nr_inodes=8M), copied to the same tmpfs, one tree at a time. Per tree: one "
            f"untimed run of each tool, then {RUNS} round{'' if RUNS == 1 else 's'}; each "
            "round runs every tool once, in an order rotated each round, the destination "
            "removed (rm -rf) and "
            "`sync; echo 1 > /proc/sys/vm/drop_caches` run before each timed run, outside "
            "the timing. Each run is a process reaped with wait4: wall time, CPU (user + "
            "sys, its threads and reaped children) and peak RSS (GNU time's %M, the "
            "largest single process, the largest over the timed runs; /bin/true reads "
            f"{floor:.1f} MB spawned the same way). The last round's "
            "destinations were counted against the source (files, directories, bytes). "
            "rsync -a copies SRC/ to DST. Ratios are medians against cpz's median in the "
            f"same tree. Trees: {described}.\n\n")
        for tree, _, _ in trees:
            base = med(tree, "cpz", 0)
            w.write(f"## `{tree}`: {counts[tree][0]:,} files, {counts[tree][1]:,} "
                    f"subdirectories\n\n")
            w.write("| tool | median wall (s) | min-max (s) | ratio to cpz | "
                    "CPU (user+sys, s) | peak RSS (MB) |\n"
                    "|---|---:|---:|---:|---:|---:|\n")
            for name, _ in rows:
                walls = [x[0] for x in results[tree][name]]
                rss = max(x[2] for x in results[tree][name]) * 1024 / 1e6
                w.write(f"| {name} | {med(tree, name, 0):.3f} | {min(walls):.3f}-"
                        f"{max(walls):.3f} | {med(tree, name, 0) / base:.2f} | "
                        f"{med(tree, name, 1):.3f} | {rss:.1f} |\n")
            w.write("\n")

        def per_file(tree, name, i):
            return med(tree, name, i) / counts[tree][0] * 1e6

        w.write("## Cost per file\n\n")
        w.write("Median wall and median CPU of each tool over the tree's file count, in "
                "µs per file; a ratio of 1.00 is a flat cost per file.\n\n")
        w.write("| tool | wall 100k | wall 1m | wall 1m / 100k | wall flat | "
                "wall flat / 1m | CPU 100k | CPU 1m | CPU 1m / 100k | CPU flat | "
                "CPU flat / 1m |\n|---|" + "---:|" * 10 + "\n")
        for name, _ in rows:
            cells = []
            for i in (0, 1):
                k, m, f = (per_file(t, name, i) for t in ("100k", "1m", "flat"))
                cells += [f"{k:.2f}", f"{m:.2f}", f"{m / k:.2f}", f"{f:.2f}", f"{f / m:.2f}"]
            w.write(f"| {name} | " + " | ".join(cells) + " |\n")


if __name__ == "__main__":
    main()
