"""CLI commands of this group; `register` adds them to the `memory-dag` parser."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add this group's subcommands (`commands` is the parser's subparsers object)."""
