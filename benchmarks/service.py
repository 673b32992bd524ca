"""Live memory on a stored corpus: `Memory` verbs, the proxy's added latency, write→searchable.

    python benchmarks/service.py [--sizes 10000,100000] [--calls 200] [--keep DIR] [--seed 0]

For every size N it writes N transcript turns (`ingest_search.write_corpus`: 20 conversations,
25-turn sessions, LoCoMo vocabulary) and builds the store with the pipeline (`run_all`, the
embedded defaults, no LLM), then times, warm, on the paths a user takes:

    add        Memory.add(messages) of one user turn: transcript line, rules extraction,
               reconciliation with the user's facts, journal + delta (durable on return)
    search     Memory.search, one user, one conversation (published index + live delta)
    query      Memory.query (memory.query, the supervisor's allowlist, bullets)
    context    Memory.context (the block injected before a turn)
    proxy      POST /v1/chat/completions through `memory-dag serve` (its own process, uvicorn
               on loopback; the real openai client) minus the same call made directly to the
               upstream (the tests' scripted OpenAI-compatible server, answering at once)
    write→searchable  one process adds a memory (`Memory.add(text)`); a second, warm process
               polls `Memory.search` for it; time from the start of the write to the first
               search that returns it

and prints p50 / p95 / mean in ms. The issue's aims on this machine kind: search and query
p50 <= 10 ms, add <= 20 ms, proxy overhead p50 <= 30 ms, write→searchable <= 100 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # the tests' scripted OpenAI-compatible server

from ingest_search import LOCOMO_DIR, load_locomo, make_queries, write_corpus  # noqa: E402
from serving import memory_dag_serve  # noqa: E402

from memory_dag.config import Settings  # noqa: E402
from memory_dag.memory import Memory  # noqa: E402
from memory_dag.pipeline import run_all  # noqa: E402

USER = "bench"

#: The second process of write→searchable: reads `<token> <t0>` lines, polls search for the
#: token, answers with the seconds from t0 (the writer's clock: one machine) to the first hit.
READER = """
import sys, time
from memory_dag import Memory
memory = Memory(path=sys.argv[1])
memory.search("warm up", user_id="bench", conversation_id="conv-00")
print("ready", flush=True)
for line in sys.stdin:
    token, started = line.split()
    deadline = time.time() + 10
    while not any(token in r.memory for r in memory.search(
            token, user_id="bench", conversation_id="conv-00", min_score=0.0, limit=10).results):
        if time.time() > deadline:
            print("missed", flush=True)
            break
        time.sleep(0.001)
    else:
        print(time.time() - float(started), flush=True)
"""


def percentiles(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"{statistics.median(ms):8.2f} {p95:8.2f} {statistics.fmean(ms):8.2f}"


def timed(call: Callable[[], object], times: int) -> list[float]:
    out = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def build_store(root: Path, size: int, seed: int) -> tuple[Settings, list[tuple[str, str]]]:
    sentences, pairs, questions = load_locomo(LOCOMO_DIR)
    settings = Settings(workspace=root / "workspace", db_path=root / "memory.duckdb",
                        index_dir=root / "index")  # fmt: skip
    names, samples = write_corpus(settings.workspace, size, sentences, pairs, seed)
    started = time.perf_counter()
    run_all(settings)
    print(f"store: {size:,} turns built by the pipeline in {time.perf_counter() - started:.1f}s")
    queries = make_queries(questions, samples, names, 400, random.Random(seed))
    return settings, queries


def measure_memory(memory: Memory, queries: list[tuple[str, str]], calls: int, rng) -> None:
    said = [q for q, _ in queries]
    picks = [rng.choice(queries) for _ in range(calls)]
    memory.search("warm up", user_id=USER, conversation_id="conv-00")
    counter = iter(range(10**9))

    def add() -> None:
        n = next(counter)
        text = f"I have started learning {rng.choice(said)[:60]} (note {n})."
        memory.add([{"role": "user", "content": text}], user_id=USER, conversation_id="conv-00")

    rows = {
        "add (rules)": timed(add, calls),
        "search": [],
        "query": [],
        "context": [],
    }
    for query, conversation in picks:
        scope = {"user_id": USER, "conversation_id": conversation}
        rows["search"] += timed(lambda q=query, s=scope: memory.search(q, **s), 1)
        rows["query"] += timed(
            lambda q=query, s=scope: memory.query(q, agent_id="supervisor", **s), 1
        )
        rows["context"] += timed(lambda q=query, s=scope: memory.context(q, **s), 1)
    for name, values in rows.items():
        print(f"  {name:<22} {percentiles(values)}   n={len(values)}")


def measure_proxy(memory: Memory, calls: int) -> None:
    import openai

    from tests.openai_server import Reply, ScriptedOpenAIServer

    settings = memory.settings
    with ScriptedOpenAIServer(handler=lambda body: Reply.text("Sure.")) as upstream:
        env = {
            **os.environ,
            "MEMORY_DAG_WORKSPACE": str(settings.workspace),
            "MEMORY_DAG_DB": str(settings.db_path),
            "MEMORY_DAG_INDEX_DIR": str(settings.index_dir),
            "MEMORY_DAG_UPSTREAM_BASE_URL": upstream.base_url,
        }
        with memory_dag_serve(env, "--user", USER) as url:
            direct = openai.OpenAI(base_url=upstream.base_url, api_key="x", max_retries=0)
            proxied = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            headers = {"X-Memory-Conversation": "conv-01"}
            message = [{"role": "user", "content": "What did we plan for the weekend?"}]

            def ask(client: openai.OpenAI, extra: dict[str, str]) -> None:
                client.chat.completions.create(model="m", messages=message, extra_headers=extra)

            for _ in range(5):
                ask(direct, {})
                ask(proxied, headers)
            plain, through = [], []
            for _ in range(calls):  # interleaved, so load hits both alike
                plain += timed(lambda: ask(direct, {}), 1)
                through += timed(lambda: ask(proxied, headers), 1)
    added = [t - p for t, p in zip(sorted(through), sorted(plain), strict=True)]
    print(f"  {'upstream direct':<22} {percentiles(plain)}   n={len(plain)}")
    print(f"  {'through the proxy':<22} {percentiles(through)}   n={len(through)} (serve)")
    print(f"  {'proxy overhead':<22} {percentiles(added)}   (proxy minus direct, by rank)")


def measure_write_to_searchable(memory: Memory, root: Path, calls: int) -> None:
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert reader.stdin is not None and reader.stdout is not None
    assert reader.stdout.readline().strip() == "ready"
    delays, missed = [], 0
    rng = random.Random(7)
    for n in range(calls):
        token = "".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(5))
        started = time.time()
        said = [{"role": "user", "content": f"My new code word is {token}, number {n}."}]
        memory.add(said, user_id=USER, conversation_id="conv-00")  # a turn: always recorded
        reader.stdin.write(f"{token} {started}\n")
        reader.stdin.flush()
        answer = reader.stdout.readline().strip()
        if answer == "missed":
            missed += 1
            print(f"  missed: write {n} ({token})")
        else:
            delays.append(float(answer))
    reader.stdin.close()
    reader.wait(timeout=60)
    print(f"  {'write→searchable':<22} {percentiles(delays)}   n={len(delays)} (2nd process), "
          f"missed after 10 s: {missed}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", help="build the stores here and keep them")
    args = parser.parse_args()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"memory-dag service benchmark  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")  # fmt: skip
    print(f"load average at start: {load}")
    for size in (int(s) for s in args.sizes.split(",")):
        root = Path(args.keep or tempfile.mkdtemp(prefix="memory-dag-service-")) / f"n{size}"
        shutil.rmtree(root, ignore_errors=True)
        print(f"\n=== {size:,} stored turns ===")
        settings, queries = build_store(root, size, args.seed)
        memory = Memory(settings)
        print(f"  {'':<22} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
        measure_memory(memory, queries, args.calls, random.Random(args.seed))
        measure_proxy(memory, args.calls)
        measure_write_to_searchable(memory, root, min(args.calls, 100))
        print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
