"""The truth suite: scripted multi-session stories (`stories/*.yaml`) and what agents are told
after each step (issue 13). `harness.py` loads and runs them."""

from tests.scenarios.steps import load_stories

STORIES = load_stories()
