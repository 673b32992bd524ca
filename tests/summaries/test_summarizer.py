"""Adaptive summarizer: levels, tree shape and metrics, through the scripted server and offline."""

from __future__ import annotations

import math
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_dag.ingest.tokens import count_tokens, decode, encode
from memory_dag.llm import LLMClient, LLMConfig
from memory_dag.summaries.summarizer import (
    _ANAPHOR_INITIALS,
    _ANAPHOR_START,
    _LINE_SENTENCE_SPLIT,
    _SENTENCE_SPLIT,
    _WORD,
    THRESHOLD_BRIEF,
    THRESHOLD_DETAILED,
    THRESHOLD_NONE,
    THRESHOLD_STANDARD,
    SummarizationError,
    SummarizerConfig,
    SummaryLevel,
    SummaryResult,
    _content_words,
    _fewest_tokens,
    chunk_text,
    determine_level,
    extract_sentences,
    extraction_units,
    final_summary_text,
    middle_truncate,
    split_sentences,
    summarize,
)
from tests.openai_server import Reply, ScriptedOpenAIServer

NAMES = ["Anne", "Boris", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana"]
PLACES = ["Lisbon", "Osaka", "Nairobi", "Quito", "Tromso", "Leipzig"]
TOPICS = [
    "the garden project",
    "a marathon plan",
    "the budget review",
    "a pottery class",
    "the database migration",
    "a trip to the coast",
    "the new puppy",
    "a chess tournament",
]


def sentence(rng: random.Random) -> str:
    name, topic, place, k = (
        rng.choice(NAMES),
        rng.choice(TOPICS),
        rng.choice(PLACES),
        rng.randint(2, 99),
    )
    return rng.choice(
        [
            f"{name} talked about {topic} in {place} for {k} minutes.",
            f"On day {k}, {name} decided that {topic} needs a clear schedule.",
            f"{name} thinks {topic} will cost about {k} euros and wants to start in {place}.",
            f"After a long call, {name} agreed to review {topic} again next week.",
        ]
    )


def text_in_band(low: int, high: int, seed: int = 0) -> str:
    """Paragraph prose (5 sentences each) whose real token count lies in [low, high)."""
    rng = random.Random(seed)
    sentences: list[str] = []
    estimate = 0  # per-sentence counts: cheap, and close to the real count of the joined text
    while True:
        sentences.append(sentence(rng))
        estimate += count_tokens(sentences[-1]) + 1
        if estimate < low - 20:
            continue
        paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
        candidate = "\n\n".join(paragraphs)
        tokens = count_tokens(candidate)
        if tokens >= low:
            assert tokens < high, "band too narrow for one sentence"
            return candidate


BANDS = {
    SummaryLevel.BRIEF: (150, THRESHOLD_BRIEF),
    SummaryLevel.STANDARD: (1200, THRESHOLD_STANDARD),
    SummaryLevel.DETAILED: (8000, THRESHOLD_DETAILED),
    SummaryLevel.HIERARCHICAL: (40000, 60000),
}


@pytest.fixture(scope="module")
def texts() -> dict[SummaryLevel, str]:
    return {level: text_in_band(low, high) for level, (low, high) in BANDS.items()}


def llm_config(server: ScriptedOpenAIServer, **overrides: Any) -> SummarizerConfig:
    client = LLMClient(
        LLMConfig(base_url=server.base_url, model="m", max_retries=0, retry_backoff=0.0)
    )
    return SummarizerConfig(llm=client, **overrides)


def prompt_of(request: dict[str, Any]) -> str:
    return request["body"]["messages"][-1]["content"]


def by_prompt(body: dict[str, Any]) -> Reply:
    """Answer each kind of summary request with a recognisable, deterministic text."""
    prompt = body["messages"][-1]["content"]
    section = re.search(r"^Section (\d+) of (\d+):", prompt, re.MULTILINE)
    if section:
        return Reply.text(f"L1 summary of section {section.group(1)}.")
    if prompt.startswith("Synthesize"):
        items = re.findall(r"^\[\d+\] (.*)$", prompt, re.MULTILINE)
        sections = re.findall(r"^\[\d+\] L1 summary of section (\d+)\.$", prompt, re.MULTILINE)
        if sections:
            return Reply.text(f"Synthesis of sections {sections[0]}-{sections[-1]}.")
        return Reply.text(f"Final synthesis of {len(items)} parts.")
    return Reply.text("A paragraph summary.")


def assert_metrics(result: SummaryResult) -> None:
    assert result.summary is not None
    assert result.output_tokens == count_tokens(result.summary)
    assert 0.0 <= result.compression_ratio <= 1.0
    assert result.compression_ratio == pytest.approx(
        min(1.0, result.output_tokens / result.input_tokens)
    )


# --- Level selection ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "level"),
    [
        (0, SummaryLevel.NONE),
        (THRESHOLD_NONE - 1, SummaryLevel.NONE),
        (THRESHOLD_NONE, SummaryLevel.BRIEF),
        (THRESHOLD_BRIEF - 1, SummaryLevel.BRIEF),
        (THRESHOLD_BRIEF, SummaryLevel.STANDARD),
        (THRESHOLD_STANDARD - 1, SummaryLevel.STANDARD),
        (THRESHOLD_STANDARD, SummaryLevel.DETAILED),
        (THRESHOLD_DETAILED - 1, SummaryLevel.DETAILED),
        (THRESHOLD_DETAILED, SummaryLevel.HIERARCHICAL),
    ],
)
def test_determine_level_thresholds(tokens: int, level: SummaryLevel) -> None:
    assert determine_level(tokens) is level


@pytest.mark.parametrize("content", ["", "   \n\t  ", "Short note about tea."])
def test_empty_and_short_content_is_not_summarized(
    openai_server: ScriptedOpenAIServer, content: str
) -> None:
    result = summarize(content, llm_config(openai_server))

    assert result.level is SummaryLevel.NONE
    assert result.summary is None
    assert result.compression_ratio == 1.0
    assert final_summary_text(result) is None
    assert openai_server.requests == []


def test_texts_land_in_their_bands(texts: dict[SummaryLevel, str]) -> None:
    for level, text in texts.items():
        assert determine_level(count_tokens(text)) is level


# --- Through the scripted LLM server --------------------------------------------------------------


def test_brief_uses_one_low_budget_call(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.push(Reply.text("  Several people planned projects across cities.\n"))
    content = texts[SummaryLevel.BRIEF]

    result = summarize(content, llm_config(openai_server))

    assert result.level is SummaryLevel.BRIEF
    assert result.method == "llm"
    assert result.summary == "Several people planned projects across cities."
    assert result.input_tokens == count_tokens(content)
    assert_metrics(result)
    [request] = openai_server.chat_requests
    assert "single, comprehensive sentence" in prompt_of(request)
    assert content in prompt_of(request)
    assert request["body"]["max_tokens"] <= 256


def test_brief_with_prior_summary_uses_rolling_prompt(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.push(Reply.text("Updated."))
    prior = "Anne has been planning a garden in Lisbon since March."

    summarize(texts[SummaryLevel.BRIEF], llm_config(openai_server), prior_summary=prior)

    prompt = prompt_of(openai_server.chat_requests[0])
    assert "Existing summary:\n" + prior in prompt
    assert "a single sentence" in prompt


@pytest.mark.parametrize(
    ("content_type", "marker"),
    [
        ("general", "Summarize the following content in a concise paragraph."),
        ("conversation", "- User preferences and decisions"),
        ("journal", "- Emotional context and growth"),
        ("document", "- Methodology and approach"),
    ],
)
def test_standard_prompt_follows_content_type_and_prior(
    openai_server: ScriptedOpenAIServer,
    texts: dict[SummaryLevel, str],
    content_type: str,
    marker: str,
) -> None:
    openai_server.push(Reply.text("A paragraph summary."))
    prior = "Boris reviewed the budget twice in May."

    result = summarize(
        texts[SummaryLevel.STANDARD],
        llm_config(openai_server),
        prior_summary=prior,
        content_type=content_type,
    )

    assert result.level is SummaryLevel.STANDARD
    assert_metrics(result)
    prompt = prompt_of(openai_server.chat_requests[0])
    assert marker in prompt
    assert prior in prompt
    assert texts[SummaryLevel.STANDARD] in prompt


def test_compression_ratio_is_clamped(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    content = texts[SummaryLevel.BRIEF]
    openai_server.push(Reply.text(content + " " + content))  # a model that rambles

    result = summarize(content, llm_config(openai_server))

    assert result.output_tokens > result.input_tokens
    assert result.compression_ratio == 1.0


def test_detailed_builds_l1_per_chunk_and_meta(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.handler = by_prompt
    content = texts[SummaryLevel.DETAILED]
    prior = "Earlier: Chen joined the chess tournament."
    chunks = chunk_text(content, 3000, 200)

    result = summarize(content, llm_config(openai_server), prior_summary=prior)

    assert result.level is SummaryLevel.DETAILED
    tree = result.hierarchical
    assert tree is not None
    assert len(tree.l1_summaries) == len(chunks) >= 2
    assert [s.content for s in tree.l1_summaries] == [
        f"L1 summary of section {i + 1}." for i in range(len(chunks))
    ]
    assert [s.source_tokens for s in tree.l1_summaries] == [count_tokens(c) for c in chunks]
    assert all(s.parent_group is None for s in tree.l1_summaries)
    assert tree.l2_summaries == []
    assert tree.l3_summary == result.summary == f"Synthesis of sections 1-{len(chunks)}."
    assert final_summary_text(result) == tree.l3_summary
    assert_metrics(result)
    requests = openai_server.chat_requests
    assert len(requests) == len(chunks) + 1
    chunk_prompts = [prompt_of(r) for r in requests if re.search(r"Section \d+ of", prompt_of(r))]
    assert len(chunk_prompts) == len(chunks)
    assert all(any(chunk in p for p in chunk_prompts) for chunk in chunks)
    [meta] = [prompt_of(r) for r in requests if prompt_of(r).startswith("Synthesize")]
    assert prior in meta
    assert not any(prior in p for p in chunk_prompts)


def test_hierarchical_builds_l1_l2_l3_tree(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.handler = by_prompt
    content = texts[SummaryLevel.HIERARCHICAL]
    prior = "Previous L3: the group met in Osaka."
    chunks = chunk_text(content, 3000, 200)
    groups = math.ceil(len(chunks) / 5)

    result = summarize(content, llm_config(openai_server), prior_summary=prior)

    assert result.level is SummaryLevel.HIERARCHICAL
    tree = result.hierarchical
    assert tree is not None
    assert len(tree.l1_summaries) == len(chunks) > 5
    assert [s.parent_group for s in tree.l1_summaries] == [i // 5 for i in range(len(chunks))]
    assert tree.l2_summaries == [
        f"Synthesis of sections {5 * g + 1}-{min(5 * g + 5, len(chunks))}." for g in range(groups)
    ]
    assert tree.l3_summary == result.summary == f"Final synthesis of {groups} parts."
    assert_metrics(result)
    requests = openai_server.chat_requests
    assert len(requests) == len(chunks) + groups + 1
    syntheses = [prompt_of(r) for r in requests if prompt_of(r).startswith("Synthesize")]
    with_prior = [p for p in syntheses if prior in p]
    assert len(with_prior) == 1  # only the final synthesis sees the prior L3
    assert all(l2 in with_prior[0] for l2 in tree.l2_summaries)


def test_parallel_calls_respect_summarizer_bound(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.handler = lambda body: Reply.delay(0.05, by_prompt(body))

    summarize(texts[SummaryLevel.HIERARCHICAL], llm_config(openai_server, max_concurrency=2))

    assert openai_server.max_in_flight == 2


def test_failing_l1_call_raises_and_returns_nothing(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    def fail_section_two(body: dict[str, Any]) -> Reply:
        if "Section 2 of" in body["messages"][-1]["content"]:
            return Reply.status(500)
        return by_prompt(body)

    openai_server.handler = fail_section_two

    with pytest.raises(SummarizationError, match="chunk 2/"):
        summarize(texts[SummaryLevel.DETAILED], llm_config(openai_server))

    syntheses = [r for r in openai_server.chat_requests if prompt_of(r).startswith("Synthesize")]
    assert syntheses == []  # failed fast: no synthesis over a partial set of L1s


def test_llm_timeout_raises_summarization_error(
    openai_server: ScriptedOpenAIServer, texts: dict[SummaryLevel, str]
) -> None:
    openai_server.push(Reply.delay(1.0, Reply.text("late")))
    client = LLMClient(
        LLMConfig(base_url=openai_server.base_url, model="m", timeout=0.2, max_retries=0)
    )

    with pytest.raises(SummarizationError, match="timeout"):
        summarize(texts[SummaryLevel.STANDARD], SummarizerConfig(llm=client))


# --- Extractive default (no LLM) ------------------------------------------------------------------


def assert_extracted_in_order(summary: str, content: str) -> None:
    """Every summary sentence is a sentence of the content, in the content's order."""
    positions = []
    for piece in split_sentences(summary):
        assert piece in content
        positions.append(content.index(piece))
    assert positions == sorted(positions)


def test_extractive_brief_is_one_sentence(texts: dict[SummaryLevel, str]) -> None:
    content = texts[SummaryLevel.BRIEF]

    result = summarize(content, SummarizerConfig())

    assert result.level is SummaryLevel.BRIEF
    assert result.method == "extractive"
    assert result.summary is not None
    assert len(split_sentences(result.summary)) == 1
    assert result.summary in split_sentences(content)
    assert_metrics(result)
    assert result.compression_ratio <= 0.2


def test_extractive_standard_meets_target_compression(texts: dict[SummaryLevel, str]) -> None:
    content = texts[SummaryLevel.STANDARD]

    result = summarize(content, SummarizerConfig())

    assert result.level is SummaryLevel.STANDARD
    assert result.summary is not None
    assert_extracted_in_order(result.summary, content)
    assert_metrics(result)
    assert 0.06 <= result.compression_ratio <= 0.13


def test_extractive_prefers_central_sentences() -> None:
    on_topic = [
        f"The garden project in Lisbon needs {k} new tomato beds and a watering plan."
        for k in range(3, 12)
    ]
    off_topic = "Farah once saw a purple submarine near Quito during a thunderstorm."
    content = " ".join([on_topic[0], off_topic, *on_topic[1:]])
    assert determine_level(count_tokens(content)) is SummaryLevel.BRIEF

    result = summarize(content, SummarizerConfig())

    assert result.summary in on_topic


def test_an_extractive_summary_of_short_turns_is_never_a_session_header() -> None:
    """Issue 13 item 7: a BRIEF summary of short turns was its `[s1, date]` header."""
    turns = [
        "Sam: Hi!", "Iris: Hello Sam.", "Sam: All good?", "Iris: Yes, thanks.",
        "Sam: Pizza tonight.", "Iris: Sounds fun.", "Sam: See you later.", "Iris: Bye!",
    ]  # fmt: skip
    content = "\n\n".join(
        f"[s{n}, {n} November 2026, 10:00]\n" + "\n".join(turns) for n in range(1, 6)
    )
    assert determine_level(count_tokens(content)) is SummaryLevel.BRIEF

    summary = summarize(content, SummarizerConfig()).summary

    assert summary is not None and summary.strip()
    assert not re.search(r"\[s\d+, \d+ November 2026", summary)
    assert summary in "\n".join(turns)


def test_an_extractive_summary_keeps_a_pronoun_with_what_it_refers_to() -> None:
    """Issue 13 item 7: "This replaces the earlier statement ..." was chosen without the
    sentence "This" points back to."""
    antecedent = "Sam no longer likes pizza after a bad experience in November."
    anaphor = "This replaces the earlier statement that pizza was the favourite pizza food of Sam."
    content = "\n".join(
        [
            "Anne likes pizza with anchovies and pizza with olives at the pizza place.",
            antecedent,
            anaphor,
            "Iris suggested a pizza place in Lisbon for the pizza night of Friday.",
            "Sam will skip the pizza night this week and cook risotto instead.",
        ]
    )
    chosen_somewhere = False
    for budget in range(count_tokens(anaphor) - 2, count_tokens(content) + 2):
        summary = extract_sentences(content, budget)
        if anaphor in summary:
            chosen_somewhere = True
            assert antecedent + " " + anaphor in summary, budget
    assert chosen_somewhere  # the pair is central enough to be chosen when it fits


@pytest.mark.parametrize("level", [SummaryLevel.DETAILED, SummaryLevel.HIERARCHICAL])
def test_extractive_tree_has_same_shape(
    level: SummaryLevel, texts: dict[SummaryLevel, str]
) -> None:
    content = texts[level]
    chunks = chunk_text(content, 3000, 200)

    result = summarize(content, SummarizerConfig())

    assert result.level is level
    tree = result.hierarchical
    assert tree is not None
    assert len(tree.l1_summaries) == len(chunks)
    for node, chunk in zip(tree.l1_summaries, chunks, strict=True):
        assert node.token_count == count_tokens(node.content)
        assert node.source_tokens == count_tokens(chunk)
        assert 0 < node.token_count <= 0.08 * node.source_tokens
        assert_extracted_in_order(node.content, chunk)
    if level is SummaryLevel.DETAILED:
        assert tree.l2_summaries == []
        assert 0.03 <= result.compression_ratio <= 0.08
    else:
        assert len(tree.l2_summaries) == math.ceil(len(chunks) / 5)
        assert 0.02 <= result.compression_ratio <= 0.05
    assert tree.l3_summary == result.summary
    assert_metrics(result)


# --- Chunking -------------------------------------------------------------------------------------


def rebuild(chunks: list[str], overlap: int) -> str:
    """Undo chunking: drop each chunk's copy of the previous chunk's tail."""
    text = chunks[0]
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        tail = decode(encode(previous)[-overlap:])
        assert chunk.startswith(tail)
        text += chunk[len(tail) :]
    return text


def test_chunk_text_overlap_is_previous_tail_on_paragraph_boundaries(
    texts: dict[SummaryLevel, str],
) -> None:
    content = texts[SummaryLevel.DETAILED]

    chunks = chunk_text(content, chunk_size=1000, overlap=100)

    assert len(chunks) >= 8
    assert all(count_tokens(c) <= 1000 for c in chunks)
    assert rebuild(chunks, 100) == content
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        tail = decode(encode(previous)[-100:])
        assert count_tokens(tail) in range(95, 106)
        assert chunk[len(tail) :].startswith("\n\n")  # new material starts a paragraph


def test_chunk_text_falls_back_to_sentences() -> None:
    rng = random.Random(1)
    paragraph = " ".join(sentence(rng) for _ in range(300))  # one huge paragraph

    chunks = chunk_text(paragraph, chunk_size=500, overlap=50)

    assert len(chunks) > 5
    assert all(count_tokens(c) <= 500 for c in chunks)
    assert rebuild(chunks, 50) == paragraph
    assert all(c.endswith(".") for c in chunks[:-1])


def test_chunk_text_falls_back_to_characters() -> None:
    rng = random.Random(2)
    blob = "".join(rng.choice("abcdef0123456789") for _ in range(20000))  # no breaks at all

    chunks = chunk_text(blob, chunk_size=700, overlap=60)

    assert len(chunks) > 3
    assert all(count_tokens(c) <= 700 for c in chunks)
    assert rebuild(chunks, 60) == blob


def test_chunk_text_edges() -> None:
    assert chunk_text("   ") == []
    assert chunk_text("One short paragraph.") == ["One short paragraph."]
    no_overlap = chunk_text(text_in_band(3000, 3500), chunk_size=1000, overlap=0)
    assert "".join(no_overlap) == text_in_band(3000, 3500)
    with pytest.raises(ValueError):
        chunk_text("text", chunk_size=100, overlap=100)


# --- Middle truncation ----------------------------------------------------------------------------


def test_middle_truncate_keeps_head_and_tail_within_budget() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(10000))

    kept, removed = middle_truncate(text, 1000)

    assert len(kept) <= 1000
    assert kept.startswith(text[:300])
    assert kept.endswith(text[-300:])
    assert removed == len(text) - 600
    assert f"{removed} characters truncated" in kept


def test_middle_truncate_short_and_tiny_budgets() -> None:
    assert middle_truncate("short text", 100) == ("short text", 0)
    text = "x" * 500
    for budget in (0, 10, 40, 60):
        kept, removed = middle_truncate(text, budget)
        assert len(kept) <= budget
        assert removed >= len(text) - budget
    with pytest.raises(ValueError):
        middle_truncate(text, 100, head_frac=0.7, tail_frac=0.5)


def test_unit_costs_equal_counting_each_unit_whole() -> None:
    """Chunking adds a piece's count to its separator's only where the join cannot change
    how cl100k cuts the text: the costs equal encoding every `separator + piece` whole."""
    from memory_dag.ingest.tokens import count_tokens_batch
    from memory_dag.summaries.summarizer import _split_units, _unit_costs

    rng = random.Random(3)
    words = ["Hello", "world", "it's", "I'm", "42", "1234", "héllo", "日本語", "naïve", "'s"]
    marks = [".", "!", "?", ",", "—", "(", '"', "'", "...", "->", "\x1c", "\u00a0", "\t"]
    spaces = ["\n\n", "\n \n", "\r\n\r\n", "\n\t\n  ", "\n\n\n", "\n\u00a0\n", "\n\n\x1c\n"]
    for _ in range(300):
        paragraphs = []
        for _ in range(rng.randint(1, 6)):
            tokens = rng.choices(words + marks, k=rng.randint(1, 30))
            paragraphs.append(rng.choice(["", " ", "\t"]) + " ".join(tokens))
        text = "".join(p + rng.choice(spaces) for p in paragraphs)
        for limit in (5, 40, 3000):
            units, piece_tokens = _split_units(text, limit)
            assert "".join(sep + piece for sep, piece in units) == text
            whole = count_tokens_batch([sep + piece for sep, piece in units])
            assert _unit_costs(units, piece_tokens) == whole, (text, limit)


def test_sentence_token_cache_counts_right_when_it_is_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache is bounded; emptied in the middle of a call it must not lose the sentences
    it knew a moment before (a 600-conversation run failed with a KeyError there)."""
    from memory_dag.summaries import summarizer

    monkeypatch.setattr(summarizer, "_SENTENCE_TOKENS", {})
    monkeypatch.setattr(summarizer, "_SENTENCE_TOKENS_MAX", 3)
    known = ["Tim: Congrats!", "It is all about trust."]
    assert summarizer.sentence_tokens(known) == [count_tokens(s) for s in known]
    again = [*known, "A new one.", "And another one."]  # 2 known + 2 new > 3: emptied
    assert summarizer.sentence_tokens(again) == [count_tokens(s) for s in again]
    assert len(summarizer._SENTENCE_TOKENS) <= len(again)


@settings(max_examples=500, deadline=None)
@given(
    line=st.lists(st.sampled_from(list("ab.!?\"'”’)]:- \t\r\u00a0\u2003")), max_size=40).map(
        "".join
    )
)
def test_line_sentence_split_cuts_as_the_sentence_split(line: str) -> None:
    """Within a line, the faster pattern cuts where `_SENTENCE_SPLIT` does."""
    assert _LINE_SENTENCE_SPLIT.split(line) == _SENTENCE_SPLIT.split(line)


#: Letters, digits, punctuation and every kind of space the tokenizer or Python treats apart.
_HOSTILE_CHARS = list("aZ9.!?'’:-_ \t\n\r\x0b\x0c\x1c\x1f\x85\u00a0\u2003\u2028\u3000é字🙂")


@settings(max_examples=800, deadline=None)
@given(sentence=st.lists(st.sampled_from(_HOSTILE_CHARS), max_size=30).map("".join))
def test_the_fewest_tokens_of_a_sentence_never_exceed_its_count(sentence: str) -> None:
    """The selection skips counting a sentence whose lower bound exceeds what is left of the
    budget: a bound above the real count would wrongly leave a sentence out."""
    assert _fewest_tokens(sentence) <= count_tokens(sentence)


def test_the_fewest_tokens_of_plain_text_are_its_words() -> None:
    assert _fewest_tokens("I went to the lake yesterday.") == 6
    assert _fewest_tokens("two  spaces") == 1  # not plain: the bound falls back to one
    assert _fewest_tokens("") == 0


@settings(max_examples=500, deadline=None)
@given(
    sentences=st.lists(
        st.lists(
            # The Kelvin sign and the dotted I: outside ASCII, lower-cased they hold ASCII letters.
            st.sampled_from(
                [*_HOSTILE_CHARS, "The", "don't", "rock'n'roll", "'tis", "''", "\u212a", "İ"]
            )
        ).map("".join),
        max_size=8,
    )
)
def test_content_words_of_all_sentences_at_once_equal_those_of_each(sentences: list[str]) -> None:
    """One pass over the sentences joined finds what one pass over each found (sentences
    holding a line break, which the joined pass cannot tell apart, included)."""
    stopwords = frozenset({"the", "a"})
    each = [[w for w in _WORD.findall(s.lower()) if w not in stopwords] for s in sentences]
    assert _content_words(sentences, stopwords) == each


def test_a_sentence_says_who_said_it_once() -> None:
    """A later sentence of a turn gets its speaker's label; a summary's sentences (a prior, or
    what a synthesis reads) carry their own, several speakers' on one line: none is added."""
    transcript = "Sam: I sold the boat last week. The buyer paid cash.\nKim: Good news."
    assert extraction_units(transcript) == [
        "Sam: I sold the boat last week.",
        "Sam: The buyer paid cash.",
        "Kim: Good news.",
    ]
    prior = "Sam: I sold the boat last week. Kim: Good news. Sam: The buyer paid cash."
    assert extraction_units(f"{prior}\n{transcript}", labelled_lines=1) == [
        "Sam: I sold the boat last week.",
        "Kim: Good news.",
        "Sam: The buyer paid cash.",
        *extraction_units(transcript),
    ]


@pytest.mark.parametrize("tokens", [300, 1500])  # BRIEF and STANDARD roll a prior summary
def test_a_rolling_summary_quotes_its_prior_with_one_label_a_sentence(tokens: int) -> None:
    rng = random.Random(3)
    turns: list[str] = []
    while count_tokens("\n".join(turns)) < tokens:
        turns.append(f"{rng.choice(['Dana', 'Ravi'])}: {sentence(rng)} {sentence(rng)}")
    prior = " ".join(f"{name}: {sentence(rng)}" for name in ("Dana", "Ravi", "Dana", "Ravi"))

    result = summarize("\n".join(turns), SummarizerConfig(), prior)

    assert result.summary
    assert not re.search(r"\b(Dana|Ravi): (Dana|Ravi):", result.summary)


@settings(max_examples=500, deadline=None)
@given(
    start=st.lists(st.sampled_from([*_HOSTILE_CHARS, "Th", "It", "hIS", "Sam: ", "İT"])).map(
        "".join
    ),
)
def test_the_anaphor_pattern_only_matches_where_its_cheap_check_lets_it(start: str) -> None:
    """`extraction_units` skips the pattern unless a sentence starts with a pronoun's letter or
    holds a label's colon; it must never skip a sentence the pattern would match."""
    for sentence in (start, start + "s", start + " it", "it" + start, "ſhe" + start):
        if _ANAPHOR_START.match(sentence):
            assert sentence[:1] in _ANAPHOR_INITIALS or ":" in sentence


def test_selection_counting_sentences_lazily_chooses_as_counting_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sizes the selection did not count are lower bounds; with every sentence counted
    beforehand (the cache warmed) it must choose the same sentences."""
    from memory_dag.summaries import summarizer

    rng = random.Random(7)
    words = [
        "lake",
        "paint",
        "camping",
        "kids",
        "adopt",
        "guitar",
        "violin",
        "pottery",
        "museum",
        "beach",
        "hike",
        "city",
    ]
    for trial in range(30):
        lines = []
        for turn in range(40):
            size = rng.randint(3, 30)
            said = " ".join(rng.choice(words) for _ in range(size))
            lines.append(f"{'Ann' if turn % 2 else 'Bo'}: I {said}. We {rng.choice(words)} too!")
        text = "\n".join(lines)
        budget = rng.randint(5, 200)
        monkeypatch.setattr(summarizer, "_SENTENCE_TOKENS", {})
        lazy = extract_sentences(text, budget)
        counted_lazily = len(summarizer._SENTENCE_TOKENS)
        summarizer.sentence_tokens(summarizer.extraction_units(text))  # every size known now
        assert extract_sentences(text, budget) == lazy, (trial, budget)
        assert counted_lazily < len(summarizer.extraction_units(text))
