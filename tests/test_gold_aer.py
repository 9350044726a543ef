"""Forced-decoding AER against gold alignments, on the smoke model and the vendored fixture."""

import json
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


def test_gold_aer_rejects_mismatched_files(smoke_workdir, tmp_path):
    gold = tmp_path / "short.talp"
    gold.write_text("1-1\n")
    result = run_module("attention.gold_aer", "--workdir", str(smoke_workdir),
                        "--pairs", str(FIXTURES / "rwth_de_en.head10.de-en"), "--gold", str(gold))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "1 lines" in result.stderr and "10" in result.stderr
