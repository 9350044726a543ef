"""Sequence-level knowledge distillation as a data option (`data.distilled_targets`,
`data.distilled_mix`): load_corpus and the streamed training split agree, the cache key
follows the teacher's file, a file that does not fit the split is refused, and the vendored
teacher text is the one its reading scored."""

import gzip
import json
from pathlib import Path

import pytest
from conftest import run_script

from configs import base, multi30k_de_en_cpu_kd
from data import corpora, streaming
from data.corpora import DataError
from evaluation.inputs import read_inputs
from evaluation.scoring import metric_for

ROOT = Path(__file__).resolve().parents[1]


def text_config(tmp_path, n=300, **overrides):
    """A `text` dataset of the first n Multi30k pairs with a blank source to drop, and a
    teacher file (gzip, one line per raw pair; one teacher line blank)."""
    sources, targets = corpora.load_corpus(base.get_config().data, "train")
    sources, targets = sources[:n], targets[:n]
    sources[3] = ""
    (tmp_path / "train.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("\n".join(targets) + "\n", encoding="utf-8")
    teacher = [f"teacher {i} {t.lower()}" for i, t in enumerate(targets)]
    teacher[7] = ""
    with gzip.open(tmp_path / "teacher.en.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(teacher) + "\n")
    cfg = base.get_config().data
    cfg.update(dataset="text", train_source=str(tmp_path / "train.de"),
               train_target=str(tmp_path / "train.en"),
               distilled_targets=str(tmp_path / "teacher.en.gz"), **overrides)
    return cfg, sources, targets, teacher


def test_replace_trains_on_the_teachers_targets(tmp_path):
    cfg, sources, _, teacher = text_config(tmp_path)
    got_src, got_tgt = corpora.load_corpus(cfg, "train")
    keep = [i for i in range(len(sources)) if sources[i] and teacher[i]]  # 3 and 7 dropped
    assert len(keep) == len(sources) - 2
    assert (got_src, got_tgt) == ([sources[i] for i in keep], [teacher[i] for i in keep])


def test_add_keeps_each_original_pair_before_its_teachers(tmp_path):
    cfg, sources, targets, teacher = text_config(tmp_path, distilled_mix="add")
    got = list(zip(*corpora.load_corpus(cfg, "train"), strict=True))
    want = [pair for i in range(len(sources))
            for pair in ((sources[i], targets[i]), (sources[i], teacher[i]))
            if pair[0] and pair[1]]
    assert got == want and len(got) == 2 * len(sources) - 3  # pair 3 twice, teacher 7


@pytest.mark.parametrize("mix", ["replace", "add"])
def test_streamed_split_equals_load_corpus(tmp_path, mix):
    cfg, *_ = text_config(tmp_path, distilled_mix=mix, max_train_sentences=250)
    sources, targets = corpora.load_corpus(cfg, "train")
    chunks = list(streaming.training_source(cfg).chunks(64))
    assert ([s for c, _ in chunks for s in c], [t for _, c in chunks for t in c]) == (
        sources, targets)
    assert len(sources) == 250


def test_the_cache_key_follows_the_teachers_file_and_the_mix(tmp_path):
    cfg, *_ = text_config(tmp_path)
    key = streaming.training_source(cfg).key
    plain = cfg.copy_and_resolve_references()
    plain.distilled_targets = ""
    added = cfg.copy_and_resolve_references()
    added.distilled_mix = "add"
    assert len({key, streaming.training_source(plain).key,
                streaming.training_source(added).key}) == 3
    with gzip.open(tmp_path / "teacher.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read()
    with gzip.open(tmp_path / "teacher.en.gz", "wt", encoding="utf-8") as f:
        f.write(lines.replace("teacher 0 ", "teacher zero "))
    assert streaming.training_source(cfg).key != key


@pytest.mark.parametrize("change", [-1, +1])
def test_a_teacher_file_of_another_length_is_refused(tmp_path, change):
    cfg, *_, teacher = text_config(tmp_path)
    lines = teacher[:change] if change < 0 else [*teacher, "one more"]
    (tmp_path / "other.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg.distilled_targets = str(tmp_path / "other.en")
    match = "fewer lines" if change < 0 else "more lines"
    with pytest.raises(DataError, match=match):
        corpora.load_corpus(cfg, "train")
    with pytest.raises(DataError, match=match):
        list(streaming.training_source(cfg).chunks(64))


def test_train_refuses_a_missing_teacher_file_in_one_line_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        f"--config.data.distilled_targets={tmp_path / 'missing.en'}",
                        f"--config.data.cache_dir={tmp_path / 'cache'}", timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: ") and "missing.en" in lines[0]
    assert not workdir.exists()


def test_the_teacher_reads_every_training_pair_as_read(tmp_path):
    """`evaluate.py --split train` translates one line per pair before any filtering (the
    blank source kept), and a file of one line per such pair is the student's data."""
    config = base.get_config()
    config.data, sources, targets, _ = text_config(tmp_path, max_train_sentences=100)
    inputs = read_inputs(config, "train", None, None)
    assert (inputs.sources, inputs.references) == (sources, targets)  # the teacher's not used
    assert inputs.sources[3] == "" and inputs.base == "train"
    (tmp_path / "hyp.txt").write_text("".join(f"h{i}\n" for i in range(len(sources))))
    config.data.distilled_targets = str(tmp_path / "hyp.txt")
    got = corpora.load_corpus(config.data, "train")
    assert got == ([s for s in sources if s][:100], [f"h{i}" for i, s in enumerate(sources)
                                                    if s][:100])


@pytest.mark.parametrize("teacher, reading", [
    (multi30k_de_en_cpu_kd.TEACHER, "multi30k_de_en_cpu_readings/teacher_ens3_train.json"),
    (ROOT / "data/multi30k/distilled/train.en_de_proxy_ens2.de.gz",
     "multi30k_en_de_readings/teacher_proxy_ens2_train.json"),
    (ROOT / "data/multi30k/distilled/train.en_fr_bpe10k_ens3.fr.gz",
     "multi30k_en_fr_readings/teacher_ens3_train.json"),
    (ROOT / "data/multi30k/distilled/train.en_de_ens3.de.gz",
     "multi30k_en_de_readings/teacher_ens3_train.json"),
], ids=["de_en_cpu_ens3", "en_de_proxy_ens2", "en_fr_bpe10k_ens3", "en_de_ens3"])
def test_a_shipped_teacher_text_is_the_one_its_reading_scored(teacher, reading):
    """Each vendored ensemble translation (data/multi30k/distilled/; the De->En one is
    configs/multi30k_de_en_cpu_kd.py's) has one line per training pair of its reading's
    direction and scores against the references the BLEU that reading says (a file swapped,
    cut or shifted by a line would not; its chrF, 70% of the time, would add no check)."""
    reading = json.loads((ROOT / "results" / reading).read_text(encoding="utf-8"))
    plain = base.get_config().data
    plain.update(source_lang=reading["source_lang"], target_lang=reading["target_lang"])
    cfg = plain.copy_and_resolve_references()
    cfg.update(distilled_targets=str(teacher), distilled_mix="replace")
    sources, teacher = corpora.load_corpus(cfg, "train")
    raw_sources, references = corpora.load_corpus(plain, "train")
    assert sources == raw_sources and len(teacher) == 29_000
    bleu, prepare = metric_for("bleu")  # evaluate.py's own metric
    assert reading["num_sentences"] == 29_000
    scored = bleu.corpus_score(prepare(teacher), [prepare(references)]).score
    assert scored == pytest.approx(reading["bleu"], abs=1e-6)
