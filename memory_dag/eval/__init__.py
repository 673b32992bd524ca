"""Evaluation: LoCoMo retrieval recall, overall and per read-path stage."""
