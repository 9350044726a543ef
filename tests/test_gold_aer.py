"""`attention.gold_aer`, the old name of the AER table (now over `attention.align`), on the
smoke model and the vendored fixture."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import run_module

FIXTURES = Path(__file__).parent / "fixtures"


def test_gold_aer_cli_reports_every_layer(smoke_workdir):
    result = run_module("attention.gold_aer", "--workdir", str(smoke_workdir),
                        "--pairs", str(FIXTURES / "rwth_de_en.head10.de-en"),
                        "--gold", str(FIXTURES / "rwth_de_en.head10.talp"))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((smoke_workdir / "eval" / "gold_aer.json").read_text())
    assert report["sentences"] == 10
    settings = {(r["layer"], r["shift"]) for r in report["results"]}
    assert settings == {(0, False), (0, True), ("mean", False), ("mean", True)}
    assert all(0.0 <= r["aer"] <= 1.0 for r in report["results"])
    assert report["best"]["aer"] == min(r["aer"] for r in report["results"])
    assert "AER" in result.stdout and "best: layer" in result.stdout
    # The alias reads the links as `attention.align` does, setting by setting.
    from attention.align import align
    from attention.alignment import read_gold, read_pairs

    sources, targets = read_pairs(FIXTURES / "rwth_de_en.head10.de-en")
    golds = read_gold(FIXTURES / "rwth_de_en.head10.talp", sources, targets)
    step = str(report["checkpoint_steps"][0])
    for row in report["results"]:
        same = align(smoke_workdir, sources, targets, golds=golds, checkpoint=step,
                     layer=row["layer"], shift=row["shift"], threshold="argmax")
        assert same["scores"]["all"]["aer"] == row["aer"]
        assert same["scores"]["all"]["precision"] == row["precision"]


def test_pieces_merge_back_into_the_gold_words(smoke_workdir):
    from attention.alignment import words_from_pieces
    from attention.gold_aer import read_pairs
    from data.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(smoke_workdir / "tokenizer")
    sources, targets = read_pairs(FIXTURES / "rwth_de_en.head10.de-en")
    for text in sources + targets:
        pieces = tokenizer.source_pieces(tokenizer.encode_source([text])[0])
        words = [w for w in words_from_pieces(pieces) if w >= 0]
        assert max(words) + 1 == len(text.split()), (text, pieces)


def test_gold_aer_bad_inputs_one_line_exit_2(tmp_path):
    """Input errors are found before the workdir is read: one `error:` line, exit 2."""
    pairs, talp = FIXTURES / "rwth_de_en.head10.de-en", FIXTURES / "rwth_de_en.head10.talp"
    short, malformed = tmp_path / "short.talp", tmp_path / "malformed.talp"
    short.write_text("1-1\n")
    lines = talp.read_text().splitlines()
    malformed.write_text("\n".join([lines[0], "1-1 x-y", *lines[2:]]) + "\n")
    workdir = tmp_path / "run"
    flags = ["--workdir", str(workdir), "--pairs", str(pairs)]
    cases = {
        "mismatched": [*flags, "--gold", str(short)],
        "malformed": [*flags, "--gold", str(malformed)],
        "gold missing": [*flags, "--gold", str(tmp_path / "absent.talp")],
        "no --pairs": ["--workdir", str(workdir), "--gold", str(talp)],
    }
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = dict(zip(cases, pool.map(lambda argv: run_module("attention.gold_aer", *argv),
                                           cases.values()), strict=True))
    for name, result in results.items():
        assert result.returncode == 2, (name, result.stderr[-2000:])
        assert re.fullmatch(r"error: [^\n]+\n", result.stderr), (name, result.stderr[-2000:])
    assert "1 lines" in results["mismatched"].stderr and "10" in results["mismatched"].stderr
    assert results["malformed"].stderr == (
        f"error: {malformed}:2: not a 1-indexed TALP link: 'x-y'\n")
    assert results["gold missing"].stderr == f"error: file not found: {tmp_path / 'absent.talp'}\n"
    assert results["no --pairs"].stderr == "error: --pairs is required\n"
    assert not workdir.exists()
