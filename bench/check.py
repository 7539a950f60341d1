#!/usr/bin/env python3
"""Correctness gate for one benchmark copy (stdlib only).

  check.py SRC DST OUT.json [--no-content] [--shared]

Walks both trees and compares the set of relative paths, entry types, sizes, symlink targets
and (unless --no-content) regular-file bytes; any difference makes the run INVALID.  It also
records, without failing on them:
  - whether metadata was kept: mode, uid, gid, and mtime to the nanosecond (not for symlinks),
    for every entry including the top directory, counted separately for directories and for
    the other entries;
  - the allocated bytes of both trees (was sparseness kept?);
  - with --shared, the bytes of DST's regular files in extents the filesystem flags as shared
    (FIEMAP_EXTENT_SHARED), i.e. reflinked to SRC rather than written ("dst_shared_bytes"),
    and the allocated bytes of DST's regular files ("dst_file_alloc_bytes").
    st_blocks counts shared extents in full, so the allocated size cannot show a clone.

Writes OUT.json: {"ok": bool, "errors": [first few], "entries": N, "files": N, "dirs": N,
"apparent_bytes": B, "src_alloc_bytes": A, "dst_alloc_bytes": A, "file_meta_diffs": N,
"dir_meta_diffs": N, "meta_preserved": bool, "content_checked": bool[, "dst_shared_bytes": B,
"dst_file_alloc_bytes": A]}.
Exits 0 even on a mismatch; the report marks the run invalid.
"""
import fcntl
import json
import os
import stat
import struct
import sys

BUF = 1 << 20

# linux/fiemap.h
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_SHARED = 0x2000
FIEMAP_HDR = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved
FIEMAP_EXT = struct.Struct("=QQQQQIIII")  # fe_logical, fe_physical, fe_length, 2 reserved, fe_flags, 3 reserved
FIEMAP_BATCH = 256


def shared_bytes(path):
    """Bytes of PATH in extents flagged FIEMAP_EXTENT_SHARED (reflinked/deduplicated)."""
    total = 0
    start = 0
    with open(path, "rb") as f:
        while True:
            buf = bytearray(FIEMAP_HDR.size + FIEMAP_EXT.size * FIEMAP_BATCH)
            FIEMAP_HDR.pack_into(buf, 0, start, (1 << 64) - 1 - start, FIEMAP_FLAG_SYNC, 0, FIEMAP_BATCH, 0)
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
            mapped = FIEMAP_HDR.unpack_from(buf)[3]
            if mapped == 0:
                return total
            for i in range(mapped):
                logical, _, length, _, _, flags, *_ = FIEMAP_EXT.unpack_from(buf, FIEMAP_HDR.size + i * FIEMAP_EXT.size)
                if flags & FIEMAP_EXTENT_SHARED:
                    total += length
                if flags & FIEMAP_EXTENT_LAST:
                    return total
            start = logical + length


def walk(root):
    out = {".": os.lstat(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = os.lstat(p)
    return out


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x = fa.read(BUF)
            y = fb.read(BUF)
            if x != y:
                return False
            if not x:
                return True


def compare(src, dst, content, shared=False):
    errors = []
    res = {"ok": False, "errors": errors}
    if not os.path.isdir(dst):
        errors.append(f"{dst} is not a directory")
        return res
    s, d = walk(src), walk(dst)
    missing = sorted(set(s) - set(d))
    extra = sorted(set(d) - set(s))
    errors += [f"missing {p}" for p in missing[:5]]
    errors += [f"extra {p}" for p in extra[:5]]
    if len(missing) > 5 or len(extra) > 5:
        errors.append(f"{len(missing)} missing, {len(extra)} extra in total")
    counts = {"file": 0, "dir": 0}
    diffs = {"file": 0, "dir": 0}
    src_alloc = dst_alloc = apparent = dst_shared = dst_file_alloc = 0
    for rel in sorted(set(s) & set(d)):
        a, b = s[rel], d[rel]
        src_alloc += a.st_blocks * 512
        dst_alloc += b.st_blocks * 512
        if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode):
            errors.append(f"type differs: {rel}")
            continue
        kind = "dir" if stat.S_ISDIR(a.st_mode) else "file"
        counts[kind] += 1
        if (a.st_mode, a.st_uid, a.st_gid) != (b.st_mode, b.st_uid, b.st_gid) or (
            not stat.S_ISLNK(a.st_mode) and a.st_mtime_ns != b.st_mtime_ns
        ):
            diffs[kind] += 1
        if stat.S_ISREG(a.st_mode):
            apparent += a.st_size
            if a.st_size != b.st_size:
                errors.append(f"size differs: {rel} {a.st_size} != {b.st_size}")
            elif content and not same_bytes(os.path.join(src, rel), os.path.join(dst, rel)):
                errors.append(f"content differs: {rel}")
            dst_file_alloc += b.st_blocks * 512
            if shared and dst_shared is not None:
                try:
                    dst_shared += min(shared_bytes(os.path.join(dst, rel)), b.st_blocks * 512)
                except OSError:  # no FIEMAP on this filesystem (tmpfs)
                    dst_shared = None
        elif stat.S_ISLNK(a.st_mode):
            if os.readlink(os.path.join(src, rel)) != os.readlink(os.path.join(dst, rel)):
                errors.append(f"symlink target differs: {rel}")
        if len(errors) > 20:
            errors.append("... stopped after 20 errors")
            break
    res.update(
        entries=len(s),
        files=counts["file"],
        dirs=counts["dir"],
        apparent_bytes=apparent,
        src_alloc_bytes=src_alloc,
        dst_alloc_bytes=dst_alloc,
        file_meta_diffs=diffs["file"],
        dir_meta_diffs=diffs["dir"],
        meta_preserved=diffs["file"] + diffs["dir"] == 0,
        content_checked=content,
    )
    if shared:
        res["dst_shared_bytes"] = dst_shared
        res["dst_file_alloc_bytes"] = dst_file_alloc
    res["ok"] = not errors
    return res


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 3:
        sys.exit(__doc__)
    src, dst, out = args
    res = compare(src, dst, "--no-content" not in argv, "--shared" in argv)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    if res["ok"]:
        print(f"check: ok; metadata differs on {res['file_meta_diffs']}/{res['files']} files "
              f"and {res['dir_meta_diffs']}/{res['dirs']} dirs; allocated "
              f"{res['dst_alloc_bytes']} B (source {res['src_alloc_bytes']} B)"
              + (f"; shared (reflinked) {res['dst_shared_bytes']} B" if res.get("dst_shared_bytes") is not None else ""))
    else:
        print("check: INVALID: " + "; ".join(res["errors"][:3]))


if __name__ == "__main__":
    main(sys.argv)
