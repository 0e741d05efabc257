"""Whisper: CTranslate2 model files -> ONNX graphs, ONNX Runtime sessions, tokenizer, decoding, streaming policy."""
