#!/usr/bin/python3
"""eiofs: a read-only FUSE passthrough of ROOT at MOUNTPOINT whose reads fail on purpose,
for Ferry's I/O-error tests (there is no device-mapper `error` target to hand).

  - every read of a file named `bad-*` fails with EIO;
  - reads of a file named `flaky-*` fail with EIO through the first handle opened on it,
    and succeed through every later one (a transient error a fresh open gets past);
  - looking up a name `hang-*` never answers (a server that went away: the caller blocks
    in the kernel until the filesystem is unmounted);
  - a file named `endless-*` never ends: every read returns as many `x` bytes as asked, at
    any offset. Its size reads as 1 EiB, or as 0 with --direct-io, where reads past the
    size reach the filesystem (as procfs files and some FUSE filesystems behave);
  - everything else reads as ROOT has it. Times are passed in nanoseconds.

Usage: /usr/bin/python3 eiofs.py ROOT MOUNTPOINT [--direct-io]
(runs in the foreground until unmounted)
"""

import errno
import os
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations


class EioFS(Operations):
    use_ns = True

    def __init__(self, root, direct_io):
        self.root = root
        self.direct_io = direct_io
        self.mutex = threading.Lock()
        self.next_fh = 1
        self.fds = {}  # fh -> (fd, fails)
        self.opened = set()  # flaky paths opened at least once

    def _real(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        if os.path.basename(path).startswith("hang-"):
            while True:
                time.sleep(3600)
        st = os.lstat(self._real(path))
        attrs = {
            k: getattr(st, k)
            for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_rdev", "st_blocks")
        }
        if os.path.basename(path).startswith("endless-"):
            attrs["st_size"] = 0 if self.direct_io else 1 << 60
            attrs["st_blocks"] = attrs["st_size"] // 512
        attrs["st_atime"] = st.st_atime_ns
        attrs["st_mtime"] = st.st_mtime_ns
        attrs["st_ctime"] = st.st_ctime_ns
        return attrs

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._real(path))

    def readlink(self, path):
        return os.readlink(self._real(path))

    def access(self, path, mode):
        if mode & os.W_OK:
            raise FuseOSError(errno.EROFS)

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        name = os.path.basename(path)
        fd = os.open(self._real(path), os.O_RDONLY)
        with self.mutex:
            fails = name.startswith("bad-")
            if name.startswith("flaky-") and path not in self.opened:
                self.opened.add(path)
                fails = True
            fh = self.next_fh
            self.next_fh += 1
            self.fds[fh] = (fd, fails)
        return fh

    def read(self, path, size, offset, fh):
        if os.path.basename(path).startswith("endless-"):
            return b"x" * size
        with self.mutex:
            fd, fails = self.fds[fh]
        if fails:
            raise FuseOSError(errno.EIO)
        return os.pread(fd, size, offset)

    def release(self, path, fh):
        with self.mutex:
            fd, _ = self.fds.pop(fh)
        os.close(fd)

    def statfs(self, path):
        sv = os.statvfs(self._real(path))
        return {
            k: getattr(sv, k)
            for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        }


if __name__ == "__main__":
    args = sys.argv[1:]
    direct_io = "--direct-io" in args
    args = [a for a in args if a != "--direct-io"]
    if len(args) != 2:
        sys.exit("usage: eiofs.py ROOT MOUNTPOINT [--direct-io]")
    options = {"direct_io": True} if direct_io else {}
    FUSE(EioFS(args[0], direct_io), args[1], foreground=True, ro=True, nothreads=False, **options)
