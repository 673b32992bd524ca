"""Every story of the truth suite, with the rules and with the scripted stand-in model: each
step's expectations hold, and nothing stale, replaced, out of scope or lost is told."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.openai_server import ScriptedOpenAIServer
from tests.scenarios import STORIES
from tests.scenarios.harness import run_story, scripted_model
from tests.scenarios.steps import Say, Story


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedOpenAIServer]:
    """One stand-in model for the module (one address: the embedding provider loads once)."""
    with ScriptedOpenAIServer(handler=scripted_model) as server:
        yield server


def test_the_suite_has_at_least_thirty_stories_with_unique_names() -> None:
    names = [story.name for story in STORIES]
    assert len(names) >= 30 and len(set(names)) == len(names)


@pytest.mark.parametrize("method", ["rules", "llm"])
@pytest.mark.parametrize("story", STORIES, ids=lambda story: story.name)
def test_story(story: Story, method: str, tmp_path: Path, model: ScriptedOpenAIServer) -> None:
    asked = len(model.chat_requests)

    tally, failures = run_story(story, tmp_path, model.base_url if method == "llm" else None)

    assert failures == [], "\n".join(failures)
    assert tally.problems == [], "\n".join(tally.problems)
    assert tally.blocks > 0 or not any(getattr(step, "contexts", None) for step in story.steps)
    said = any(isinstance(step, Say) for step in story.steps)
    assert (len(model.chat_requests) > asked) == (method == "llm" and said)
