"""OpenBLAS, numpy's BLAS, starts its worker threads when numpy is imported, and lets them spin (yielding) for
2**28 cycles before they sleep, at start and after every call (``OPENBLAS_THREAD_TIMEOUT``): about 0.1 s of a core
per thread in every process that imports numpy (the server, the Python workers' template) and after each BLAS call a
model makes. At a cold start on two cores that spin took the second core from the Python workers' template for
0.1 s; a function pays for every CPU-second. Set before numpy's first import by the composition root, so that every
process we start inherits it; a user's own value wins. A BLAS call still gets its threads: they are woken for it
instead of being found spinning.
"""

from __future__ import annotations

import os

SPIN_ENV = "OPENBLAS_THREAD_TIMEOUT"
SHORTEST_SPIN = "4"  # 2**4 cycles, the least OpenBLAS takes


def short_openblas_spin() -> None:
    """Let OpenBLAS's idle threads sleep at once, in this process and the processes it starts (unless set)."""
    os.environ.setdefault(SPIN_ENV, SHORTEST_SPIN)
