"""Shape rules read from the source with ast: the trainer stays in parts a reader can hold in their head."""

from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "xmr" / "train"
MAX_LINES = 80


def long_functions(path: Path, limit: int) -> list[str]:
    """``file:function (N lines)`` for each function or method of ``path`` longer than ``limit`` lines (its
    decorators, signature and docstring included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = node.end_lineno - start + 1
            if n > limit:
                out.append(f"{path.name}:{node.name} ({n} lines)")
    return out


def test_the_reader_sees_a_long_function(tmp_path):
    src = tmp_path / "long.py"
    src.write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 80 + "    return x\n")
    assert long_functions(src, MAX_LINES) == ["long.py:long (82 lines)"]


def test_no_function_in_the_train_package_is_over_80_lines():
    offenders = [f for p in sorted(TRAIN.glob("*.py")) for f in long_functions(p, MAX_LINES)]
    assert offenders == []


def test_the_old_monolith_is_gone():
    tree = ast.parse((TRAIN / "trainer.py").read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert "_train" not in names
    assert {"TrainState", "set_up", "resume_state", "run_epoch", "end_epoch"} <= names
