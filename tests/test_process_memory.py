"""A process's own resident memory (runtime/process_memory.py): shared memory it touched is left out, what it
allocated itself is counted; a process that is gone has none."""

from __future__ import annotations

import subprocess
import sys

from runtime.process_memory import own_resident_bytes

MIB = 1 << 20
CHILD = """
import mmap, os, sys
fd = os.memfd_create("shared")
os.ftruncate(fd, 96 << 20)
shared = mmap.mmap(fd, 96 << 20)
shared.write(b"x" * (96 << 20))  # 96 MiB of shared memory, resident
own = bytearray(os.urandom(1 << 20)) * 48  # 48 MiB of its own
print("ready", flush=True)
sys.stdin.readline()
"""


def test_shared_memory_is_left_out_and_its_own_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        own = own_resident_bytes(child.pid)
        assert 48 * MIB <= own < 48 * MIB + 64 * MIB  # its own 48 MiB and an interpreter, not the 96 shared
    finally:
        child.communicate("\n", timeout=30)
    assert own_resident_bytes(child.pid) == 0  # gone
