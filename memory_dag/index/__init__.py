"""The search index: published FAISS + BM25 versions, their build stage, and the search
that reads them (hybrid, scoped, never opening DuckDB).
"""
