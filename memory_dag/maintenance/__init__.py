"""Nightly maintenance, one module per job: enrichment, consolidation, dedup/merge,
decay, lifecycle, reflection, insights; `nightly` runs them in order.
"""
