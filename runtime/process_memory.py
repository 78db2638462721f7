"""A process's resident memory of its own, shared memory left out.

The server and its Python workers map the same shared memory (the tensor pool requests are received into, each
worker's arenas): its pages show in the resident size of every process that touched them.  Summed over a process
tree, or held against one worker's limit, they would count once per process, so a worker's own memory leaves out
its resident shared memory (``RssShmem``); the process that owns the pool counts it once.
"""

from __future__ import annotations


def own_resident_bytes(pid: int) -> int:
    """``pid``'s resident bytes less its resident shared memory (memfd and tmpfs pages); 0 once it is gone.  Where
    /proc gives no split, its whole resident size."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            fields = dict(line.split(b":", 1) for line in status.read().splitlines() if b":" in line)
        return (int(fields[b"VmRSS"].split()[0]) - int(fields[b"RssShmem"].split()[0])) * 1024
    except (KeyError, ValueError, IndexError):
        pass
    except OSError:
        return 0
    import psutil  # only where /proc gives no split (psutil is not loaded at start-up)

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0
