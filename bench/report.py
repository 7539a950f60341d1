#!/usr/bin/env python3
"""Render the benchmark report from one run's raw results (stdlib only).

  report.py RESULTS_DIR OUT.md

RESULTS_DIR is what bench/run.sh wrote for one run: meta.tsv, and per (filesystem, tree, tool)
FS--TREE--TOOL.json (hyperfine --export-json), FS--TREE--TOOL.check.json (bench/check.py) or
FS--TREE--TOOL.failed, FS--TREE--ferry.summary.json (ferry --json, on xfs), plus rss.tsv.  Every number in the report, ratios included, is computed
here from those files; nothing is typed in.

Exit status: 0, or 3 if a ferry result failed or was INVALID (the report is written anyway).
"""
import glob
import json
import os
import statistics
import sys

FS_ORDER = ["tmpfs", "disk", "ext4", "xfs"]
TREE_ORDER = ["small", "many", "flat", "large", "sparse"]
TOOL_ORDER = ["ferry", "ferry-verify", "cp-reflink", "cp-r", "cp-a", "rsync-a", "xcp", "cpz", "fcp"]
# One line per filesystem, above its tables and in the Machine section.
# What bench/run.sh's hyperfine --prepare runs (RUN is the fs root's `run`).
PREPARE = "rm -rf RUN RUN.* && d=$(mktemp -d RUN.XXXXXXXX) && ln -sfn ${d##*/} RUN && sync"

FS_ABOUT = {
    "tmpfs": "tmpfs (RAM): pure CPU and syscall cost.",
    "disk": "`bench/work/disk` on the host disk (see Disk filesystem above).",
    "ext4": "a loop-mounted ext4 image made with `mkfs.ext4`'s defaults (a journal, as on a node's "
            "disk), stored on the host disk (see ext4 filesystem above); cold, the loop device uses "
            "direct I/O on the image file (bench/README.md).",
    "xfs": "a loop-mounted XFS image made with `mkfs.xfs -m reflink=1`, stored on the host disk "
           "(see XFS filesystem above). Every tool can clone here, so a copy costs metadata, not "
           "data: `cp-reflink` is `cp -a --reflink=always`, ferry uses its default `--reflink auto`. "
           "'dst shared' is how much of DST's allocated file data sits in extents the filesystem "
           "flags as shared (FIEMAP), i.e. was cloned from SRC rather than written.",
}
BASELINE = "ferry"


def order(seq, known):
    return sorted(seq, key=lambda x: (known.index(x) if x in known else len(known), x))


def tree_of(path):
    return os.path.basename(path)[len("revs--"):-len(".json")]


def read_meta(d):
    meta = {}
    with open(os.path.join(d, "meta.tsv")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("\t")
            meta[k] = v
    return meta


def fmt_s(x):
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def load(d):
    """{(fs, tree): {tool: row}}"""
    cells = {}
    for path in glob.glob(os.path.join(d, "*--*--*")):
        name = os.path.basename(path)
        for suffix in (".check.json", ".summary.json", ".json", ".failed"):
            if name.endswith(suffix):
                stem = name[: -len(suffix)]
                break
        else:
            continue
        fs, tree, tool = stem.split("--")
        row = cells.setdefault((fs, tree), {}).setdefault(tool, {})
        if suffix == ".json":
            with open(path) as f:
                r = json.load(f)["results"][0]
            row["hf"] = r
        elif suffix == ".check.json":
            with open(path) as f:
                row["check"] = json.load(f)
        elif suffix == ".summary.json":
            with open(path) as f:
                row["summary"] = json.load(f)
        else:
            with open(path) as f:
                row["failed"] = f.read().strip().replace("\n", " / ")
    return cells


def fmt_shared(c):
    """'dst shared' cell: shared bytes, and their share of DST's allocated file bytes."""
    n = c.get("dst_shared_bytes")
    if n is None:
        return "-"
    total = c.get("dst_file_alloc_bytes") or 0
    return f"{fmt_bytes(n)} ({100 * n / total:.0f}%)" if total else fmt_bytes(n)


def summary_line(s):
    """How ferry moved the bytes, from its --json summary (one extra, untimed run)."""
    b = s.get("bytes", 0)

    def part(key):
        n = s.get(key)
        if n is None:
            return "?"
        return f"{fmt_bytes(n)}" + (f" ({100 * n / b:.0f}%)" if b else "")

    verdict = ("cloned, not copied" if b and s.get("bytes_reflinked") == b
               else "NOT fully cloned" if b else "no file data")
    ok = "" if s.get("ok", True) else " The --json run reported ok=false."
    return (f"ferry `--json` (one more, untimed run): `bytes_reflinked` = {part('bytes_reflinked')} of "
            f"`bytes` = {fmt_bytes(b)}; `bytes_copy_file_range` = {part('bytes_copy_file_range')}, "
            f"`bytes_read_write` = {part('bytes_read_write')}, {s.get('files', '?')} files: "
            f"**{verdict}**.{ok}")


def check_cell(row):
    c = row.get("check")
    if c is None:
        return "not checked"
    if not c["ok"]:
        return "**INVALID**: " + "; ".join(c["errors"][:2])
    if "file_meta_diffs" not in c:
        return "ok"
    def part(label, diffs, total):
        if total == 0:
            return f"{label} -"
        if diffs == 0:
            return f"{label} kept"
        return f"{label} lost ({diffs}/{total})" if diffs < total else f"{label} lost"

    return (f"ok; metadata: {part('files', c['file_meta_diffs'], c.get('files', 0))}, "
            f"{part('dirs', c['dir_meta_diffs'], c.get('dirs', 0))}")


def problems(d):
    """[(fs, tree, tool, what)] for every failed or INVALID result, RSS runs included."""
    out = []
    for (fs, tree), rows in load(d).items():
        for tool, row in rows.items():
            if "hf" not in row:
                out.append((fs, tree, tool, "failed"))
            elif row.get("check", {}).get("ok") is False:
                out.append((fs, tree, tool, "INVALID"))
            if row.get("summary", {}).get("ok") is False:
                out.append((fs, tree, tool, "failed (--json run)"))
    for path in glob.glob(os.path.join(d, "rss--*.check.json")):
        with open(path) as f:
            if not json.load(f)["ok"]:
                out.append(("tmpfs", "rss", os.path.basename(path)[5:-11], "INVALID"))
    rss = os.path.join(d, "rss.tsv")
    if os.path.exists(rss):
        with open(rss) as f:
            for line in f:
                tool, fs, tree, *rest = line.rstrip("\n").split("\t")
                if rest == ["failed"]:
                    out.append((fs, tree, tool, "failed"))
    return sorted(out)


def draw_charts(cells, out_md):
    """One SVG per filesystem beside OUT.md (`<name>-<fs>.svg`): a bar group per tree, the
    tools side by side, mean wall time with σ as the error bar, as fuc's and fcp's READMEs
    draw theirs. {fs: file name}; nothing without matplotlib (the tables stand alone)."""
    try:
        import matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib missing, no charts (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return {}
    out = {}
    stem = os.path.splitext(os.path.basename(out_md))[0]
    for fs in order({k[0] for k in cells}, FS_ORDER):
        trees = order({k[1] for k in cells if k[0] == fs}, TREE_ORDER)
        tools = order({t for k, rows in cells.items() if k[0] == fs for t in rows
                       if rows[t].get("hf")}, TOOL_ORDER)
        if not trees or not tools:
            continue
        fig, axes = plt.subplots(1, len(trees), figsize=(3.2 * len(trees), 3.4), squeeze=False)
        for ax, tree in zip(axes[0], trees):
            rows = cells[(fs, tree)]
            names = [t for t in tools if rows.get(t, {}).get("hf")]
            means = [rows[t]["hf"]["mean"] for t in names]
            sds = [rows[t]["hf"]["stddev"] or 0.0 for t in names]
            colors = ["#d62728" if t.startswith("ferry") else "#7f7f7f" for t in names]
            ax.bar(range(len(names)), means, yerr=sds, color=colors, capsize=3)
            ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
            ax.set_title(tree, fontsize=10)
            ax.set_ylabel("seconds (lower is better)", fontsize=8)
        fig.suptitle(f"{fs}: mean wall time", fontsize=11)
        fig.tight_layout()
        name = f"{stem}-{fs}.svg"
        # Fixed metadata and hashes, so the same numbers draw the same file.
        matplotlib.rcParams["svg.hashsalt"] = "ferry"
        fig.savefig(os.path.join(os.path.dirname(os.path.abspath(out_md)), name),
                    metadata={"Date": None})
        plt.close(fig)
        out[fs] = name
    return out


def render(d, out_md=None):
    meta = read_meta(d)
    cells = load(d)
    charts = draw_charts(cells, out_md) if out_md else {}
    out = []
    w = out.append
    w("# Ferry copy benchmark results")
    w("")
    fs_run = order({k[0] for k in cells}, FS_ORDER)
    runs_other = "".join(f", `--runs {meta[f'runs_{fs}']}` on {'the disk' if fs == 'disk' else fs}"
                         for fs in fs_run if f"runs_{fs}" in meta)
    cold = meta.get("cold") == "1"
    cache = ("**cold page cache**: `--prepare '" + PREPARE + " && echo 3 > "
             "/proc/sys/vm/drop_caches'` before every run (DST is RUN/dst: RUN a symlink to a new "
             "directory with a new name under a `chattr +T` parent, so each run's copy lands in a new region of the disk "
             "and not on the inodes the previous run freed: bench/README.md; on the XFS image ferry and xcp run with `--reflink never` and cp with "
             "`--reflink=never`; ferry's and cp's data is then read and written, but xcp's "
             "`copy_file_range` still clones on XFS, as cpz's and fcp's does (they cannot be told): "
             "see 'dst shared', and compare only unshared copies there)"
             if cold else "warm page cache, `--prepare '" + PREPARE + "'` (DST is RUN/dst)")
    w(f"Generated by `bench/run.sh` ({meta.get('mode', '?')} mode) on {meta.get('date', '?')}; "
      f"hyperfine `--warmup {meta.get('warmup')} --runs {meta.get('runs')}` "
      f"({runs_other[2:] or 'all filesystems'}), {cache}. Protocol: `bench/README.md`. "
      f"Raw hyperfine JSON: `bench/work/results/{meta.get('mode', '?')}/`.")
    if meta.get("mode") == "quick":
        w("")
        w("**Quick mode: tiny trees and a single run. These numbers only smoke-test the harness.**")
    w("")
    w("## Machine")
    w("")
    for k, label in (("nproc", "nproc"), ("cpu", "CPU"), ("memory", "Memory"), ("kernel", "Kernel"),
                     ("disk", "Disk filesystem"), ("tmpfs", "tmpfs options"),
                     ("ext4", "ext4 filesystem"), ("xfs", "XFS filesystem"), ("xfs_img_alloc", "XFS image allocated on the host disk after the run"),
                     ("ferry_rev", "Ferry revision"), ("elapsed_s", "Harness wall time (s)")):
        if k in meta:
            w(f"- {label}: {meta[k]}")
    if "disk_read" in meta:
        w(f"- Disk noise: five uncached reads (`dd iflag=direct`) of one 1 GiB file gave "
          f"{', '.join(meta['disk_read'].split(';'))}: judge the disk ratios against that spread.")
    w("")
    w("## Tools")
    w("")
    w("| tool | version | command line |")
    w("|---|---|---|")
    versions = {k.split(":", 1)[1]: v for k, v in meta.items() if k.startswith("version:")}
    cmds = {k.split(":", 1)[1]: v for k, v in meta.items() if k.startswith("cmd:")}
    ver_of = {"ferry": "ferry", "ferry-verify": "ferry", "cp-r": "cp", "cp-a": "cp", "cp-reflink": "cp",
              "rsync-a": "rsync", "xcp": "xcp", "cpz": "cpz", "fcp": "fcp"}
    for tool in order(cmds, TOOL_ORDER):
        w(f"| {tool} | {versions.get(ver_of.get(tool, tool), '?')} | `{cmds[tool]}` |")
    for extra in ("ftzz", "hyperfine", "python3"):
        if extra in versions:
            w(f"| ({extra}) | {versions[extra]} | |")
    w("")
    w("## Wall time")
    w("")
    w("Median of the timed runs. Ratio = tool median / ferry median from this same run "
      "(above 1 means ferry is faster). The check column is the correctness gate on the last "
      "run's output (paths, types, sizes, bytes must match, else INVALID), and whether mode, "
      "owner and mtime were kept for files and for directories (informational: `cp -r`, `cpz` "
      "and `fcp` do not try). 'dst allocated' shows whether sparseness was kept.")
    w("")
    w("Filesystems, in the order of the tables below (source and destination on the same one):")
    w("")
    for fs in fs_run:
        w(f"- **{fs}**: {FS_ABOUT.get(fs, '')}")
    trees = {k: v for k, v in meta.items() if k.startswith("tree:")}
    for fs in fs_run:
        chart = charts.get(fs)
        if chart:
            w("")
            w(f"![{fs}: mean wall time per tree, tools side by side]({chart})")
        for tree in order({k[1] for k in cells if k[0] == fs}, TREE_ORDER):
            rows = cells[(fs, tree)]
            # 'dst shared' only where check.py measured it (xfs).
            shared = any(r.get("check", {}).get("dst_shared_bytes") is not None for r in rows.values())
            w("")
            w(f"### {fs} / {tree}")
            w("")
            if fs == "xfs":
                w("Loop-mounted XFS (reflink=1) on the host disk.")
                w("")
            w(f"{trees.get('tree:' + tree, '')}")
            w("")
            w("| tool | median (s) | mean ± σ (s) | min (s) | user (s) | sys (s) | runs | ratio to ferry | dst allocated | "
              + ("dst shared | " if shared else "") + "check |")
            w("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if shared else "") + "---|")
            base = rows.get(BASELINE, {}).get("hf")
            base_med = base["median"] if base else None
            src_alloc = None
            for tool in order(rows, TOOL_ORDER):
                row = rows[tool]
                hf = row.get("hf")
                if hf is None:
                    w(f"| {tool} | failed | | | | | | | | " + ("| " if shared else "")
                      + f"{row.get('failed', 'no result')} |")
                    continue
                ratio = f"{hf['median'] / base_med:.2f}" if base_med else "-"
                c = row.get("check", {})
                src_alloc = c.get("src_alloc_bytes", src_alloc)
                w(f"| {tool} | {fmt_s(hf['median'])} | {fmt_s(hf['mean'])} ± {fmt_s(hf['stddev'] or 0.0)} "
                  f"| {fmt_s(hf['min'])} | {fmt_s(hf['user'])} | {fmt_s(hf['system'])} | {len(hf['times'])} | {ratio} "
                  f"| {fmt_bytes(c.get('dst_alloc_bytes'))} | "
                  + (f"{fmt_shared(c)} | " if shared else "") + f"{check_cell(row)} |")
            if src_alloc is not None:
                w("")
                w(f"Source allocated: {fmt_bytes(src_alloc)}.")
            summary = rows.get(BASELINE, {}).get("summary")
            if summary is not None:
                w("")
                w(summary_line(summary))
    revs = sorted(glob.glob(os.path.join(d, "revs--*.json")),
                  key=lambda p: TREE_ORDER.index(tree_of(p)) if tree_of(p) in TREE_ORDER else 99)
    if revs:
        w("")
        w("## Against earlier revisions")
        w("")
        w("`BENCH_FERRY_REVS`: ferry-agent built at earlier revisions, timed against this one by "
          "`bench/ab.py` on tmpfs: every round copies the tree once with each binary, in a "
          "shuffled order, so drift of the machine falls on all of them alike (round 0 is a "
          "warmup). Ratio = median / this ferry's median (above 1 means this ferry is faster).")
        versions = {k.split(":", 1)[1]: v for k, v in meta.items() if k.startswith("version:")}
        for path in revs:
            with open(path) as f:
                ab = json.load(f)
            tree = tree_of(path)
            w("")
            w(f"### tmpfs / {tree}, {ab['rounds']} rounds")
            w("")
            w("| binary | median (s) | mean ± σ (s) | min (s) | ratio to ferry |")
            w("|---|---:|---:|---:|---:|")
            base = statistics.median(ab["times"]["ferry"])
            for name, t in ab["times"].items():
                label = name if name == "ferry" else f"{name} ({versions.get(name, '?')})"
                sd = statistics.stdev(t) if len(t) > 1 else 0.0
                w(f"| {label} | {fmt_s(statistics.median(t))} | {fmt_s(statistics.mean(t))} ± {fmt_s(sd)} "
                  f"| {fmt_s(min(t))} | {statistics.median(t) / base:.3f} |")
    w("")
    w("## Peak RSS")
    w("")
    rss = os.path.join(d, "rss.tsv")
    if os.path.exists(rss):
        w(f"One run each on tmpfs, `/usr/bin/time -f %M`; tree: {trees.get('tree:rss', 'rss')}.")
        w("")
        w("| tool | peak RSS (MiB) | wall (s) | user (s) | sys (s) | check (no content) |")
        w("|---|---:|---:|---:|---:|---|")
        with open(rss) as f:
            for line in f:
                tool, fs, tree, *rest = line.rstrip("\n").split("\t")
                vals = rest[0].split() if rest else []
                row = {}
                cpath = os.path.join(d, f"rss--{tool}.check.json")
                if os.path.exists(cpath):
                    with open(cpath) as cf:
                        row["check"] = json.load(cf)
                if len(vals) == 4:
                    kib, wall, user, sys_ = vals
                    w(f"| {tool} | {int(kib) / 1024:.1f} | {wall} | {user} | {sys_} | {check_cell(row)} |")
                else:
                    w(f"| {tool} | failed | | | | |")
    else:
        w("Skipped (BENCH_SKIP_1M=1).")
    w("")
    return "\n".join(out)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    text = render(argv[1], argv[2])
    with open(argv[2], "w") as f:
        f.write(text)
    bad = problems(argv[1])
    for fs, tree, tool, what in bad:
        print(f"report: {what}: {tool} on {fs}/{tree}", file=sys.stderr)
    # Exit 3 when ferry itself failed or produced a wrong copy; peers' problems only warn.
    if any(tool.startswith("ferry") for _, _, tool, _ in bad):
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv)
