"""The encode-once data cache (data/cache.py) and streaming reads (data/streaming.py)."""

import gzip
import json

import ml_collections
import numpy as np
import pytest

from configs import base
from data import cache as data_cache
from data import corpora, streaming, tokenizer
from data.batching import TokenArray, TrainBatcher
from data.cache import DataCache
from data.corpora import DataError


def text_config(tmp_path, n=1500, **overrides) -> ml_collections.ConfigDict:
    """A `text` dataset of the first n Multi30k pairs (gzip source, plain target), with
    a blank pair to drop."""
    sources, targets = corpora.load_corpus(base.get_config().data, "train")
    sources, targets = sources[:n], targets[:n]
    sources[3] = ""
    with gzip.open(tmp_path / "train.de.gz", "wt", encoding="utf-8") as f:
        f.write("\ufeff" + "\n".join(sources) + "\n")
    (tmp_path / "train.en").write_text("\n".join(targets) + "\n", encoding="utf-8")
    cfg = base.get_config().data
    cfg.update(dataset="text", train_source=str(tmp_path / "train.de.gz"),
               train_target=str(tmp_path / "train.en"), vocab_size=200, max_length=24,
               cache_dir=str(tmp_path / "cache"), **overrides)
    return cfg


def build(cfg, workdir):
    """What train.py does: (cache, corpus scan, tokenizer, source ids, target ids, dropped)."""
    source = streaming.training_source(cfg)
    cache = DataCache(cfg.cache_dir)
    corpus = cache.scan(source)
    tok = cache.tokenizer(workdir / "tokenizer", cfg, source, corpus)
    src, tgt, dropped = cache.encoded(source, corpus, tok, workdir / "tokenizer",
                                      cfg.max_length, cfg.long_pairs)
    return cache, corpus, tok, src, tgt, dropped


def entries(cfg):
    return sorted(p.name for p in (DataCache(cfg.cache_dir).folder / "encoded").iterdir()
                   if not p.name.startswith("."))


def test_streamed_split_equals_load_corpus_and_its_fingerprint(tmp_path):
    cfg = text_config(tmp_path, max_train_sentences=1234)
    sources, targets = corpora.load_corpus(cfg, "train")
    source = streaming.training_source(cfg)
    chunks = list(source.chunks(100))
    assert all(len(s) <= 100 for s, _ in chunks)
    assert ([x for s, _ in chunks for x in s], [x for _, t in chunks for x in t]) == (
        sources, targets)
    assert len(sources) == 1234 and "" not in sources
    assert streaming.scan(source) == streaming.Scan(
        1234, corpora.corpus_fingerprint(sources, targets))


@pytest.mark.parametrize("joint", [True, False])
def test_streamed_tokenizer_sample_is_the_full_list_sample(tmp_path, joint):
    cfg = text_config(tmp_path)
    sources, targets = corpora.load_corpus(cfg, "train")
    source = streaming.training_source(cfg)
    pools = [sources + targets] if joint else [sources, targets]
    for max_sentences in (500, 10_000):  # sampled, and all of it
        got = streaming.sample_for_tokenizer(source, len(sources), joint, max_sentences, 0)
        for pool, lines in zip(pools, got, strict=True):
            keep = tokenizer.sample_indices(len(pool), max_sentences, 0)
            assert lines == (pool if keep is None else [pool[i] for i in keep])
    # Hence the cached tokenizer is byte-identical to one trained on the whole lists.
    cfg.joint_vocab, cfg.spm_max_sentences = joint, 500
    build(cfg, tmp_path / "run")
    tokenizer.load_or_train_tokenizer(tmp_path / "lists", cfg, lambda: (sources, targets))
    for model in (tmp_path / "lists").glob("*.model"):
        assert (tmp_path / "run/tokenizer" / model.name).read_bytes() == model.read_bytes()


def test_cache_holds_the_pairs_and_gives_the_same_batches_as_lists(tmp_path):
    cfg = text_config(tmp_path)
    _, corpus, tok, src, tgt, dropped = build(cfg, tmp_path / "run")
    sources, targets = corpora.load_corpus(cfg, "train")
    src_lists, tgt_lists, dropped_lists = tokenizer.encode_for_training(
        tok, sources, targets, cfg.max_length, cfg.long_pairs)
    assert dropped == dropped_lists > 0 and corpus.pairs == len(sources)
    assert isinstance(src.ids, np.memmap) and src.ids.dtype == np.uint16
    assert [list(src[i]) for i in range(len(src))] == src_lists
    assert [list(tgt[i]) for i in range(len(tgt))] == tgt_lists
    mapped = TrainBatcher(src, tgt, 512, cfg.max_length, seed=3)
    listed = TrainBatcher(src_lists, tgt_lists, 512, cfg.max_length, seed=3)
    for epoch in (0, 1):
        for index in range(listed.num_batches):
            a, b = mapped.batch(epoch, index), listed.batch(epoch, index)
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def test_warm_start_reads_no_corpus_and_encodes_nothing(tmp_path, monkeypatch):
    cfg = text_config(tmp_path)
    _, corpus, _, src, tgt, _ = build(cfg, tmp_path / "first")

    def fail(*args, **kwargs):
        raise AssertionError("the corpus was read, a tokenizer trained or text encoded")

    monkeypatch.setattr(streaming, "iter_lines", fail)
    monkeypatch.setattr(tokenizer, "train_model", fail)
    monkeypatch.setattr(data_cache, "encode_for_training", fail)
    for workdir in ("first", "second"):  # a resume, then a new run on the same data
        _, again, _, src2, tgt2, _ = build(cfg, tmp_path / workdir)
        assert again == corpus
        np.testing.assert_array_equal(src2.ids, src.ids)
        np.testing.assert_array_equal(tgt2.offsets, tgt.offsets)
    assert ((tmp_path / "second/tokenizer/spm.model").read_bytes()
            == (tmp_path / "first/tokenizer/spm.model").read_bytes())
    assert len(entries(cfg)) == 1


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "drop the manifest",
                                    "other data in the manifest"])
def test_damaged_entry_is_detected_and_rebuilt(tmp_path, capsys, damage):
    cfg = text_config(tmp_path, n=400)
    *_, src, tgt, _ = build(cfg, tmp_path / "run")
    expected = (np.array(src.ids), np.array(tgt.ids))
    entry = DataCache(cfg.cache_dir).folder / "encoded" / entries(cfg)[0]
    del src, tgt
    if damage == "flip a byte":
        data = bytearray((entry / "target.bin").read_bytes())
        data[7] ^= 1
        (entry / "target.bin").write_bytes(bytes(data))
    elif damage == "truncate":
        (entry / "source.offsets.npy").write_bytes((entry / "source.offsets.npy").read_bytes()[:-8])
    elif damage == "drop the manifest":
        (entry / "manifest.json").unlink()
    else:
        manifest = json.loads((entry / "manifest.json").read_text())
        manifest["max_length"] = 99
        (entry / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    *_, src, tgt, _ = build(cfg, tmp_path / "run")
    assert "encoding again" in capsys.readouterr().err
    np.testing.assert_array_equal(src.ids, expected[0])
    np.testing.assert_array_equal(tgt.ids, expected[1])


def test_changed_corpus_or_settings_get_their_own_entry(tmp_path):
    cfg = text_config(tmp_path, n=300)
    _, corpus, *_ = build(cfg, tmp_path / "a")
    (tmp_path / "train.en").write_text("changed\n" + (tmp_path / "train.en").read_text()
                                       .split("\n", 1)[1], encoding="utf-8")
    _, changed, *_ = build(cfg, tmp_path / "b")
    assert changed.data_sha256 != corpus.data_sha256
    cfg.max_length = 32
    build(cfg, tmp_path / "b")
    assert len(entries(cfg)) == 3


def test_truncate_mode_and_errors(tmp_path):
    cfg = text_config(tmp_path, n=300, long_pairs="truncate")
    *_, src, tgt, dropped = build(cfg, tmp_path / "run")
    assert dropped == 0 and src.lengths.max() <= cfg.max_length
    assert tgt.lengths.max() <= cfg.max_length - 1 and len(src) == 299
    (tmp_path / "short.en").write_text("a\nb\n")
    cfg.train_target = str(tmp_path / "short.en")
    with pytest.raises(DataError, match="mismatched line counts: .*train.de.gz has 300 lines, "
                                        ".*short.en has 2"):
        streaming.scan(streaming.training_source(cfg))
    (tmp_path / "blank.en").write_text("\n" * 300)
    cfg.train_target = str(tmp_path / "blank.en")
    with pytest.raises(DataError, match="empty corpus"):
        streaming.scan(streaming.training_source(cfg))


def test_hub_path_streams_through_datasets_into_the_same_cache(tmp_path):
    cfg = text_config(tmp_path, n=300)
    sources, targets = corpora.load_corpus(cfg, "train")
    rows = [{"translation": {"de": s, "en": t}} for s, t in zip(sources, targets, strict=True)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hub = text_config(tmp_path, n=300)
    hub.update(dataset="hf", hf_name="json", hf_data_files=f"train={tmp_path / 'train.jsonl'}",
               hf_cache_dir=str(tmp_path / "hf"))
    source = streaming.training_source(hub)
    assert streaming.scan(source) == streaming.scan(streaming.training_source(cfg))
    *_, src, _, _ = build(hub, tmp_path / "hub")
    *_, src_text, _, _ = build(cfg, tmp_path / "text")
    np.testing.assert_array_equal(src.ids, src_text.ids)
    assert len(entries(cfg)) == 1  # same pairs, same tokenizer: one entry for both


def test_token_array_from_lists():
    array = TokenArray.from_lists([[5, 6, 3], [], [7, 3]])
    assert len(array) == 3 and list(array.lengths) == [3, 0, 2]
    assert list(array[0]) == [5, 6, 3] and list(array[1]) == [] and list(array[2]) == [7, 3]
    with pytest.raises(ValueError, match="do not index"):
        TokenArray(np.zeros(3, np.int32), np.array([0, 2]))


def test_a_build_cut_off_by_a_kill_leaves_nothing_behind(tmp_path):
    cfg = text_config(tmp_path, n=200)
    leftover = DataCache(cfg.cache_dir).folder / "encoded" / ".0123abcd.k1ll3d_x.tmp"
    (leftover / "source.bin").parent.mkdir(parents=True)
    (leftover / "source.bin").write_bytes(b"\0" * 64)  # a kill mid-build: no lock holds it
    build(cfg, tmp_path / "run")
    assert not leftover.exists() and len(entries(cfg)) == 1
