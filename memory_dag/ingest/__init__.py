"""Ingestion: workspace files → notes, episodes and chunk rows (sources, watch, chunking,
token counts). The first stages of the pipeline; nothing here embeds or indexes.
"""
