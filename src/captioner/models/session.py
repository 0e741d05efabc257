"""ONNX Runtime sessions — the one module that imports ``onnxruntime`` (lazily).

The CUDA execution provider is used when it actually works, else the CPU provider. ONNX Runtime
falls back to the CPU with only a log line when CUDA libraries are missing, so the choice is made
by opening a probe session and checking ``get_providers()``, and every session is checked again.
What a request means is :func:`captioner.compute.resolve_device`, the rule the array back-end
(``gpu.backend``) follows too: "auto" takes the GPU when the CUDA provider works there, else the
CPU (the reason kept as the choice's ``note``); a GPU asked for by name that cannot be used is a
:class:`~captioner.errors.UserError`, never a quiet CPU run.

Inputs and outputs go through I/O binding: NumPy arrays are bound as host inputs, arrays that
live on the GPU (anything with ``__cuda_array_interface__``, e.g. CuPy) are bound by device
pointer with no host round trip, and outputs the next graph consumes (encoder states, cross K/V,
the self-attention cache) stay on the device as ``OrtValue`` handles.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioner import cuda_driver
from captioner.compute import parse_device as parse_compute_device
from captioner.compute import requested_device, resolve_device
from captioner.errors import UserError, one_line
from captioner.models import gpu_memory

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

CUDNN_ATTENTION_ENV = "ORT_ENABLE_CUDNN_FLASH_ATTENTION"
"""ONNX Runtime's switch for cuDNN's fused attention (``0`` turns it off for every attention op of
the CUDA provider; read when a session makes its kernels). On compute capability 9 and newer ONNX
Runtime prefers cuDNN's attention for fp16 MultiHeadAttention (onnxruntime PR #28849). The
prompt prefill, whose shapes (bucket x prompt width) change from step to step, ran several times
slower with it than with ONNX Runtime's own kernels; the decoder step was no slower with it
(benchmarks/results/capacity/HISTORY.md, "the prefill's missing ten milliseconds"). So sessions opened
with ``cudnn_attention=False`` (the prefill) get ``0`` while they are made, unless the environment
already sets the switch, which then holds for all."""


def _ort():
    try:
        import onnxruntime
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise UserError(f"onnxruntime is not installed ({e}); pip install onnxruntime-gpu") from None
    return onnxruntime


@dataclass(frozen=True)
class ProviderChoice:
    """What a session will run on. ``note`` says why CUDA is not used when it was asked for."""

    provider: str  # CUDA or CPU
    device_id: int | None
    device_name: str
    note: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.provider == CUDA


def parse_device(device: str | None) -> tuple[str, int | None]:
    """``None``/"auto" -> ("auto", None) (``CAPTIONER_DEVICE`` fills in ``None``); otherwise the
    back-end's own reading of "cpu" / "cuda" / "cuda:N", so features and model accept the same names."""
    wanted = requested_device(device)
    return ("auto", None) if wanted == "auto" else parse_compute_device(wanted)


def _provider_options(device_id: int, cuda_graph: bool = False) -> dict[str, Any]:
    # HEURISTIC: cuDNN's exhaustive convolution search stalls the first encoder run for seconds.
    options = {"device_id": device_id, "cudnn_conv_algo_search": "HEURISTIC"}
    options.update(gpu_memory.provider_options())
    if cuda_graph:
        options["enable_cuda_graph"] = "1"
    return options


def _session_options(intra_threads: int | None = None, device_id: int | None = None):
    """``device_id``: the GPU of a CUDA session, whose working memory then comes from the
    process's shared arena on that GPU where :mod:`captioner.models.gpu_memory` makes one."""
    ort = _ort()
    ort.set_default_logger_severity(3)  # ORT's global log (plugin-EP notices) would flood the CLI
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only: fallbacks are reported by this module, not ORT's log
    if intra_threads:
        so.intra_op_num_threads = intra_threads
    if device_id is not None and gpu_memory.shared_arena(ort, CUDA, device_id):
        so.add_session_config_entry("session.use_env_allocators", "1")
    return so


def _cuda_device_name(device_id: int) -> str:
    # Names come from NVML via the telemetry module when the app runs; here a plain label suffices.
    return f"cuda:{device_id}"


def choose_provider(device: str | None = None) -> ProviderChoice:
    """CUDA or CPU for ``device`` (a name, "auto" or ``None``), by
    :func:`~captioner.compute.resolve_device` over the GPUs the CUDA provider really runs on."""
    kind, _ = parse_device(device)
    if kind == "cpu":
        return ProviderChoice(CPU, None, "cpu")  # asked for the CPU: nothing to probe
    count, why_none = _cuda_provider_devices()
    name = resolve_device(device, count, why_none)  # UserError for a named GPU that cannot be used
    if name == "cpu":
        log.info("running on the CPU: %s", why_none)
        return ProviderChoice(CPU, None, "cpu", why_none)
    device_id = int(name.split(":")[1])
    failure = _probe_cuda(device_id)  # device 0 passed already; another one is tried on its own
    if failure:
        raise UserError(f"{name} cannot run the model: {failure}; use --device cpu")
    return ProviderChoice(CUDA, device_id, _cuda_device_name(device_id))


@functools.lru_cache(maxsize=1)
def _cuda_provider_devices() -> tuple[int, str]:
    """(GPUs the CUDA provider can run on, why none when 0): the driver's device count once the
    provider has run a probe graph on cuda:0. The driver is asked first: without it (or without
    a GPU) no onnxruntime build would help, and the reason says so (:mod:`captioner.cuda_driver`)."""
    count, why_none = cuda_driver.driver_devices()
    if count == 0:
        return 0, why_none
    ort = _ort()
    if CUDA not in ort.get_available_providers():
        return 0, "this onnxruntime build has no CUDA provider: install onnxruntime-gpu, not onnxruntime"
    failure = _probe_cuda(0)
    if failure:
        return 0, failure
    return count, ""


@functools.cache
def _probe_cuda(device_id: int) -> str:
    """Why the CUDA provider cannot run on ``device_id`` ("" when it can): a one-node graph is
    opened there and ONNX Runtime asked which provider it really used."""
    ort = _ort()
    _preload_cuda_wheels(ort)
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    probe = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "probe", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    probe.ir_version = 8
    # A failing probe is an answer, not an error: ORT's own red log line for it is silenced here
    # and the reason is reported once, by the caller.
    ort.set_default_logger_severity(4)
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), _session_options(), providers=[(CUDA, _provider_options(device_id)), CPU])
        used = sess.get_providers()
    except Exception as e:  # ORT raises plain RuntimeError/Fail for a bad device id or driver
        return f"the CUDA provider failed to start on cuda:{device_id}: {one_line(str(e).splitlines()[0])}"
    finally:
        ort.set_default_logger_severity(2)
    if not used or used[0] != CUDA:
        return "the CUDA provider is unusable: CUDA or cuDNN libraries missing, ONNX Runtime fell back to the CPU"
    return ""


_preloaded = False


def _preload_cuda_wheels(ort) -> None:
    """Load the CUDA runtime, cuBLAS, cuFFT and cuDNN from the ``nvidia-*`` wheels of the
    ``[cuda]`` extra, so that a machine with only an NVIDIA driver (no CUDA toolkit) gets the CUDA
    provider; where the libraries come from the system instead, nothing is lost."""
    global _preloaded
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True

    import io  # noqa: PLC0415

    # preload_dlls prints its own notes on stdout (which may be a caption stream); keep them out.
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            ort.preload_dlls(cuda=True, cudnn=True, msvc=False, directory="")
        except Exception as error:  # a missing wheel is fine: system libraries may serve
            log.info("CUDA wheel preload skipped: %s", error)


@contextlib.contextmanager
def _attention_switch(cudnn_off: bool):
    """While a session is made: cuDNN's attention off when ``cudnn_off`` and the environment does
    not set :data:`CUDNN_ATTENTION_ENV` itself (sessions are made on one thread at a time)."""
    if not cudnn_off or CUDNN_ATTENTION_ENV in os.environ:
        yield
        return
    os.environ[CUDNN_ATTENTION_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(CUDNN_ATTENTION_ENV, None)


class OrtModel:
    """One inference session plus I/O binding. Not thread-safe: one thread (the GPU worker, or
    the CLI's main thread) drives a model."""

    def __init__(self, path: Path, choice: ProviderChoice, intra_threads: int | None = None, cuda_graph: bool = False,
                 model_bytes: bytes | None = None, cudnn_attention: bool = True):
        """``model_bytes``: a serialized graph made in memory (``path`` then only names it).
        ``cudnn_attention=False``: this session's attention kernels are not cuDNN's
        (:data:`CUDNN_ATTENTION_ENV`)."""
        ort = _ort()
        self.choice = choice
        self.path = Path(path)
        self.cuda_graph = bool(cuda_graph and choice.is_cuda)
        providers = [(CUDA, _provider_options(choice.device_id or 0, self.cuda_graph)), CPU] if choice.is_cuda else [CPU]
        try:
            source = model_bytes if model_bytes is not None else str(path)
            with _attention_switch(choice.is_cuda and not cudnn_attention):
                options = _session_options(intra_threads, (choice.device_id or 0) if choice.is_cuda else None)
                self.session = ort.InferenceSession(source, options, providers=providers)
        except Exception as e:
            raise UserError(f"ONNX Runtime cannot load {self.path.name}: {str(e).splitlines()[0]}") from None
        used = self.session.get_providers()
        self.provider = used[0] if used else CPU
        if choice.is_cuda and self.provider != CUDA:
            warnings.warn(f"{self.path.name}: CUDA provider dropped, running on {self.provider}", RuntimeWarning, stacklevel=2)
        self._device = ("cuda", choice.device_id or 0) if self.provider == CUDA else ("cpu", 0)
        self.input_names = [i.name for i in self.session.get_inputs()]
        # Declared shapes, symbolic dimensions as strings ("batch").
        self.input_shapes = {i.name: list(i.shape) for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        # Runs and their wall time (the device's work included: a run returns when it is done),
        # for benchmarks that ask how often and how long each graph ran inside the engine.
        self.runs = 0
        self.run_s = 0.0

    def _run_io(self, io, options=None) -> None:
        t0 = time.perf_counter()
        self.session.run_with_iobinding(io, options)
        self.run_s += time.perf_counter() - t0
        self.runs += 1

    def run(self, inputs: dict[str, Any], host_outputs: tuple[str, ...] = ()) -> dict[str, Any]:
        """Run once. ``inputs``: NumPy arrays (host), device arrays (``__cuda_array_interface__``)
        or OrtValues from an earlier run. Outputs named in ``host_outputs`` come back as NumPy
        arrays; all others stay where the provider put them (device memory on CUDA) as OrtValues."""
        binding = self.binding()
        binding.bind_all(inputs)
        return binding.run(host_outputs)

    def run_into(self, inputs: dict[str, Any], name: str, buffer: Any, shape: tuple[int, ...],
                 wait: bool = True) -> None:
        """Run once, writing output ``name`` ([shape], the graph's only output) into the start of
        ``buffer``, an OrtValue of this session's device at least that large (a batch written
        into the first rows of a bigger, fixed buffer). The input is bound as in :meth:`run`.
        ``wait=False`` (CUDA): return once the work is queued on the device, not when it is done;
        the caller must synchronise the device before anything reads ``buffer`` (or the input is
        overwritten)."""
        binding = self.binding()
        binding.bind_all(inputs)
        device_type, device_id = self._device
        element = np.float16 if buffer.data_type() == "tensor(float16)" else np.float32
        binding.io.bind_output(name, device_type, device_id, element, list(shape), buffer.data_ptr())
        self._run_io(binding.io, None if wait or self.provider != CUDA else self._no_wait_options())

    def _no_wait_options(self):
        """Run options under which a CUDA run does not synchronise its stream before returning
        (ONNX Runtime's ``disable_synchronize_execution_providers``); made once."""
        options = getattr(self, "_no_wait", None)
        if options is None:
            options = self._no_wait = _ort().RunOptions()
            options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return options

    def zeros(self, shape: tuple[int, ...], dtype) -> Any:
        """A zero-filled OrtValue on this session's device (fixed address: for CUDA graphs)."""
        device_type, device_id = self._device
        return _ort().OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype), device_type, device_id)

    def binding(self) -> Binding:
        """A reusable I/O binding: inputs that do not change between runs (cross K/V) are bound
        once; the decoder rebinds only tokens and the cache at each step."""
        return Binding(self)


class Binding:
    def __init__(self, model: OrtModel):
        self.model = model
        self.io = model.session.io_binding()
        self._graph_options: dict[int, Any] = {}
        self._ort = _ort()

    def bind_all(self, inputs: dict[str, Any]) -> None:
        for name, value in inputs.items():
            self.bind(name, value)

    def bind(self, name: str, value: Any) -> None:
        io = self.io
        if isinstance(value, self._ort.OrtValue):
            io.bind_ortvalue_input(name, value)
        elif hasattr(value, "__cuda_array_interface__"):
            self._bind_device_array(name, value)
        else:
            io.bind_cpu_input(name, np.ascontiguousarray(value))

    def bind_output_value(self, name: str, value: Any) -> None:
        """Bind an output to an existing OrtValue (written in place at every run)."""
        self.io.bind_ortvalue_output(name, value)

    def bind_output_array(self, name: str, value: Any) -> None:
        """Bind an output to a device array (``__cuda_array_interface__``, e.g. CuPy) of the
        output's shape and type: the graph writes into it in place at every run, so the result
        stays on the GPU for the array code that reads it next (CUDA sessions only)."""
        model = self.model
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is None or model.provider != CUDA:
            raise ValueError(f"{name}: an output can be bound to a device array only on a CUDA session")
        if cai.get("strides") is not None and not _c_contiguous(cai):
            raise ValueError(f"{name}: device array must be C-contiguous")
        self.io.bind_output(name, "cuda", model._device[1], np.dtype(cai["typestr"]).type, list(cai["shape"]), cai["data"][0])

    def run_bound(self, graph_id: int | None = None) -> None:
        """Run with every input and output already bound (fixed buffers). ``graph_id`` selects the
        CUDA graph to capture/replay when the session was made with ``cuda_graph=True``."""
        options = None
        if self.model.cuda_graph and graph_id is not None:
            # One RunOptions per graph, made once: a decoder step is short enough that building
            # it on every step was a measurable share (docs/benchmarks.md, "Per-step overhead").
            options = self._graph_options.get(graph_id)
            if options is None:
                options = self._graph_options[graph_id] = self._ort.RunOptions()
                options.add_run_config_entry("gpu_graph_id", str(graph_id))
        self.model._run_io(self.io, options)

    def run(self, host_outputs: tuple[str, ...] = ()) -> dict[str, Any]:
        model, io = self.model, self.io
        device_type, device_id = model._device
        io.clear_binding_outputs()
        for name in model.output_names:
            if name in host_outputs:
                io.bind_output(name, "cpu")
            else:
                io.bind_output(name, device_type, device_id)
        model._run_io(io)
        out = {}
        for name, value in zip(model.output_names, io.get_outputs()):
            out[name] = value.numpy() if name in host_outputs else value
        return out

    def _bind_device_array(self, name: str, value) -> None:
        model = self.model
        if model.provider != CUDA:
            # CPU session: bring the data over once (CuPy has .get(); anything else via NumPy).
            host = value.get() if hasattr(value, "get") else np.asarray(value)
            self.io.bind_cpu_input(name, np.ascontiguousarray(host))
            return
        cai = value.__cuda_array_interface__
        if cai.get("strides") is not None and not _c_contiguous(cai):
            raise ValueError(f"{name}: device array must be C-contiguous")
        # The producer (CuPy) may still be writing on its own stream; ORT reads on its stream.
        sync = getattr(getattr(value, "device", None), "synchronize", None)
        if sync is not None:
            sync()
        self.io.bind_input(name, "cuda", model._device[1], np.dtype(cai["typestr"]).type, list(cai["shape"]), cai["data"][0])


def _c_contiguous(cai: dict) -> bool:
    shape, strides = cai["shape"], cai["strides"]
    itemsize = np.dtype(cai["typestr"]).itemsize
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expected:
            return False
        expected *= dim
    return True


def write(value, array: np.ndarray) -> None:
    """Copy host data into an existing OrtValue (same shape and dtype), keeping its address."""
    value.update_inplace(np.ascontiguousarray(array))


def to_numpy(value) -> np.ndarray:
    return value.numpy()
