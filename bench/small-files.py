#!/usr/bin/env python3
"""make bench-small-files: issue 35's small-file rows in one interleaved run.

Warm, bench/run.sh's "many" tree (100,000 files, 500 MB, ftzz -d 5 --seed 1) on a tmpfs;
each round runs every tool once, in an order rotated each round (so no tool always runs
right after the same one), removing the destination between runs outside the timing.
Rows: Ferry with its defaults (checksum), with --verify none (everything `cp -a` keeps),
with --verify none --no-preserve all (cpz's work: names and data), cpz, xcp, cp -a; and
the floor rows, bench/uring's minimal copier (`uexp plain`, two threads) doing cpz's calls
per file and nothing else, then with Ferry's race-free open added (O_PATH, fstat, the
reopen through /proc/self/fd, the close), then with its torn-copy check (a second fstat):
what those calls cost, measured against cpz in the same run.
Writes bench/SMALL-FILES.md: median and spread of each, its CPU (user + system, from
wait4), and its ratio to cpz's median.

Env: SMALL_RUNS (rounds, default 7), SMALL_FILES / SMALL_BYTES (the tree), SMALL_MD (out).
Root (the tmpfs mount).
"""
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS_DIR = os.environ.get("FERRY_TOOLS", "/var/cache/ferry-tools")
BIN = os.path.join(TOOLS_DIR, "cargo", "bin")
RUNS = int(os.environ.get("SMALL_RUNS", "7"))
FILES = int(os.environ.get("SMALL_FILES", "100000"))
BYTES = int(os.environ.get("SMALL_BYTES", "500000000"))
OUT = os.environ.get("SMALL_MD", os.path.join(REPO, "bench", "SMALL-FILES.md"))


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def main():
    if os.geteuid() != 0:
        sys.exit("bench-small-files: run as root (a tmpfs mount)")
    sh("cargo", "build", "-q", "--release", "-p", "ferry-agent", cwd=REPO)
    ferry = os.path.join(REPO, "target", "release", "ferry-agent")
    sh("cargo", "build", "-q", "--release", cwd=os.path.join(REPO, "bench", "uring"))
    uexp = [os.path.join(REPO, "bench", "uring", "target", "release", "uexp"), "plain"]
    rows = [
        ("ferry (defaults: checksum)", [ferry, "copy", "--no-progress"]),
        ("ferry --verify none", [ferry, "copy", "--no-progress", "--verify", "none"]),
        (
            "ferry --verify none --no-preserve all",
            [ferry, "copy", "--no-progress", "--verify", "none", "--no-preserve", "all"],
        ),
        ("cpz", [os.path.join(BIN, "cpz")]),
        ("xcp", [os.path.join(BIN, "xcp"), "-r"]),
        ("cp -a", ["cp", "-a"]),
        ("floor: cpz's calls (uexp plain --times off)", uexp),
        ("floor: + Ferry's race-free open", uexp + ["--open", "opath"]),
        ("floor: + race-free open + torn-copy check", uexp + ["--open", "opath", "--recheck"]),
    ]
    # uexp takes its options after the two paths; the others take just the paths.
    def argv(cmd, src, dst):
        if cmd[:2] == uexp:
            return uexp + [src, dst, "-t", "2", "--times", "off"] + cmd[2:]
        return cmd + [src, dst]

    def timed(cmd, src, dst):
        """Wall seconds and user + system CPU seconds of one run (wait4's rusage)."""
        t = time.perf_counter()
        p = subprocess.Popen(argv(cmd, src, dst), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"{argv(cmd, src, dst)} failed ({p.returncode}): {err}")
        return wall, usage.ru_utime + usage.ru_stime
    work = tempfile.mkdtemp(prefix="ferry-small-")
    sh("mount", "-t", "tmpfs", "-o", "size=3g", "tmpfs", work)
    try:
        src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
        sh(os.path.join(BIN, "ftzz"), src, "-n", str(FILES), "-b", str(BYTES), "-d", "5",
           "--seed", "1", stdout=subprocess.DEVNULL)
        nfiles = sum(len(f) for _, _, f in os.walk(src))
        times = {name: [] for name, _ in rows}
        cpu = {name: [] for name, _ in rows}
        # One untimed run of each first: the page cache, the binaries, the allocator.
        for name, cmd in rows:
            timed(cmd, src, dst)
            shutil.rmtree(dst)
        for r in range(RUNS):
            order = rows[r % len(rows):] + rows[:r % len(rows)]
            for name, cmd in order:
                wall, secs = timed(cmd, src, dst)
                times[name].append(wall)
                cpu[name].append(secs)
                shutil.rmtree(dst)
    finally:
        subprocess.run(["umount", work])
        os.rmdir(work)
    base = statistics.median(times["cpz"])
    rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(OUT, "w") as w:
        w.write("# Small files, everything `cp -a` keeps, against cpz\n\n")
        w.write(
            f"Generated by `make bench-small-files` (bench/small-files.py) on {when}, "
            f"revision {rev}, nproc {os.cpu_count()}. Warm: {nfiles:,} files, "
            f"{BYTES / 1e6:.0f} MB (bench/run.sh's \"many\" tree, ftzz -d 5 --seed 1) on a "
            f"tmpfs, copied to the same tmpfs. One untimed run of each, then {RUNS} rounds; "
            "each round runs every tool once, in an order rotated each round, the "
            "destination removed between runs outside the timing. Ratios are medians "
            "against cpz's median in this same run.\n\n")
        cpu_base = statistics.median(cpu["cpz"])
        w.write("| tool | median (s) | min-max (s) | ratio to cpz | CPU, median (s) | CPU ratio to cpz |\n"
                "|---|---:|---:|---:|---:|---:|\n")
        for name, _ in rows:
            ts, cs = times[name], cpu[name]
            w.write(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f}-{max(ts):.3f} | "
                    f"{statistics.median(ts) / base:.2f} | {statistics.median(cs):.3f} | "
                    f"{statistics.median(cs) / cpu_base:.2f} |\n")
        w.write("\nCPU: user + system seconds of the process and its threads (wait4). The floor "
                "rows are bench/uring's `uexp plain` on two threads (its directories made "
                "first, in the timing), not a copier anyone should use: per file it opens the "
                "source (`O_NOFOLLOW|O_NOATIME`), stats it, creates the destination `O_EXCL`, "
                "`copy_file_range`, closes both: cpz's calls and nothing more. `+ Ferry's "
                "race-free open` opens the source as the engine must (`O_PATH`, `fstat`, the "
                "reopen through `/proc/self/fd`, `close` of the `O_PATH` descriptor: nothing is "
                "opened before it is known to be a regular file); `+ torn-copy check` adds the "
                "engine's second `fstat` of the source after the copy.\n")
        verify = statistics.median(times["ferry (defaults: checksum)"])
        plain = statistics.median(times["ferry --verify none"])
        w.write(f"\nVerification's own cost (defaults against --verify none): "
                f"{(verify / plain - 1) * 100:+.1f}%.\n")
    print(open(OUT).read())


if __name__ == "__main__":
    main()
