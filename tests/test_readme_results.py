"""The README's results table quotes result JSONs: every figure in it must be the figure of
the JSON its row cites, rounded as printed, and every gap it states must follow from them."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d+(?:\.\d+)?)"
SCORE = NUMBER + r"(?: ± " + NUMBER + r")?"  # a value, or a mean ± std
BLEU_CELL = re.compile(rf"^{SCORE} / {SCORE} / {SCORE}$")
ALIGN_CELL = re.compile(rf"^AER {NUMBER} / {NUMBER} / {NUMBER}; eflomal on the same text: {NUMBER}$")
TARGET_BLEU = re.compile(rf"≥ {NUMBER} (lc-tok|cased): \*\*(not met|met)\*\*(?:, {NUMBER} short)?")
TARGET_AER = re.compile(rf"≥ {NUMBER} AER ahead of eflomal: \*\*(not met|met)\*\*, {NUMBER} ahead")
ATTNMT_ROW = "attnmt heads and student"
EFLOMAL_ROW = "eflomal grow-diag-final-and"


def results_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first table under `## Results`, as {header: cell} (bold removed
    from the figures, kept in the target cell where it marks met / not met)."""
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        row = dict(zip(header, cells, strict=True))
        figures = next(key for key in header if key.startswith("test"))
        row["figures"] = row[figures].replace("**", "")
        rows.append(row)
    return rows


def decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def assert_printed(printed: str | None, value: float, what: str) -> None:
    assert printed is not None, f"{what}: the table gives no figure"
    assert f"{value:.{decimals(printed)}f}" == printed, f"{what}: README {printed}, JSON {value}"


def cited_json(row: dict[str, str]) -> dict:
    paths = re.findall(r"`(results/[\w./-]+\.json)`", row["source"])
    assert len(paths) == 1, f"each row cites one result JSON: {row['source']}"
    return json.loads((ROOT / paths[0]).read_text(encoding="utf-8"))


ROWS = results_rows((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_table_has_every_headline():
    assert len(ROWS) >= 8, ROWS
    sources = " ".join(row["source"] for row in ROWS)
    for name in ("multi30k_de_en.json", "multi30k_en_de.json", "multi30k_en_fr.json",
                 "multi30k_de_en_ensemble.json", "multi30k_en_de_ensemble.json",
                 "multi30k_en_fr_ensemble.json", "multi30k_de_en_cpu.json", "multi30k_de_en_cpu_kd.json",
                 "alignment_peers_align_de_en_links.json"):
        assert name in sources, f"the results table lost the row of {name}"


@pytest.mark.parametrize("row", [r for r in ROWS if BLEU_CELL.match(r["figures"])],
                         ids=lambda r: r["result"])
def test_bleu_row_matches_its_json(row):
    result = cited_json(row)
    assert result["split"] == "test" and result["decoding"]["beam_size"] == 5
    fields = BLEU_CELL.match(row["figures"]).groups()
    for i, metric in enumerate(("bleu", "bleu_lc_tok", "chrf")):
        mean, std = fields[2 * i], fields[2 * i + 1]
        assert_printed(mean, result[metric], metric)
        if "mean" in row["result"]:
            assert result["num_seeds"] == 3 and len(result["per_seed"][metric]) == 3
            assert_printed(std, result[f"{metric}_std"], f"{metric}_std")
        else:
            assert std is None, f"{metric}: a single result has no ± in the README"
    target = TARGET_BLEU.search(row["target"])
    if target is None:
        assert row["target"] == "reported apart", row["target"]
        return
    goal, metric, verdict, short = target.groups()
    value = result["bleu_lc_tok" if metric == "lc-tok" else "bleu"]
    assert verdict == ("met" if value >= float(goal) else "not met"), row["target"]
    if verdict == "not met":
        assert_printed(short, float(goal) - value, "gap to the target")


def test_alignment_row_matches_its_json():
    (row,) = [r for r in ROWS if ALIGN_CELL.match(r["figures"])]
    result = cited_json(row)
    by_method = {r["method"]: r["all"] for r in result["rows"]}
    assert result["gold_pairs"] == by_method[ATTNMT_ROW]["sentences"] == 508
    aer, precision, recall, eflomal = ALIGN_CELL.match(row["figures"]).groups()
    assert_printed(aer, 100 * by_method[ATTNMT_ROW]["aer"], "AER")
    assert_printed(precision, 100 * by_method[ATTNMT_ROW]["precision"], "precision")
    assert_printed(recall, 100 * by_method[ATTNMT_ROW]["recall"], "recall")
    assert_printed(eflomal, 100 * by_method[EFLOMAL_ROW]["aer"], "eflomal's AER")
    goal, verdict, ahead = TARGET_AER.search(row["target"]).groups()
    gap = 100 * (by_method[EFLOMAL_ROW]["aer"] - by_method[ATTNMT_ROW]["aer"])
    assert verdict == ("met" if gap >= float(goal) else "not met"), row["target"]
    assert_printed(ahead, gap, "AER ahead of eflomal")


def test_every_row_is_checked():
    checked = [r for r in ROWS if BLEU_CELL.match(r["figures"]) or ALIGN_CELL.match(r["figures"])]
    assert checked == ROWS, [r["result"] for r in ROWS if r not in checked]


def test_the_parser_reads_a_row():
    text = ("x\n## Results\n\n| result | test: a | target | source |\n|---|---|---|---|\n"
            "| De→En, mean | 1.00 ± 0.10 / **2.00 ± 0.20** / 3.0 ± 0.3 | ≥ 44 lc-tok: **not met**, "
            "42.00 short | `results/a.json` |\n\n## Next\n| a | b |\n")
    (row,) = results_rows(text)
    assert BLEU_CELL.match(row["figures"]).groups() == ("1.00", "0.10", "2.00", "0.20", "3.0", "0.3")
    assert TARGET_BLEU.search(row["target"]).groups() == ("44", "lc-tok", "not met", "42.00")
