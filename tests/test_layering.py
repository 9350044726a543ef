"""The import rule of the README's code map: a library module imports only from its own
folder and the folders before it in configs -> data -> attention -> models; the entry
points (train.py, evaluate.py and the attention/ commands) may import anything."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("configs", "data", "attention", "models")
ENTRY_POINTS = {"attention/inspect.py", "attention/gold_aer.py", "attention/heads.py",
                "attention/align.py"}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every import in the file, module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_library_modules_import_only_downward():
    violations = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((REPO / layer).glob("*.py")):
            if str(path.relative_to(REPO)) in ENTRY_POINTS:
                continue
            above = imported_packages(path) & {*LAYERS[rank + 1:], "train", "evaluate", "bench"}
            violations += [f"{path.relative_to(REPO)} imports {name}" for name in sorted(above)]
    assert not violations, violations


def test_the_rule_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from models.training import create_train_state\n")
    assert "models" in imported_packages(bad)
