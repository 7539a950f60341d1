#!/usr/bin/env bash
# Ferry copy benchmark: ferry-agent vs cp -r, cp -a, xcp, cpz (fuc) and fcp on tmpfs and disk,
# and vs cp --reflink=always on a loop-mounted XFS (reflink=1).
# See bench/README.md for the protocol. Usage (from the repo root): make bench, or bench/run.sh
#   bench/run.sh clean    unmount the tmpfs and the XFS image, delete bench/work (trees, results)
#   BENCH_COLD=1 bench/run.sh   (make bench-cold) cold page cache: `sync; echo 3 >
#                        /proc/sys/vm/drop_caches` before every run, on the disk, a journalled
#                        ext4 image and the XFS image (ferry and cp with reflink off there), 5
#                        runs, no warmup; the 20k-file, 100k-file and 2 x 1 GiB trees; report
#                        to bench/COLD.md
#
# Environment (all optional):
#   BENCH_QUICK=1        tiny trees, 0 warmup, 1 run; report to bench/work/RESULTS-quick.md
#   BENCH_NO_BUILD=1     do not run `cargo build --release -p ferry-agent`
#   BENCH_NO_INSTALL=1   do not install tools (they must already be in place)
#   BENCH_SKIP_1M=1      skip the peak-RSS measurement on the 1M-file tree
#   BENCH_CHECK=0        skip the correctness gate after each tool (bench/check.py)
#   BENCH_RUNS, BENCH_WARMUP          hyperfine --runs / --warmup (default 5 / 1; quick 1 / 0)
#   BENCH_RUNS_DISK, BENCH_RUNS_XFS   --runs on the disk and on xfs (default 3 / 3; quick 1 / 1)
#   BENCH_FS="tmpfs disk xfs"         filesystems to run on (drop xfs to skip the XFS image;
#                                     cold: "disk ext4 xfs", ext4 a journalled ext4 image)
#   BENCH_TREES="many flat large sparse"              trees on tmpfs (and disk, by default)
#   BENCH_DISK_TREES="$BENCH_TREES"   trees on disk (the 100k-file tree takes ~1 min a copy on a slow VM disk)
#   BENCH_TOOLS="ferry ferry-verify cp-r cp-a rsync-a xcp cpz fcp"   tools on tmpfs and disk
#   BENCH_FERRY_REVS="5dd8a2d"        earlier Ferry revisions to time against this one, interleaved
#                                     (bench/ab.py) on the tmpfs trees many and flat; each is built
#                                     once and cached under $FERRY_TOOLS/ferry-revs
#   BENCH_AB_ROUNDS=15                rounds of that comparison (quick: 2)
#   BENCH_XFS_TREES="large many"      trees on xfs
#   BENCH_XFS_TOOLS="ferry cp-reflink cp-r xcp cpz fcp"      tools on xfs
#   BENCH_XFS_SIZE=12G                size of the sparse XFS image (quick: 1G); grown, never shrunk
#   BENCH_RSS_TOOLS="ferry"           tools whose peak RSS is measured on the 1M-file tree
#   BENCH_WORK=bench/work             work dir (gitignored); trees are cached there
#   BENCH_TMPFS_SIZE=10G              size of the tmpfs mounted at $BENCH_WORK/tmpfs
#   BENCH_RESULTS=bench/RESULTS.md    where the report goes
#   FERRY_BIN=target/release/ferry-agent
#   FERRY_TOOLS=/var/cache/ferry-tools   tool cache (cargo-installed peers under cargo/bin)
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$BENCH_DIR")"
QUICK="${BENCH_QUICK:-0}"
COLD="${BENCH_COLD:-0}"
WORK="${BENCH_WORK:-$BENCH_DIR/work}"
FERRY_TOOLS="${FERRY_TOOLS:-/var/cache/ferry-tools}"
TOOLS_BIN="$FERRY_TOOLS/cargo/bin"
FERRY="${FERRY_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/ferry-agent}"
if [[ "$COLD" == 1 ]]; then
    # Data that is not in the page cache, as a data mover meets it (the seed report's method).
    BENCH_FS="${BENCH_FS:-disk ext4 xfs}"
    BENCH_TREES="${BENCH_TREES:-small many large}"
    BENCH_TOOLS="${BENCH_TOOLS:-ferry xcp cpz fcp cp-a rsync-a}"
    BENCH_XFS_TREES="${BENCH_XFS_TREES:-$BENCH_TREES}"
    BENCH_XFS_TOOLS="${BENCH_XFS_TOOLS:-$BENCH_TOOLS}"
    BENCH_RUNS_DISK="${BENCH_RUNS_DISK:-5}"
    BENCH_RUNS_XFS="${BENCH_RUNS_XFS:-5}"
    # One untimed run first: the first run after another tree's (or tool's) deleted copy meets
    # its leftovers (online discards, writeback): up to 3x slower, and always the same tool.
    BENCH_WARMUP="${BENCH_WARMUP:-1}"
    BENCH_SKIP_1M=1
    BENCH_FERRY_REVS=""
fi
FILESYSTEMS="${BENCH_FS:-tmpfs disk xfs}"
TREES="${BENCH_TREES:-many flat large sparse}"
TOOLS="${BENCH_TOOLS:-ferry ferry-verify cp-r cp-a rsync-a xcp cpz fcp}"
FERRY_REVS="${BENCH_FERRY_REVS:-}"
XFS_TREES="${BENCH_XFS_TREES:-large many}"
DISK_TREES="${BENCH_DISK_TREES:-$TREES}"
XFS_TOOLS="${BENCH_XFS_TOOLS:-ferry cp-reflink cp-r xcp cpz fcp}"
XFS_IMG="$WORK/xfs.img"
EXT4_IMG="$WORK/ext4.img"
RSS_TOOLS="${BENCH_RSS_TOOLS:-ferry}"
CHECK="${BENCH_CHECK:-1}"
TMPFS_SIZE="${BENCH_TMPFS_SIZE:-10G}"

if [[ "$QUICK" == 1 ]]; then
    MODE=quick
    RUNS="${BENCH_RUNS:-1}"
    RUNS_DISK="${BENCH_RUNS_DISK:-$RUNS}"
    RUNS_XFS="${BENCH_RUNS_XFS:-$RUNS}"
    WARMUP="${BENCH_WARMUP:-0}"
    AB_ROUNDS="${BENCH_AB_ROUNDS:-2}"
    XFS_SIZE="${BENCH_XFS_SIZE:-1G}"
    RESULTS_MD="${BENCH_RESULTS:-$WORK/RESULTS-quick.md}"
else
    MODE=full
    RUNS="${BENCH_RUNS:-5}"
    RUNS_DISK="${BENCH_RUNS_DISK:-${BENCH_RUNS:-3}}"
    RUNS_XFS="${BENCH_RUNS_XFS:-${BENCH_RUNS:-3}}"
    WARMUP="${BENCH_WARMUP:-1}"
    AB_ROUNDS="${BENCH_AB_ROUNDS:-15}"
    XFS_SIZE="${BENCH_XFS_SIZE:-12G}"
    RESULTS_MD="${BENCH_RESULTS:-$BENCH_DIR/RESULTS.md}"
fi
if [[ "$COLD" == 1 ]]; then
    MODE="cold-$MODE"
    if [[ "$QUICK" == 1 ]]; then
        RESULTS_MD="${BENCH_RESULTS:-$WORK/COLD-quick.md}"
    else
        RESULTS_MD="${BENCH_RESULTS:-$BENCH_DIR/COLD.md}"
    fi
fi
RES="$WORK/results/$MODE"

log() { printf '\n[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------
# Tree specifications. Every tree is a directory generated deterministically (fixed seeds).
#   spec fields: generator, then its arguments.
# ---------------------------------------------------------------------------------------
GiB=$((1 << 30)) MiB=$((1 << 20))
declare -A SPEC DESC
if [[ "$MODE" == *full ]]; then
    SPEC[small]="ftzz -n 20000 -b 200000000 --seed 5"
    DESC[small]="about 20,000 files, 200 MB total, ftzz default depth, seed 5 (the seed report's tree)"
    SPEC[many]="ftzz -n 100000 -b 500000000 -d 5 --seed 1"
    DESC[many]="100,000 files, 500 MB total, ftzz depth 5 (about 1,000 dirs), seed 1"
    SPEC[flat]="ftzz -n 20000 -b 40000000 -d 0 --seed 2"
    DESC[flat]="20,000 files (about 2 KB each, 40 MB) in one directory, ftzz depth 0, seed 2"
    SPEC[large]="large 2 $GiB 3"
    DESC[large]="2 files of 1 GiB pseudo-random data, seed 3"
    SPEC[sparse]="sparse $((4 * GiB)) $((256 * MiB)) 4"
    DESC[sparse]="4 GiB apparent image with ~256 MiB of data in 4 KiB-8 MiB extents, plus a hole-only and a hole-at-end file, seed 4"
    SPEC[rss]="ftzz -n 1000000 -b 0 -d 5 --seed 5"
    DESC[rss]="1,000,000 empty files, ftzz depth 5, seed 5"
else
    SPEC[small]="ftzz -n 500 -b 5000000 --seed 5"
    DESC[small]="quick: 500 files, 5 MB, seed 5"
    SPEC[many]="ftzz -n 2000 -b 10000000 -d 5 --seed 1"
    DESC[many]="quick: 2,000 files, 10 MB, ftzz depth 5, seed 1"
    SPEC[flat]="ftzz -n 2000 -b 4000000 -d 0 --seed 2"
    DESC[flat]="quick: 2,000 files, 4 MB, in one directory, seed 2"
    SPEC[large]="large 2 $((16 * MiB)) 3"
    DESC[large]="quick: 2 files of 16 MiB, seed 3"
    SPEC[sparse]="sparse $((256 * MiB)) $((16 * MiB)) 4"
    DESC[sparse]="quick: 256 MiB apparent image with ~16 MiB data, seed 4"
    SPEC[rss]="ftzz -n 10000 -b 0 -d 5 --seed 5"
    DESC[rss]="quick: 10,000 empty files, seed 5"
fi

# Command line of TOOL copying $1 to $2, as one string for hyperfine -N (shell-word split).
tool_cmd() {
    local tool="$1" src="$2" dst="$3" fs="${4:-}" never=""
    # Cold on XFS: data is read and written, not cloned (where the tool can be told).
    [[ "$COLD" == 1 && "$fs" == xfs ]] && never=1
    case "$tool" in
        ferry) echo "$FERRY copy --no-progress --verify none ${never:+--reflink never }$src $dst" ;;
        ferry-verify) echo "$FERRY copy --no-progress --verify checksum $src $dst" ;;
        cp-r) echo "cp -r $src $dst" ;;
        cp-a) echo "cp -a ${never:+--reflink=never }$src $dst" ;;
        cp-reflink) echo "cp -a --reflink=always $src $dst" ;;
        # What VolSync's and pv-migrate's rsync movers run at heart (the trailing slash
        # copies the contents, so DST becomes a copy of SRC as with the others).
        rsync-a) echo "rsync -a $src/ $dst" ;;
        xcp) echo "$TOOLS_BIN/xcp -r --no-progress ${never:+--reflink never }$src $dst" ;;
        cpz) echo "$TOOLS_BIN/cpz $src $dst" ;;
        fcp) echo "$TOOLS_BIN/fcp $src $dst" ;;
        *) die "unknown tool $tool" ;;
    esac
}

# Which tools run on which tree: --verify checksum only on the many-small-files tree.
tool_applies() {
    local tool="$1" tree="$2"
    [[ "$tool" != ferry-verify || "$tree" == many ]]
}

# The cached release binary of ferry-agent at revision $1 (see build_rev).
rev_bin() {
    local sha
    sha="$(git -C "$REPO" rev-parse --short=12 "$1^{commit}")" || die "BENCH_FERRY_REVS: no revision $1"
    echo "$FERRY_TOOLS/ferry-revs/$sha/ferry-agent"
}

# This ferry against the earlier revisions in BENCH_FERRY_REVS, interleaved (bench/ab.py), on
# the tmpfs trees many and flat: RES/revs--TREE.json.
bench_revs() {
    local tree src bins=("ferry=$FERRY") rev
    for rev in $FERRY_REVS; do bins+=("ferry@$rev=$(rev_bin "$rev")"); done
    for tree in many flat; do
        [[ " $TREES " == *" $tree "* ]] || continue
        gen_tree tmpfs "$tree"
        src="$(fs_root tmpfs)/src/$tree"
        log "tmpfs/$tree: ferry against $FERRY_REVS, $AB_ROUNDS interleaved rounds"
        python3 "$BENCH_DIR/ab.py" "$AB_ROUNDS" "$src" "$(fs_root tmpfs)/dst" "$RES/revs--$tree.json" "${bins[@]}"
    done
}

# Build ferry-agent at revision $1 in a temporary worktree, once per revision.
build_rev() {
    local bin wt
    bin="$(rev_bin "$1")"
    [[ -x "$bin" ]] && return
    wt="$(mktemp -d)"
    log "building ferry-agent at $1 (cached as $bin)"
    git -C "$REPO" worktree add -q --detach "$wt" "$1"
    (cd "$wt" && CARGO_TARGET_DIR="$FERRY_TOOLS/ferry-revs/target" cargo build -q --release -p ferry-agent)
    mkdir -p "$(dirname "$bin")"
    cp "$FERRY_TOOLS/ferry-revs/target/release/ferry-agent" "$bin"
    git -C "$REPO" worktree remove --force "$wt"
}

# Trees, tools and hyperfine --runs per filesystem: xfs has its own lists (the reflink case).
fs_trees() {
  case "$1" in
    xfs) echo "$XFS_TREES" ;;
    disk|ext4) echo "$DISK_TREES" ;;
    *) echo "$TREES" ;;
  esac
}
fs_tools() { if [[ "$1" == xfs ]]; then echo "$XFS_TOOLS"; else echo "$TOOLS"; fi; }
fs_runs() {
    case "$1" in
        disk|ext4) echo "$RUNS_DISK" ;;
        xfs) echo "$RUNS_XFS" ;;
        *) echo "$RUNS" ;;
    esac
}
has_fs() { [[ " $FILESYSTEMS " == *" $1 "* ]]; }

# ---------------------------------------------------------------------------------------
setup_tools() {
    if [[ "${BENCH_NO_INSTALL:-0}" != 1 ]]; then
        FERRY_TOOLS="$FERRY_TOOLS" "$BENCH_DIR/install-tools.sh"
    fi
    for b in ftzz xcp cpz fcp; do
        [[ -x "$TOOLS_BIN/$b" ]] || die "$TOOLS_BIN/$b missing (run bench/install-tools.sh)"
    done
    command -v hyperfine >/dev/null || die "hyperfine missing"
    [[ -x /usr/bin/time ]] || die "/usr/bin/time missing"
    if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
        log "cargo build --release -p ferry-agent"
        (cd "$REPO" && cargo build --release -p ferry-agent)
    fi
    [[ -x "$FERRY" ]] || die "$FERRY not found (build it, or set FERRY_BIN)"
    for rev in $FERRY_REVS; do build_rev "$rev"; done
}

setup_dirs() {
    mkdir -p "$WORK/tmpfs" "$WORK/disk"
    # 10G: the full trees take ~3.5 GiB of tmpfs pages, and cpz and fcp fill the holes of the
    # sparse tree, so its copy takes ~4.2 GiB; 1M empty files need inodes, not pages.
    if mountpoint -q "$WORK/tmpfs"; then
        mount -o "remount,size=$TMPFS_SIZE,nr_inodes=4M" "$WORK/tmpfs"
    else
        log "mounting a $TMPFS_SIZE tmpfs at $WORK/tmpfs"
        mount -t tmpfs -o "size=$TMPFS_SIZE,nr_inodes=4M,mode=0755" ferry-bench "$WORK/tmpfs"
    fi
    [[ "$(stat -f -c %T "$WORK/tmpfs")" == tmpfs ]] || die "$WORK/tmpfs is not a tmpfs"
    [[ "$(stat -f -c %T "$WORK/disk")" != tmpfs ]] || die "$WORK/disk is on a tmpfs"
    check_room
    if has_fs xfs; then setup_xfs; fi
    if has_fs ext4; then setup_ext4; fi
    rm -rf "$RES"
    mkdir -p "$RES"
}

# A sparse image file $WORK/xfs.img (on the host disk) formatted with mkfs.xfs -m reflink=1 and
# loop-mounted at $WORK/xfs. Like the tmpfs it stays mounted between runs (trees stay cached);
# `run.sh clean` unmounts it. A quick run makes it 1G; a full run grows it to 12G in place.
setup_xfs() {
    if ! command -v mkfs.xfs >/dev/null || ! command -v xfs_growfs >/dev/null; then
        die "mkfs.xfs/xfs_growfs missing: apt-get install xfsprogs, or set BENCH_FS=\"tmpfs disk\""
    fi
    loop_image "$XFS_IMG" "$WORK/xfs" xfs "xfs_growfs -d $WORK/xfs" mkfs.xfs -q -m reflink=1
    grep -q 'reflink=1' <<<"$(xfs_info "$WORK/xfs")" || die "$WORK/xfs: XFS without reflink=1 (run bench/run.sh clean)"
}

# A sparse image file $WORK/ext4.img (on the host disk) formatted by mkfs.ext4 with its
# defaults (a journal, flex_bg) and loop-mounted at $WORK/ext4: the filesystem a node's
# disk usually has. `/` on the machine this was written on is ext4 *without* a journal, where
# the inode allocator skips (and rescans, for every new file) inodes deleted in the last
# minutes, so a copy right after deleting the previous one measures that scan too (see
# bench/README.md); a journalled ext4 has no such scan.
setup_ext4() {
    command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 missing: apt-get install e2fsprogs"
    # Online resize2fs is refused here (EPERM): a smaller image is made anew (its trees too).
    loop_image "$EXT4_IMG" "$WORK/ext4" ext2/ext3 "" mkfs.ext4 -q -F
}

# Stop early when the host disk cannot hold what the run writes: each image may fill up to
# $XFS_SIZE (a filesystem does not hand freed blocks back to its image file), plus the trees
# and one copy on the disk itself. A full cold run filled a disk with 21 GiB free.
check_room() {
    local need=0 img fs have avail
    for fs in xfs ext4; do
        has_fs "$fs" || continue
        img="$WORK/$fs.img"
        have=0
        [[ ! -f "$img" ]] || have=$(($(stat -c %b "$img") * 512))
        need=$((need + $(numfmt --from=iec "$XFS_SIZE") - have))
    done
    if has_fs disk; then need=$((need + 8 * GiB)); fi
    avail=$(($(stat -f -c %a "$WORK") * $(stat -f -c %S "$WORK")))
    ((avail >= need)) || die "the run may write $(numfmt --to=iec "$need") to the host disk and only $(numfmt --to=iec "$avail") is free: free some, or set BENCH_XFS_SIZE, BENCH_FS or BENCH_DISK_TREES lower"
}

# loop_image IMG MNT STATFS_TYPE GROW MKFS...: make the sparse image IMG ($XFS_SIZE) with the
# command MKFS... IMG unless it exists, loop-mount it at MNT unless mounted (it stays mounted
# between runs, so its trees stay cached; `run.sh clean` unmounts it), check that MNT is IMG
# and of STATFS_TYPE (stat -f), and grow it to $XFS_SIZE if it is smaller: in place with
# the command GROW, or, when GROW is empty, by making it anew. Never shrunk.
loop_image() {
    local img="$1" mnt="$2" type="$3" grow="$4" want have dev back
    shift 4
    want="$(numfmt --from=iec "$XFS_SIZE")"
    mkdir -p "$mnt"
    if ! mountpoint -q "$mnt"; then
        if [[ ! -f "$img" ]]; then
            log "creating a $XFS_SIZE sparse image ($*) at $img"
            truncate -s "$XFS_SIZE" "$img"
            "$@" "$img" || { rm -f "$img"; die "$1 failed"; }
        fi
        log "loop-mounting $img at $mnt"
        mount -o loop "$img" "$mnt" ||
            die "mount -o loop $img failed (no loop devices?); BENCH_FS without $(basename "$mnt") skips it"
    fi
    dev="$(findmnt -n -o SOURCE --mountpoint "$mnt")"
    back="$(losetup -n -O BACK-FILE "$dev" 2>/dev/null | sed 's/ *$//')"
    [[ "$back" -ef "$img" ]] || die "$mnt is mounted from $dev, not from $img (run bench/run.sh clean)"
    [[ "$(stat -f -c %T "$mnt")" == "$type" ]] || die "$mnt is not a $type"
    # Cold, the image is read and written with direct I/O on the image file: buffered, the
    # loop device reads it one request at a time through the image's own page cache, which
    # held every tool to the same ~1.0 s on the 20k-file tree on ext4 whatever its workers
    # (ferry 4, 16 or 64 workers, xcp: 0.94-1.11 s); with direct I/O the reads reach the
    # disk as deep as the filesystem above asks, as a partition's do (ferry 0.89-0.93 s,
    # xcp 1.28-1.29 s). Warm runs keep the buffered default their numbers were taken with.
    local dio=off
    [[ "$COLD" != 1 ]] || dio=on
    losetup --direct-io="$dio" "$dev" || die "losetup --direct-io=$dio $dev failed"
    have="$(stat -c %s "$img")"
    if ((have < want)) && [[ -z "$grow" ]]; then
        log "making $img anew at $XFS_SIZE (it was $(numfmt --to=iec "$have"))"
        umount "$mnt"
        rm -f "$img"
        loop_image "$img" "$mnt" "$type" "$grow" "$@"
    elif ((have < want)); then
        log "growing $img from $(numfmt --to=iec "$have") to $XFS_SIZE"
        truncate -s "$XFS_SIZE" "$img"
        losetup -c "$dev"
        $grow >/dev/null || die "$grow failed"
    fi
}

fs_root() { echo "$WORK/$1/$MODE"; }

# Generate tree $2 on filesystem $1 (cached: regenerated only if its spec changed).
gen_tree() {
    local fs="$1" tree="$2" root dir spec
    root="$(fs_root "$fs")"
    dir="$root/src/$tree"
    spec="${SPEC[$tree]}"
    if [[ -d "$dir" && "$(cat "$dir.spec" 2>/dev/null)" == "$spec v1" ]]; then
        return
    fi
    log "generating $fs/$tree: $spec"
    rm -rf "$dir" "$dir.spec"
    mkdir -p "$root/src"
    # shellcheck disable=SC2086
    set -- $spec
    case "$1" in
        ftzz) shift; "$TOOLS_BIN/ftzz" -q -e "$@" "$dir" ;;
        large) python3 "$BENCH_DIR/gen_files.py" large "$dir" "$2" "$3" "$4" ;;
        sparse) python3 "$BENCH_DIR/gen_files.py" sparse "$dir" "$2" "$3" "$4" ;;
        *) die "bad spec $spec" ;;
    esac
    sync -f "$dir"
    echo "$spec v1" >"$dir.spec"
}

bench_one() {
    local fs="$1" tree="$2" tool="$3" root src dst cmd base
    root="$(fs_root "$fs")"
    src="$root/src/$tree"
    # DST is RUN/dst, RUN a symlink to a directory made anew, under a new name, before every
    # run, under a parent marked as the top of a hierarchy (`chattr +T`, ext4's Orlov flag:
    # a new subdirectory goes to the group with the fewest directories, searched from a hash
    # of its name). So each run's copy lands in a fresh region of the disk, as a copy onto a
    # new volume does, not on the inodes the previous run's copy freed a moment before: on
    # ext4 without a journal, the allocator rescans past each of those for every new file
    # for up to 6 minutes (bench/README.md), which measured the delete, not the copy. (A
    # fixed name hashes to the same group every time: the symlink keeps the command line
    # fixed for hyperfine while the name changes.)
    dst="$root/run/dst"
    chattr +T "$root" 2>/dev/null || true
    base="$RES/$fs--$tree--$tool"
    cmd="$(tool_cmd "$tool" "$src" "$dst" "$fs")"
    local prepare="rm -rf $root/run $root/run.* && d=\$(mktemp -d $root/run.XXXXXXXX) && ln -sfn \${d##*/} $root/run && sync"
    rm -rf "$root/dst"
    sh -c "$prepare"
    [[ "$COLD" != 1 ]] || prepare="$prepare && echo 3 > /proc/sys/vm/drop_caches"
    log "$fs/$tree: $tool: $cmd"
    if hyperfine -N --warmup "$WARMUP" --runs "$(fs_runs "$fs")" \
        --prepare "sh -c '$prepare'" \
        --command-name "$tool" --export-json "$base.json" "$cmd"; then
        if [[ "$CHECK" == 1 ]]; then
            # On xfs, also count the bytes of DST that share blocks (reflinked) with SRC.
            local shared=()
            [[ "$fs" != xfs ]] || shared=(--shared)
            python3 "$BENCH_DIR/check.py" "${shared[@]}" "$src" "$dst" "$base.check.json"
        fi
        if [[ "$fs" == xfs && "$tool" == ferry ]]; then
            ferry_summary "$src" "$dst" "$base.summary.json"
        fi
    else
        echo "hyperfine failed (the command exited non-zero)" >"$base.failed"
        # Show why, once, outside hyperfine.
        rm -rf "$dst"
        # shellcheck disable=SC2086
        $cmd 2>&1 | tail -n 5 >>"$base.failed" || true
        cat "$base.failed" >&2
        rm -f "$base.json"
    fi
    rm -rf "$dst"
}

# One more, untimed, ferry run with --json: its summary says how the bytes were moved
# (bytes_reflinked / bytes_copy_file_range / bytes_read_write).
ferry_summary() {
    local src="$1" dst="$2" out="$3"
    rm -rf "$dst"
    sync
    log "ferry --json summary: $FERRY copy --no-progress --json $src $dst"
    if ! "$FERRY" copy --no-progress --json "$src" "$dst" >"$out.tmp"; then
        echo "ferry --json run failed (exit non-zero)" >&2
    fi
    if python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out.tmp" 2>/dev/null; then
        mv "$out.tmp" "$out"
    else
        echo "ferry --json printed no JSON object; see $out.bad" >&2
        mv "$out.tmp" "$out.bad"
    fi
}

measure_rss() {
    local fs=tmpfs tree=rss root src dst tool cmd
    root="$(fs_root "$fs")"
    src="$root/src/$tree"
    dst="$root/dst"
    gen_tree "$fs" "$tree"
    for tool in $RSS_TOOLS; do
        cmd="$(tool_cmd "$tool" "$src" "$dst")"
        rm -rf "$dst"
        sync
        log "peak RSS: $fs/$tree: $cmd"
        # shellcheck disable=SC2086
        if /usr/bin/time -f '%M %e %U %S' -o "$RES/rss--$tool.time" $cmd >/dev/null; then
            printf '%s\t%s\t%s\t%s\n' "$tool" "$fs" "$tree" "$(cat "$RES/rss--$tool.time")" \
                >>"$RES/rss.tsv"
            if [[ "$CHECK" == 1 ]]; then
                python3 "$BENCH_DIR/check.py" --no-content "$src" "$dst" "$RES/rss--$tool.check.json"
            fi
        else
            printf '%s\t%s\t%s\tfailed\n' "$tool" "$fs" "$tree" >>"$RES/rss.tsv"
        fi
        rm -rf "$dst"
    done
}

tool_version() {
    case "$1" in
        ferry) "$FERRY" --version 2>/dev/null | head -n1 || echo "ferry-agent (no --version)" ;;
        ferry@*) echo "ferry-agent at $(git -C "$REPO" rev-parse --short "${1#ferry@}")" ;;
        cp) cp --version | head -n1 ;;
        rsync) rsync --version | head -n1 ;;
        fcp) echo "fcp $("$TOOLS_BIN/fcp" --version 2>&1 | head -n1)" ;;
        xcp | cpz | ftzz) "$TOOLS_BIN/$1" --version 2>&1 | head -n1 ;;
        hyperfine) hyperfine --version | head -n1 ;;
        python3) python3 --version ;;
    esac
}

# Union, in first-seen order, of "$1 FS" over the filesystems that run.
all_of() {
    local fs x seen=" "
    for fs in $FILESYSTEMS; do
        for x in $("$1" "$fs"); do
            [[ "$seen" == *" $x "* ]] || seen="$seen$x "
        done
    done
    echo "$seen"
}

write_meta() {
    local m="$RES/meta.tsv" rev
    rev="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)"
    if [[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null | head -n1)" ]]; then rev="$rev (dirty tree)"; fi
    {
        printf 'date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
        printf 'mode\t%s\n' "$MODE"
        printf 'cold\t%s\n' "$COLD"
        printf 'runs\t%s\n' "$RUNS"
        printf 'runs_disk\t%s\n' "$RUNS_DISK"
        printf 'runs_xfs\t%s\n' "$RUNS_XFS"
        if has_fs ext4; then printf 'runs_ext4\t%s\n' "$RUNS_DISK"; fi
        printf 'filesystems\t%s\n' "$FILESYSTEMS"
        printf 'warmup\t%s\n' "$WARMUP"
        printf 'nproc\t%s\n' "$(nproc)"
        printf 'cpu\t%s\n' "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
        printf 'kernel\t%s\n' "$(uname -srm)"
        printf 'memory\t%s\n' "$(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
        printf 'disk\t%s\n' "$(findmnt -n -o SOURCE,FSTYPE,OPTIONS -T "$WORK/disk" | awk '{print $1 " " $2 " (" $3 ")"}')"
        printf 'tmpfs\t%s\n' "$(findmnt -n -o OPTIONS -T "$WORK/tmpfs")"
        if has_fs xfs; then
            printf 'xfs\tloop-mounted XFS (mkfs.xfs -m reflink=1, %s) on %s, options %s; image %s: %s sparse file on the host disk (%s)\n' \
                "$(mkfs.xfs -V | awk '{print $NF}' | sed 's/^/xfsprogs /')" \
                "$(findmnt -n -o SOURCE --mountpoint "$WORK/xfs")" \
                "$(findmnt -n -o OPTIONS --mountpoint "$WORK/xfs")" \
                "${XFS_IMG#"$REPO"/}" "$(numfmt --to=iec "$(stat -c %s "$XFS_IMG")")" \
                "$(findmnt -n -o SOURCE,FSTYPE -T "$XFS_IMG" | awk '{print $1 " " $2}')"
        fi
        if has_fs ext4; then
            printf 'ext4\tloop-mounted ext4 (mkfs.ext4 defaults, %s: journal %s) on %s, options %s; image %s: %s sparse file on the host disk (%s)\n' \
                "$(mkfs.ext4 -V 2>&1 | head -n1 | awk '{print $1 " " $2}')" \
                "$(dumpe2fs -h "$(findmnt -n -o SOURCE --mountpoint "$WORK/ext4")" 2>/dev/null | grep -q has_journal && echo yes || echo no)" \
                "$(findmnt -n -o SOURCE --mountpoint "$WORK/ext4")" \
                "$(findmnt -n -o OPTIONS --mountpoint "$WORK/ext4")" \
                "${EXT4_IMG#"$REPO"/}" "$(numfmt --to=iec "$(stat -c %s "$EXT4_IMG")")" \
                "$(findmnt -n -o SOURCE,FSTYPE -T "$EXT4_IMG" | awk '{print $1 " " $2}')"
        fi
        printf 'ferry_rev\t%s\n' "$rev"
        printf 'ferry_bin\t%s\n' "$FERRY"
        for t in ferry cp rsync xcp cpz fcp ftzz hyperfine python3 ${FERRY_REVS:+$(printf 'ferry@%s ' $FERRY_REVS)}; do
            printf 'version:%s\t%s\n' "$t" "$(tool_version "$t")"
        done
        for tool in $(all_of fs_tools); do
            printf 'cmd:%s\t%s\n' "$tool" "$(tool_cmd "$tool" SRC DST | sed "s#$TOOLS_BIN/##; s#$FERRY#ferry-agent#; s#$FERRY_TOOLS/ferry-revs/\([0-9a-f]*\)/ferry-agent#ferry-agent@\1#")"
        done
        for tree in $(all_of fs_trees) rss; do
            [[ -n "${DESC[$tree]:-}" ]] || continue
            printf 'tree:%s\t%s\n' "$tree" "${DESC[$tree]}"
        done
    } >"$m"
}

# How noisy the disk is, so a reader can judge the cold ratios: 5 direct (uncached) reads
# of one 1 GiB file of the large tree, MB/s each (dd's own figure).
disk_noise() {
    local f speeds=()
    f="$(find "$(fs_root disk)/src/large" -type f 2>/dev/null | sort | head -n1 || true)"
    [[ -n "$f" ]] || return 0
    for _ in 1 2 3 4 5; do
        sync
        echo 3 >/proc/sys/vm/drop_caches
        speeds+=("$(dd if="$f" of=/dev/null bs=1M iflag=direct 2>&1 | awk -F', ' '/copied/ {print $NF}')")
    done
    log "disk read (dd iflag=direct, $f): ${speeds[*]}"
    printf 'disk_read\t%s\n' "$(IFS=';'; echo "${speeds[*]}")" >>"$RES/meta.tsv"
}

clean() {
    if mountpoint -q "$WORK/tmpfs"; then umount "$WORK/tmpfs"; fi
    # mount -o loop set up the loop device with autoclear: umount detaches it too.
    if mountpoint -q "$WORK/xfs"; then umount "$WORK/xfs"; fi
    if mountpoint -q "$WORK/ext4"; then umount "$WORK/ext4"; fi
    rm -rf "$WORK"
}

main() {
    local start=$SECONDS fs tree tool
    if [[ "${1:-}" == clean ]]; then
        clean
        return
    fi
    setup_tools
    setup_dirs
    write_meta
    for fs in $FILESYSTEMS; do
        for tree in $(fs_trees "$fs"); do
            gen_tree "$fs" "$tree"
            for tool in $(fs_tools "$fs"); do
                tool_applies "$tool" "$tree" || continue
                bench_one "$fs" "$tree" "$tool"
            done
        done
    done
    if [[ "$COLD" == 1 ]] && has_fs disk; then
        disk_noise
    fi
    if [[ -n "$FERRY_REVS" ]] && has_fs tmpfs; then
        bench_revs
    fi
    if [[ "${BENCH_SKIP_1M:-0}" != 1 ]]; then
        measure_rss
    fi
    printf 'elapsed_s\t%s\n' "$((SECONDS - start))" >>"$RES/meta.tsv"
    if has_fs xfs; then
        printf 'xfs_img_alloc\t%s\n' "$(du -h "$XFS_IMG" | cut -f1)" >>"$RES/meta.tsv"
    fi
    local rc=0
    # Debian's python3 has the charts' matplotlib (install-tools.sh); another python3 first
    # on PATH (pyenv) may not.
    local py=python3
    if ! python3 -c 'import matplotlib' 2>/dev/null && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
        py=/usr/bin/python3
    fi
    "$py" "$BENCH_DIR/report.py" "$RES" "$RESULTS_MD" || rc=$?
    cat "$RESULTS_MD"
    log "done in $((SECONDS - start))s; report: $RESULTS_MD; raw hyperfine JSON: $RES"
    if ((rc == 3)); then
        log "ferry failed or made a wrong copy (see the report); exiting 1"
        return 1
    fi
    return "$rc"
}

main "$@"
