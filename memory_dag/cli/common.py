"""What every `memory-dag` command group shares: settings from the common flags, JSON output."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memory_dag.config import Settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from --workspace / --db / --index-dir, then MEMORY_DAG_* variables."""
    return Settings.load(workspace=args.workspace, db_path=args.db, index_dir=args.index_dir)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))
