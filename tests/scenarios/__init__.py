"""The truth suite: scripted multi-session stories and what agents are told after each step
(issue 13). `harness.py` runs a story; the `stories_*.py` modules hold them."""

from tests.scenarios import stories_changes, stories_scope, stories_time

STORIES = [*stories_changes.STORIES, *stories_time.STORIES, *stories_scope.STORIES]
