"""The import rule of the README's code map: a library module imports only from its own
folder and the folders before it in

    common -> configs -> data -> attention -> models -> training -> evaluation
           -> alignment -> analysis

and the entry points (train.py, evaluate.py, the `python -m attention.*` commands,
scripts/ and bench/) may import anything. The translation core does not know its
plug-ins: nothing below alignment/ imports it."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("common", "configs", "data", "attention", "models", "training", "evaluation",
          "alignment", "analysis")
# Command modules: `python -m attention.X` keeps its name; its body lives in its layer.
ENTRY_POINTS = {"attention/inspect.py", "attention/heads.py", "attention/align.py",
                "attention/teacher_links.py"}
# Upward imports still to be removed; each one is a defect this list names.
KNOWN: set[str] = set()


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
            above = imported_packages(path) & {*LAYERS[rank + 1:], "train", "evaluate", "bench",
                                               "scripts"}
            violations += [f"{path.relative_to(REPO)} imports {name}" for name in sorted(above)]
    assert sorted(set(violations) - KNOWN) == [], violations


def test_every_package_is_a_layer():
    """A new top-level package must take its place in LAYERS (and the README's code map)."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(LAYERS)


def test_the_rule_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from training.step import create_train_state\n")
    assert "training" in imported_packages(bad)


def test_training_and_evaluation_start_without_matplotlib():
    """train.py draws its previews in a worker process and evaluate.py only when asked, so
    neither start pays matplotlib's import (`attention.heatmaps.agg_figure` imports it at
    the first figure); a module-level matplotlib import anywhere on their path fails this."""
    import subprocess
    import sys

    code = "import sys, train, evaluate; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
