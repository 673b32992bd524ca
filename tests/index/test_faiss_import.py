"""FAISS is imported with the OpenBLAS kernel the CPU allows, and nothing else changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_dag.index.faiss_import import cpu_flags, openblas_kernel

AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("flags", "kernel"),
    [
        ({"sse2", "avx", "avx2", "fma", *AVX512}, "SkylakeX"),
        ({"avx", "avx2", "fma", "avx512f"}, "Haswell"),  # AVX-512 foundation alone: not enough
        ({"avx", "avx2", "fma"}, "Haswell"),
        ({"avx", "avx2"}, None),  # no FMA: Haswell's kernels would fault
        ({"sse2", "avx"}, None),
        (set(), None),
    ],
)
def test_the_kernel_is_the_best_the_flags_allow(flags: set[str], kernel: str | None) -> None:
    assert openblas_kernel(flags) == kernel


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 fma\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


_REPORT = """
import json, os
import memory_dag.index.vector_index  # imports FAISS the way every module does
from threadpoolctl import threadpool_info
kernels = {
    ("faiss" if "faiss" in pool["filepath"] else "numpy"): pool.get("architecture")
    for pool in threadpool_info()
    if pool["internal_api"] == "openblas" and "scipy.libs" not in pool["filepath"]
}
print(json.dumps({"kernels": kernels, "variable": os.environ.get("OPENBLAS_CORETYPE")}))
"""


def _kernels_in_a_new_process(**environment: str) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_CORETYPE"}
    done = subprocess.run(
        [sys.executable, "-c", _REPORT],
        env={**env, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _numpy_kernel_alone() -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import numpy; from threadpoolctl import threadpool_info; "
            "print([p['architecture'] for p in threadpool_info() "
            "if p['internal_api'] == 'openblas'][0])",
        ],
        env={key: value for key, value in os.environ.items() if key != "OPENBLAS_CORETYPE"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def test_faiss_gets_the_cpus_kernel_and_the_variable_is_restored() -> None:
    kernel = openblas_kernel(cpu_flags())
    if kernel is None:
        pytest.skip("this CPU (or OS) offers no kernel to choose: OpenBLAS chooses")
    report = _kernels_in_a_new_process()
    assert report["kernels"]["faiss"] == kernel  # type: ignore[index]
    # NumPy's OpenBLAS chose for itself, and no child process inherits the choice.
    assert report["kernels"]["numpy"] == _numpy_kernel_alone()  # type: ignore[index]
    assert report["variable"] is None


def test_a_users_own_kernel_is_kept() -> None:
    report = _kernels_in_a_new_process(OPENBLAS_CORETYPE="Sandybridge")
    assert report["kernels"]["faiss"] == "Sandybridge"  # type: ignore[index]
    assert report["variable"] == "Sandybridge"
