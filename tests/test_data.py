"""Tests of data/: corpus loaders, their errors, the tokenizer and batching."""

import gzip
import itertools
import json
import zipfile
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from common.errors import UserError
from configs import base
from data import batching, corpora, tokenizer
from data.corpora import DataError, load_corpus
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer


def data_config(**overrides) -> ml_collections.ConfigDict:
    cfg = base.get_config().data
    cfg.update(overrides)
    return cfg


def write(path: Path, lines: list[str], compress: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


# --- multi30k -------------------------------------------------------------


def test_multi30k_sizes_and_first_pair():
    sizes = {"train": 29_000, "valid": 1_014, "test": 1_000}
    for split, size in sizes.items():
        sources, targets = load_corpus(data_config(), split)
        assert len(sources) == len(targets) == size
    sources, targets = load_corpus(data_config(), "train")
    assert sources[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert targets[0] == "Two young, White males are outside near many bushes."


def test_multi30k_directions():
    de, en = load_corpus(data_config(source_lang="de", target_lang="en"), "test")
    en2, fr = load_corpus(data_config(source_lang="en", target_lang="fr"), "test")
    fr2, de2 = load_corpus(data_config(source_lang="fr", target_lang="de"), "test")
    assert en2 == en and de2 == de and fr2 == fr
    assert fr[0].startswith("Un homme") and de[0] != en[0]


def test_multi30k_max_train_sentences_and_unknown_language():
    sources, _ = load_corpus(data_config(max_train_sentences=100), "train")
    assert len(sources) == 100
    assert len(load_corpus(data_config(max_train_sentences=100), "valid")[0]) == 1014
    with pytest.raises(DataError, match="multi30k has no language 'cs'"):
        load_corpus(data_config(source_lang="cs"), "train")


def test_multi30k_data_dir_override(tmp_path):
    write(tmp_path / "val.de.gz", ["Hallo Welt", "Guten Tag"], compress=True)
    write(tmp_path / "val.en", ["hello world", "good day"])  # plain copies work too
    sources, targets = load_corpus(data_config(data_dir=str(tmp_path)), "valid")
    assert (sources, targets) == (["Hallo Welt", "Guten Tag"], ["hello world", "good day"])


# --- tatoeba ---------------------------------------------------------------

TATOEBA = [f"English sentence {i}.\tDeutscher Satz {i}.\tCC-BY 2.0 (France) Attribution: #{i}"
           for i in range(60)]


def tatoeba_files(tmp_path: Path) -> tuple[Path, Path]:
    txt = write(tmp_path / "deu.txt", TATOEBA)
    archive = tmp_path / "deu-eng.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("_about.txt", "about the data\n")
        z.write(txt, "deu.txt")
    return archive, txt


def test_tatoeba_zip_and_txt_split(tmp_path):
    archive, txt = tatoeba_files(tmp_path)
    splits = {}
    for path in (archive, txt):
        cfg = data_config(dataset="tatoeba", path=str(path), valid_size=5, test_size=7)
        splits[path] = {s: load_corpus(cfg, s) for s in corpora.SPLITS}
    assert splits[archive] == splits[txt]
    parts = splits[archive]
    assert [len(parts[s][0]) for s in ("train", "valid", "test")] == [48, 5, 7]
    german = [s for split in parts.values() for s in split[0]]
    assert sorted(german) == sorted(f"Deutscher Satz {i}." for i in range(60))  # disjoint, complete
    for sources, _ in parts.values():  # each split keeps file order
        numbers = [int(s.split()[-1].rstrip(".")) for s in sources]
        assert numbers == sorted(numbers)
    for sources, targets in parts.values():  # de -> en, pairs intact
        for de, en in zip(sources, targets, strict=True):
            assert de.split()[-1] == en.split()[-1] and de.startswith("Deutscher")
    # Deterministic: the same split every time, whatever the training seed.
    cfg = data_config(dataset="tatoeba", path=str(archive), valid_size=5, test_size=7)
    assert load_corpus(cfg, "test") == parts["test"]
    en, de = load_corpus(data_config(dataset="tatoeba", path=str(archive), valid_size=5,
                                     test_size=7, source_lang="en", target_lang="de"), "test")
    assert (de, en) == parts["test"]


def test_tatoeba_errors(tmp_path):
    bad = write(tmp_path / "deu.txt", [TATOEBA[0], "no tab on this line"])
    with pytest.raises(DataError, match=r"deu.txt: line 2 is not"):
        corpora.read_tatoeba(bad)
    tiny = write(tmp_path / "tiny.txt", TATOEBA[:3])
    with pytest.raises(DataError, match="3 pairs cannot hold"):
        load_corpus(data_config(dataset="tatoeba", path=str(tiny), valid_size=2, test_size=1),
                    "train")
    with pytest.raises(DataError, match="must be 'en'"):
        load_corpus(data_config(dataset="tatoeba", path=str(bad), source_lang="de",
                                target_lang="fr"), "train")


# --- text ------------------------------------------------------------------


def text_config(tmp_path: Path, src: list[str], tgt: list[str], compress=False):
    suffix = ".gz" if compress else ""
    paths = {}
    for split in corpora.SPLITS:
        paths[f"{split}_source"] = str(write(tmp_path / f"{split}.de{suffix}", src, compress))
        paths[f"{split}_target"] = str(write(tmp_path / f"{split}.en{suffix}", tgt, compress))
    return data_config(dataset="text", **paths)


@pytest.mark.parametrize("compress", [False, True])
def test_text_loader_plain_and_gzip(tmp_path, compress):
    src = ["ein Hund", "", "eine Katze  ", "zwei\u2028Zeilen"]
    tgt = ["a dog", "nothing", "", "two\u2028lines"]
    cfg = text_config(tmp_path, src, tgt, compress)
    # Eval keeps every line (empty ones too); "\u2028" is not a line break.
    assert load_corpus(cfg, "test") == (["ein Hund", "", "eine Katze", "zwei\u2028Zeilen"],
                                        ["a dog", "nothing", "", "two\u2028lines"])
    # Training drops pairs with an empty side.
    assert load_corpus(cfg, "train") == (["ein Hund", "zwei\u2028Zeilen"],
                                         ["a dog", "two\u2028lines"])


def test_crlf_bom_and_missing_final_newline():
    assert corpora.decode_lines(b"\xef\xbb\xbfa\r\nb\r\nc", "f") == ["a", "b", "c"]
    assert corpora.decode_lines(b"", "f") == []
    assert corpora.decode_lines(b"\n", "f") == [""]


def test_mismatched_line_counts_names_both_files(tmp_path):
    cfg = text_config(tmp_path, ["a", "b", "c"], ["x", "y"])
    with pytest.raises(DataError) as info:
        load_corpus(cfg, "valid")
    message = str(info.value)
    assert cfg.valid_source in message and cfg.valid_target in message
    assert "3" in message and "2" in message and "\n" not in message


def test_empty_corpus_names_file(tmp_path):
    cfg = text_config(tmp_path, ["a"], ["x"])
    write(Path(cfg.test_target), [])
    with pytest.raises(DataError, match=f"empty corpus: {cfg.test_target}$"):
        load_corpus(cfg, "test")
    write(Path(cfg.train_target), [""])  # one blank line is empty too
    with pytest.raises(DataError, match="empty corpus"):
        load_corpus(cfg, "train")


def test_invalid_utf8_names_file_and_line(tmp_path):
    cfg = text_config(tmp_path, ["a", "b", "c"], ["x", "y", "z"])
    Path(cfg.valid_source).write_bytes(b"a\nb\nc \xff\xfe d\n")
    with pytest.raises(DataError, match=f"{cfg.valid_source}: invalid UTF-8 on line 3"):
        load_corpus(cfg, "valid")
    gz = write(tmp_path / "bad.gz", ["ok"], compress=True)
    gz.write_bytes(gzip.compress(b"ok\n\xc3\n"))
    with pytest.raises(DataError, match="bad.gz: invalid UTF-8 on line 2"):
        corpora.read_lines(gz)


def test_missing_file_unknown_dataset_and_unset_paths(tmp_path):
    cfg = text_config(tmp_path, ["a"], ["x"])
    cfg.test_source = str(tmp_path / "nope.de")
    with pytest.raises(DataError, match="file not found: .*nope.de"):
        load_corpus(cfg, "test")
    with pytest.raises(DataError, match="unknown dataset 'wmt' .known: multi30k, tatoeba, text, hf"):
        load_corpus(data_config(dataset="wmt"), "train")
    with pytest.raises(DataError, match="data.valid_source is not set"):
        load_corpus(data_config(dataset="text"), "valid")
    with pytest.raises(DataError, match="unknown split"):
        load_corpus(data_config(), "dev")
    assert issubclass(DataError, UserError) and issubclass(DataError, ValueError)


# --- Hugging Face datasets (local files through the same load_dataset call) ---


def test_hf_loader_with_local_json(tmp_path):
    files = {}
    for split, n in (("train", 6), ("validation", 3), ("test", 2)):
        path = tmp_path / f"{split}.jsonl"
        rows = [{"translation": {"de": f"{split} Satz {i}", "en": f"{split} sentence {i}"}}
                for i in range(n)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        files[split] = path
    spec = ",".join(f"{split}={path}" for split, path in files.items())
    cfg = data_config(dataset="hf", hf_name="json", hf_data_files=spec,
                      hf_cache_dir=str(tmp_path / "cache"))
    sources, targets = load_corpus(cfg, "valid")
    assert sources == [f"validation Satz {i}" for i in range(3)]
    assert targets == [f"validation sentence {i}" for i in range(3)]
    assert len(load_corpus(cfg, "train")[0]) == 6
    cfg.source_lang, cfg.target_lang = "en", "de"
    assert load_corpus(cfg, "test") == ([f"test sentence {i}" for i in range(2)],
                                        [f"test Satz {i}" for i in range(2)])
    cfg.target_lang = "fr"
    with pytest.raises(DataError, match="not 'en' and 'fr'"):
        load_corpus(cfg, "test")
    cfg.hf_data_files = f"train={files['train']}"
    with pytest.raises(DataError, match="cannot load Hugging Face dataset json split 'test'"):
        load_corpus(cfg, "test")


def test_translation_pairs_flat_columns():
    rows = {"de": ["a", None], "en": ["b", "c"], "id": [0, 1]}
    assert corpora.translation_pairs(rows, "de", "en", "x") == (["a", ""], ["b", "c"])
    assert corpora.parse_hf_data_files("") is None
    assert corpora.parse_hf_data_files("a.jsonl") == "a.jsonl"
    with pytest.raises(DataError):
        corpora.parse_hf_data_files("train=a,=b")


# --- tokenizer -------------------------------------------------------------


@pytest.fixture(scope="module")
def small_corpus():
    cfg = data_config(max_train_sentences=1500)
    return load_corpus(cfg, "train")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, small_corpus):
    directory = tmp_path_factory.mktemp("work") / "tokenizer"
    tokenizer.load_or_train_tokenizer(directory, data_config(vocab_size=300),
                                      lambda: small_corpus)
    return directory


def test_tokenizer_special_ids_and_conventions(tok_dir):
    tok = Tokenizer.load(tok_dir)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.joint and tok.vocab_size == 300
    assert tok.source_pieces([0, 1, 2, 3]) == ["", "<unk>", "<s>", "</s>"]
    src = tok.encode_source(["Ein Hund läuft.", ""])
    assert src[0][-1] == EOS_ID and BOS_ID not in src[0] and src[1] == [EOS_ID]
    tgt = tok.encode_target(["A dog runs."])[0]
    assert all(i > EOS_ID for i in tgt)
    assert "".join(tok.target_pieces(tgt)).replace("\u2581", " ").strip() == "A dog runs."


def test_tokenizer_round_trip_and_decode_stops_at_eos(tok_dir, small_corpus):
    tok = Tokenizer.load(tok_dir)
    texts = small_corpus[1][:50]
    ids = tok.encode_target(texts)
    assert tok.decode_target(ids) == texts
    padded = [[BOS_ID, *row, EOS_ID, *row, PAD_ID, PAD_ID] for row in ids]
    assert tok.decode_target(padded) == texts
    assert tok.decode_target(np.array([[BOS_ID, EOS_ID, 50]])) == [""]


def test_tokenizer_trained_once_then_reused(tok_dir, small_corpus, monkeypatch):
    model = tok_dir / "spm.model"
    before = model.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(tokenizer, "train_model", no_training)
    tok = tokenizer.load_or_train_tokenizer(tok_dir, data_config(vocab_size=300),
                                            lambda: small_corpus)
    assert model.stat().st_mtime_ns == before and tok.vocab_size == 300
    assert not [p for p in tok_dir.parent.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(DataError, match="vocab_size: 300 -> 400"):
        tokenizer.load_or_train_tokenizer(tok_dir, data_config(vocab_size=400),
                                          lambda: small_corpus)


def test_tokenizer_deterministic_separate_and_too_large(tmp_path, small_corpus, tok_dir):
    sources, targets = small_corpus
    again = tokenizer.load_or_train_tokenizer(tmp_path / "a", data_config(vocab_size=300),
                                              lambda: small_corpus)
    assert (tmp_path / "a/spm.model").read_bytes() == (tok_dir / "spm.model").read_bytes()
    assert again.encode_source(sources[:5]) == Tokenizer.load(tok_dir).encode_source(sources[:5])
    separate = tokenizer.load_or_train_tokenizer(
        tmp_path / "b", data_config(vocab_size=200, joint_vocab=False), lambda: small_corpus)
    assert not separate.joint
    assert (tmp_path / "b/spm_src.model").is_file() and (tmp_path / "b/spm_tgt.model").is_file()
    assert separate.source_vocab_size == separate.target_vocab_size == 200
    with pytest.raises(DataError, match="data.vocab_size=100000 is too large"):
        tokenizer.load_or_train_tokenizer(tmp_path / "c", data_config(vocab_size=100_000),
                                          lambda: (sources[:50], targets[:50]))
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".tokenizer-tmp-*"))


def test_tokenizer_case_folding_and_older_meta(tmp_path, small_corpus, tok_dir):
    """nmt_nfkc_cf: one id sequence for any casing, lowercase output, words kept apart; a
    tokenizer folder from before the key loads as the default rule, which does not fold."""
    folded = tokenizer.load_or_train_tokenizer(
        tmp_path / "cf", data_config(vocab_size=300, spm_normalization="nmt_nfkc_cf"),
        lambda: small_corpus)
    assert folded.encode_source(["Ein HUND läuft."]) == folded.encode_source(["ein hund läuft."])
    assert folded.decode_target(folded.encode_target(["A Dog RUNS."])) == ["a dog runs."]
    pieces = folded.target_pieces(folded.encode_target(["A Dog RUNS."])[0])
    assert sum(p.startswith("\u2581") for p in pieces) == 3  # three words, as given
    assert json.loads((tmp_path / "cf/tokenizer.json").read_text())["normalization"] == \
        "nmt_nfkc_cf"
    cased = Tokenizer.load(tok_dir)
    assert cased.encode_source(["Hund"]) != cased.encode_source(["hund"])
    older = tmp_path / "older"
    older.mkdir()
    for path in tok_dir.iterdir():
        (older / path.name).write_bytes(path.read_bytes())
    meta = json.loads((older / "tokenizer.json").read_text())
    del meta["normalization"]
    (older / "tokenizer.json").write_text(json.dumps(meta))
    tokenizer.load_or_train_tokenizer(older, data_config(vocab_size=300), lambda: small_corpus)
    older_config = ml_collections.ConfigDict(data_config(vocab_size=300).to_dict())
    del older_config["spm_normalization"]  # a config.json from before the key
    assert tokenizer.tokenizer_meta(older_config) == meta | {"normalization": "nmt_nfkc"}
    with pytest.raises(DataError, match="normalization: 'nmt_nfkc' -> 'nmt_nfkc_cf'"):
        tokenizer.load_or_train_tokenizer(
            older, data_config(vocab_size=300, spm_normalization="nmt_nfkc_cf"),
            lambda: small_corpus)
    with pytest.raises(DataError, match="data.spm_normalization must be one of"):
        tokenizer.train_model(small_corpus[0][:100], 100, normalization="nfc")


def test_encode_for_training_drop_and_truncate(tok_dir):
    tok = Tokenizer.load(tok_dir)
    long = " ".join(["Hund"] * 40)
    src, tgt, dropped = tokenizer.encode_for_training(tok, ["Hund", long], ["dog", "dog"], 16)
    assert dropped == 1 and len(src) == 1 and src[0][-1] == EOS_ID
    src, tgt, dropped = tokenizer.encode_for_training(tok, ["Hund", long], [long, "dog"], 16,
                                                      long_pairs="truncate")
    assert dropped == 0 and max(map(len, src)) == 16 and src[1][-1] == EOS_ID
    assert max(len(t) + 1 for t in tgt) == 16


# --- batching --------------------------------------------------------------


def synthetic_pairs(n: int = 400, max_len: int = 60, seed: int = 1):
    """Pairs whose first token (10 + i) identifies them."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for i in range(n):
        s, t = rng.integers(1, max_len, size=2)
        sources.append([10 + i] + [5] * (s - 1) + [EOS_ID])
        targets.append([10 + i] + [6] * (t - 1))
    return sources, targets


def test_train_batches_shapes_budget_and_coverage():
    sources, targets = synthetic_pairs()
    batcher = batching.TrainBatcher(sources, targets, batch_tokens=512, max_length=64,
                                    batch_multiple=4, seed=3)
    shapes = set(batcher.shapes())
    seen = []
    for i in range(batcher.num_batches):
        batch = batcher.batch(epoch=0, index=i)
        b, s = batch["src"].shape
        assert batch["tgt_in"].shape == batch["tgt_out"].shape == (b, s)
        assert (b, s) in shapes and b * s <= 512 and b % 4 == 0 and s % 8 == 0
        real = batch["src"][:, 0] != PAD_ID
        for key in ("src", "tgt_in", "tgt_out"):  # padding rows hold no token at all
            assert not batch[key][~real].any() and batch[key].dtype == np.int32
        assert batch["num_tokens"] == int((batch["tgt_out"] != PAD_ID).sum())
        for row in batch["src"][real]:
            pair = sources[row[0] - 10]
            assert list(row[:len(pair)]) == pair and not row[len(pair):].any()
        for row_in, row_out in zip(batch["tgt_in"][real], batch["tgt_out"][real], strict=True):
            n = len(targets[row_in[1] - 10])
            assert row_in[0] == BOS_ID and row_out[n] == EOS_ID
            assert list(row_in[1:n + 1]) == list(row_out[:n]) == targets[row_in[1] - 10]
        seen.extend(batch["src"][real][:, 0] - 10)
    assert sorted(seen) == list(range(len(sources)))  # every pair exactly once


def test_train_batches_deterministic_and_resumable():
    sources, targets = synthetic_pairs(200)

    def make(seed):
        return batching.TrainBatcher(sources, targets, batch_tokens=256, max_length=64,
                                     batch_multiple=2, seed=seed)

    a, b = make(7), make(7)
    n = a.num_batches
    first = [(e, i, x["src"].copy()) for e, i, x in itertools.islice(a.iterate(), 2 * n + 5)]
    assert [(e, i) for e, i, _ in first[:3]] == [(0, 0), (0, 1), (0, 2)]
    assert first[n][:2] == (1, 0) and first[2 * n][:2] == (2, 0)
    for cut in (1, n - 1, n, n + 3):  # resume mid-epoch and at epoch boundaries
        epoch, index = a.position(cut)
        resumed = list(itertools.islice(b.iterate(epoch, index), len(first) - cut))
        for (e1, i1, x1), (e2, i2, x2) in zip(first[cut:], resumed, strict=True):
            assert (e1, i1) == (e2, i2) and np.array_equal(x1, x2["src"])
    order = [tuple(rows) for _, rows in a.epoch_plan(0)]
    assert order != [tuple(rows) for _, rows in a.epoch_plan(1)]
    # Batches are recomposed each epoch, not just visited in another order.
    assert ({frozenset(rows) for _, rows in a.epoch_plan(0)}
            != {frozenset(rows) for _, rows in a.epoch_plan(1)})
    assert order != [tuple(rows) for _, rows in make(8).epoch_plan(0)]


def test_train_batcher_errors_and_explicit_boundaries():
    sources, targets = synthetic_pairs(50)
    with pytest.raises(UserError, match="batch_tokens=100 cannot hold 2 row"):
        batching.TrainBatcher(sources, targets, batch_tokens=100, max_length=64,
                              batch_multiple=2)
    with pytest.raises(UserError, match="largest bucket"):
        batching.TrainBatcher(sources, targets, batch_tokens=4096, max_length=32)
    batcher = batching.TrainBatcher(sources, targets, batch_tokens=1024, max_length=64,
                                    boundaries=[16, 64])
    assert {length for _, length in batcher.shapes()} <= {16, 64}
    assert batching.bucket_boundaries(20, 8) == [8, 16, 24]


def test_length_groups_cut_at_half_the_longest_and_at_a_cost():
    lengths = [10, 4, 6, 9, 5, 30, 2]
    assert batching.length_groups(lengths, 8) == [[5], [0, 3, 2], [4, 1], [6]]
    assert batching.length_groups(lengths, 2) == [[5], [0, 3], [2, 4], [1], [6]]
    # cost(longest, rows) = rows * longest: at most 20 -> two rows of 10, one of 30
    assert batching.length_groups(lengths, 8, cost=lambda longest, rows: rows * longest,
                                  max_cost=20) == [[5], [0, 3], [2, 4, 1], [6]]


def test_eval_batches_keep_every_sentence_and_restore_order():
    sources = [[5, EOS_ID], [EOS_ID], [7] * 300 + [EOS_ID], [8, 9, EOS_ID], [EOS_ID]]
    targets = [[5], [], [7] * 250, [8], [9] * 3]
    seen, outputs, index_batches = [], [], []
    for batch, indices in batching.eval_batches(sources, targets, batch_size=3,
                                                batch_multiple=2):
        b, s = batch["src"].shape
        assert b in (2, 4) and s % 8 == 0 and batch["tgt_in"].shape[0] == b
        assert len(indices) == b and not batch["src"][indices < 0].any()
        for row, i in zip(batch["src"], indices, strict=True):
            if i >= 0:
                assert list(row[:len(sources[i])]) == sources[i]  # never truncated
        seen.extend(int(i) for i in indices if i >= 0)
        outputs.append([f"hyp{i}" for i in indices])
        index_batches.append(indices)
    assert sorted(seen) == list(range(5))
    assert batching.restore_order(outputs, index_batches, 5) == [f"hyp{i}" for i in range(5)]
    source_only = list(batching.eval_batches(sources, batch_size=8))
    assert all(set(batch) == {"src"} for batch, _ in source_only)
    # The 301-token line decodes alone: shorter lines never wait for its budget.
    assert [sorted(int(i) for i in idx if i >= 0) for _, idx in source_only] == [[2], [0, 3], [1, 4]]
    with pytest.raises(ValueError, match="1 of 6 sentences have no result"):
        batching.restore_order(outputs, index_batches, 6)


def test_padding_fraction_and_prefetch():
    batch = batching.make_batch([[4, EOS_ID]], [[4]], [0], batch_size=2, src_len=4, tgt_len=4)
    # src: 2 of 8 slots used, tgt_out: 2 of 8 -> 12 of 16 are padding.
    assert batching.padding_fraction([batch]) == pytest.approx(0.75)
    assert list(batching.prefetch(iter(range(10)), size=2)) == list(range(10))

    def broken():
        yield 1
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        list(batching.prefetch(broken()))
    stream = batching.prefetch(itertools.count(), size=1)
    assert next(stream) == 0
    stream.close()  # stops the producer thread instead of blocking forever
