"""attnverify's asv benchmark suite (see benchmarks/README.md).

asv imports every module of this package when it discovers benchmarks, so modules here import
torch only inside ``setup``: a skipped combination (no GPU, no target set) then costs no
torch import. Helper modules (``grid``, ``devices``, ``subjects``, ``measure``, ``allocator``)
hold no benchmarks; ``bench_*`` modules hold them; ``compare_peers`` is a script. Importing the
package pins glibc's heap (``allocator.py``) so that no timed call page-faults its output in.
"""

import sys as _sys

from .allocator import pin_glibc_heap as _pin_glibc_heap

_pin_glibc_heap()

if len(_sys.argv) > 1 and _sys.argv[1] == "run_server":
    # ``asv run --launch-method forkserver`` (CPU-only quick runs): import torch once in the
    # server so that forked benchmark processes do not each import it. This initialises no
    # CUDA; a forked child that uses CUDA initialises it itself.
    import torch  # noqa: F401
