"""resemblyzer's voice encoder weights, found in its installed package and checked.

The package (``resemblyzer`` 0.1.4, Apache-2.0) is installed without its dependencies
(``scripts/setup.sh``: it would pull PyTorch, librosa and webrtcvad), so it is never imported:
only the path of its ``pretrained.pt`` is looked up. The model (GE2E, Wan et al. 2018): 40 mel
bands of linear power in, a 3-layer LSTM of 256 units, the last layer's final hidden state
through a 256 x 256 linear layer, ReLU, then scaled to unit length; trained on partial
utterances of 160 frames (1.6 s).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioner.errors import UserError
from captioner.models.speaker.torch_checkpoint import load_legacy_checkpoint

N_BANDS = 40
HIDDEN = 256
LAYERS = 3
EMBEDDING = 256
PARTIAL_FRAMES = 160
"""Frames (10 ms each) of the partial utterances the model was trained on and embeds."""
TARGET_DBFS = -30.0
"""resemblyzer raises a recording's RMS level to this before its mel spectrogram (never lowers
it): the network takes linear mel power, so its input scales with the gain."""
PACKAGE = "resemblyzer"
REQUIREMENT = "resemblyzer==0.1.4"
INSTALL_HINT = f"pip install --no-deps {REQUIREMENT}"


@dataclass(frozen=True)
class LstmLayer:
    """One LSTM layer in PyTorch's layout: gates stacked ``i, f, g, o`` along the first axis."""

    w_ih: np.ndarray  # [4 H, in]
    w_hh: np.ndarray  # [4 H, H]
    b_ih: np.ndarray  # [4 H]
    b_hh: np.ndarray  # [4 H]


@dataclass(frozen=True)
class SpeakerWeights:
    layers: tuple[LstmLayer, ...]
    linear_w: np.ndarray  # [EMBEDDING, HIDDEN]
    linear_b: np.ndarray  # [EMBEDDING]
    source: str = ""


def checkpoint_path() -> Path:
    """Where the installed resemblyzer keeps ``pretrained.pt`` (the package is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"speaker labels need the voice encoder of the {PACKAGE} package: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise UserError(f"{path} is missing: reinstall with {INSTALL_HINT}")
    return path


def _expect(state: dict, name: str, shape: tuple[int, ...]) -> np.ndarray:
    value = state.get(name)
    if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != np.float32:
        got = getattr(value, "shape", type(value).__name__)
        raise UserError(f"the voice encoder checkpoint's {name} is {got}, not float32 {shape}")
    return value


def weights_from_state(state: dict, source: str = "") -> SpeakerWeights:
    """The network from a ``model_state`` dict (PyTorch names), every shape checked."""
    layers = []
    for k in range(LAYERS):
        width = N_BANDS if k == 0 else HIDDEN
        layers.append(LstmLayer(
            _expect(state, f"lstm.weight_ih_l{k}", (4 * HIDDEN, width)),
            _expect(state, f"lstm.weight_hh_l{k}", (4 * HIDDEN, HIDDEN)),
            _expect(state, f"lstm.bias_ih_l{k}", (4 * HIDDEN,)),
            _expect(state, f"lstm.bias_hh_l{k}", (4 * HIDDEN,)),
        ))
    return SpeakerWeights(tuple(layers), _expect(state, "linear.weight", (EMBEDDING, HIDDEN)),
                          _expect(state, "linear.bias", (EMBEDDING,)), source)


@functools.lru_cache(maxsize=2)
def load_weights(path: str | Path | None = None) -> SpeakerWeights:
    """resemblyzer's pretrained voice encoder (``path``: another checkpoint of the same shape),
    read once a process."""
    path = Path(path) if path is not None else checkpoint_path()
    checkpoint = load_legacy_checkpoint(path)
    state = checkpoint.get("model_state") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise UserError(f"{path.name} holds no model_state")
    return weights_from_state(state, str(path))
