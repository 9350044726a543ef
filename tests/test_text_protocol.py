"""data.text_protocol (data/protocol.py): the literature's lowercased, normalised,
Moses-tokenised text changes what is loaded, what the tokenizer trains on and what BLEU
scores; evaluate's JSON names the protocol."""

import gzip
import json

import ml_collections
import pytest
from conftest import REPO, run_script

from configs import smoke
from data.corpora import MULTI30K_DIR, MULTI30K_FILES, load_corpus

LC = "lc_norm_tok"


def lines(path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return file.read().split("\n")[:-1]


def data_config(**overrides) -> ml_collections.ConfigDict:
    cfg = smoke.get_config().data
    cfg.update(overrides)
    return cfg


def test_sacremoses_pipeline_reproduces_the_official_files():
    from data.protocol import lc_norm_tok

    matched = total = 0
    for lang in ("de", "en", "fr"):
        for split in ("valid", "test"):
            prefix = MULTI30K_FILES[split]
            raw = [line.strip() for line in lines(MULTI30K_DIR / f"{prefix}.{lang}.gz")]
            official = lines(MULTI30K_DIR / "tok" / f"{prefix}.lc.norm.tok.{lang}.gz")
            assert len(raw) == len(official)
            ours = lc_norm_tok(raw, lang)
            matched += sum(a == b for a, b in zip(ours, official, strict=True))
            total += len(official)
    # 6,042 lines; 2 differ (a right single quote the Perl script of the time made `"`).
    assert matched / total >= 0.999, (matched, total)
    # Normalising with the line's newline moves a final full stop out of German quotes.
    assert lc_norm_tok(['Ein Schild: „Fabrik.“'], "de") == ["ein schild : &quot; fabrik &quot; ."]
    assert lc_norm_tok(["A man's hat.", ""], "en") == ["a man &apos;s hat .", ""]


def test_multi30k_reads_the_official_files_under_the_protocol():
    raw = load_corpus(data_config(), "valid")
    lc = load_corpus(data_config(text_protocol=LC), "valid")
    assert lc[0] == lines(MULTI30K_DIR / "tok" / "val.lc.norm.tok.de.gz")
    assert lc[1] == lines(MULTI30K_DIR / "tok" / "val.lc.norm.tok.en.gz")
    assert raw[1][2] == "A boy wearing headphones sits on a woman's shoulders."
    assert lc[1][2] == "a boy wearing headphones sits on a woman &apos;s shoulders ."


def text_files(tmp_path):
    source, target = tmp_path / "train.de", tmp_path / "train.en"
    source.write_text("Der Mann sagt: „Hallo.“\nZwei Hunde.\n", encoding="utf-8")
    target.write_text("The man says: \"Hello.\"\nTwo dogs.\n", encoding="utf-8")
    return dict(dataset="text", train_source=str(source), train_target=str(target),
                max_train_sentences=0)


def test_other_datasets_pass_through_sacremoses_in_loading_and_streaming(tmp_path):
    from data.streaming import training_source

    raw_cfg, lc_cfg = data_config(**text_files(tmp_path)), data_config(
        **text_files(tmp_path), text_protocol=LC)
    expected = (["der mann sagt : &quot; hallo &quot; .", "zwei hunde ."],
                ["the man says : &quot; hello . &quot;", "two dogs ."])
    assert load_corpus(lc_cfg, "train") == expected
    assert load_corpus(raw_cfg, "train")[0][1] == "Zwei Hunde."
    # The streamed training split (what the cache encodes) is the same text.
    chunks = list(training_source(lc_cfg).chunks())
    assert chunks == [expected]
    # Another protocol is another training source: no cache entry is shared.
    assert training_source(lc_cfg).key != training_source(raw_cfg).key


def test_the_tokenizer_trains_on_the_protocols_text():
    import sentencepiece as spm

    from data.streaming import training_source
    from data.tokenizer import train_model

    pieces = {}
    for protocol in ("raw", LC):
        cfg = data_config(text_protocol=protocol)
        texts = [line for s, t in training_source(cfg).chunks() for line in (*s, *t)]
        sp = spm.SentencePieceProcessor(model_proto=train_model(texts, 200))
        pieces[protocol] = {sp.id_to_piece(i) for i in range(sp.vocab_size())}
    assert any(p != p.lower() for p in pieces["raw"])  # cased pieces: "▁A", "▁Ein", ...
    assert all(p == p.lower() for p in pieces[LC] if not p.startswith("<"))
    # Tokenised text puts a space before a full stop: a word-initial "▁." piece.
    assert "▁." in pieces[LC] and "▁." not in pieces["raw"]


def test_scores_under_the_protocol_are_the_text_as_written():
    from evaluation.scoring import score

    refs = ["a man &apos;s hat .", "two dogs run ."]
    exact = score(refs, refs, text_protocol=LC)
    assert exact["bleu"] == pytest.approx(100.0) and exact["bleu_lc_tok"] == exact["bleu"]
    assert exact["text_protocol"] == LC and "tok:none" in exact["bleu_signature"]
    # Untokenised hypotheses are not re-tokenised under the protocol (the raw protocol's
    # --compat_lc_tok would tokenise both sides and call them equal).
    untokenised = ["a man's hat.", "two dogs run."]
    assert score(untokenised, refs, text_protocol=LC)["bleu"] < 60
    raw = score(untokenised, ["a man's hat.", "two dogs run."], compat_lc_tok=True)
    assert raw["bleu_lc_tok"] == pytest.approx(100.0) and "text_protocol" not in raw


def test_detokenize_needs_a_tokenised_protocol():
    from common.errors import UserError
    from configs.validation import validate_config

    cfg = smoke.get_config()
    cfg.eval.detokenize = True
    with pytest.raises(UserError, match="eval.detokenize"):
        validate_config(cfg)
    cfg.data.text_protocol = LC
    validate_config(cfg)


@pytest.mark.slow
def test_a_smoke_run_trains_and_evaluates_under_the_protocol(tmp_path):
    workdir = tmp_path / "lc"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        f"--config.data.text_protocol={LC}", "--config.eval.detokenize=True",
                        "--config.train.num_steps=20", "--config.eval.max_sentences=8",
                        "--config.attention_maps.enabled=False")
    assert result.returncode == 0, result.stderr[-2000:]
    vocab = (workdir / "tokenizer" / "spm.vocab").read_text(encoding="utf-8")
    assert vocab == vocab.lower()  # trained on lowercased text
    valid = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
             if '"valid"' in line]
    assert valid and all(event["text_protocol"] == LC for event in valid)

    result = run_script("evaluate.py", "--workdir", str(workdir), "--split", "valid",
                        "--max_sentences", "20", "--beam_size", "1", "--name", "v")
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads((workdir / "eval" / "v.json").read_text())
    assert out["text_protocol"] == LC and out["bleu_lc_tok"] == out["bleu"]
    assert "not comparable" in out["bleu_detok_note"]
    hyps = (workdir / "eval" / "v.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 20 and all(h == h.lower() for h in hyps)
    # BLEU is that of the hypotheses as written against the official reference lines.
    from sacrebleu.metrics import BLEU

    reference = lines(REPO / "data" / "multi30k" / "tok" / "val.lc.norm.tok.en.gz")[:20]
    assert out["bleu"] == pytest.approx(BLEU(tokenize="none").corpus_score(hyps, [reference]).score)
    detok = (workdir / "eval" / "v.detok.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert len(detok) == 20 and not any("&apos;" in h or " ." in h for h in detok)
