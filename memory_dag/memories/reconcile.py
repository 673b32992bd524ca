"""Reconciliation: decide what new facts do to the memories already stored (seed 000 §4.3, §5.2).

Every call answers with a full enumeration (seed 000 §5.2): one `Decision` per existing
neighbour (UPDATE, DELETE or NONE) followed by one ADD per new fact that becomes a new memory.
A new fact that duplicates a memory produces no ADD; the memory it duplicates gets NONE.

Rule-based decisions (`reconcile_rules`), checked in this order for each new fact against each
neighbour:

0. The same text after normalisation (case, punctuation, whitespace) -> duplicate (NONE).

1. Structure next. Facts in the third-person forms the extractors produce ("Caroline loves
   pizza.", "The user lives in Paris.", "The user's wife is named Anne.") are parsed into
   subject, predicate topic, polarity and object. With both facts parsed and the same subject:

   * same topic and object, opposite polarity (love/like/enjoy vs hate/dislike/"does not like",
     "no longer", "is not", works at vs quit) -> **contradiction**: the old memory is DELETEd
     and the new fact ADDed. This is checked before any similarity band because embeddings
     barely see negation: "loves pizza" and "hates pizza" embed almost identically.
   * same topic and object, same polarity -> duplicate (NONE), or UPDATE when the wording of
     the predicate changed ("likes" -> "loves").
   * same single-valued slot (residence, employer, occupation, origin, age, a favourite thing,
     the name of a spouse or parent...) with a different value -> **UPDATE** (new text replaces
     the old id): "lives in Paris" -> "lives in Berlin".
   * same topic and polarity, the new object strictly contains the old one -> UPDATE
     (refinement: "loves pizza" -> "loves pepperoni pizza"); the reverse -> duplicate; the
     same thing with another count -> UPDATE ("has two kids" -> "has three kids").
   * otherwise the facts are different facts (multi-valued predicates such as "loves pizza"
     and "loves pasta" coexist), whatever their similarity.
   * different subjects are never related.

2. Bands, when either fact cannot be parsed:

   * the two differ only by negation words ("is vegetarian" vs "is no longer vegetarian")
     -> contradiction.
   * near-duplicate: word-set Jaccard >= 0.75 (seed 004, `save_facts_batch`) or cosine >= 0.95
     -> duplicate (NONE). At 0.95 two short facts say the same thing in other words.
   * same subject and cosine >= 0.80 -> UPDATE: the same topic about the same person, worded
     differently enough that it is not a duplicate.
   * otherwise -> ADD.

   The cosine bands assume a sentence-embedding scale. Measured with the default WordLlama 256d
   model: "loves pizza"/"hates pizza" 0.79, "favorite color is blue"/"... red" 0.81,
   "lives in Paris"/"lives in Berlin" 0.44, "is a teacher"/"is a high school teacher" 0.85; so
   with WordLlama the cosine bands rarely fire and structure plus Jaccard carry the decisions.

When a new fact contradicts some memories it is ADDed (never merged into another memory); when
it duplicates one it is not written; otherwise it UPDATEs the most similar memory it updates,
one new fact per memory.

LLM decisions (`reconcile_llm`) send `UPDATE_MEMORY_PROMPT` with the neighbours numbered
0..n-1 (temporary ids, so the model never sees or invents real ids) and map the answer back.
Ids the model invents are ignored, neighbours it leaves out get NONE, new facts it leaves out
are ADDed, and any `LLMError` falls back to ADDing every new fact (seed 000 §4.3).

Kept as one module (~610 lines): the rules reconciler and the LLM one return the same
decisions and share the fact-structure parser (subject, predicate, object) that tells an
UPDATE from an ADD; a third of the module is that parser's pattern table.

Why one module of ~610 lines: the rule decisions, the fact parser they rest on and the LLM's
enumeration answer one question with one `Decision` vocabulary; the parser serves nothing else.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from memory_dag.llm import LLMClient, LLMError
from memory_dag.memories.prompts import MAX_FACT_CHARS, UPDATE_MEMORY_PROMPT, MemoryDecisionList

Event = Literal["ADD", "UPDATE", "DELETE", "NONE"]


@dataclass(frozen=True)
class SimilarityBands:
    """Thresholds of the rule-based reconciler (see the module docstring for each band)."""

    jaccard_duplicate: float = 0.75
    cosine_duplicate: float = 0.95
    cosine_update: float = 0.80


@dataclass
class ExistingMemory:
    """A stored memory retrieved as a neighbour of the new facts."""

    id: str
    text: str
    vector: np.ndarray | None = None


@dataclass
class Decision:
    """What happens to one memory.

    `memory_id` is the existing id for UPDATE/DELETE/NONE and None for ADD. `text` is the text
    to store (ADD, UPDATE) or the existing text (DELETE, NONE). `fact_index` points into the
    `new_facts` argument: the fact written (ADD, UPDATE), the fact that contradicts (DELETE) or
    duplicates (NONE) the memory; None when no new fact is involved or it cannot be told.
    `similarity` is the cosine when both vectors exist, else the word Jaccard.
    """

    event: Event
    text: str
    memory_id: str | None
    reason: str
    similarity: float | None = None
    fact_index: int | None = None


# --------------------------------------------------------------------------- text similarity

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; apostrophes inside words kept ("user's", "don't")."""
    return _TOKEN.findall(text.lower().replace("’", "'"))


def normalise_text(text: str) -> str:
    """Case, punctuation and whitespace removed: the key for exact-duplicate checks."""
    return " ".join(tokens(text))


@functools.lru_cache(maxsize=65_536)
def _normalised(text: str) -> str:
    """`normalise_text`, kept per text: `relate` compares a stored fact with each new fact of
    its owner."""
    return normalise_text(text)


def dedup_batch(texts: list[str]) -> list[str]:
    """`texts` without exact duplicates (after normalisation); first occurrence kept, in order."""
    seen: set[str] = set()
    kept: list[str] = []
    for text in texts:
        key = normalise_text(text)
        if key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


@functools.lru_cache(maxsize=65_536)
def _word_set(text: str) -> frozenset[str]:
    """`tokens` as a set, kept: a fact is compared with every new fact of its owner."""
    return frozenset(tokens(text))


def jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' word sets (1.0 for two empty texts)."""
    set_a, set_b = _word_set(a), _word_set(b)
    if not set_a and not set_b:
        return 1.0
    shared = len(set_a & set_b)
    return shared / (len(set_a) + len(set_b) - shared)  # the union's size, without building it


def jaccard_to_each(text: str, others: Sequence[str]) -> list[float]:
    """`jaccard(text, other)` for each of `others`, with `text`'s words looked up once (a new
    fact is compared with every active fact of its owner)."""
    words = _word_set(text)
    size = len(words)
    scores = []
    for other in others:
        other_words = _word_set(other)
        if not size and not other_words:
            scores.append(1.0)
            continue
        shared = len(words & other_words)
        scores.append(shared / (size + len(other_words) - shared))
    return scores


#: Seed 004: word Jaccard at or above this makes a near-duplicate.
NEAR_DUPLICATE_JACCARD = 0.75


def is_near_duplicate(
    text: str, existing_texts: Iterable[str], threshold: float = NEAR_DUPLICATE_JACCARD
) -> bool:
    """True when `text` has word Jaccard >= `threshold` with any existing text (seed 004)."""
    return any(jaccard(text, existing) >= threshold for existing in existing_texts)


def cosine(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    """Cosine similarity, or None when a vector is missing or zero."""
    return _cosine_of(_Unit.of(a), _Unit.of(b))


@dataclass(frozen=True)
class _Unit:
    """A vector as `cosine` reads it (float64, flat) with its norm: made once per vector of a
    reconciliation, not once per pair it is in."""

    values: np.ndarray
    norm: np.floating

    @staticmethod
    def of(vector: np.ndarray | None) -> _Unit | None:
        if vector is None:
            return None
        values = np.asarray(vector, dtype=np.float64).ravel()
        # What np.linalg.norm computes for a flat real vector, without its argument checks
        # (a reconciliation makes one per neighbour).
        return _Unit(values, np.sqrt(values.dot(values)))


def _cosine_of(a: _Unit | None, b: _Unit | None) -> float | None:
    if a is None or b is None:
        return None
    norm = float(a.norm * b.norm)
    if norm == 0.0:
        return None
    return float(np.dot(a.values, b.values) / norm)


# --------------------------------------------------------------------------- fact structure


@dataclass(frozen=True)
class FactParts:
    """A third-person fact read as subject / predicate / object."""

    subject: str  # lower-case: "the user", "caroline"
    topic: str  # what the predicate is about: "pref", "residence", "attr:wife.name", ...
    slot: str  # the value slot; single-valued slots hold one value at a time
    single: bool
    polarity: int  # +1 or -1
    predicate: str  # the predicate as written, lower-case, negation removed
    obj: frozenset[str]  # object key: content words, light plural stemming


_SUBJECT = r"(?P<subj>[Tt]he user|[A-Z][\w-]*(?:\s+[A-Z][\w-]*){0,2})"
_POSSESSIVE_FORM = re.compile(
    _SUBJECT + r"'s\s+(?P<attr>[a-z][a-z\s-]*?)\s+(?P<be>is|are|was|were)\s+"
    r"(?P<neg>not\s+|no\s+longer\s+)?(?P<named>(?:named|called)\s+)?(?P<obj>.+)"
)
_VERB_FORM = re.compile(_SUBJECT + r"\s+(?P<rest>[a-z].*)")
_LEADING_ADVERBS = re.compile(
    r"^(?:(?:now|still|also|currently|really|usually|often|always|sometimes|regularly|"
    r"recently|just|finally)\s+)+"
)
_NEGATION_PREFIX = re.compile(
    r"^(?:no\s+longer|never|does\s+not|doesn't|do\s+not|don't|did\s+not|didn't)\s+(?P<tail>.+)"
)
_NEGATED_BE = re.compile(r"^(?P<be>is|are|was)\s+(?:not|no\s+longer)\s+(?P<tail>.+)")

# (predicate regex, topic, slot, single-valued, polarity); the first match wins.
_PREDICATES: tuple[tuple[re.Pattern[str], str, str, bool, int], ...] = tuple(
    (re.compile(rf"^(?P<pred>{pattern})\s+(?P<obj>.+)"), topic, slot, single, polarity)
    for pattern, topic, slot, single, polarity in (
        (r"(?:loves?|likes?|enjoys?|adores?|prefers?)", "pref", "pref", False, 1),
        (r"(?:hates?|dislikes?|detests?|cannot\s+stand|can't\s+stand)", "pref", "pref", False, -1),
        (
            r"is\s+(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|is\s+(?:into|keen\s+on|passionate\s+about|"
            r"interested\s+in|fond\s+of|obsessed\s+with)",
            "pref",
            "pref",
            False,
            1,
        ),
        (
            r"(?:lives?|is\s+living)\s+in|(?:has\s+)?(?:moved|relocated)\s+(?:back\s+)?to",
            "residence",
            "residence",
            True,
            1,
        ),
        (
            r"(?:works?|is\s+working|is\s+employed)\s+(?:at|for|by)",
            "engage",
            "employer",
            True,
            1,
        ),
        (r"works?\s+as", "occupation", "occupation", True, 1),
        (r"(?:has\s+)?(?:quit|left|stopped|gave\s+up|given\s+up)", "engage", "engage", False, -1),
        (
            r"(?:has\s+)?(?:started|began|begun|joined|took\s+up|taken\s+up)|is\s+(?:learning|"
            r"taking|studying|practi[cs]ing|playing)|plays?|practi[cs]es?",
            "engage",
            "engage",
            False,
            1,
        ),
        (r"is\s+(?:allergic|intolerant)\s+to", "allergy", "allergy", False, 1),
        (r"is\s+(?:originally\s+)?from", "origin", "origin", True, 1),
        (
            r"(?:plans?|wants?|hopes?|intends?|is\s+planning|is\s+going|is\s+hoping)\s+to",
            "goal",
            "goal",
            False,
            1,
        ),
        (r"(?:has|have|owns?)", "has", "has", False, 1),
        (r"(?:is|are|was)", "is", "is", False, 1),
    )
)
_AGE = re.compile(r"^is\s+(?P<obj>\d{1,3})\s+years?\s+old$")

# Attributes that hold one value at a time ("the user's favorite color", "the user's birthday").
_SINGLE_ATTRIBUTES = frozenset(
    {"name", "birthday", "age", "hometown", "job", "occupation", "profession", "major", "address"}
)
# Relations with one person at a time, so "<relation>.name" is single-valued.
_SINGLE_RELATIONS = frozenset(
    {"wife", "husband", "partner", "spouse", "boyfriend", "girlfriend", "fiance", "fiancee"}
    | {"fiancé", "fiancée", "mother", "mom", "mum", "father", "dad", "boss", "manager"}
    | {"best friend"}
)
_OBJECT_STOPWORDS = frozenset(
    {"a", "an", "the", "some", "now", "anymore", "too", "very", "really", "much", "lot"}
)
_NEGATION_WORDS = frozenset(
    {"not", "no", "longer", "never", "don't", "doesn't", "didn't", "isn't", "aren't", "wasn't"}
    | {"does", "do", "did", "anymore", "now"}
)
_STEM_EXEMPT = frozenset({"is", "was", "has", "does", "this", "his", "its", "us", "yes"})


def _stem(word: str) -> str:
    """Light plural/third-person stemming so "likes"/"like" and "dogs"/"dog" compare equal."""
    if word in _STEM_EXEMPT or len(word) <= 3 or word.endswith("ss"):
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") else word


def _object_key(text: str) -> frozenset[str]:
    return frozenset(_stem(t) for t in tokens(text) if t not in _OBJECT_STOPWORDS)


def _clean_fact(text: str) -> str:
    return " ".join(text.replace("’", "'").split()).rstrip(".!;, ")


@functools.lru_cache(maxsize=65_536)
def parse_fact(text: str) -> FactParts | None:
    """Subject, predicate and object of a third-person fact; None for other shapes (kept per
    text: a stored fact is parsed again for each new fact it is related to)."""
    fact = _clean_fact(text)
    possessive = _POSSESSIVE_FORM.fullmatch(fact)
    if possessive:
        attr = " ".join(possessive.group("attr").split())
        attr = re.sub(r"^(?:favou?rite|fave)\b", "favorite", attr)
        named = possessive.group("named") is not None
        slot = f"{attr}.name" if named else attr
        single = (
            attr in _SINGLE_ATTRIBUTES
            or attr.startswith("favorite ")
            or (named and attr in _SINGLE_RELATIONS)
        )
        obj = _object_key(possessive.group("obj"))
        if not obj:
            return None
        return FactParts(
            subject=possessive.group("subj").lower(),
            topic=f"attr:{slot}",
            slot=slot,
            single=single,
            polarity=-1 if possessive.group("neg") else 1,
            predicate=f"{attr} is named" if named else f"{attr} is",
            obj=obj,
        )
    verb_form = _VERB_FORM.fullmatch(fact)
    if verb_form is None:
        return None
    rest = _LEADING_ADVERBS.sub("", verb_form.group("rest"))
    polarity = 1
    negated_be = _NEGATED_BE.match(rest)
    negated = _NEGATION_PREFIX.match(rest)
    if negated_be:
        rest, polarity = f"{negated_be.group('be')} {negated_be.group('tail')}", -1
    elif negated:
        rest, polarity = negated.group("tail"), -1
    subject = verb_form.group("subj").lower()
    age = _AGE.match(rest)
    if age:
        return FactParts(subject, "age", "age", True, polarity, "is years old", _object_key(age[1]))
    for pattern, topic, slot, single, sign in _PREDICATES:
        match = pattern.match(rest)
        if match is None:
            continue
        obj = _object_key(match.group("obj"))
        if not obj:
            return None
        predicate = " ".join(match.group("pred").split())
        return FactParts(subject, topic, slot, single, polarity * sign, predicate, obj)
    return None


@functools.lru_cache(maxsize=65_536)
def _subject_of(text: str) -> str | None:
    """The leading subject of a fact ("the user", "caroline"), for the band-based UPDATE (kept
    per text, as `parse_fact`)."""
    match = re.match(_SUBJECT + r"(?='s\b|\s)", _clean_fact(text))
    return match.group("subj").lower() if match else None


# --------------------------------------------------------------------------- rule decisions

Relation = Literal["contradicts", "duplicate", "updates", "unrelated"]


def _structural_relation(new: FactParts, old: FactParts) -> tuple[Relation, str]:
    if new.subject != old.subject:
        return "unrelated", "different subjects"
    if new.topic == old.topic and new.obj == old.obj:
        if new.polarity != old.polarity:
            return "contradicts", f"opposite polarity on the same {new.topic} object"
        if new.predicate == old.predicate:
            return "duplicate", "same subject, predicate and object"
        return "updates", f"same object, predicate changed to '{new.predicate}'"
    if new.slot == old.slot and new.single and new.polarity == old.polarity == 1:
        return "updates", f"new value for the single-valued slot '{new.slot}'"
    if new.topic == old.topic and new.polarity == old.polarity:
        if new.obj > old.obj:
            return "updates", "refines the object"
        if new.obj < old.obj:
            return "duplicate", "the memory already says more"
        if _new_count(new.obj, old.obj):
            return "updates", "a new count of the same thing"
    return "unrelated", "different facts"


#: Words that count ("has two kids" -> "has three kids" is one fact with a new count).
_COUNTS = frozenset(
    {"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
    | {"several", "many", "few", "couple"}
)


def _new_count(new: frozenset[str], old: frozenset[str]) -> bool:
    """The two objects name the same thing with a different count (words or digits)."""

    def split(words: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
        counts = frozenset(w for w in words if w in _COUNTS or w.isdigit())
        return words - counts, counts

    new_thing, new_counts = split(new)
    old_thing, old_counts = split(old)
    return bool(new_thing) and new_thing == old_thing and bool(new_counts) and bool(old_counts)


#: The negation words that make a text negated ("does", "now" only go with them).
_NEGATING_WORDS = _NEGATION_WORDS - {"does", "do", "did", "now"}


def _negation_only_difference(a: str, b: str) -> bool:
    """True when two texts differ only by negation words and one of them is negated."""
    negated_a, core_a = _negation_parts(a)
    negated_b, core_b = _negation_parts(b)
    return bool(core_a) and core_a == core_b and negated_a != negated_b


@functools.lru_cache(maxsize=65_536)
def _negation_parts(text: str) -> tuple[bool, frozenset[str]]:
    """Whether `text` is negated, and its stemmed words without negation words (kept per text:
    a stored fact is compared with each new fact of its owner)."""
    words = set(tokens(text))
    return bool(words & _NEGATING_WORDS), frozenset(_stem(t) for t in words - _NEGATION_WORDS)


def relate(
    new_text: str,
    old_text: str,
    cos: float | None,
    bands: SimilarityBands = SimilarityBands(),
) -> tuple[Relation, str]:
    """How a new fact relates to one existing memory, with a short reason (see module doc)."""
    if _normalised(new_text) == _normalised(old_text):
        return "duplicate", "same text"
    new_parts, old_parts = parse_fact(new_text), parse_fact(old_text)
    if new_parts is not None and old_parts is not None:
        return _structural_relation(new_parts, old_parts)
    if _negation_only_difference(new_text, old_text):
        return "contradicts", "differs only by negation"
    jac = jaccard(new_text, old_text)
    if jac >= bands.jaccard_duplicate:
        return "duplicate", f"near-duplicate (jaccard {jac:.2f})"
    if cos is not None and cos >= bands.cosine_duplicate:
        return "duplicate", f"near-duplicate (cosine {cos:.2f})"
    subject = _subject_of(new_text)
    same_subject = subject is not None and subject == _subject_of(old_text)
    if cos is not None and cos >= bands.cosine_update and same_subject:
        return "updates", f"same subject, similar (cosine {cos:.2f})"
    return "unrelated", "below the similarity bands"


def _decide(
    event: Event,
    memory: ExistingMemory,
    reason: str,
    similarity: float | None = None,
    fact_index: int | None = None,
    text: str | None = None,
) -> Decision:
    """A decision about an existing memory; `text` defaults to the memory's own text."""
    return Decision(event, text or memory.text, memory.id, reason, similarity, fact_index)


def _unique_neighbours(neighbours: Iterable[ExistingMemory]) -> list[ExistingMemory]:
    """Neighbours retrieved for several facts come once, in first-seen order."""
    seen: set[str] = set()
    unique = []
    for memory in neighbours:
        if memory.id not in seen:
            seen.add(memory.id)
            unique.append(memory)
    return unique


def _unique_fact_indexes(new_facts: list[str]) -> list[int]:
    seen: set[str] = set()
    indexes = []
    for index, fact in enumerate(new_facts):
        key = normalise_text(fact)
        if key and key not in seen:
            seen.add(key)
            indexes.append(index)
    return indexes


def reconcile_rules(
    new_facts: list[str],
    new_vectors: np.ndarray | None,
    neighbours: list[ExistingMemory],
    bands: SimilarityBands = SimilarityBands(),
) -> list[Decision]:
    """Full-enumeration decisions for `new_facts` against `neighbours`, without an LLM.

    `new_vectors[i]` embeds `new_facts[i]`; pass None (or neighbours without vectors) to
    decide on structure and Jaccard alone. Exact duplicates inside the batch are written once.
    """
    memories = _unique_neighbours(neighbours)
    units = [_Unit.of(memory.vector) for memory in memories]
    decided: dict[str, Decision] = {}
    adds: list[Decision] = []
    for index in _unique_fact_indexes(new_facts):
        fact = new_facts[index]
        unit = None if new_vectors is None else _Unit.of(new_vectors[index])
        contradicted: list[tuple[ExistingMemory, float | None, str]] = []
        duplicates: list[tuple[ExistingMemory, float, str]] = []
        updates: list[tuple[ExistingMemory, float, str]] = []
        for memory, memory_unit in zip(memories, units, strict=True):
            cos = _cosine_of(unit, memory_unit)
            relation, why = relate(fact, memory.text, cos, bands)
            similarity = cos if cos is not None else jaccard(fact, memory.text)
            if relation == "contradicts":
                contradicted.append((memory, similarity, why))
            elif relation == "duplicate":
                duplicates.append((memory, similarity, why))
            elif relation == "updates" and memory.id not in decided:
                updates.append((memory, similarity, why))
        for memory, similarity, why in contradicted:
            if memory.id not in decided:
                reason = f"contradicted by new fact: {why}"
                decided[memory.id] = _decide("DELETE", memory, reason, similarity, index)
        if duplicates:
            memory, similarity, why = max(duplicates, key=lambda item: item[1])
            if memory.id not in decided:
                reason = f"new fact is a duplicate: {why}"
                decided[memory.id] = _decide("NONE", memory, reason, similarity, index)
            continue
        if updates and not contradicted:
            memory, similarity, why = max(updates, key=lambda item: item[1])
            reason = f"updated by new fact: {why}"
            decided[memory.id] = _decide("UPDATE", memory, reason, similarity, index, text=fact)
            continue
        reason = "replaces contradicted memories" if contradicted else "new information"
        adds.append(Decision("ADD", fact, None, reason, fact_index=index))
    enumerated = [
        decided.get(memory.id) or _decide("NONE", memory, "unrelated to the new facts")
        for memory in memories
    ]
    return enumerated + adds


# --------------------------------------------------------------------------- LLM decisions


def _add_all(new_facts: list[str], memories: list[ExistingMemory], reason: str) -> list[Decision]:
    """The safe default: every memory kept, every (batch-unique) new fact added."""
    keep = [_decide("NONE", memory, reason) for memory in memories]
    adds = [
        Decision("ADD", new_facts[index], None, reason, fact_index=index)
        for index in _unique_fact_indexes(new_facts)
    ]
    return keep + adds


def update_memory_messages(
    new_facts: list[str], neighbours: list[ExistingMemory]
) -> list[dict[str, str]]:
    """The reconciliation prompt, with neighbours under temporary ids "0".."n-1"."""
    existing = [{"id": str(i), "text": memory.text} for i, memory in enumerate(neighbours)]
    prompt = UPDATE_MEMORY_PROMPT.format(
        existing_memories=json.dumps(existing, ensure_ascii=False, indent=2),
        new_facts=json.dumps(new_facts, ensure_ascii=False, indent=2),
    )
    return [{"role": "user", "content": prompt}]


def _valid_memory_text(text: str) -> str | None:
    cleaned = " ".join(text.split())
    return cleaned if cleaned and len(cleaned) <= MAX_FACT_CHARS else None


def reconcile_llm(
    llm: LLMClient, new_facts: list[str], neighbours: list[ExistingMemory]
) -> tuple[list[Decision], LLMError | None]:
    """Full-enumeration decisions from the LLM; `(ADD everything, error)` when the call fails.

    With no neighbours the facts are ADDed without a call (seed 000 §4.3). Mapping the answer:
    UPDATE/DELETE/NONE must name a temporary id we sent (anything else is ignored, and the first
    decision per id wins); ADDs that repeat a stored memory are dropped; neighbours missing
    from the answer get NONE; new facts missing from it (and not near-duplicates of any text in
    it) are ADDed, since losing a fact is worse than a duplicate the consolidation can merge.
    """
    memories = _unique_neighbours(neighbours)
    fact_indexes = _unique_fact_indexes(new_facts)
    if not fact_indexes:
        return _add_all(new_facts, memories, "no new facts"), None
    if not memories:
        return _add_all(new_facts, memories, "no existing memories to compare with"), None
    facts = [new_facts[index] for index in fact_indexes]
    try:
        answer = llm.complete_json(update_memory_messages(facts, memories), MemoryDecisionList)
    except LLMError as error:
        return _add_all(new_facts, memories, f"LLM {error.kind} failure: added by default"), error

    fact_by_key = {normalise_text(new_facts[index]): index for index in fact_indexes}
    stored_keys = {normalise_text(memory.text) for memory in memories}
    decided: dict[str, Decision] = {}
    adds: list[Decision] = []
    answered: list[str] = []
    for item in answer.root:
        text = _valid_memory_text(item.text)
        if text is None:
            continue
        answered.append(text)
        key = normalise_text(text)
        if item.event == "ADD":
            if key not in stored_keys and all(normalise_text(a.text) != key for a in adds):
                reason = "LLM: new information"
                adds.append(Decision("ADD", text, None, reason, fact_index=fact_by_key.get(key)))
            continue
        memory_index = int(item.id) if item.id.strip().isdigit() else -1
        if not 0 <= memory_index < len(memories):
            continue  # an id the model invented: never trusted
        memory = memories[memory_index]
        if memory.id in decided:
            continue
        if item.event == "UPDATE" and key != normalise_text(memory.text):
            index = fact_by_key.get(key)
            decided[memory.id] = _decide("UPDATE", memory, "LLM: update", None, index, text=text)
        elif item.event == "DELETE":
            decided[memory.id] = _decide("DELETE", memory, "LLM: contradicted")
        else:
            decided[memory.id] = _decide("NONE", memory, "LLM: unchanged")

    for index in fact_indexes:
        fact = new_facts[index]
        if normalise_text(fact) in stored_keys or is_near_duplicate(fact, answered):
            continue
        reason = "left out by the LLM: added by default"
        adds.append(Decision("ADD", fact, None, reason, fact_index=index))
    enumerated = [
        decided.get(memory.id) or _decide("NONE", memory, "not in the LLM answer")
        for memory in memories
    ]
    return enumerated + adds, None
