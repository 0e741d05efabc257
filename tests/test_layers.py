"""The layers hold by themselves: import contracts (import-linter), no import cycle anywhere,
and ruff's rule set, all run by the README's test command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    """A console script installed beside this interpreter (the project's .venv)."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else (shutil.which(name) or name)


def test_import_contracts_hold():
    result = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "broken" not in result.stdout.split("Contracts:")[-1].lower().replace("0 broken", "")


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the groups of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_import_cycle_anywhere():
    import grimp

    graph = grimp.build_graph("captioner", cache_dir=None)
    # A package imports its own modules by being their parent; only real import statements count.
    modules = {m for m in graph.modules if m.startswith("captioner")}
    edges = {m: {d for d in graph.find_modules_directly_imported_by(m) if d in modules} for m in modules}
    assert _strongly_connected(edges) == []


# Which modules may import each outside library that talks to hardware or draws windows (DESIGN.md:
# "each hardware library only in its one module"; Qt only in ui and the GUI entry point). Checked
# over every module the package has, so a module added later is covered without being listed:
# the forbidden contracts in pyproject.toml name their source modules one by one, and a list
# like that misses what was added after it was written.
LIBRARY_HOMES = {
    "PySide6": ("captioner.ui", "captioner.app.gui_main"),
    "shiboken6": ("captioner.ui", "captioner.app.gui_main"),
    "pyqtgraph": ("captioner.ui", "captioner.app.gui_main"),
    "cupy": ("captioner.gpu.backend",),
    "cupyx": ("captioner.gpu.backend",),
    "onnxruntime": ("captioner.models.session",),
    "sounddevice": ("captioner.audio.microphone",),
    "pynvml": ("captioner.gpu.telemetry",),
    "ctranslate2": ("captioner.models.ct2_oracle",),
    "websockets": ("captioner.serve", "captioner.app"),
    "ray": ("captioner.serve", "captioner.app"),
}


def _inside(module: str, homes: tuple[str, ...]) -> bool:
    return any(module == home or module.startswith(home + ".") for home in homes)


def _outside_importers(graph, library: str, homes: tuple[str, ...], root: str = "captioner") -> list[str]:
    """The modules of ``root`` that import ``library`` themselves (lazily or not) outside ``homes``."""
    if library not in graph.modules:
        return []
    return sorted(m for m in graph.find_modules_that_directly_import(library)
                  if _inside(m, (root,)) and not _inside(m, homes))


def test_each_hardware_library_is_imported_only_in_its_home():
    import grimp

    graph = grimp.build_graph("captioner", include_external_packages=True, cache_dir=None)
    # The graph must see the lazy imports inside functions (every hardware import is one), or
    # the check below would pass on an empty graph: each library has a known importer.
    for library, importer in (("cupy", "captioner.gpu.backend"), ("onnxruntime", "captioner.models.session"),
                              ("sounddevice", "captioner.audio.microphone"), ("PySide6", "captioner.app.gui_main")):
        assert importer in graph.find_modules_that_directly_import(library), (library, importer)
    strays = {lib: found for lib, homes in LIBRARY_HOMES.items() if (found := _outside_importers(graph, lib, homes))}
    assert strays == {}


def test_outside_importers_names_a_stray_module(tmp_path, monkeypatch):
    """The check on a made-up package: a lazy import outside the library's home is found."""
    import grimp

    package = tmp_path / "strayprobe"
    (package / "gpu").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "gpu" / "__init__.py").write_text("")
    (package / "gpu" / "backend.py").write_text("import numpy\n")
    (package / "features.py").write_text("def run():\n    import numpy.fft\n    return numpy.fft\n")
    (package / "plain.py").write_text("from strayprobe.gpu import backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("strayprobe", include_external_packages=True, cache_dir=None)
    assert _outside_importers(graph, "numpy", ("strayprobe.gpu",), root="strayprobe") == ["strayprobe.features"]
    assert _outside_importers(graph, "numpy", ("strayprobe.gpu", "strayprobe.features"), root="strayprobe") == []
    assert _outside_importers(graph, "cupy", ("strayprobe.gpu",), root="strayprobe") == []  # never imported
    assert not _inside("captioner.uix", LIBRARY_HOMES["pyqtgraph"])


def test_strongly_connected_finds_a_cycle():
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_ruff_passes():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "src", "tests", "benchmarks"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
