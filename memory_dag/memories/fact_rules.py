"""The no-LLM fact extractor: first-person self-statements rewritten about the speaker.

Regular expressions recognise first-person self-statements at the start of a clause ("I love
X", "I'm a X", "my wife is Anne", "I moved to X", ...) and rewrite them about the speaker
("Caroline loves pizza." or, without a name, "The user loves pizza."). It is conservative:
anything inside a question, conditionals and statements it cannot rewrite without pronouns
are skipped. Thousands of turns per second. Its output goes through the same validation,
triage and write cap as the LLM's (`facts.py`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memory_dag.memories.facts import (
    _COUNT_WORDS,
    FactCandidate,
    candidate_limit,
    classify_fact,
    keep_valid,
    split_sentences,
)
from memory_dag.memories.reconcile import dedup_batch

_ADVERBS = (
    r"(?:(?:really|absolutely|totally|just|also|still|truly|do|so|honestly|actually|now|"
    r"currently|definitely|genuinely|kinda|kind\s+of|sort\s+of)\s+)*"
)
_IM = r"(?:i'm|i\s+am|im)\s+"
_IVE = r"(?:i've|i\s+have|ive)\s+"
_NAME = r"(?-i:[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2})"
_RELATIONS = (
    r"wife|husband|partner|spouse|boyfriend|girlfriend|fianc[eé]e?|friend|bestie|sister|brother|"
    r"sibling|mother|mom|mum|father|dad|son|daughter|kid|child|baby|cousin|aunt|uncle|grandma|"
    r"grandmother|grandpa|grandfather|niece|nephew|boss|manager|colleague|co-?worker|roommate|"
    r"neighbou?r|teacher|mentor|therapist|doctor|coach|dog|cat|puppy|kitten|pet|horse"
)
_RELATION_ADJECTIVES = r"(?:(?:best|old|close|new|ex|little|big|older|younger|late)[\s-]+)?"
_OWN_THINGS = (
    r"name|birthday|job|hometown|major|goal|dream|plan|passion|hobby|profession|occupation|"
    r"career|degree|home|house|apartment|car|company|business|team"
)
_STATES = (
    r"vegan|vegetarian|pescatarian|married|single|divorced|engaged|pregnant|retired|widowed|"
    r"left-handed|right-handed|transgender|gay|lesbian|bisexual|straight|non-?binary|"
    r"self-employed|unemployed|a\s+student|an\s+only\s+child"
)
_PREFERENCE_VERBS = {
    "love": "loves",
    "like": "likes",
    "hate": "hates",
    "dislike": "dislikes",
    "prefer": "prefers",
    "enjoy": "enjoys",
    "adore": "adores",
    "detest": "detests",
    "can't stand": "cannot stand",
    "cannot stand": "cannot stand",
    "can not stand": "cannot stand",
}
_EVENT_VERBS = (
    r"started|quit|joined|left|finished|graduated\s+from|adopted|bought|began|launched|"
    r"signed\s+up\s+for|retired\s+from|took\s+up|gave\s+up|stopped|won|visited|went\s+to|"
    r"attended|completed|ran|got\s+(?:married|engaged|divorced|promoted|a\s+new\s+job|a\s+job)"
)
_ACTIVITY_VERBS = (
    r"learning|studying|taking|reading|writing|building|training\s+for|training|practicing|"
    r"practising|volunteering\s+at|volunteering|attending|preparing\s+for|saving\s+for|"
    r"looking\s+for|applying\s+for|applying\s+to|thinking\s+about|considering|raising|teaching|"
    r"organi[sz]ing|renovating|starting|joining|quitting|leaving|adopting|moving\s+to"
)
_HABIT_VERBS = (
    r"play|paint|cook|bake|run|swim|read|write|watch|volunteer|teach|study|practice|practise|"
    r"collect|go|hike|ski|surf|dance|sing|draw|knit|garden|meditate|drive|ride|speak"
)
_NEGATABLE = r"like|love|enjoy|eat|drink|watch|play|want|have|smoke|own"
# "I'm a bit tired" is a mood, not a role.
_NOT_A_ROLE = r"(?:bit|little|lot|while|couple|mess|wreck|tad|few)\b"


def _rule(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern + r"\s*$", re.IGNORECASE)


# Each rule: compiled pattern over one clause (fillers removed) and a template. Templates use
# {S} subject, {P} possessive subject, and named groups; {obj} is rewritten to third person.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (_rule(r"i\s+no\s+longer\s+(?P<verb>\w+)\s+(?P<obj>.+)"), "{S} no longer {verb3} {obj}"),
    (
        _rule(
            r"i\s+(?:really\s+)?(?:don't|do\s+not|dont)\s+(?P<verb>"
            + _NEGATABLE
            + r")\s+(?P<obj>.+)"
        ),
        "{S} does not {verb} {obj}",
    ),
    (
        _rule(r"i\s+never\s+(?P<verb>" + _NEGATABLE + r")\s+(?P<obj>.+)"),
        "{S} never {verb3} {obj}",
    ),
    (
        _rule(
            _IM + r"(?P<neg>not|no\s+longer)\s+(?P<obj>(?:a|an)\s+.+|(?:into|keen\s+on|"
            r"interested\s+in|allergic\s+to|a\s+fan\s+of)\s+.+|(?:" + _STATES + r")\b.*)"
        ),
        "{S} is {neg} {obj}",
    ),
    (
        _rule(r"i(?:'d|\s+would)\s+(?:really\s+)?(?P<verb>love|like)\s+to\s+(?P<obj>.+)"),
        "{S} would {verb} to {obj}",
    ),
    (
        _rule(
            r"i\s+" + _ADVERBS + r"(?P<verb>love|like|hate|dislike|prefer|enjoy|adore|detest|"
            r"can't\s+stand|cannot\s+stand|can\s+not\s+stand)\s+(?P<obj>.+)"
        ),
        "{S} {now} {verb3} {obj}",
    ),
    (
        _rule(
            _IM + _ADVERBS + r"(?P<what>into|keen\s+on|passionate\s+about|interested\s+in|"
            r"obsessed\s+with|(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|fond\s+of|crazy\s+about)\s+"
            r"(?P<obj>.+)"
        ),
        "{S} is {now} {what} {obj}",
    ),
    (
        _rule(_IM + _ADVERBS + r"(?P<what>allergic|intolerant|sensitive)\s+to\s+(?P<obj>.+)"),
        "{S} is {what} to {obj}",
    ),
    (_rule(_IM + r"(?:originally\s+)?from\s+(?P<obj>.+)"), "{S} is from {obj}"),
    (_rule(_IM + r"(?P<age>\d{1,3})(?:\s+years?\s+old)?"), "{S} is {age} years old"),
    (_rule(_IM + _ADVERBS + r"(?P<obj>(?:" + _STATES + r")\b.*)"), "{S} is {now} {obj}"),
    (
        _rule(_IM + _ADVERBS + r"(?:working|employed)\s+(?P<prep>at|for|as|by)\s+(?P<obj>.+)"),
        "{S} works {prep} {obj}",
    ),
    (_rule(_IM + _ADVERBS + r"working\s+on\s+(?P<obj>.+)"), "{S} is working on {obj}"),
    (
        _rule(_IM + _ADVERBS + r"(?P<what>going|planning|hoping|trying|about)\s+to\s+(?P<obj>.+)"),
        "{S} is {what} to {obj}",
    ),
    (_rule(_IM + r"gonna\s+(?P<obj>.+)"), "{S} is going to {obj}"),
    (_rule(_IM + _ADVERBS + r"living\s+in\s+(?P<obj>.+)"), "{S} lives in {obj}"),
    (
        _rule(_IM + _ADVERBS + r"(?P<what>" + _ACTIVITY_VERBS + r")\s+(?P<obj>.+)"),
        "{S} is {now} {what} {obj}",
    ),
    (
        _rule(_IM + _ADVERBS + r"(?P<obj>(?:a|an)\s+(?!" + _NOT_A_ROLE + r")\S.*)"),
        "{S} is {now} {obj}",
    ),
    (
        _rule(r"i\s+" + _ADVERBS + r"work\s+(?P<prep>at|for|as|in|on)\s+(?P<obj>.+)"),
        "{S} works {prep} {obj}",
    ),
    (_rule(r"i\s+" + _ADVERBS + r"live\s+in\s+(?P<obj>.+)"), "{S} lives in {obj}"),
    (
        _rule(
            r"i(?:'ve|\s+have)?\s+" + _ADVERBS + r"(?:recently\s+|finally\s+)?"
            r"(?P<verb>moved|relocated)\s+(?:back\s+)?to\s+(?P<obj>.+)"
        ),
        "{S} moved to {obj}",
    ),
    (
        _rule(
            r"my\s+(?:favou?rite|fave)\s+(?P<thing>\w+(?:\s+\w+)?)\s+(?:is|are|'s)\s+(?P<obj>.+)"
        ),
        "{P} favorite {thing} is {obj}",
    ),
    (
        _rule(
            r"my\s+(?P<rel>"
            + _RELATION_ADJECTIVES
            + r"(?:"
            + _RELATIONS
            + r"))(?:'s\s+name)?\s+(?:is|'s)\s+(?:named\s+|called\s+)?(?P<name>"
            + _NAME
            + r")"
        ),
        "{P} {rel} is named {name}",
    ),
    (
        _rule(
            r"my\s+(?P<rel>"
            + _RELATION_ADJECTIVES
            + r"(?:"
            + _RELATIONS
            + r"|"
            + _OWN_THINGS
            + r"))\s+(?P<be>is|was|'s)\s+(?P<obj>.+)"
        ),
        "{P} {rel} {be} {obj}",
    ),
    (
        _rule(
            r"(?:i\s+have|i've\s+got|i\s+have\s+got|ive\s+got)\s+(?P<obj>(?:"
            + _COUNT_WORDS
            + r")\s+.+)"
        ),
        "{S} has {obj}",
    ),
    (
        _rule(
            r"i\s+" + _ADVERBS + r"(?P<verb>plan|want|hope|intend|need|aim|wish)\s+to\s+"
            r"(?P<obj>.+)"
        ),
        "{S} {verb3} to {obj}",
    ),
    (
        _rule(r"i(?:'ve|\s+have)?\s+(?P<verb>decided|promised)\s+to\s+(?P<obj>.+)"),
        "{S} {verb} to {obj}",
    ),
    (
        _rule(
            _IVE
            + _ADVERBS
            + r"(?:recently\s+|finally\s+)?(?P<verb>"
            + _EVENT_VERBS
            + r"|been\s+to)(?:\s+(?P<obj>.+))?"
        ),
        "{S} has {verb} {obj}",
    ),
    (
        _rule(
            r"i\s+"
            + _ADVERBS
            + r"(?:recently\s+|finally\s+)?(?P<verb>"
            + _EVENT_VERBS
            + r")(?:\s+(?P<obj>.+))?"
        ),
        "{S} {verb} {obj}",
    ),
    (
        _rule(
            r"i\s+(?P<freq>(?:usually|often|always|sometimes|regularly|still)\s+)?(?P<verb>"
            + _HABIT_VERBS
            + r")\s+(?P<obj>.+)"
        ),
        "{S} {freq} {verb3} {obj}",
    ),
)

# Clause-initial fillers dropped before matching; "now" and friends are remembered.
_FILLER = re.compile(
    r"^(?:(?:and|but|so|also|well|oh|yeah|yes|yep|honestly|actually|btw|by\s+the\s+way|anyway|"
    r"anyways|plus|now|lately|recently|these\s+days|nowadays|fun\s+fact|guess\s+what|ok|okay|"
    r"wow|haha|lol|hey|hi|hello|ah|um|uh|hmm|sure|right|true|totally|exactly|cool|great|"
    r"awesome|nice|thanks|thank\s+you)\b[\s,:;!.-]*)+",
    re.IGNORECASE,
)
#: Every rule starts with "I ..." or "my ...": a clause that starts otherwise is not tried
#: against the ~30 rules (most clauses; `tests/memories` checks the rules still all start so).
_RULE_START = re.compile(r"(?:i|im|ive|my)\b", re.IGNORECASE)
#: A clause starts at the sentence's start or after a non-word character (a clause boundary,
#: a filler's separator), and ends before one, so a sentence without this word anywhere has no
#: clause that `_RULE_START` matches: three sentences in four are then skipped unsplit.
_RULE_WORD = re.compile(r"\b(?:i|im|ive|my)\b", re.IGNORECASE)
_NOW_WORDS = re.compile(r"\b(?:now|these\s+days|nowadays)\b", re.IGNORECASE)
# Clause boundaries inside a sentence: before a new first-person clause, or at ; and dashes.
_CLAUSE_SPLIT = re.compile(
    r"\s*;\s*|\s+[-–—]+\s+|,?\s+(?:and|but|so|because|(?:even\s+)?(?:although|though)|plus|"
    r"while|since)\s+"
    r"(?=(?:i|i'm|i've|i'd|im|my|he|she|it|they|we|you)\b)"
    # A comma before a new subject starts a new clause: "I love pizza, it's my favourite".
    r"|,\s*(?=(?:i|i'm|i've|i'd|im|my|he|she|it|it's|they|we|you)\b)",
    re.IGNORECASE,
)
_QUESTION_START = re.compile(
    r"^(?:do|does|did|is|are|was|were|can|could|would|will|should|have|has|what|who|whom|why|"
    r"how|where|when|which|whose|if|unless|whether|what\s+if)\b",
    re.IGNORECASE,
)
# Objects we cannot rewrite into a standalone third-person fact.
_UNREWRITABLE_START = re.compile(
    r"^(?:it|its|it's|that|this|them|those|these|him|her|you|your|yours|there|what|how|which|"
    r"who|so|such|everything|anything|something|nothing|mine|one)\b",
    re.IGNORECASE,
)
# Pronouns left in an object would make the fact depend on the conversation (seed 003 §9).
_OTHER_PERSON = re.compile(
    r"\b(?:i|i'm|i've|i'd|i'll|im|we|we're|we've|us|our|ours|you|your|yours|mine|he|he's|she|"
    r"she's|they|they're|them|his|her|hers|him|their|theirs|it|it's|its|this|that|these|those|"
    r"here|there)\b",
    re.IGNORECASE,
)
_TRAILING_NOISE = re.compile(
    r"(?:[\s,]+(?:anymore|any\s+more|these\s+days|nowadays|lately|at\s+the\s+moment|right\s+now|"
    r"now|too|as\s+well|so\s+much|a\s+lot|very\s+much|really|haha|lol))+$",
    re.IGNORECASE,
)
_IRREGULAR_THIRD_PERSON = {"be": "is", "am": "is", "have": "has", "do": "does", "go": "goes"}


def third_person(verb: str) -> str:
    """Third-person singular present of a base verb: love -> loves, watch -> watches."""
    words = verb.split()
    head = words[0].lower()
    if head in _IRREGULAR_THIRD_PERSON:
        head = _IRREGULAR_THIRD_PERSON[head]
    elif head in ("can", "will", "would", "must", "should", "could", "may", "might"):
        pass  # modals do not inflect
    elif re.search(r"(?:s|sh|ch|x|z|o)$", head):
        head += "es"
    elif re.search(r"[^aeiou]y$", head):
        head = head[:-1] + "ies"
    else:
        head += "s"
    return " ".join([head, *words[1:]])


@dataclass(frozen=True)
class _Subject:
    start: str  # "Caroline" / "The user"
    mid: str  # "Caroline" / "the user"
    possessive: str  # "Caroline's" / "The user's"
    possessive_mid: str  # "Caroline's" / "the user's"


def _subject(speaker: str | None) -> _Subject:
    name = " ".join(speaker.split()) if speaker else ""
    if name:
        return _Subject(name, name, f"{name}'s", f"{name}'s")
    return _Subject("The user", "the user", "The user's", "the user's")


def _rewrite_object(obj: str, subject: _Subject) -> tuple[str, bool, bool] | None:
    """Third-person object, plus whether it said "now"/"anymore"; None if not rewritable."""
    obj = obj.strip().rstrip(".!,;: ")
    trailing = _TRAILING_NOISE.search(obj)
    tail = trailing.group(0).lower() if trailing else ""
    if trailing:
        obj = obj[: trailing.start()].rstrip(" ,")
    now = bool(_NOW_WORDS.search(tail))
    anymore = "anymore" in tail or "any more" in tail
    if not obj or _UNREWRITABLE_START.match(obj):
        return None
    obj = re.sub(r"\bmy\b", subject.possessive_mid, obj, flags=re.IGNORECASE)
    obj = re.sub(r"\b(?:me|myself)\b", subject.mid, obj, flags=re.IGNORECASE)
    if _OTHER_PERSON.search(obj):
        return None
    return obj, now, anymore


def _render(match: re.Match[str], template: str, subject: _Subject, lead_now: bool) -> str | None:
    """Fill a rule's template from its match; None when the object cannot be made standalone."""
    values = {key: " ".join((value or "").split()) for key, value in match.groupdict().items()}
    now, anymore = lead_now, False
    if values.get("obj"):
        rewritten = _rewrite_object(values["obj"], subject)
        if rewritten is None:
            return None
        values["obj"], said_now, anymore = rewritten
        now = now or said_now
    for key in ("verb", "what", "rel", "prep", "freq", "thing", "be", "neg"):
        values[key] = values.get(key, "").lower()
    values["be"] = "is" if values["be"] == "'s" else values["be"]
    verb = values["verb"]
    if anymore and "does not {verb}" in template:  # "I don't like X anymore"
        template = template.replace("does not {verb}", "no longer {verb3}")
    values["verb3"] = _PREFERENCE_VERBS.get(verb) or (third_person(verb) if verb else "")
    values["now"] = "now" if now and not anymore else ""
    values.setdefault("obj", "")
    text = " ".join(template.format(S=subject.start, P=subject.possessive, **values).split())
    return text[0].upper() + text[1:] + "."


def _clauses(sentence: str) -> list[str]:
    return [clause for clause in _CLAUSE_SPLIT.split(sentence) if clause.strip()]


def extract_facts_rules(
    turn_text: str, speaker: str | None, turn_id: str, rejected: list[str] | None = None
) -> list[FactCandidate]:
    """Self-statements of a user turn as third-person facts, in the order they were said;
    facts that break seed 003 §9's writing rules are appended to `rejected`."""
    subject = _subject(speaker)
    text = turn_text.replace("’", "'").replace("‘", "'")
    facts: list[str] = []
    for sentence in split_sentences(text):
        if "?" in sentence or not _RULE_WORD.search(sentence):
            continue
        if _QUESTION_START.match(sentence.lstrip("\"'(")):
            continue
        for clause in _clauses(sentence):
            filler = _FILLER.match(clause.strip())
            lead = filler.group(0) if filler else ""
            body = clause.strip()[len(lead) :].strip().rstrip(".!;:, ")
            if not body or not _RULE_START.match(body):
                continue
            for pattern, template in _RULES:
                match = pattern.match(body)
                if match is None:
                    continue
                fact = _render(match, template, subject, bool(_NOW_WORDS.search(lead)))
                if fact is not None:
                    facts.append(fact)
                break
    valid = keep_valid(facts, rejected)
    candidates = []
    for fact in dedup_batch(valid)[: candidate_limit(turn_text)]:
        category, importance = classify_fact(fact)
        candidates.append(FactCandidate(fact, turn_id, speaker, category, importance))
    return candidates


def extract_facts_rules_batch(
    said: Sequence[tuple[str, str | None, str]],
) -> list[tuple[list[FactCandidate], list[str]]]:
    """`extract_facts_rules` of (text, speaker, turn id) triples: (candidates, rejected facts)
    of each. What the write path's worker processes run: it lives here, not in `write_path`,
    so a worker imports this module's few dependencies (~0.15 s), not the write path's DuckDB,
    Arrow, Polars and index modules (~0.7 s, paid by each worker as the facts stage starts)."""
    results = []
    for text, speaker, turn_id in said:
        rejected: list[str] = []
        results.append((extract_facts_rules(text, speaker, turn_id, rejected), rejected))
    return results
