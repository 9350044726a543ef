"""The READMEs and docs/ name files of the repository (result JSONs, configs, bench scripts):
each one they name must exist, so a renamed or moved result cannot leave a dead reference."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("results", "configs", "bench", "data", "models", "attention", "tests", "docs",
           "common", "training", "evaluation", "alignment", "analysis", "scripts")
DOCUMENTS = ["README.md", "bench/README.md", "scripts/README.md",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# A path starts at one of the repository's folders (not inside a longer path) and runs
# to its last word character; what follows tells a pattern (`seed<k>.json`, `{a,b}`).
PATH = re.compile(r"(?<![\w/.-])((?:" + "|".join(FOLDERS) + r")/[\w./-]*\w)(.?)")


def named_paths(text: str) -> list[tuple[str, bool]]:
    """[(path, is_pattern_prefix)] of the repository paths a document names."""
    return [(path, follower != "" and follower in "<{*") for path, follower in PATH.findall(text)]


def exists(path: str, is_prefix: bool) -> bool:
    """The file or folder exists; for a pattern's prefix, some file starts with it; for
    `module.function`, the module's file exists."""
    if (ROOT / path).exists():
        return True
    if is_prefix:
        parent, stem = (ROOT / path).parent, (ROOT / path).name
        return parent.is_dir() and any(p.name.startswith(stem) for p in parent.iterdir())
    module = path.rsplit(".", 1)[0]
    return "." in path and (ROOT / f"{module}.py").is_file()


def test_named_paths_reads_patterns_and_plain_paths():
    text = ("see `results/a.json`, results/x_seed<k>.json and results/bench/t_{a,b}.json; "
            "models/layers.embedding_lookup, not foo/results/b.json")
    assert named_paths(text) == [("results/a.json", False), ("results/x_seed", True),
                                 ("results/bench/t_", True), ("models/layers.embedding_lookup",
                                                              False)]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_named_path_exists(document):
    paths = named_paths((ROOT / document).read_text(encoding="utf-8"))
    assert paths, f"{document} names no repository path: the pattern no longer matches"
    missing = sorted({path for path, prefix in paths if not exists(path, prefix)})
    assert not missing, f"{document} names paths that do not exist: {missing}"


LINK = re.compile(r"\]\(([^)\s]+?\.md|)(?:#([^)\s]+))?\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercased, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_markdown_link_resolves(document):
    """Links between the documents (`[x](docs/results.md#seeds)`) reach a file and heading."""
    source = ROOT / document
    broken = []
    for target, anchor in LINK.findall(source.read_text(encoding="utf-8")):
        path = (source.parent / target).resolve() if target else source
        if not path.is_file():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
            if anchor not in {github_anchor(h) for h in headings}:
                broken.append(f"{target}#{anchor}")
    assert not broken, f"{document} links to what does not exist: {broken}"


def test_github_anchor():
    assert github_anchor("The CPU-budget recipe (60 minutes, 2-core CPU)") == \
        "the-cpu-budget-recipe-60-minutes-2-core-cpu"
