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


def test_strongly_connected_finds_a_cycle():
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_ruff_passes():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "src", "tests", "benchmarks"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
