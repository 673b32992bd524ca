"""The limits that hostile or broken input meets while a workspace is read.

Each limit turns input that would exhaust memory, time or the stack into one `ingest_errors`
row that names the limit; the rest of the file (and every other file) is still ingested.
They are documented in docs/architecture.md ("Bad input and limits").
"""

from __future__ import annotations

from datetime import UTC, datetime

#: Characters in one line of a note or a transcript; a longer line is left out with an error.
MAX_LINE_CHARS = 1_000_000

#: Levels of nested lists and mappings in a JSON line or in front matter (after YAML aliases).
MAX_NESTING_DEPTH = 64

#: Characters of YAML between a note's `---` lines; larger front matter is ignored (body kept).
MAX_FRONT_MATTER_CHARS = 65_536

#: Values (scalars, lists, mappings) front matter may hold once its YAML aliases are expanded:
#: a 465-byte alias "bomb" expands to ~390 million.
MAX_FRONT_MATTER_VALUES = 10_000

#: Times are kept only inside this range (UTC): a day inside what Python's datetime can hold,
#: so the time can be shown in every time zone. Outside it, the row keeps no time.
EARLIEST_TIME = datetime(1, 1, 2, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 30, tzinfo=UTC)
