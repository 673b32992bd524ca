"""Prompts of the adaptive summarizer (seed 001 §5).

Templates are plain `str.format` strings (literal braces doubled) so a missing or misspelt
placeholder fails at render time instead of reaching the model.
"""

from __future__ import annotations

BRIEF_PROMPT = """\
Distill the following content into a single, comprehensive sentence
that captures the essential meaning:

{content}

Summary (one sentence):"""

STANDARD_PROMPT = """\
Summarize the following content in a concise paragraph.
{prior_context}
Focus on key information, decisions, and actionable insights.

Content:
{content}

Summary:"""

CHUNK_PROMPT = """\
Summarize this section of a larger document.
Preserve specific details, names, and numbers that may be important.

Section {chunk_index} of {total_chunks}:
{content}

Section summary:"""

META_PROMPT = """\
Synthesize these section summaries into a coherent narrative.
Maintain logical flow and preserve the most important information.
{prior_context}
Section Summaries:
{summaries}

Synthesized Summary:"""

ROLLING_PROMPT = """\
Update an existing summary with new content.
Keep everything in the existing summary that is still true, integrate the new information, \
and drop what the new content explicitly replaces or contradicts.
Answer with {length}.

Existing summary:
{prior_summary}

New content:
{content}

Updated summary:"""

CONVERSATION_PROMPT = """\
Summarize this conversation focusing on:
- User preferences and decisions
- Action items and commitments
- Key topics discussed
{prior_context}
Conversation:
{content}

Summary:"""

JOURNAL_PROMPT = """\
Summarize this journal entry focusing on:
- Personal insights and reflections
- Emotional context and growth
- Goals and intentions
{prior_context}
Journal entry:
{content}

Summary:"""

DOCUMENT_PROMPT = """\
Summarize this document focusing on:
- Key findings and conclusions
- Methodology and approach
- Recommendations and implications
{prior_context}
Document:
{content}

Summary:"""

#: System message for every summary call: the answer is used verbatim as stored memory.
SUMMARY_SYSTEM_PROMPT = (
    "You write faithful summaries for a long-term memory. Answer with the summary text only: "
    "no preamble, no headings, no commentary. Never invent facts that are not in the input. "
    "A line starting with [superseded] was said earlier and replaced by a newer statement: "
    "mention it only as past, never as what holds now."
)

#: Fills `{prior_context}`; an empty string when there is no prior summary.
PRIOR_CONTEXT_TEMPLATE = """
Previous summary (build on it; keep what the new content does not change):
{prior_summary}
"""


def prompt_for_content_type(content_type: str) -> str:
    """The paragraph-level template for a content domain (seed 001 §2.3)."""
    match content_type:
        case "conversation":
            return CONVERSATION_PROMPT
        case "journal":
            return JOURNAL_PROMPT
        case "document":
            return DOCUMENT_PROMPT
        case _:
            return STANDARD_PROMPT


def prior_context(prior_summary: str | None) -> str:
    """The `{prior_context}` block: the previous summary, or nothing."""
    if prior_summary is None or not prior_summary.strip():
        return ""
    return PRIOR_CONTEXT_TEMPLATE.format(prior_summary=prior_summary.strip())
