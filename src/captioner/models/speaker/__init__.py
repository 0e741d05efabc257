"""The speaker encoder: who is speaking, from the same 10 ms frames Whisper's features come from.

resemblyzer's GE2E d-vector model (40 mel bands, a 3-layer LSTM of 256, a 256-d embedding),
read from the package's own checkpoint without PyTorch (:mod:`.torch_checkpoint`,
:mod:`.weights`), written out in NumPy as its specification (:mod:`.reference`) and as an ONNX
graph (:mod:`.graph`) run by ONNX Runtime with its state carried between calls (:mod:`.encoder`).
Takes arrays; imports none of gpu, audio, engine, app or ui.
"""
