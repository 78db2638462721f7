"""The entry of a worker run by a model's own interpreter (``environment_process.py``):
``python -m handlers.python.environment_worker <worker|auto_complete> <connection fd> <progress fd> <server pid>
<name>``.  Runs under that interpreter with only numpy beside the standard library and our worker's packages."""

from __future__ import annotations

import mmap
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    mode, connection_fd, progress_fd, server_pid = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    connection = Connection(connection_fd)
    progress = memoryview(mmap.mmap(progress_fd, 16)).cast("q")
    first = connection.recv()
    from handlers.python.worker import auto_complete_main, worker_main

    if mode == "worker":
        worker_main(connection, first, server_pid, progress)
    elif mode == "auto_complete":
        spec, config = first
        auto_complete_main(connection, spec, config)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
