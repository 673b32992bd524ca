"""FAISS's IVF build with the OpenBLAS kernel its wheel picks, and with the one memory-dag picks.

    python benchmarks/faiss_kernel.py [--size 115000] [--repeats 3]

The faiss-cpu wheel bundles its own OpenBLAS, which chooses its matrix kernels by CPU model;
`memory_dag/index/faiss_import.py` imports FAISS with the kernel the CPU's flags allow. Each
measurement runs in a fresh process (OpenBLAS chooses once, when it is loaded), the two ways
alternating: which kernel FAISS's and NumPy's OpenBLAS use, then `vector_index.build_faiss` of
`--size` random unit vectors of 256 floats (k-means training and list assignment, as the index
step builds it: ~115k rows at 100k turns), wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
if sys.argv[1] == "wheel":
    import faiss  # first: its OpenBLAS chooses by itself, and memory-dag keeps that choice
from memory_dag.index.vector_index import build_faiss
import numpy as np
from threadpoolctl import threadpool_info

kernels = {
    ("faiss" if "faiss" in pool["filepath"] else "numpy"): pool.get("architecture")
    for pool in threadpool_info()
    if pool["internal_api"] == "openblas" and "scipy.libs" not in pool["filepath"]
}
vectors = np.random.default_rng(0).standard_normal((int(sys.argv[2]), 256), dtype=np.float32)
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
wall, cpu = time.perf_counter(), time.process_time()
index = build_faiss(vectors)
print(json.dumps({
    "kernels": kernels, "lists": int(index.nlist),
    "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
}))
"""


def measure(how: str, size: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(size)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=115_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, object]]] = {"wheel": [], "memory-dag": []}
    for repeat in range(args.repeats):
        for how in runs:
            run = measure(how, args.size)
            runs[how].append(run)
            print(
                f"[{repeat + 1}/{args.repeats}] {how:>10}: faiss's OpenBLAS {run['kernels']}, "
                f"{run['lists']} lists, build {run['wall']:.2f} s wall, {run['cpu']:.2f} CPU s",
                flush=True,
            )
    print(f"medians, {args.size:,} vectors of 256 floats:")
    for how, measured in runs.items():
        wall = statistics.median(float(run["wall"]) for run in measured)  # type: ignore[arg-type]
        cpu = statistics.median(float(run["cpu"]) for run in measured)  # type: ignore[arg-type]
        print(f"  {how:>10}: build {wall:.2f} s wall, {cpu:.2f} CPU s")


if __name__ == "__main__":
    main()
