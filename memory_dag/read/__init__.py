"""The read path after search: retrieval stages (liveness, rerank, recency, relations,
MMR), memory.query with allowlists, and the context block an agent is given.
"""
