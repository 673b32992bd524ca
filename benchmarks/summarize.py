"""Summarization time per conversation over LoCoMo, on the embedded defaults.

    python benchmarks/summarize.py [--data DIR] [--store DIR]

Builds a store from the conversations (`write_workspace` + `run_all`), then summarizes each
conversation with `summarize_conversation` (extractive unless MEMORY_DAG_LLM_* configure an
LLM) and prints level, tokens in/out, ratio, tree size and seconds per step. Ends with the
embed + index stages that make the summaries searchable, and a second pass that shows the
skip of unchanged conversations.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.eval.locomo import write_workspace
from memory_dag.index.build import build_search_index
from memory_dag.pipeline import run_all
from memory_dag.summaries.conversation_summaries import conversation_ids
from memory_dag.summaries.refresh import summarize_conversation

DEFAULT_DATA = Path("/work/shared/datasets/locomo-dev")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--store", type=Path, help="keep the store here (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="summarize-bench-") as scratch:
        root = args.store or Path(scratch)
        settings = Settings.load(
            workspace=root / "workspace", db_path=root / "memory.duckdb", index_dir=root / "index"
        )
        corpus = write_workspace(sorted(args.data.glob("*.json")), settings.workspace)
        started = time.perf_counter()
        run_all(settings)
        print(
            f"store: {corpus['conversations']} conversations, {corpus['sessions']} sessions, "
            f"{corpus['turns']} turns; ingest {time.perf_counter() - started:.1f}s\n"
        )

        header = (
            f"{'conversation':<12} {'turns':>5} {'level':<12} {'in':>6} {'out':>5} {'ratio':>6} "
            f"{'L1':>3} {'L2':>3} {'method':<10} {'gather':>7} {'summ.':>7} {'write':>7} "
            f"{'total':>7}"
        )
        print(header)
        print("-" * len(header))
        totals = 0.0
        for conversation_id in conversation_ids(settings):
            run = summarize_conversation(settings, conversation_id)
            seconds = run.seconds
            total = sum(seconds.values())
            totals += total
            print(
                f"{conversation_id:<12} {run.turns:>5} {run.level.value:<12} "
                f"{run.input_tokens:>6} {run.output_tokens:>5} {run.compression_ratio:>6.3f} "
                f"{run.l1:>3} {run.l2:>3} {run.method:<10} {seconds['gather']:>6.2f}s "
                f"{seconds['summarize']:>6.2f}s {seconds['write']:>6.2f}s {total:>6.2f}s"
            )
        print(f"\nsummarize, all conversations: {totals:.2f}s")

        for report in (embed_chunks(settings), build_search_index(settings)):
            print(report.line())
        started = time.perf_counter()
        again = [summarize_conversation(settings, c) for c in conversation_ids(settings)]
        skipped = sum(run.status == "unchanged" for run in again)
        print(
            f"second pass: {skipped}/{len(again)} unchanged, skipped in "
            f"{time.perf_counter() - started:.2f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
