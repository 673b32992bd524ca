"""Named-entity extraction and entity resolution for the write path (seed 004 `ner`, `entities`).

Two strategies:

* ``fast`` (the ``regex`` provider, always available): regular expressions for @mentions,
  #hashtags, emails, URLs and calendar dates, plus capitalised-name heuristics with context cues
  ("my wife is Anne" -> person, "I live in Paris" -> location, "working on Apollo" -> project,
  "I work at Acme" -> organization).
* ``accurate``: ``fast`` plus spaCy NER (``en_core_web_sm``) when spaCy and the model are
  installed. spaCy is optional and imported lazily; without it ``accurate`` equals ``fast``.

Decisions:

* Relative time words ("yesterday", "last week", "tomorrow") are not entities: they name no
  stable thing and only mean something next to the turn's timestamp, which the store keeps anyway.
* Dates are canonicalised to ISO (``2023-05-08``; ``2023-05`` for "May 2023") so "8 May 2023" and
  "May 8, 2023" resolve to the same entity. Purely numeric dates other than ISO (``08/05/2023``)
  are skipped because day/month order is ambiguous.
* A capitalised word at the start of a sentence is usually just a capitalised word, so a lone
  sentence-initial word is kept only when it is clearly a name: it is followed by a possessive or
  a subject verb ("Caroline loves pizza"), or the same word appears capitalised mid-sentence too.
* Capitalised runs without a context cue get type ``other``: we cannot tell a person from a city
  by capitalisation alone. The resolver treats ``other`` as compatible with every name type.
* Overlapping spans from all providers are deduplicated: highest confidence wins, then the longest
  span, then the earliest.

Confidences: email/url 0.99, mention/hashtag 0.95, full date 0.95, month-year 0.8, relation cue
person 0.9, title/"my name is" person 0.85, spaCy 0.85, location/organization/project cue 0.8,
organisation-suffix run 0.7, plain capitalised run 0.5 (0.4 when sentence-initial).

Kept as one module (~560 lines): one extractor; most of it is pattern tables (dates, names,
cues) and the spaCy bridge, which must agree on one output type.

Why one module of ~640 lines: most of it is the `fast` extractor's patterns and cue lists, whose
order matters; resolution sits beside them because it compares the canonical names they make.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal, Protocol, TypeVar

import polars as pl

from memory_dag.parallel import process_map, process_map_iter

EntityType = Literal[
    "person",
    "project",
    "organization",
    "location",
    "email",
    "url",
    "mention",
    "hashtag",
    "date",
    "other",
]

#: Types that name a real-world thing by its written name (title-cased canonical form).
NAME_TYPES = frozenset({"person", "project", "organization", "location", "other"})

REGEX_PROVIDER = "regex"
SPACY_PROVIDER = "spacy"
SPACY_MODEL = "en_core_web_sm"


@dataclass(frozen=True)
class EntityMention:
    """One entity found in a text; ``start``/``end`` are character offsets into that text."""

    text: str
    canonical: str
    type: str
    start: int
    end: int
    confidence: float
    provider: str


@dataclass(frozen=True)
class KnownEntity:
    """An entity already registered in the store (a row of the ``entities`` table)."""

    id: str
    canonical_name: str
    type: str
    aliases: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- regex provider


def _words(text: str) -> frozenset[str]:
    """A word set written as one whitespace-separated block (keeps the long lists readable)."""
    return frozenset(text.split())


_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'()]+", re.IGNORECASE)
_MENTION = re.compile(r"(?<![\w@.])@([A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?)")
_HASHTAG = re.compile(r"(?<![\w&#/])#([A-Za-z_][A-Za-z0-9_-]*)")

_MONTHS = {
    "january": 1,
    "february": 2,
    "march": 3,
    "april": 4,
    "may": 5,
    "june": 6,
    "july": 7,
    "august": 8,
    "september": 9,
    "october": 10,
    "november": 11,
    "december": 12,
}
_MONTH_ABBREVIATIONS = {name[:3]: number for name, number in _MONTHS.items()} | {"sept": 9}
_MONTH_NUMBERS = _MONTHS | _MONTH_ABBREVIATIONS
_MONTH = (
    r"(?P<month>January|February|March|April|May|June|July|August|September|October|November"
    r"|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?"
)
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DATE_PATTERNS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"\b(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)\b"), 0.95),
    (re.compile(rf"\b{_DAY}(?:\s+of)?\s+{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE), 0.95),
    (re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE), 0.95),
    (re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE), 0.8),
)

# A name token: capitalised word, allowing inner apostrophes and hyphens (O'Brien, Jean-Luc).
_CAPITAL = r"[A-ZÀ-ÖØ-Þ]"
_NAME_TAIL = r"[A-Za-zÀ-ÖØ-öø-ÿ0-9]*(?:['’-][A-Za-zÀ-ÖØ-öø-ÿ]+)*"
_NAME_TOKEN = _CAPITAL + _NAME_TAIL
_CONNECTOR = r"(?:of|de|da|di|du|del|der|van|von|la|le)"
# At most six words, starting at a word boundary: bounds the regex work per position, so long
# title-cased text stays linear.
_NAME = rf"(?<![\w'’-]){_NAME_TOKEN}(?:\s+(?:{_CONNECTOR}\s+)?{_NAME_TOKEN}){{0,5}}"
# Inside case-insensitive cue patterns the name itself must stay case-sensitive.
_CASED_NAME = rf"(?-i:{_NAME})"
# `(?<![@#]){_NAME}`, written to start with the capital (the character before it is then
# looked at behind the capital): a pattern that starts with a character set lets `re` skip
# to the next capital letter instead of trying every position, half the time of a scan.
_NAME_RUN = re.compile(
    rf"{_CAPITAL}(?<![@#\w'’-].){_NAME_TAIL}(?:\s+(?:{_CONNECTOR}\s+)?{_NAME_TOKEN}){{0,5}}"
)
_CONNECTORS = frozenset({"of", "de", "da", "di", "du", "del", "der", "van", "von", "la", "le"})

# Capitalised words that are never names on their own, wherever they appear.
_ALWAYS_STOP = _words(
    """
    i i'm i've i'd i'll im ive me my mine myself we we're we've our ours us you you're your yours
    he he's his him she she's her hers it it's its they they're their them this that these those
    there here the a an
    monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri
    sat sun january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
    today tomorrow yesterday tonight morning evening afternoon night weekend
    ok okay yes yeah yep yup no nope lol haha omg btw tbh
    """
)
# Words that often start a sentence; removed from the front of a sentence-initial run.
_SENTENCE_STARTERS = _ALWAYS_STOP | _words(
    """
    and but or so if when what who whom whose why how where which while because since though
    although as at in on for from with without about after before by to of into onto over under
    is are was were be been am do does did have has had can could will would shall should may
    might must let let's lets please thanks thank hi hello hey dear oh wow well also just maybe
    actually really sure great good nice cool awesome glad sorry anyway anyways plus then now
    not never every each some any all both many much more most other another such only even
    still yet already again last next first one two three totally definitely absolutely honestly
    congrats congratulations happy sounds looks seems guess hope love like hate went got gonna
    """
)
# Lower-case words that, right after a sentence-initial capitalised word, mark it as a subject.
_SUBJECT_VERBS = _words(
    """
    is was has had and said says told asked called texted wrote went came got made took gave
    loves likes lives works wants thinks knows feels seems looks sounds will would can could
    """
)
_ORG_SUFFIXES = _words(
    """
    inc inc. corp corp. corporation ltd ltd. llc plc gmbh co co. company group bank university
    college school institute foundation labs lab studios studio hospital agency association
    """
)
_TITLES = r"(?:Mr|Mrs|Ms|Miss|Dr|Prof)\.?"
_TITLE_WORDS = frozenset({"mr", "mrs", "ms", "miss", "dr", "prof"})

_RELATIONS = (
    r"wife|husband|partner|spouse|boyfriend|girlfriend|fianc[eé]e?|friend|bestie|sister|brother|"
    r"sibling|mother|mom|mum|mama|father|dad|papa|son|daughter|kid|child|baby|cousin|aunt|uncle|"
    r"grandma|grandmother|granny|grandpa|grandfather|niece|nephew|boss|manager|colleague|"
    r"co-?worker|roommate|flatmate|neighbou?r|teacher|mentor|therapist|doctor|coach|"
    r"(?:step|half)-?(?:sister|brother|mother|father|son|daughter)"
)
_RELATION_ADJECTIVES = r"(?:(?:best|old|close|new|ex|little|big|older|younger|late|dear)[\s-]+)?"

# (pattern with a `name` group, type, confidence). Case-insensitive cue words, but the name group
# itself must be capitalised; that is checked after matching.
_CUES: tuple[tuple[re.Pattern[str], str, float], ...] = (
    (
        re.compile(
            rf"(?:\bmy|['’]s)\s+{_RELATION_ADJECTIVES}(?:{_RELATIONS})(?:'s\s+name)?"
            rf"(?:\s*,\s*|\s+(?:is|was|'s)\s+(?:named\s+|called\s+)?|\s+(?:named|called)\s+|\s+)"
            rf"(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "person",
        0.9,
    ),
    (
        re.compile(
            rf"(?P<name>{_CASED_NAME})\s+(?:is|was|'s)\s+my\s+{_RELATION_ADJECTIVES}(?:{_RELATIONS})\b",
            re.IGNORECASE,
        ),
        "person",
        0.9,
    ),
    (
        re.compile(rf"\b(?:my\s+name\s+is|call\s+me)\s+(?P<name>{_CASED_NAME})", re.IGNORECASE),
        "person",
        0.85,
    ),
    (re.compile(rf"(?P<name>\b{_TITLES}\s+{_CASED_NAME})"), "person", 0.85),
    (
        re.compile(
            r"\b(?:live[sd]?|living|based|born|grew\s+up|staying|settled)\s+in\s+"
            rf"(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "location",
        0.8,
    ),
    (
        re.compile(
            r"\b(?:moved|moving|move|relocat\w+|flew|flying|fly|travel\w*|trip|headed|heading)"
            rf"\s+(?:back\s+)?to\s+(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "location",
        0.8,
    ),
    (
        re.compile(
            rf"\b(?:i'm|i\s+am|he's|she's|is|are|was|comes?|came)\s+from\s+(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "location",
        0.8,
    ),
    (
        re.compile(
            r"\b(?:work|works|worked|working|job|intern(?:ing|ship)?|employed|hired)\s+"
            rf"(?:at|for|by)\s+(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "organization",
        0.8,
    ),
    (
        re.compile(
            r"\b(?:working|work|works|worked)\s+on\s+(?:the\s+|a\s+|my\s+|our\s+)?"
            rf"(?:project\s+)?(?P<name>{_CASED_NAME})",
            re.IGNORECASE,
        ),
        "project",
        0.8,
    ),
    (re.compile(rf"\b[Pp]roject\s+(?P<name>{_CASED_NAME})"), "project", 0.85),
    (re.compile(rf"(?P<name>{_CASED_NAME})\s+project\b"), "project", 0.85),
)

# spaCy label -> our type; labels not listed are dropped (numbers, money, times...).
SPACY_LABELS: dict[str, str] = {
    "PERSON": "person",
    "ORG": "organization",
    "GPE": "location",
    "LOC": "location",
    "FAC": "location",
    "DATE": "date",
    "NORP": "other",
    "EVENT": "other",
    "PRODUCT": "other",
    "WORK_OF_ART": "other",
    "LAW": "other",
    "LANGUAGE": "other",
}


def _title_case(text: str) -> str:
    """Upper-case the first letter of each word as written, leaving connectors and inner case."""
    words = text.split()
    titled = []
    for index, word in enumerate(words):
        if index > 0 and word.lower() in _CONNECTORS:
            titled.append(word)
        else:
            titled.append(word[:1].upper() + word[1:])
    return " ".join(titled)


_POSSESSIVE_END = re.compile(r"['’]s$")
_NON_SPACE_RUN = re.compile(r"\S+")
_HAS_SPACE = re.compile(r"\s")
_EDGE_STOP = _ALWAYS_STOP | _CONNECTORS  # never the first or last word of a name
_BEFORE_SENTENCE = " \t\"'“‘([*-•"  # what may stand between a sentence's start and its first word


def _strip_possessive(text: str) -> str:
    """`text` without a final 's or ’s (what `_POSSESSIVE_END.sub("", text)` gives, without
    the regular expression: it runs on every capitalised word)."""
    if text.endswith(("'s", "’s")):
        return text[:-2]
    if text.endswith(("'s\n", "’s\n")):  # `$` also matches before a final line break
        return text[:-3] + "\n"
    return text


def _date_iso(text: str) -> str | None:
    """ISO form of an absolute date ("8 May 2023" -> "2023-05-08"), or None if not one."""
    for pattern, _ in _DATE_PATTERNS:
        match = pattern.fullmatch(text.strip())
        if match:
            return _iso_from_match(match)
    return None


def _iso_from_match(match: re.Match[str]) -> str | None:
    groups = match.groupdict()
    year = int(groups["year"])
    raw_month = groups["month"].lower().rstrip(".")
    month = int(raw_month) if raw_month.isdigit() else _MONTH_NUMBERS.get(raw_month)
    if month is None or not 1 <= month <= 12:
        return None
    if groups.get("day") is None:
        return f"{year:04d}-{month:02d}"
    try:
        return date(year, month, int(groups["day"])).isoformat()
    except ValueError:
        return None


@functools.lru_cache(maxsize=65_536)
def canonical_name(text: str, type: str) -> str:
    """The key an entity is registered under, so spelling variants resolve to one entity
    (kept per name: the same names come back in text after text)."""
    cleaned = " ".join(text.split()).strip(" \t.,;:!?\"'“”()[]")
    if type in ("email", "url"):
        return cleaned.lower()
    if type in ("mention", "hashtag"):
        return cleaned.lstrip("@#").lower()
    if type == "date":
        return _date_iso(cleaned) or cleaned
    return _title_case(_strip_possessive(cleaned))


def _mention(text: str, start: int, type: str, confidence: float, provider: str) -> EntityMention:
    return EntityMention(
        text=text,
        canonical=canonical_name(text, type),
        type=type,
        start=start,
        end=start + len(text),
        confidence=confidence,
        provider=provider,
    )


def _sentence_initial(text: str, position: int) -> bool:
    """True when only sentence punctuation, quotes, bullets or nothing precede `position`."""
    while position > 0 and text[position - 1] in _BEFORE_SENTENCE:
        position -= 1
    return position == 0 or text[position - 1] in ".!?:;\n"


#: The patterns of `_regex_entities`, in the order they are tried: (pattern, type, confidence).
_REGEX_PATTERNS: tuple[tuple[re.Pattern[str], str, float], ...] = (
    (_EMAIL, "email", 0.99),
    (_URL, "url", 0.99),
    (_MENTION, "mention", 0.95),
    (_HASHTAG, "hashtag", 0.95),
    *((pattern, "date", confidence) for pattern, confidence in _DATE_PATTERNS),
)


def _regex_entities(text: str, may: Sequence[bool] | None = None) -> list[EntityMention]:
    """Emails, URLs, mentions, hashtags, dates; `may[i]` False: pattern i cannot match."""
    found: list[EntityMention] = []
    for index, (pattern, kind, confidence) in enumerate(_REGEX_PATTERNS):
        if may is not None and not may[index]:
            continue
        for match in pattern.finditer(text):
            value = match.group(0)
            if kind == "url":
                value = value.rstrip(".,;:!?")
            elif kind == "date" and _iso_from_match(match) is None:
                continue
            found.append(_mention(value, match.start(), kind, confidence, REGEX_PROVIDER))
    return found


def _clean_name_span(text: str, start: int, end: int) -> tuple[int, int] | None:
    """Trim a possessive and stop words off a captured name; None when nothing is left."""
    span = text[start:end]
    possessive = _POSSESSIVE_END.search(span)
    if possessive:
        end -= 2
    if not _HAS_SPACE.search(text, start, end):  # one word (most spans): no token loop
        word = text[start:end]
        return None if not word or word.lower() in _EDGE_STOP else (start, end)
    tokens = list(_NON_SPACE_RUN.finditer(text, start, end))
    while tokens and tokens[0].group(0).lower() in _EDGE_STOP:
        tokens.pop(0)
    while len(tokens) > 1 and tokens[0].group(0).lower() in _SENTENCE_STARTERS:
        tokens.pop(0)
    while tokens and tokens[-1].group(0).lower() in _EDGE_STOP:
        tokens.pop()
    if not tokens:
        return None
    return tokens[0].start(), tokens[-1].end()


def _cue_entities(text: str, may: Sequence[bool] | None = None) -> list[EntityMention]:
    """Names after (or before) a context cue; `may[i]` False: cue i cannot match."""
    found: list[EntityMention] = []
    for index, (pattern, kind, confidence) in enumerate(_CUES):
        if may is not None and not may[index]:
            continue
        for match in pattern.finditer(text):
            if not match.group("name")[:1].isupper():
                continue
            span = _clean_name_span(text, match.start("name"), match.end("name"))
            if span is None:
                continue
            found.append(
                _mention(text[span[0] : span[1]], span[0], kind, confidence, REGEX_PROVIDER)
            )
    return found


def _split_run(text: str, match: re.Match[str]) -> list[tuple[int, int]]:
    """Split a capitalised run of several words at stop words, giving the (start, end) of each
    remaining piece (a run of one word: `_one_word_name`)."""
    initial = _sentence_initial(text, match.start())
    pieces: list[tuple[int, int]] = []
    current: list[tuple[int, int]] = []
    for token in _NON_SPACE_RUN.finditer(text, match.start(), match.end()):
        word = _strip_possessive(token.group(0)).lower()
        stop = word in _ALWAYS_STOP or (initial and not current and word in _SENTENCE_STARTERS)
        if stop:
            if current:
                pieces.append((current[0][0], current[-1][1]))
                current = []
            initial = False
            continue
        current.append((token.start(), token.end()))
    if current:
        pieces.append((current[0][0], current[-1][1]))
    return pieces


def _clearly_a_name(text: str, start: int, end: int) -> bool:
    """Whether a lone sentence-initial capitalised word reads as a name (see module docstring)."""
    word = text[start:end]
    bare = _strip_possessive(word)
    for other in _whole_word_at(text, bare):
        if other != start and not _sentence_initial(text, other):
            return True
    if bare.lower().endswith("ing"):
        return False  # a gerund ("Painting looks great"), not a name
    if _POSSESSIVE_AFTER.match(text, end) or _POSSESSIVE_END.search(word):
        return True
    following = _WORD_AFTER.match(text, end)
    return bool(following and following.group(1) in _SUBJECT_VERBS)


_POSSESSIVE_AFTER = re.compile(r"['’]s\b")
_WORD_AFTER = re.compile(r"\s+([a-z]+)")


def _whole_word_at(text: str, word: str) -> list[int]:
    r"""Where `word` stands as a whole word in `text`: the starts of the matches of
    `(?<![\w'’-])word\b`, found with `str.find` (a pattern per word would be compiled for
    every capitalised word of every text)."""
    if not word or not _is_word_char(word[-1]):  # not a name's word: the pattern itself
        return [m.start() for m in re.finditer(rf"(?<![\w'’-]){re.escape(word)}\b", text)]
    starts = []
    position = text.find(word)
    while position != -1:
        after = position + len(word)
        before_ok = position == 0 or not (
            _is_word_char(text[position - 1]) or text[position - 1] in "'’-"
        )
        if before_ok and (after == len(text) or not _is_word_char(text[after])):
            starts.append(position)
        position = text.find(word, position + 1)
    return starts


def _is_word_char(char: str) -> bool:
    r"""What `\w` matches in a `str` pattern."""
    return char.isalnum() or char == "_"


@functools.lru_cache(maxsize=65_536)
def _one_word_name(run: str) -> tuple[int, bool] | None:
    """What a capitalised run of one word gives wherever it stands, worked out once per word
    (runs are ~11 a text, nearly all one word, and the same words: "I", "It's", "Thanks",
    "Maria"): None when it is never a name (a stop word, a title); else the length of the name
    (a possessive trimmed) and whether it is a sentence starter, no name at a sentence's start.

    These are the text-independent steps of `_split_run`, `_clean_name_span` and the title test
    of `_name_entities`, in their order; the steps that look at the text stay there."""
    word = _strip_possessive(run).lower()
    if word in _ALWAYS_STOP:
        return None
    starter = word in _SENTENCE_STARTERS
    length = len(run) - 2 if _POSSESSIVE_END.search(run) else len(run)
    name = run[:length]
    if not name or name.lower() in _EDGE_STOP:
        return None
    if name.lower().rstrip(".") in _TITLE_WORDS:
        return None
    return length, starter


def _name_entities(text: str) -> list[EntityMention]:
    found: list[EntityMention] = []
    for match in _NAME_RUN.finditer(text):
        run = match.group(0)
        if not _HAS_SPACE.search(run):  # one word (most runs): `_one_word_name` knows it
            known = _one_word_name(run)
            if known is None:
                continue
            length, starter = known
            start = match.start()
            end = start + length
            initial = _sentence_initial(text, start)
            if initial and (starter or not _clearly_a_name(text, start, end)):
                continue
            confidence = 0.4 if initial else 0.5
            found.append(_mention(text[start:end], start, "other", confidence, REGEX_PROVIDER))
            continue
        for piece_start, piece_end in _split_run(text, match):
            span = _clean_name_span(text, piece_start, piece_end)
            if span is None:
                continue
            start, end = span
            words = text[start:end].split()
            if all(word.lower().rstrip(".") in _TITLE_WORDS for word in words):
                continue
            initial = _sentence_initial(text, start)
            if initial and len(words) == 1 and not _clearly_a_name(text, start, end):
                continue
            if len(words) > 1 and any(word.lower() in _ORG_SUFFIXES for word in words):
                kind, confidence = "organization", 0.7
            else:
                kind, confidence = "other", 0.4 if initial else 0.5
            found.append(_mention(text[start:end], start, kind, confidence, REGEX_PROVIDER))
    return found


# --------------------------------------------------------------------------- spaCy provider


@functools.cache
def _spacy_pipeline() -> Any | None:
    """The loaded spaCy model, or None when spaCy or the model is not installed."""
    try:
        spacy = importlib.import_module("spacy")
        return spacy.load(SPACY_MODEL)
    except (ImportError, OSError):
        return None


def accurate_extractor_available() -> bool:
    """True when the `accurate` strategy adds spaCy NER on top of the regex provider."""
    return _spacy_pipeline() is not None


def spacy_entity(text: str, start: int, label: str) -> EntityMention | None:
    """Map one spaCy entity to ours; None for labels we do not keep and for relative dates."""
    kind = SPACY_LABELS.get(label)
    if kind is None:
        return None
    if kind == "date" and _date_iso(text) is None:
        return None
    if kind in NAME_TYPES and text.lower() in _ALWAYS_STOP:
        return None
    return _mention(text, start, kind, 0.85, SPACY_PROVIDER)


def _spacy_entities(text: str) -> list[EntityMention]:
    nlp = _spacy_pipeline()
    if nlp is None:
        return []
    found = []
    for ent in nlp(text).ents:
        mention = spacy_entity(ent.text, ent.start_char, ent.label_)
        if mention is not None:
            found.append(mention)
    return found


# --------------------------------------------------------------------------- public API


def deduplicate_overlaps(mentions: Iterable[EntityMention]) -> list[EntityMention]:
    """Keep non-overlapping mentions: highest confidence, then longest, then earliest span."""
    ranked = sorted(mentions, key=lambda m: (-m.confidence, -(m.end - m.start), m.start))
    kept: list[EntityMention] = []
    for mention in ranked:
        if all(mention.end <= other.start or mention.start >= other.end for other in kept):
            kept.append(mention)
    return sorted(kept, key=lambda m: m.start)


def extract_entities(
    text: str, strategy: Literal["fast", "accurate"] = "fast"
) -> list[EntityMention]:
    """Entities in `text`, sorted by position, with overlapping spans resolved."""
    return _extract(text, strategy, None)


def extract_entities_batch(
    texts: Sequence[str], strategy: Literal["fast", "accurate"] = "fast"
) -> list[list[EntityMention]]:
    """`extract_entities` of each text, the same mentions, faster for many texts.

    Most texts hold no email, date or cue ("my wife", "lives in"), yet each of those ~20
    patterns costs Python's `re` a scan of every text. Polars first tests a pattern that
    matches wherever each of them does (`_PREFILTERS`); `re` then runs a pattern only on the
    texts where that test found something. Large batches are shared by worker processes.
    """
    if strategy == "accurate":  # spaCy's model stays loaded in this process
        return _extract_prefiltered(texts, strategy)
    return process_map(_extract_prefiltered, texts)


def extract_entities_iter(texts: Sequence[str]) -> Iterator[list[EntityMention]]:
    """`extract_entities_batch(texts)` ("fast"), one text's mentions at a time, in order, as
    the worker processes find them: the caller resolves the first texts' mentions while the
    workers read the rest (`parallel.process_map_iter`)."""
    return process_map_iter(_extract_prefiltered, texts)


def _extract_prefiltered(
    texts: Sequence[str], strategy: Literal["fast", "accurate"] = "fast"
) -> list[list[EntityMention]]:
    if len(texts) < BATCH_MIN_TEXTS:
        return [_extract(text, strategy, None) for text in texts]
    column = pl.Series("text", list(texts), dtype=pl.String)
    may = pl.DataFrame(
        [column.str.contains(prefilter).alias(str(i)) for i, prefilter in enumerate(_PREFILTERS)]
    ).to_numpy()
    return [_extract(text, strategy, row) for text, row in zip(texts, may, strict=True)]


def _extract(
    text: str, strategy: Literal["fast", "accurate"], may: Sequence[bool] | None
) -> list[EntityMention]:
    if strategy not in ("fast", "accurate"):
        raise ValueError(f"unknown NER strategy {strategy!r}")
    regexes = len(_REGEX_PATTERNS)
    mentions = (
        _regex_entities(text, None if may is None else may[:regexes])
        + _cue_entities(text, None if may is None else may[regexes:])
        + _name_entities(text)
    )
    if strategy == "accurate":
        mentions += _spacy_entities(text)
    return deduplicate_overlaps(mentions)


#: Below this many texts a batch is extracted one text at a time (no Polars pass).
BATCH_MIN_TEXTS = 64


def _necessary(pattern: re.Pattern[str]) -> str:
    """A pattern (in Polars' syntax) that matches wherever `pattern` does: the cue without its
    name, which stands at one end of each cue, so what is left is a substring of any match."""
    source = pattern.pattern.replace(_CASED_NAME, "")
    return ("(?i)" if pattern.flags & re.IGNORECASE else "") + source


#: One test per pattern of `_REGEX_PATTERNS`, then of `_CUES` (see `extract_entities_batch`).
#: The first four patterns look behind, which Polars cannot: their tests are a character.
_PREFILTERS: tuple[str, ...] = (
    "@",
    r"(?i)https?://|www\.",
    "@",
    "#",
    *(_necessary(pattern) for pattern, _ in _DATE_PATTERNS),
    *(_necessary(pattern) for pattern, _, _ in _CUES),
)


def _types_compatible(a: str, b: str) -> bool:
    """`other` is an unspecific name type, so it may match any name type (and vice versa)."""
    if a == b:
        return True
    return (a == "other" and b in NAME_TYPES) or (b == "other" and a in NAME_TYPES)


class NamedEntity(Protocol):
    """What `resolve` reads of an entity: a `KnownEntity`, or the entity linker's own record
    (passed as it is: building a `KnownEntity` per candidate per mention cost more than the
    resolution)."""

    @property
    def canonical_name(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def aliases(self) -> Sequence[str]: ...


Named = TypeVar("Named", bound=NamedEntity)


def resolve(mention: EntityMention, known: Iterable[Named]) -> Named | None:
    """The registered entity a mention refers to: canonical name + type first, then an alias.

    The alias step compares the mention's raw text and canonical name case-insensitively with
    each entity's aliases and canonical name, among entities of a compatible type (so the
    hashtag "#paris" never resolves to the location "Paris"). When several match, the choice
    does not depend on their order (entity ids are random, so neither may it): the mention's
    own type before an `other`, a canonical name before an alias, then the first by canonical
    name and type (a pair no two entities share).
    """
    candidates = list(known)
    for entity in candidates:
        if entity.type == mention.type and entity.canonical_name == mention.canonical:
            return entity
    keys = {mention.canonical.casefold(), mention.text.strip().casefold()}
    best: Named | None = None
    best_rank: tuple[bool, bool, str, str] | None = None
    for entity in candidates:
        if not _types_compatible(entity.type, mention.type):
            continue
        names = {alias.strip().casefold() for alias in entity.aliases}
        canonical = entity.canonical_name.casefold()
        names.add(canonical)
        if not keys & names:
            continue
        rank = (
            entity.type != mention.type,
            canonical not in keys,
            entity.canonical_name,
            entity.type,
        )
        if best_rank is None or rank < best_rank:
            best, best_rank = entity, rank
    return best
