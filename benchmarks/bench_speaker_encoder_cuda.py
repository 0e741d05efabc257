"""The voice encoder on the CUDA provider: the same embeddings as on the CPU, and its GPU time
per stream-second at 1, 64 and 512 streams (device arrays bound, CuPy; needs a GPU).

    PYTHONPATH=src python benchmarks/bench_speaker_encoder_cuda.py
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from captioner.models.speaker.encoder import SpeakerEncoder

FRAMES, ROWS = 160, 64  # one partial (1.6 s) of 64 streams
STEP_FRAMES = 10  # 0.1 s of audio a step, as the engine advances it


def main() -> None:
    rng = np.random.default_rng(0)
    log_mel = rng.standard_normal((FRAMES, ROWS, 40)).astype(np.float32) * 0.5 - 4.0
    gain = np.zeros(ROWS, np.float32)
    lengths = np.full(ROWS, FRAMES, np.int32)
    cpu, gpu = SpeakerEncoder("cpu"), SpeakerEncoder("cuda:0")
    print("providers", cpu.provider, gpu.provider)
    _, _, on_cpu = cpu.step(log_mel, gain, lengths, *SpeakerEncoder.zero_state(ROWS))
    _, _, on_gpu = gpu.step(cp.asarray(log_mel), cp.asarray(gain), cp.asarray(lengths),
                            *SpeakerEncoder.zero_state(ROWS, cp), xp=cp)
    print("cosine cpu/gpu min", float((on_cpu * cp.asnumpy(on_gpu)).sum(1).min()))
    for n in (1, 64, 512):
        frames = cp.asarray(np.repeat(log_mel[:STEP_FRAMES, :1], n, 1))
        gains, steps = cp.zeros(n, cp.float32), cp.full(n, STEP_FRAMES, cp.int32)
        h, c = SpeakerEncoder.zero_state(n, cp)
        for _ in range(3):
            gpu.step(frames, gains, steps, h, c, xp=cp)
        cp.cuda.Device().synchronize()
        started = time.perf_counter()
        for _ in range(20):
            gpu.step(frames, gains, steps, h, c, xp=cp)
        cp.cuda.Device().synchronize()
        step_s = (time.perf_counter() - started) / 20
        print(f"{n} streams: {step_s * 1e3:.2f} ms per {STEP_FRAMES}-frame step: "
              f"{step_s / n / (STEP_FRAMES / 100) * 1e3:.3f} ms GPU wall per stream-second")


if __name__ == "__main__":
    main()
