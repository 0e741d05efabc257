"""An engine on CUDA decides the same with the VAD measures kernel (gpu/speech_kernel.py) as with
the NumPy path over gathered frames: twelve real recordings as twelve streams, the same speech
frames, the same segments and the same number of model steps."""

from __future__ import annotations

import pytest

from captioner.gpu.backend import cuda_usable, get_backend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    if not cuda_usable():
        pytest.skip("no usable CUDA device")
    return get_backend("cuda")


def test_an_engine_decides_the_same_with_and_without_the_kernel(cuda, speech_clips, monkeypatch):
    from scripted import ScriptedRecognizer

    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.live import LiveCaptioner
    from captioner.gpu.features import FeaturePool

    clips = sorted(c for c in speech_clips if speech_clips[c].language == "en")
    audio = [read_audio_16k(speech_clips[clips[i % len(clips)]].wav) for i in range(12)]

    def run(kernel: bool):
        if not kernel:
            monkeypatch.setattr(FeaturePool, "measures_on_device", property(lambda self: False))
        live = LiveCaptioner(recognizer=ScriptedRecognizer({}, check_audio=False), backend=cuda, language="en")
        streams = [live.open_stream(f"s{i}") for i in range(len(audio))]
        assert live.engine.features.measures_on_device == kernel
        for start in range(0, 16000 * 12, 1600):
            for stream, a in zip(streams, audio):
                if start < a.size:
                    stream.accept_waveform(16000, a[start:start + 1600])
            live.step()
        engine = live.engine
        rows = [engine._streams[s.label].vad_row for s in streams]
        out = (engine.vad.voiced_frames[rows].tolist(), engine.vad.speaking[rows].tolist(), engine.steps)
        live.close()
        monkeypatch.undo()
        return out

    with_kernel, without = run(True), run(False)
    assert with_kernel == without
    assert sum(with_kernel[0]) > 1000
