"""Whisper as arrays in, tokens out: CTranslate2 model files -> ONNX graphs, ONNX Runtime
sessions, the tokenizer, greedy decoding with Whisper's rules. Takes arrays and constants;
imports none of gpu, audio, engine, app or ui."""
