"""Cold-start bootstrap: reads function.yaml, prepares the repository, runs the servers."""

from runtime.dataclass_code import use_compiled_code

use_compiled_code()  # before any module of the start makes a dataclass (runtime/dataclass_code.py)
