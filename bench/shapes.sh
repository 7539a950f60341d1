#!/usr/bin/env bash
# Memory and descriptors by tree shape (issue 19, item 11): builds three trees on a tmpfs
# (300k hard-linked pairs, a 3,000-level chain of 255-byte names, one directory of 3M
# files), copies each with every tool in SHAPES_TOOLS, and records peak RSS, the most
# descriptors open at once, and wall time (bench/shapes.py measure). See bench/README.md,
# "Tree shapes", and bench/SHAPES.md for the last run.
#
#   bench/shapes.sh            # all three shapes, full size (~5 min, ~3 more to build the
#                              # trees the first time; ~6 GiB of RAM for 6M tmpfs inodes)
#   bench/shapes.sh clean      # unmount the tmpfs
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=${SHAPES_WORK:-$here/work/shapes}
scale=${SHAPES_SCALE:-1}
shapes=${SHAPES:-links chain flat}
ferry=${FERRY_BIN:-$here/../target/release/ferry-agent}
base=${FERRY_BASE_BIN:-}
tools=${SHAPES_TOOLS:-ferry${base:+ ferry-base} cp-a}

if [ "${1:-}" = clean ]; then
    if mountpoint -q "$work"; then umount "$work"; fi
    rm -rf "$work"
    exit 0
fi

mkdir -p "$work"
if ! mountpoint -q "$work"; then
    # 3M inodes (and as many again for a copy) need more than tmpfs's default inode count.
    mount -t tmpfs -o "size=${SHAPES_TMPFS_SIZE:-16G},nr_inodes=16M" tmpfs "$work"
fi
out=${SHAPES_OUT:-$work/results.jsonl}
: >"$out"
echo "cores: $(nproc), $(date -u +%Y-%m-%dT%H:%MZ), scale 1/$scale, results in $out"

for shape in $shapes; do
    src=$work/$shape-src
    dst=$work/$shape-dst
    if [ ! -e "$src.done" ]; then
        rm -rf "$src"
        echo "building $shape..."
        python3 "$here/shapes.py" gen "$shape" "$src" "$scale"
        touch "$src.done"
    fi
    for tool in $tools; do
        rm -rf "$dst"
        case $tool in
        ferry) cmd=("$ferry" copy --no-progress --verify none "$src" "$dst") ;;
        ferry-base) cmd=("$base" copy --no-progress --verify none "$src" "$dst") ;;
        cp-a) cmd=(cp -a "$src" "$dst") ;;
        *) echo "unknown tool $tool" >&2; exit 2 ;;
        esac
        python3 "$here/shapes.py" measure "$out" "$shape / $tool" -- "${cmd[@]}"
        python3 "$here/shapes.py" check "$shape" "$src" "$dst" "$scale" || echo "$shape / $tool: WRONG COPY" >&2
    done
    rm -rf "$dst"
done
python3 "$here/shapes.py" table "$out"
