"""The truth suite's figures: what agents were told over every story (issue 13).

    python benchmarks/truth_suite.py [--out benchmarks/results/truth_suite_<date>.txt]

Runs every story of `tests/scenarios/stories/` twice, with the rules (no LLM) and with the tests'
scripted stand-in model on a local OpenAI-compatible server, through the library's real paths
(transcripts ingested, facts written as turns arrive, agent operations, nightly jobs at the
stories' dates, context blocks built through the scope boundary), and prints over all of them:

* stale facts shown: context lines presenting as current a memory that is no longer active,
  or a statement the story says was overruled;
* replaced facts shown as current: such lines for memories replaced by a correction, an
  update or a merge;
* out-of-scope memories shown: lines of another user's memories, of categories outside the
  agent's allowlist, of another conversation, or procedure steps nobody asked for (and reads
  answered that the boundary must refuse);
* memories lost: memories a story expects active that are not, and expected lines missing.

The aim is 0 for each. The stories' own expectations (what each block must show and hide) are
the tests of `tests/scenarios/test_truth_suite.py`; this script counts, it does not assert.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the stories and the stand-in model live in tests/

from tests.openai_server import ScriptedOpenAIServer  # noqa: E402
from tests.scenarios import STORIES  # noqa: E402
from tests.scenarios.harness import FIGURES, Tally, run_story, scripted_model  # noqa: E402

TITLES = {
    "stale_shown": "stale facts shown",
    "replaced_shown": "replaced facts shown as current",
    "out_of_scope_shown": "out-of-scope memories shown",
    "lost": "memories lost",
}


def run_all() -> tuple[dict[str, Tally], dict[str, list[str]], float]:
    """Tallies and failed expectations per method, and the seconds it took."""
    tallies = {"rules": Tally(), "llm": Tally()}
    failures: dict[str, list[str]] = {"rules": [], "llm": []}
    started = time.perf_counter()
    with (
        ScriptedOpenAIServer(handler=scripted_model) as model,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for method, base_url in (("rules", None), ("llm", model.base_url)):
            for story in STORIES:
                tally, failed = run_story(story, Path(tmp) / method / story.name, base_url)
                tallies[method].add(tally)
                failures[method] += failed
    return tallies, failures, time.perf_counter() - started


def report(tallies: dict[str, Tally], failures: dict[str, list[str]], seconds: float) -> str:
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [
        f"truth suite, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {len(STORIES)} stories x "
        f"2 methods, {sum(t.blocks for t in tallies.values())} context blocks judged, "
        f"{seconds:.0f} s (load average {load} on {os.cpu_count()} cores)",
        "",
        f"{'':34}{'rules':>8}{'llm':>8}{'total':>8}",
    ]
    for figure in FIGURES:
        values = [tallies[method].counts[figure] for method in ("rules", "llm")]
        lines.append(f"{TITLES[figure]:34}{values[0]:>8}{values[1]:>8}{sum(values):>8}")
    broken = sum(len(f) for f in failures.values())
    lines.append(f"{'failed story expectations':34}{len(failures['rules']):>8}"
                 f"{len(failures['llm']):>8}{broken:>8}")  # fmt: skip
    for method, tally in tallies.items():
        lines += [f"  {method}: {problem}" for problem in tally.problems]
        lines += [f"  {method}: {failure}" for failure in failures[method]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = REPO / "benchmarks" / "results" / f"truth_suite_{datetime.now(UTC):%Y-%m-%d}.txt"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()
    text = report(*run_all())
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
