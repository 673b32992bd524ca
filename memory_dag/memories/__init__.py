"""Derived memories: facts extracted from turns, reconciliation, entities, relations,
categories, and `MemoryWriter`, the one writer of history and the change log.
"""
