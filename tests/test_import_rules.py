"""Directions of dependency inside the package, read from the source with ast (every import statement, module level
or inside a function): each part of xmr/ (a package, or one of the three modules beside them) is on one floor of
docs/architecture.md and imports only its floor and those below; the library never reaches into the workflow or the
trainer, and has no import cycle."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "xmr"


def module_name(path: Path) -> str:
    if not path.is_relative_to(PKG.parent):  # a file written by a test
        return path.stem
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> list[str]:
    """Dotted names a file imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), relative imports resolved."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. Importing ``xmr.a.b`` also runs ``xmr/a/__init__.py``, so the
    parent packages count as imported too, except the top-level ``xmr`` (its ``__init__`` imports nothing at
    import time: ``xmr.load`` imports the inference module when called). A copy of the graph read once per
    pytest process (every file parsed; a dozen tests ask)."""
    return {mod: set(deps) for mod, deps in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps = set()
        for name in imported_names(path):
            target = owner(name) if name.split(".")[0] == "xmr" else None
            if target is None:
                continue
            deps.add(target)
            parent = target.rpartition(".")[0]
            while parent and parent != "xmr":
                deps.add(parent)
                parent = parent.rpartition(".")[0]
        deps.discard(mod)
        deps -= {p for p in deps if mod.startswith(p + ".")}  # a package's own __init__ runs first anyway
        graph[mod] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_graph_reader_sees_the_edges_it_should():
    # guards the checks below against a reader that finds nothing
    graph = import_graph()
    assert "xmr.inference.model" in graph["xmr.train.trainer"]
    assert "xmr.inference.model" in graph["xmr.commands.score"]  # imported inside run(): still counted
    assert "xmr.rerank" in graph["xmr.evaluation.protocols"]
    assert {"xmr.models", "xmr.models.image_backbone"} <= graph["xmr.inference.model"]  # parent package counted
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_the_workflow_helpers():
    offenders = sorted(m for m, deps in import_graph().items() if any(d == "xmr.workflow" for d in deps))
    assert offenders == []
    assert not (PKG / "workflow.py").exists()  # paths and targets live in xmr.run.layout


def test_only_the_train_package_imports_the_trainer():
    # the `xmr train` command is the trainer's one thin CLI wrapper; everything else uses xmr.inference
    allowed = {"xmr.commands.train"}
    offenders = sorted(m for m, deps in import_graph().items() if "xmr.train.trainer" in deps
                       and not m.startswith("xmr.train.") and m != "xmr.train" and m not in allowed)
    assert offenders == []


def test_inference_never_imports_the_trainer():
    graph = import_graph()
    assert "xmr.train.trainer" not in graph["xmr.inference.model"]
    assert "xmr.train.trainer" not in graph["xmr.commands.search"]


def test_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None


def part_of(module: str) -> str:
    """The part of xmr/ that holds a module: ``xmr.run.layout`` -> ``xmr.run``; ``xmr`` is its ``__init__.py``."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the package's first-level parts (``xmr.config``, ``xmr.methods``, ...)."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(part_of(mod), set()).update(part_of(d) for d in deps if part_of(d) != part_of(mod))
    return out


def test_no_package_level_cycle():
    # e.g. config -> methods -> models -> text -> config, which module-level edges alone do not show
    assert package_graph({"xmr.a.x": {"xmr.b.y"}, "xmr.b.y": {"xmr.a.z"}, "xmr.a.z": set()}) == {
        "xmr.a": {"xmr.b"}, "xmr.b": {"xmr.a"}}
    assert find_cycle(package_graph(import_graph())) is None


def test_the_library_never_imports_train():
    """train/ holds only the trainer, samplers, distributed and schedules; loaders, the end-to-end backbone,
    checkpoint I/O and the model factory are library (inference, report, commands use them without training)."""
    offenders = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                       if d.startswith("xmr.train") and not m.startswith("xmr.train") and m != "xmr.commands.train")
    assert offenders == []


FLOORS = {  # docs/architecture.md "Floors": each part of xmr/ on one floor; it may import its own floor and those below
    "xmr.core": 0,
    "xmr.losses": 1, "xmr.similarity": 1, "xmr.evaluation": 1, "xmr.rerank": 1,
    "xmr": 2,  # xmr/__init__.py: __version__ and xmr.load, which imports the inference package when called
    "xmr.config": 2, "xmr.schemas": 2, "xmr.data": 2, "xmr.text": 2, "xmr.features": 2, "xmr.settings": 2,
    "xmr.models": 2, "xmr.methods": 2, "xmr.run": 2, "xmr.inference": 2, "xmr.checkpoints": 2,
    "xmr.train": 3,
    "xmr.studies": 4, "xmr.planning": 4, "xmr.report": 4,
    "xmr.cli": 5, "xmr.commands": 5, "xmr.__main__": 5,
}
ENTRY_POINTS = ("__init__.py", "__main__.py", "cli.py")  # the only modules of xmr/ outside a package


def floor_of(module: str) -> int:
    return FLOORS[part_of(module)]


def test_xmr_holds_packages_and_its_entry_points_only():
    assert sorted(p.name for p in PKG.glob("*.py")) == sorted(ENTRY_POINTS)


def test_every_part_of_xmr_has_a_floor():
    packages = {f"xmr.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    modules = {"xmr" if n == "__init__.py" else f"xmr.{Path(n).stem}" for n in ENTRY_POINTS}
    assert packages | modules == set(FLOORS)


def floor_table() -> dict[str, int]:
    """Part -> floor as docs/architecture.md's table "Floors, and what each may import" names them (``xmr/run/``,
    ``xmr/cli.py``, ``xmr/__init__.py``)."""
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    section = text.split("## Floors, and what each may import", 1)[1].split("\n## ", 1)[0]
    out: dict[str, int] = {}
    for row in re.findall(r"^\| (\d)\. [^|]+\| ([^|]+) \|", section, re.M):
        for name in re.findall(r"`xmr/(\w+)(?:/|\.py)`", row[1]):
            out["xmr" if name == "__init__" else f"xmr.{name}"] = int(row[0])
    return out


def test_the_floor_table_of_the_docs_is_the_one_enforced():
    assert floor_table() == FLOORS


def test_the_architecture_names_only_paths_that_exist():
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    named = {p.rstrip(".") for p in re.findall(r"`(xmr/[\w/.]*)", text)}  # up to a placeholder: xmr/methods/<name>.py
    assert sorted(p for p in named if not (PKG.parent / p).exists()) == []


def test_every_module_imports_only_its_floor_and_below():
    assert (floor_of("xmr.core.io"), floor_of("xmr.rerank.fast"), floor_of("xmr.run.layout"),
            floor_of("xmr.train.trainer"), floor_of("xmr.studies.benchmark"), floor_of("xmr.commands.train")) == (
        0, 1, 2, 3, 4, 5)
    upward = sorted(f"{m} (floor {floor_of(m)}) -> {d} (floor {floor_of(d)})" for m, deps in import_graph().items()
                    for d in deps if floor_of(d) > floor_of(m))
    assert upward == []


RUN_ROOTS = ("runs", "results")
LAYOUT = PKG / "run" / "layout.py"  # the run-key module


def run_paths_built(path: Path) -> list[str]:
    """Places where a module builds a path under runs/ or results/ itself: a string ``"runs"``/``"results"`` as a
    parameter default or a ``Path(...)`` argument, or a string or f-string starting ``runs/``/``results/`` outside
    an error message, a help text or a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            skip.add(id(node.body[0].value))
        messages = []
        if isinstance(node, ast.Raise) and node.exc is not None:
            messages.append(node.exc)
        if isinstance(node, ast.Call):
            messages += [k.value for k in node.keywords if k.arg in ("help", "description")]
            if isinstance(node.func, (ast.Name, ast.Attribute)) and getattr(node.func, "id", getattr(
                    node.func, "attr", "")) in ("print", "warn", "XmrError", "log_line", "note", "write"):
                messages += node.args
        for m in messages:
            skip.update(id(n) for n in ast.walk(m))
        if isinstance(node, ast.JoinedStr):  # judged as a whole, by its first piece
            skip.update(id(v) for v in node.values)
    out: list[tuple[int, int, str]] = []

    def starts(n: ast.AST) -> str | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return n.value
        if isinstance(n, ast.JoinedStr) and n.values and isinstance(n.values[0], ast.Constant):
            return n.values[0].value
        return None

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.args.defaults + node.args.kw_defaults:
                if d is not None and starts(d) in RUN_ROOTS:
                    out.append((d.lineno, d.col_offset, f"default {starts(d)!r}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Path" and node.args and \
                starts(node.args[0]) in RUN_ROOTS:
            out.append((node.lineno, node.col_offset, f"Path({starts(node.args[0])!r})"))
        elif id(node) not in skip and isinstance(node, (ast.Constant, ast.JoinedStr)):
            text = starts(node)
            if text and text.startswith(tuple(f"{r}/" for r in RUN_ROOTS)) and (
                    isinstance(node, ast.JoinedStr) or " " not in text):
                out.append((node.lineno, node.col_offset, repr(text)))
    return [f"{path.name}:{line}: {what}" for line, _, what in sorted(out)]


def test_run_path_reader_finds_built_paths(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""Docs about runs/{dataset}."""\nfrom pathlib import Path\n\n'
                 'def f(d, root="runs"):\n    raise ValueError(f"runs/{d}: missing")\n\n'
                 'def g(d):\n    return Path("results") / d, f"runs/{d}/best.pt"\n')
    assert [hit.split(": ", 1)[1] for hit in run_paths_built(p)] == ["default 'runs'", "Path('results')",
                                                                     "'runs/'"]


def test_no_run_or_result_path_is_built_outside_the_run_key_module():
    found = [hit for p in sorted(PKG.rglob("*.py")) if p != LAYOUT for hit in run_paths_built(p)]
    assert found == []


FILE_CALLS = {"read_text", "read_bytes", "open", "load_yaml", "safe_load", "exists", "is_file", "glob", "iterdir"}
FILE_MODULES = {"yaml", "h5py", "xmr.config.loader", "xmr.core.io", "pickle"}


def file_access(path: Path) -> list[str]:
    """Calls and imports through which a module reads files: ``open``, ``Path.read_text``/``exists``/...,
    ``np.load``/``torch.load``/``json.load``, imports of yaml/h5py/the config loader."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("open", "load_yaml"):
                out.append(f"{path.name}:{node.lineno}: {f.id}()")
            elif isinstance(f, ast.Attribute) and (f.attr in FILE_CALLS or (
                    f.attr in ("load", "loadtxt", "fromfile") and isinstance(f.value, ast.Name)
                    and f.value.id in ("np", "numpy", "torch", "json"))):
                out.append(f"{path.name}:{node.lineno}: .{f.attr}()")
    out += [f"{path.name}: imports {name}" for name in imported_names(path) if name in FILE_MODULES]
    return out


def test_file_access_reader_finds_reads(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import numpy as np\nfrom xmr.config.loader import load_yaml\n\ndef f(x):\n    return np.load(x), "
                 "open(x), x.read_text()\n")
    assert len(file_access(p)) == 4


def test_evaluation_and_reranking_open_no_files():
    """Config and arrays are read at the edges (CLI, results, report, inference) and passed in as values."""
    found = [hit for sub in ("evaluation", "rerank") for p in sorted((PKG / sub).glob("*.py")) for hit in file_access(p)]
    assert found == []


def test_methods_load_no_data():
    """Data-dependent state comes in through RetrievalModel.prepare(train_split), which the trainer calls."""
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items() if m.startswith("xmr.methods") and "xmr.data" in {
        d if not d.startswith("xmr.data.") else "xmr.data" for d in deps})
    assert offenders == []
