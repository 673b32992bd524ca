"""Embedding: providers (WordLlama, ONNX, OpenAI-compatible), WordLlama's bag of tokens,
ONNX model loading, and the stage that fills `embedding_cache`.
"""
