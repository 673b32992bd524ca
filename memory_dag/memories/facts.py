"""Fact extraction for the write path: user turn -> 0..3 standalone third-person facts.

Seed 000 §4.2 / §5.1 (latest user message only, 0-3 atomic standalone facts, failures -> []),
seed 003 §9 (third person, no pronouns, 1-2 sentences, at most 280 characters, validator) and
§13 (long turns may yield up to 5 candidates; at most 3 are written).

The validator (`fact_problem`, `validate_fact`) holds every memory to seed 003 §9, whoever
wrote it (rules, an LLM, `remember`, a merge): third person (no I, my, we, you), no pronoun
without a referent ("He likes it a lot.", "... to see one for a long time.", "This replaces
..."), at most 2 sentences and 280 characters. Extractors append what fails to `rejected`,
so the write path counts it (`facts_rejected`).

Two extractors share one output type:

* `extract_facts_rules` (`fact_rules.py`): the honest no-LLM default, regular expressions over
  first-person self-statements.
* `extract_facts_llm`: `FACT_SYSTEM_PROMPT` through `LLMClient.complete_json`; on any
  `LLMError` it returns no facts together with the error, so the caller can record the failure.
  "the user" in its answers is replaced by the speaker's name, as in rule facts.

Both return at most `candidate_limit(turn)` candidates (3, or 5 for long turns); the caller
then runs `select_for_write` (batch + stored dedup, then the 3-writes cap) before reconciling.

The caller passes only user turns; the functions do not see roles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from memory_dag.llm import LLMClient, LLMError
from memory_dag.memories.prompts import FACT_SYSTEM_PROMPT, MAX_FACT_CHARS, FactList
from memory_dag.memories.reconcile import (
    NEAR_DUPLICATE_JACCARD,
    dedup_batch,
    jaccard_to_each,
    normalise_text,
    relate,
)

#: Seed 003 §13: at most this many facts are written per turn.
MAX_FACTS_PER_TURN = 3
#: Seed 003 §13: turns longer than this may yield up to `MAX_CANDIDATES_LONG_TURN` candidates
#: before the write cap (twice a typical chat turn, which is 100-200 characters in LoCoMo).
LONG_TURN_CHARS = 400
MAX_CANDIDATES_LONG_TURN = 5
#: Seed 003 §9: a memory is 1-2 sentences.
MAX_FACT_SENTENCES = 2


@dataclass
class FactCandidate:
    """A fact proposed for the memory, with where it came from and a rule-based triage."""

    text: str
    source_turn_id: str
    speaker: str | None
    category: str | None
    importance: int  # 1 (trivia) .. 5 (identity, health)


def candidate_limit(turn_text: str) -> int:
    """How many candidates a turn may yield before the write cap (seed 003 §13)."""
    return MAX_CANDIDATES_LONG_TURN if len(turn_text) > LONG_TURN_CHARS else MAX_FACTS_PER_TURN


# --------------------------------------------------------------------------- validation

# Words that end with a period without ending the sentence.
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "inc", "ltd"}
    | {"co", "no", "approx", "dept", "mt", "ft", "u.s", "u.k", "a.m", "p.m"}
)
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split on line breaks and on . ! ? followed by whitespace and a capital letter or digit.

    A period after a known abbreviation ("Dr.", "e.g.") or a single-letter initial ("J. Smith")
    does not end a sentence; decimals and URLs never match because no whitespace follows the dot.
    """
    sentences: list[str] = []
    for line in text.splitlines():
        start = 0
        for match in _BOUNDARY.finditer(line):
            if line[match.start()] == "." and _abbreviation_before(line, match.start() + 1):
                continue
            sentences.append(line[start : match.end()].strip())
            start = match.end()
        sentences.append(line[start:].strip())
    return [sentence for sentence in sentences if sentence]


def _abbreviation_before(line: str, end: int) -> bool:
    """Whether the word ending at `end` (a period's end) is a known abbreviation or an initial:
    looked at only for periods, as the other boundaries always end a sentence."""
    word = _word_ending_at(line, end).rstrip(".").lower()
    return word in _ABBREVIATIONS or len(word) == 1


def _word_ending_at(line: str, end: int) -> str:
    """The run of non-space characters that ends at `end` (what `(\\S+)$` finds before it)."""
    start = end
    while start > 0 and not line[start - 1].isspace():
        start -= 1
    return line[start:end]


# Seed 003 §9: a memory is written in the third person and stands alone.
_FIRST_OR_SECOND_PERSON = re.compile(
    r"\b(?:I|I'm|I've|I'd|I'll|us)\b"
    r"|\b(?i:me|my|mine|myself|we|we're|we've|we'd|our|ours|ourselves|you|you're|you've|"
    r"your|yours|yourself)\b"
)
# Personal pronouns need someone named before them ("Sam likes his job").
_PERSONAL_PRONOUN = re.compile(
    r"\b(?i:he|he's|him|his|himself|she|she's|her|hers|herself|they|they're|they've|them|"
    r"their|theirs|themselves|its)\b"
)
# "it" always stands for something said before the fact ("Sam loves it").
_IT = re.compile(r"\b(?i:it|it's)\b")
# A demonstrative standing alone ("This replaces ...", "that was the best trip").
_DEMONSTRATIVE = re.compile(
    r"\b(?i:this|that|these|those)\b(?=\s*(?:[.,;:!?]|$)|\s+(?i:is|was|are|were|has|have|had|"
    r"will|would|can|could|should|may|might|must|does|did|replaces|replaced|means|meant|"
    r"includes|included|shows|showed|makes|made|seems|sounds|looks)\b)"
)
# "one" standing for a thing named before ("does not want to see one for a long time").
_ONE = re.compile(
    r"\b(?i:one)\b(?=\s*(?:[.,;:!?]|$)|\s+(?i:for|at|in|on|with|from|again|too|anymore|"
    r"either|soon|later|now|today|tomorrow|yet)\b)"
)
# A referent: the user, or a capitalised word that is not a pronoun or a determiner.
_REFERENT = re.compile(
    r"\b(?i:the user)\b|\b(?!(?:The|A|An|This|That|These|Those|It|Its|He|She|They|We|I|"
    r"His|Her|Their|Our|My|Your|One)\b)[A-Z][\w'-]*"
)


def fact_problem(text: str) -> str | None:
    """Why `text` is not a valid memory (seed 003 §9), or None: empty, over 280 characters,
    over 2 sentences, not third person, or a pronoun with nothing to refer to."""
    cleaned = " ".join(text.split())
    if not cleaned:
        return "empty"
    if len(cleaned) > MAX_FACT_CHARS:
        return f"longer than {MAX_FACT_CHARS} characters"
    if len(split_sentences(cleaned)) > MAX_FACT_SENTENCES:
        return f"more than {MAX_FACT_SENTENCES} sentences"
    match = _FIRST_OR_SECOND_PERSON.search(cleaned)
    if match:
        return f"not third person ({match.group(0)!r})"
    for pattern in (_IT, _DEMONSTRATIVE, _ONE):
        match = pattern.search(cleaned)
        if match:
            return f"pronoun without a referent ({match.group(0)!r})"
    for match in _PERSONAL_PRONOUN.finditer(cleaned):
        if not _REFERENT.search(cleaned[: match.start()]):
            return f"pronoun without a referent ({match.group(0)!r})"
    return None


def validate_fact(text: str) -> str | None:
    """The fact with whitespace normalised, or None when `fact_problem` finds a problem."""
    return " ".join(text.split()) if fact_problem(text) is None else None


def keep_valid(texts: Iterable[str], rejected: list[str] | None = None) -> list[str]:
    """The valid facts of `texts`, normalised; the others are appended to `rejected`."""
    kept: list[str] = []
    for text in texts:
        valid = validate_fact(text)
        if valid is not None:
            kept.append(valid)
        elif rejected is not None:
            rejected.append(" ".join(text.split()))
    return kept


# --------------------------------------------------------------------------- triage

_COUNT_WORDS = r"a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+|no|several|many"
_RELATION_WORDS = (
    r"wife|husband|partner|spouse|boyfriend|girlfriend|fianc[eé]e?|friends?|besties?|sisters?|"
    r"brothers?|siblings?|mother|mom|mum|father|dad|parents?|sons?|daughters?|kids?|children|"
    r"child|bab(?:y|ies)|cousins?|aunts?|uncles?|grandma|grandmother|grandpa|grandfather|"
    r"grandparents?|grandkids?|grandchildren|nieces?|nephews?|boss|manager|colleagues?|"
    r"co-?workers?|roommates?|neighbou?rs?|family|mentor"
)

# (pattern over the third-person fact, category, importance); first match wins.
_TRIAGE: tuple[tuple[re.Pattern[str], str, int], ...] = (
    (re.compile(r"\b(?:allergic|intolerant)\b|\bname is\b", re.I), "profile", 5),
    (
        re.compile(
            rf"^(?:the user|[A-Z][\w-]*(?: [A-Z][\w-]*)?)'s\s+(?:\w+\s+)?(?:{_RELATION_WORDS})\b|"
            rf"\bhas\s+(?:{_COUNT_WORDS})\s+(?:\w+\s+)?(?:{_RELATION_WORDS})\b",
            re.I,
        ),
        "relationships",
        4,
    ),
    (
        re.compile(
            r"\b(?:plans?|wants?|hopes?|intends?|aims?|would (?:like|love)|"
            r"(?:is|are) (?:going|planning|hoping|trying|about|saving|preparing))\b|"
            r"\bgoal\b|\bdream\b",
            re.I,
        ),
        "goals",
        3,
    ),
    (re.compile(r"\b(?:needs? to|has to|must|deadline)\b", re.I), "tasks", 3),
    (
        re.compile(
            r"\b(?:loves?|likes?|hates?|dislikes?|prefers?|enjoys?|adores?|detests?|"
            r"favou?rite|fan of|is into|keen on|passionate about|interested in|cannot stand)\b",
            re.I,
        ),
        "preferences",
        3,
    ),
    (
        re.compile(
            r"\b(?:lives? in|living in|moved to|is from|works? (?:at|for|as|in)|years old|"
            r"birthday|hometown|born|is (?:a|an)|is (?:vegan|vegetarian|married|single|retired|"
            r"divorced|engaged|pregnant|transgender))\b",
            re.I,
        ),
        "profile",
        4,
    ),
    (re.compile(r"\b(?:working on|project)\b", re.I), "projects", 3),
    (re.compile(rf"\bhas\s+(?:{_COUNT_WORDS})\b", re.I), "profile", 3),
    (
        re.compile(
            r"\b(?:started|quit|joined|left|finished|graduated|adopted|bought|began|launched|"
            r"stopped|took up|gave up|won|visited|went|attended|completed|got|signed up|ran|"
            r"is \w+ing|plays|"
            r"goes|paints|cooks|bakes|runs|swims|reads|writes|watches|volunteers|teaches|studies|"
            r"practi[cs]es|collects|hikes|dances|sings|draws|knits|meditates|rides)\b",
            re.I,
        ),
        "activity",
        2,
    ),
)


def classify_fact(text: str) -> tuple[str | None, int]:
    """Category and importance (1-5) of a third-person fact, by keyword rules."""
    for pattern, category, importance in _TRIAGE:
        if pattern.search(text):
            return category, importance
    return None, 2


# --------------------------------------------------------------------------- LLM extraction


def _name_the_user(fact: str, speaker: str | None) -> str:
    """Replace "the user" with the speaker's name, so LLM facts read like rule facts."""
    if not speaker or not speaker.strip():
        return fact
    name = " ".join(speaker.split())
    return re.sub(r"\b[Tt]he user\b", name, fact)


def fact_messages(turn_text: str) -> list[dict[str, str]]:
    """Chat messages for fact extraction: the system prompt and the user's message only."""
    return [
        {"role": "system", "content": FACT_SYSTEM_PROMPT},
        {"role": "user", "content": turn_text},
    ]


def extract_facts_llm(
    llm: LLMClient,
    turn_text: str,
    speaker: str | None,
    turn_id: str,
    rejected: list[str] | None = None,
) -> tuple[list[FactCandidate], LLMError | None]:
    """LLM-extracted facts of a user turn; on failure `([], error)` so the caller can record it.

    Answers that fail `validate_fact` are dropped one by one (the rest are kept); the number of
    candidates is capped by `candidate_limit`.
    """
    if not turn_text.strip():
        return [], None
    try:
        answer = llm.complete_json(fact_messages(turn_text), FactList)
    except LLMError as error:
        return [], error
    texts = [_name_the_user(fact, speaker) for fact in answer.root]
    valid = keep_valid(texts, rejected)
    candidates = []
    for fact in dedup_batch(valid)[: candidate_limit(turn_text)]:
        category, importance = classify_fact(fact)
        candidates.append(FactCandidate(fact, turn_id, speaker, category, importance))
    return candidates, None


# --------------------------------------------------------------------------- write cap


def _repeats(text: str, stored: list[str]) -> bool:
    """A near-duplicate (Jaccard >= 0.75) of a stored fact that does not change it."""
    scores = jaccard_to_each(text, stored)
    similar = [
        other
        for other, score in zip(stored, scores, strict=True)
        if score >= NEAR_DUPLICATE_JACCARD
    ]
    return any(relate(text, other, None)[0] not in ("updates", "contradicts") for other in similar)


def select_for_write(
    candidates: list[FactCandidate],
    existing_texts: Iterable[str] = (),
    limit: int = MAX_FACTS_PER_TURN,
) -> list[FactCandidate]:
    """The candidates worth writing: no batch duplicates, none already stored, top `limit`.

    The two-level dedup of seed 004 (exact within the batch, Jaccard >= 0.75 against stored
    facts) runs before the cap, so a duplicate never takes the place of a new fact. A candidate
    that changes a stored fact it resembles (a refinement, a new value, a contradiction: "loves
    pepperoni pizza" after "loves pizza") is kept for reconciliation, not dropped as a
    duplicate. The most important candidates win; ties and the output keep the order they were
    said in.
    """
    stored = list(existing_texts)
    seen: set[str] = set()
    fresh: list[tuple[int, FactCandidate]] = []
    for position, candidate in enumerate(candidates):
        key = normalise_text(candidate.text)
        if key in seen or _repeats(candidate.text, stored):
            continue
        seen.add(key)
        fresh.append((position, candidate))
    ranked = sorted(fresh, key=lambda item: (-item[1].importance, item[0]))[:limit]
    return [candidate for _, candidate in sorted(ranked, key=lambda item: item[0])]
