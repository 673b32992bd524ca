"""The `memory-dag` command line: one module per group of commands, all calling the
library; `main` builds the parser.
"""
