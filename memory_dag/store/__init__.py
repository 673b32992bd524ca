"""The DuckDB store: connection and locking, the versioned schema, data-quality checks.
Every other package reads and writes its tables through `store.connection`.
"""
