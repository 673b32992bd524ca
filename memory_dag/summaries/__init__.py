"""Summaries: the adaptive summarizer (seed 001), one summary tree per conversation,
and the Markdown export.
"""
