"""One timed run of a command, shared by the benchmarks written in Python
(small-files.py, million.py): wall time, CPU and, if asked, peak RSS."""
import os
import subprocess
import tempfile
import time


def run(cmd, peak_rss=True):
    """Run cmd to completion: (wall s, user+sys CPU s, peak RSS KiB or None). The CPU is
    wait4's, the process's and its reaped children's. Raises on a non-zero exit status,
    with the end of the command's stderr (kept in a file, so a chatty failure cannot fill
    a pipe and hang the run)."""
    # The peak RSS is GNU time's (%M, its child's ru_maxrss): a process forked from this
    # Python and exec'd keeps this Python's high-water mark in its own (the kernel carries
    # the old mm's peak over exec), so wait4's figure here would never read below ~15 MB.
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        argv = ["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd if peak_rss else cmd
        t = time.perf_counter()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            msg = err.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"{' '.join(cmd)}: exit status {code}\n{msg}")
        peak = int(rss.read().split()[-1]) if peak_rss else None
    return wall, ru.ru_utime + ru.ru_stime, peak
