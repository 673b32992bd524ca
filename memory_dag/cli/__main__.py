"""`python -m memory_dag.cli`: the same as the `memory-dag` command."""

from memory_dag.cli.main import run

run()
