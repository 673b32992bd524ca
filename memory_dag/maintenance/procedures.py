"""Procedural memory (seed 003 §12): numbered steps, category `procedural`, which default
retrieval leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence

from memory_dag.config import Settings
from memory_dag.embed.providers import get_provider
from memory_dag.memories.writer import MemoryWriter, NewMemory
from memory_dag.store.connection import open_store

PROCEDURAL_CATEGORY = "procedural"
MAX_PROCEDURE_CHARS = 2000


def remember_procedure(
    settings: Settings,
    steps: Sequence[str],
    *,
    title: str | None = None,
    conversation_id: str | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    importance: int = 3,
    pinned: bool = False,
    actor: str = "agent",
    refresh: bool = True,
) -> str:
    """Store a how-to as numbered steps (seed 003 §12); returns the memory id.

    Category `procedural`, so default retrieval leaves it out and only agents that ask for the
    category get it. `decay_rate` 0: a procedure is removed by forgetting it, not by time.
    """
    from memory_dag.memories.agent_ops import refresh_index
    from memory_dag.memories.writer import MemoryOpError

    cleaned = [" ".join(step.split()) for step in steps if step.strip()]
    if not cleaned:
        raise MemoryOpError("a procedure needs at least one step")
    header = f"{' '.join(title.split())}:\n" if title and title.strip() else ""
    content = header + "\n".join(f"{n}. {step}" for n, step in enumerate(cleaned, 1))
    if len(content) > MAX_PROCEDURE_CHARS:
        raise MemoryOpError(f"a procedure is at most {MAX_PROCEDURE_CHARS} characters")
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor=actor)
        with writer.transaction():
            memory_id = writer.add(
                NewMemory(
                    content=content,
                    kind="procedural",
                    conversation_id=conversation_id,
                    session_id=session_id,
                    user_id=user_id,
                    agent_id=agent_id,
                    source_role=actor,
                    category=PROCEDURAL_CATEGORY,
                    importance=importance,
                    tags=list(tags),
                    decay_rate=0.0,
                    attributes={"steps": len(cleaned)},
                ),
                meta={"op": "remember_procedure"},
            )
            if pinned:
                con.execute("UPDATE memories SET pinned = true WHERE id = ?", [memory_id])
    if refresh:
        refresh_index(settings)
    return memory_id
