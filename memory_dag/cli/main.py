"""`memory-dag`: ingest, search, SQL, evaluation and the UI, from the command line.

Every command takes --workspace, --db, --index-dir and --json; all go through the same
library functions the Dagster assets call.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from memory_dag.cli.common import (
    Interrupted,
    exit_now,
    print_json,
    report_error,
    require_store,
    restore_signals,
    settings_from_args,
    signal_exit_code,
    stop_on_signals,
)
from memory_dag.cli.shards import ingest_every_shard
from memory_dag.config import Settings
from memory_dag.store.shards import shard_count

if TYPE_CHECKING:
    from memory_dag.ingest.watch import WorkspaceChanges

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Dagster's switch for one "materialization planned" event per asset of a run rather than one
#: per partition (read when a run is created). An ingest run that summarizes 200 conversations
#: wrote 200 of them to the instance before its first step, ~3 s at 100k turns (~15 ms each).
#: The price: when such a run fails, its partitions show as missing, not failed (the run and
#: its step show the failure). Set for `memory-dag ingest` and `memory-dag ui`.
PLANNED_EVENTS_ENV = ("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")
#: Dagster's switch for handing a step's per-partition materializations to the event log as
#: batches of up to this many (read at each event). The instance's event log
#: (`memory_dag/dagster_event_log.py`, named in data/dagster_home/dagster.yaml) stores a batch
#: in one transaction: the summaries step's 200 at 100k turns took ~3 s one by one.
EVENT_BATCH_ENV = ("DAGSTER_EVENT_BATCH_SIZE", "1000")


# --- ingest ----------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if shard_count(settings) > 1:  # route the workspace, then ingest every shard
        return ingest_every_shard(args, settings)
    started = time.perf_counter()
    if args.no_dagster or not _dagster_layer_available():
        from memory_dag.pipeline import run_all

        if not args.json:
            print("running the pipeline stages in-process (no Dagster)", file=sys.stderr)
        reports = run_all(settings, force=args.force, progress=not args.json)
        stages = {
            r.stage: {
                "counts": r.counts,
                "seconds": r.seconds,
                "notes": r.notes,
                "skipped": r.skipped,
                "errors": r.errors,
            }
            for r in reports
        }
        if not args.json:
            for report in reports:
                print(report.line(), file=sys.stderr)
    else:
        stages = _ingest_supervised(settings, force=args.force, progress=not args.json)
    summary = {
        "workspace": str(settings.workspace),
        "db": str(settings.db_path),
        "index": str(settings.index_dir),
        "seconds": round(time.perf_counter() - started, 2),
        "stages": stages,
        "tables": _table_counts(settings),
    }
    if args.json:
        print_json(summary)
    else:
        _print_ingest_summary(summary)
    return 0


def _dagster_layer_available() -> bool:
    """The Dagster layer (assets/, sensors/, schedules/) lives in the checkout, not the wheel."""
    if (REPO_ROOT / "assets" / "ingest.py").exists():
        if str(REPO_ROOT) not in sys.path:
            sys.path.insert(0, str(REPO_ROOT))
        return True
    return False


def _dagster_instance():  # -> dagster.DagsterInstance
    """The instance `memory-dag ui` uses (so CLI runs show in the UI), else an ephemeral one."""
    import dagster as dg

    from memory_dag.cli.instance_findings import instance_home

    os.environ.setdefault(*PLANNED_EVENTS_ENV)
    os.environ.setdefault(*EVENT_BATCH_ENV)
    home = instance_home(REPO_ROOT)
    if home is None:
        return dg.DagsterInstance.ephemeral()
    # The instance's own storages find their folders under DAGSTER_HOME (the event log's among
    # them: `dagster_event_log.default_base_dir`).
    os.environ.setdefault("DAGSTER_HOME", str(home))
    return dg.DagsterInstance.get()


def _ingest_supervised(settings: Settings, *, force: bool, progress: bool) -> dict[str, Any]:
    """`_ingest_with_dagster` after freeing what dead CLI runs held, stoppable by a signal.

    What is due is decided before the asset modules are imported, while Dagster itself (~1 s of
    imports and the instance) loads in a thread when it will be needed. A store with nothing
    due launches no run (`_record_nothing_due`), and when the instance already holds that
    finding (`instance_findings`) the command does not load Dagster at all."""
    from memory_dag.cli.dagster_runs import (
        fail_own_runs,
        free_dead_runs,
        run_in_worker,
        start_in_background,
    )
    from memory_dag.cli.instance_findings import InstanceFindings, instance_home
    from memory_dag.graph_state import SETTLED_KEY, Due, settled_record, work_due
    from memory_dag.store.connection import get_meta, open_store
    from memory_dag.summaries.due import workspace_due

    with open_store(settings.db_path) as con:  # a held lock is one clear error, before any run
        settled = get_meta(con, SETTLED_KEY) or ""
    findings = InstanceFindings(instance_home(REPO_ROOT), settings.db_path)
    # Dagster will be needed (for a run or to record a finding) unless the instance knows this
    # settled store and nothing changed: load it meanwhile, except in that likely case.
    instance_knows = findings.knows(settled)
    loaded_instance = None if instance_knows else start_in_background(_dagster_instance)
    started = time.perf_counter()
    conversations, changes = workspace_due(settings)
    files_due = force or bool(conversations) or changes.any or bool(changes.touched)
    if files_due and loaded_instance is None:
        loaded_instance = start_in_background(_dagster_instance)
    due = Due(reasons=["files changed"]) if files_due else work_due(settings)
    decided = time.perf_counter() - started
    if not due and instance_knows and due.settled == settled:  # the store as it was read above
        return _record_nothing_due(None, changes, decided)
    instance = (loaded_instance or _dagster_instance)()
    freed = free_dead_runs(instance)
    if freed and progress:
        print(
            f"marked {len(freed)} run(s) of a memory-dag process that died as failed "
            "and freed their slots",
            file=sys.stderr,
        )
    if not due:
        stages = _record_nothing_due(instance, changes, decided)
        findings.remember(due.settled)
        return stages
    findings.forget()  # until this run ends well: a run that dies sends the next check here
    try:
        stages = run_in_worker(
            lambda: _ingest_with_dagster(
                settings, instance, conversations, force=force, progress=progress
            )
        )
    except KeyboardInterrupt as stop:
        # The worker may be inside a step: record the stop, then leave without waiting for it.
        name = stop.signal_name if isinstance(stop, Interrupted) else "SIGINT"
        fail_own_runs(instance, f"stopped by {name}")
        exit_now(name)
    findings.remember(settled_record(settings))
    return stages


def _ingest_with_dagster(
    settings: Settings,
    instance: Any,
    conversations: list[str],
    *,
    force: bool,
    progress: bool,
) -> dict[str, Any]:
    """One run of the whole asset graph (and every check) in this process, like a UI click:
    the summaries of `conversations` (those that changed), in one step."""
    import dagster as dg

    from assets.checks import INGEST_CHECKS
    from assets.jobs import PIPELINE_ASSETS, ingest_run
    from assets.resources import MemoryStoreResource
    from assets.summaries import conversations as PARTITIONS
    from memory_dag.cli.dagster_runs import run_tags
    from memory_dag.progress import show_progress

    resource = MemoryStoreResource(
        workspace=str(settings.workspace),
        db_path=str(settings.db_path),
        index_dir=str(settings.index_dir),
        embedding_provider=settings.embedding_provider,
        embedding_model=settings.embedding_model or None,
        progress=progress,
    )
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    if force:
        run_config["ops"] = {
            name: {"config": {"force": True}} for name in ("workspace_files", "chunks", "indexes")
        }
    if progress:
        print("materializing the asset graph with Dagster (in-process)", file=sys.stderr)
    run = ingest_run(instance.get_dynamic_partitions(PARTITIONS.name), conversations)
    if run.new_partitions:
        instance.add_dynamic_partitions(PARTITIONS.name, run.new_partitions)
    with show_progress() if progress else nullcontext():
        result = dg.materialize(
            [*PIPELINE_ASSETS, *INGEST_CHECKS],
            selection=run.asset_selection,
            tags={**run.tags, **run_tags()},
            resources={"memory": resource},
            instance=instance,
            run_config=run_config,
            raise_on_error=True,
        )
    stages: dict[str, Any] = {}
    # A first step that found nothing to do observes instead (the later steps were skipped).
    recorded = [event.asset_observation_data.asset_observation for event in result.all_events
                if event.event_type_value == "ASSET_OBSERVATION"]  # fmt: skip
    recorded += [event.materialization for event in result.get_asset_materialization_events()]
    for record in recorded:
        name = record.asset_key.to_user_string()
        if name not in stages:  # the summaries step has one materialization per partition
            stages[name] = {k: _metadata_value(v) for k, v in record.metadata.items()}
    for evaluation in result.get_asset_check_evaluations():
        stages.setdefault("checks", {})[evaluation.check_name] = (
            "passed" if evaluation.passed else "FAILED"
        )
    return stages


def _record_nothing_due(
    instance: Any | None, changes: WorkspaceChanges, seconds: float
) -> dict[str, Any]:
    """Nothing changed since the graph settled: no run is launched, as a sensor that finds
    nothing skips its tick. The finding goes to `instance` as a runless observation of
    `workspace_files` (shown on the asset's page in the UI); None: the instance already holds
    it. A run would cost a second or more of Dagster's own bookkeeping to do nothing."""
    from memory_dag.graph_state import NOTHING_DUE

    metadata = {
        "files": changes.listed,
        "unchanged": changes.listed,
        "notes": NOTHING_DUE,
        "seconds": round(seconds, 3),  # the scan and the store's version that decided it
    }
    if instance is not None:
        import dagster as dg

        key = dg.AssetKey("workspace_files")
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=key, metadata=metadata))
    recorded = "recorded" if instance is not None else "already recorded"
    return {"workspace_files": {**metadata, "skipped": True, "instance": recorded}}


def _metadata_value(value: Any) -> Any:
    raw = getattr(value, "value", value)
    return raw if isinstance(raw, int | float | bool | str) else str(raw)


def _table_counts(settings: Settings) -> dict[str, int]:
    from memory_dag.store.connection import open_store

    tables = [
        "files",
        "episodes",
        "notes",
        "chunks",
        "facts",
        "entities",
        "summaries",
        "embedding_cache",
        "ingest_errors",
    ]
    with open_store(settings.db_path, read_only=True) as con:
        return {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables}


def _print_ingest_summary(summary: dict[str, Any]) -> None:
    print(f"\nmemory store  {summary['db']}")
    print(f"search index  {summary['index']}")
    print("tables        " + ", ".join(f"{t} {n}" for t, n in summary["tables"].items()))
    files = summary["stages"].get("workspace_files", {})
    if files.get("skipped"):
        print(f"nothing to do  {files.get('notes', '')}")
    checks = summary["stages"].get("checks")
    if checks:
        print("checks        " + ", ".join(f"{name} {state}" for name, state in checks.items()))
    errors = summary["tables"].get("ingest_errors", 0)
    if errors:
        print(f'ingest errors {errors}: memory-dag sql "SELECT * FROM ingest_errors"')
    print(f'done in {summary["seconds"]}s. Try: memory-dag search "what does the user like?"')


# --- sql ---------------------------------------------------------------------------------


def cmd_sql(args: argparse.Namespace) -> int:
    """SQL on a snapshot of the store, without file access (`memory_dag/store/user_sql.py`)."""
    from memory_dag.store.user_sql import run_user_sql

    result = run_user_sql(settings_from_args(args), args.query)
    if not result.columns:
        return 0
    columns, rows = result.columns, result.rows
    if args.json:
        print_json([dict(zip(columns, row, strict=True)) for row in rows])
    else:
        _print_table(columns, rows)
    return 0


def _print_table(columns: list[str], rows: Sequence[Sequence[Any]], width: int = 60) -> None:
    cells = [[_cell(v, width) for v in row] for row in rows]
    sizes = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(s) for c, s in zip(columns, sizes, strict=True)))
    print("  ".join("-" * s for s in sizes))
    for row in cells:
        print("  ".join(v.ljust(s) for v, s in zip(row, sizes, strict=True)))
    print(f"({len(rows)} rows)")


def _cell(value: Any, width: int) -> str:
    text = "NULL" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


# --- eval ------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from memory_dag.eval.locomo import evaluate_locomo, format_report

    ks = [int(k) for k in args.k.split(",") if k.strip()]
    if args.stages:
        from memory_dag.eval.stages import evaluate_stages, format_stage_report

        report = evaluate_stages(
            Path(args.data),
            ks=ks,
            store_dir=Path(args.store) if args.store else None,
            reranker_model=args.reranker,
            progress=not args.json,
        )
        if args.json:
            print_json(report)
        else:
            print(format_stage_report(report))
        return 0
    report = evaluate_locomo(
        Path(args.data),
        ks=ks,
        store_dir=Path(args.store) if args.store else None,
        progress=not args.json,
    )
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0


# --- ui --------------------------------------------------------------------------------------


def cmd_ui(args: argparse.Namespace) -> int:
    """`dagster dev` on this checkout, with the instance in data/dagster_home (pools set)."""
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str(REPO_ROOT / "data" / "dagster_home"))
    env.setdefault(*PLANNED_EVENTS_ENV)
    env.setdefault(*EVENT_BATCH_ENV)
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(REPO_ROOT / "workspace.yaml"),
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    print(f"DAGSTER_HOME={env['DAGSTER_HOME']} {' '.join(command[1:])}", file=sys.stderr)
    os.chdir(REPO_ROOT)
    os.execve(sys.executable, command, env)
    return 0  # not reached


# --- parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace", help="workspace folder (default data/workspace)")
    common.add_argument("--db", help="DuckDB store (default data/memory.duckdb)")
    common.add_argument(
        "--index-dir", help="search index folder (default: beside the store, data/index)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="memory-dag", description="Long-term memory for LLM agents (Dagster + DuckDB)."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    ingest = commands.add_parser("ingest", parents=[common], help="materialize every asset")
    ingest.add_argument("--force", action="store_true", help="re-read and re-index everything")
    ingest.add_argument("--no-dagster", action="store_true", help="run the library stages only")
    ingest.set_defaults(func=cmd_ingest, creates_store=True)

    sql = commands.add_parser("sql", parents=[common], help="run SQL on the store (read-only)")
    sql.add_argument("query")
    sql.set_defaults(func=cmd_sql)

    evaluate = commands.add_parser("eval", help="retrieval quality on a benchmark")
    benchmarks = evaluate.add_subparsers(dest="benchmark", required=True)
    locomo = benchmarks.add_parser("locomo", parents=[common], help="LoCoMo recall@k")
    locomo.add_argument("data", help="folder of LoCoMo conversation JSON files")
    locomo.add_argument("--k", default="1,5,10,25", help="comma-separated cut-offs")
    locomo.add_argument("--store", help="keep the evaluation store in this folder")
    locomo.add_argument("--stages", action="store_true", help="recall per read-path stage")
    locomo.add_argument("--reranker", help="ONNX cross-encoder for the + rerank stage")
    locomo.set_defaults(func=cmd_eval, creates_store=True)

    for register in _command_modules():
        register(commands, common)

    ui = commands.add_parser("ui", help="open the Dagster UI (dagster dev) on this project")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(func=cmd_ui)
    return parser


def _command_modules() -> list[Any]:
    """Command groups kept beside the code they drive (memory operations, summaries, ...)."""
    from memory_dag.cli import memories, read, service, shards, summaries

    return [
        memories.register,
        read.register,
        summaries.register,
        service.register,
        shards.register,
    ]


def _usage_of_each_command(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command its own parser as `command_parser`: a value a command cannot
    use (a bad id, a malformed filter) prints that command's usage, as argparse's own errors do."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                subparser.set_defaults(command_parser=subparser)
                _usage_of_each_command(subparser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _usage_of_each_command(parser)
    args = parser.parse_args(argv)
    previous = stop_on_signals()
    try:
        require_store(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as stop:
        name = stop.signal_name if isinstance(stop, Interrupted) else "SIGINT"
        print(f"memory-dag: stopped by {name}", file=sys.stderr)
        return signal_exit_code(name)
    except BrokenPipeError:  # the reader (`| head`) has gone: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ValueError as error:  # a value the command cannot use: its usage, exit 2
        args.command_parser.error(str(error))
    except Exception as error:
        code = report_error(error)
        if code is None:
            raise
        return code
    finally:
        restore_signals(previous)


def run() -> NoReturn:
    """The `memory-dag` command: `main`, then leave without tearing the interpreter down.

    Every store and instance a command opens is closed before `main` returns; what would be
    left is freeing the objects of ~1,500 modules one by one: ~0.5 s once Dagster is loaded,
    a quarter of a `memory-dag ingest` that finds nothing to do. Exit handlers still run; with
    a thread still working, or when `main` raises, the process leaves the usual way."""
    code = main()
    others = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
    if any(not thread.daemon for thread in others):
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's flush, worker pools' shutdown
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a reader that went away, a stream closed
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
