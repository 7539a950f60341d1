#!/usr/bin/env python3
"""Memory and descriptors by tree shape (issue 19, item 11), stdlib only; run by shapes.sh.

  shapes.py gen SHAPE DIR [SCALE]
      Build one tree at DIR (which must not exist). SCALE divides the sizes (quick runs).
        links  300,000 hard-linked pairs: DIR/a/dNNN/fMMM and DIR/b/dNNN/gMMM are one file
               (1,000 directories of 300 a side), empty files.
        chain  a chain of 3,000 directories with 255-byte names, each holding a file `f`
               (paths far past PATH_MAX: made with mkdir/open relative to a directory fd).
        flat   one directory of 3,000,000 empty files.
  shapes.py measure OUT.json NAME -- CMD...
      Run CMD under /usr/bin/time (its "Maximum resident set size": peak RSS), polling
      /proc/PID/fd every 2 ms for the most descriptors it had open at once; with wall time,
      user and sys time and exit status, appends one JSON line to OUT.json.
  shapes.py check SHAPE SRC DST [SCALE]
      Check a copy: every level of a chain, every pair of a links tree one inode with two
      names, every name of a flat directory.
  shapes.py table OUT.json
      The measurements in OUT.json as a markdown table.
  shapes.py normal DIR FILES
      A normal tree: FILES files of 0-8 KiB (seeded) in 10 x 10 x 10 directories.
  shapes.py ab ROUNDS SRC DST OUT.json NAME=BIN...
      Interleaved rounds (shuffled order, round 0 a warmup) of `copy --verify none`, and of
      `copy --verify checksum --manifest M` (the manifest's per-file path building).
"""
import json
import os
import random
import subprocess
import sys
import time

NAME255 = b"n" * 255


def gen(shape, d, scale=1):
    os.makedirs(d)
    if shape == "links":
        dirs, per = 1000 // scale, 300
        for side in ("a", "b"):
            os.mkdir(os.path.join(d, side))
        for i in range(dirs):
            a = os.path.join(d, "a", f"d{i:03}")
            b = os.path.join(d, "b", f"d{i:03}")
            os.mkdir(a)
            os.mkdir(b)
            for j in range(per):
                first = os.path.join(a, f"f{j:03}")
                os.close(os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                os.link(first, os.path.join(b, f"g{j:03}"))
    elif shape == "chain":
        depth = 3000 // scale
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        for level in range(depth):
            os.mkdir(NAME255, 0o755, dir_fd=fd)
            nxt = os.open(NAME255, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
            f = os.open(b"f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
            os.write(f, f"level {level}\n".encode())
            os.close(f)
        os.close(fd)
    elif shape == "flat":
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        for i in range(3_000_000 // scale):
            os.close(os.open(f"f{i:07}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
        os.close(fd)
    else:
        sys.exit(f"unknown shape {shape}")


def measure(out, name, cmd):
    # Under /usr/bin/time, whose "Maximum resident set size" (%M) is the tool's own: the
    # rusage of a process forked from this Python would carry Python's peak RSS over exec.
    times = out + ".time"
    start = time.perf_counter()
    timer = subprocess.Popen(["/usr/bin/time", "-f", "%M %U %S", "-o", times, *cmd],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    children = f"/proc/{timer.pid}/task/{timer.pid}/children"
    peak_fds = 0
    while timer.poll() is None:
        try:
            with open(children) as f:
                pids = f.read().split()
            for pid in pids:
                peak_fds = max(peak_fds, len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            pass
        time.sleep(0.002)
    elapsed = time.perf_counter() - start
    err = timer.stderr.read().decode(errors="replace")
    with open(times) as f:
        last = f.read().split("\n")
    # "Command exited with non-zero status N" comes first when it failed.
    rss, user, sys_ = [line for line in last if line.strip()][-1].split()
    os.unlink(times)
    row = {"name": name, "cmd": " ".join(cmd), "status": timer.returncode,
           "peak_rss_kib": int(rss), "peak_fds": peak_fds,
           "seconds": round(elapsed, 3), "user": float(user), "sys": float(sys_),
           "stderr_tail": err[-2000:]}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{name}: status {timer.returncode}, {int(rss) / 1024:.1f} MiB peak RSS, "
          f"{peak_fds} fds at most, {elapsed:.2f} s", flush=True)
    if timer.returncode != 0:
        print(err[-600:], file=sys.stderr)


def check(shape, src, dst, scale=1):
    if shape == "chain":
        depth = 3000 // scale
        s = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
        d = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        for level in range(depth):
            nxt = os.open(NAME255, flags, dir_fd=s)
            os.close(s)
            s = nxt
            try:
                nxt = os.open(NAME255, flags, dir_fd=d)
            except FileNotFoundError:
                sys.exit(f"chain: the copy stops above level {level}")
            os.close(d)
            d = nxt
            want = f"level {level}\n".encode()
            f = os.open(b"f", os.O_RDONLY, dir_fd=d)
            got = os.read(f, 100)
            os.close(f)
            if got != want:
                sys.exit(f"chain level {level}: {got!r}")
            if os.stat(d).st_mode != os.stat(s).st_mode:
                sys.exit(f"chain level {level}: mode differs")
        os.close(s)
        os.close(d)
    elif shape == "links":
        inodes = set()
        for i in range(1000 // scale):
            for j in range(300):
                a = os.lstat(os.path.join(dst, "a", f"d{i:03}", f"f{j:03}"))
                b = os.lstat(os.path.join(dst, "b", f"d{i:03}", f"g{j:03}"))
                if a.st_ino != b.st_ino or a.st_nlink != 2 or a.st_ino in inodes:
                    sys.exit(f"links: pair {i}/{j} is not one file of two names")
                inodes.add(a.st_ino)
    elif shape == "flat":
        want = 3_000_000 // scale
        got = 0
        with os.scandir(dst) as it:
            for _ in it:
                got += 1
        if got != want:
            sys.exit(f"flat: {got} entries, not {want}")
    print(f"{shape}: copy checked", flush=True)


def normal(d, files):
    rng = random.Random(11)
    os.makedirs(d)
    for i in range(files):
        sub = os.path.join(d, f"a{i % 10}", f"b{(i // 10) % 10}", f"c{(i // 100) % 10}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"file-{i}.dat"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(0, 8192)))


def ab(rounds, src, dst, out, bins):
    variants = {
        "none": ["copy", "--no-progress", "--verify", "none"],
        "manifest": ["copy", "--no-progress", "--verify", "checksum", "--manifest",
                     dst + ".manifest"],
    }
    times = {f"{n}/{v}": [] for n in bins for v in variants}
    rng = random.Random(1)
    for r in range(rounds + 1):
        order = list(times)
        rng.shuffle(order)
        for key in order:
            name, variant = key.split("/")
            subprocess.run(["rm", "-rf", dst, dst + ".manifest"], check=True)
            os.sync()
            start = time.perf_counter()
            subprocess.run([bins[name], *variants[variant], src, dst], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r > 0:
                times[key].append(time.perf_counter() - start)
    subprocess.run(["rm", "-rf", dst, dst + ".manifest"], check=True)
    with open(out, "w") as f:
        json.dump({"rounds": rounds, "times": times}, f)
    for key, t in sorted(times.items()):
        t = sorted(t)
        print(f"{key}: median {t[len(t) // 2]:.3f} s, min {t[0]:.3f} s", flush=True)


def table(path):
    rows = [json.loads(line) for line in open(path)]
    print("| shape / tool | peak RSS | peak open fds | wall | user | sys | exit |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['peak_rss_kib'] / 1024:.1f} MiB | {r['peak_fds']} | "
              f"{r['seconds']:.2f} s | {r['user']:.2f} s | {r['sys']:.2f} s | {r['status']} |")


def main():
    cmd = sys.argv[1]
    if cmd == "gen":
        gen(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    elif cmd == "measure":
        sep = sys.argv.index("--")
        measure(sys.argv[2], sys.argv[3], sys.argv[sep + 1:])
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    elif cmd == "table":
        table(sys.argv[2])
    elif cmd == "normal":
        normal(sys.argv[2], int(sys.argv[3]))
    elif cmd == "ab":
        ab(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5],
           dict(a.split("=", 1) for a in sys.argv[6:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
