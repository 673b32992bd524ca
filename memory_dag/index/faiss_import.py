"""FAISS, imported with the OpenBLAS kernel that matches the CPU.

The faiss-cpu wheel bundles its own OpenBLAS (0.3.15), which picks its matrix kernels by CPU
model. It does not know the newer Xeons (this project's 2-core machines, Sapphire Rapids
class, with AVX-512), so it falls back to its generic SSE3 kernel, "Prescott": FAISS's
k-means and list assignment ran ~5x slower than the same products in NumPy, whose newer
OpenBLAS picks "SkylakeX" (0.43 s against 0.08 s for 21,696 × 1,356 inner products; the IVF
build of 115k vectors took ~10 s of the index step's critical path).

OpenBLAS reads `OPENBLAS_CORETYPE` when it is loaded, so FAISS is imported here with the
kernel the CPU's flags allow (AVX-512 → SkylakeX, AVX2 + FMA → Haswell), and the variable is
restored after: NumPy's own OpenBLAS, loaded first, and child processes pick their kernels
themselves. A user's own `OPENBLAS_CORETYPE` is left as it is. Every module imports FAISS
from here (`from memory_dag.index.faiss_import import faiss`); a process that imported FAISS
before memory-dag keeps the kernel it got.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

#: CPU flags each kernel needs (as /proc/cpuinfo names them), best first.
KERNELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("SkylakeX", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("Haswell", frozenset({"avx2", "fma"})),
)
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags (none where there is no /proc/cpuinfo: not Linux)."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def openblas_kernel(flags: Iterable[str]) -> str | None:
    """The best OpenBLAS kernel these CPU flags allow, or None: let OpenBLAS choose."""
    have = set(flags)
    return next((kernel for kernel, needs in KERNELS if needs <= have), None)


def import_faiss() -> ModuleType:
    """`import faiss`, its OpenBLAS on the kernel `openblas_kernel` chooses (see the module)."""
    kernel = None
    if "faiss" not in sys.modules and "OPENBLAS_CORETYPE" not in os.environ:
        import numpy  # noqa: F401  (its OpenBLAS loads now, before the variable is set)

        kernel = openblas_kernel(cpu_flags())
    if kernel is not None:
        os.environ["OPENBLAS_CORETYPE"] = kernel
    try:
        return importlib.import_module("faiss")
    finally:
        if kernel is not None:
            del os.environ["OPENBLAS_CORETYPE"]


faiss = import_faiss()
