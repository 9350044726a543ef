"""An outside aligner's links as the alignment student's teacher (alignment.teacher_links):
Moses tokens folded onto whitespace words, word links mapped onto pieces by hand,
the batches' link matrices, the teachers the loss builds from them, the loss taught by
them, and the refusals."""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from alignment import teacher_links as tl
from alignment.student import link_teachers, student_cross_entropy
from common.errors import UserError
from data.batching import TokenArray, TrainBatcher
from data.tokenizer import EOS_ID, PAD_ID
from tests.test_alignment_head import align_loss, aligner, small_config, toy_batch
from tests.test_alignment_reverse import PAIRS, reverse_model

# A made-up vocabulary: ids 0-3 the specials, then pieces ("▁" opens a word).
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "\u2581a", "b", "\u2581c", "\u2581d", "e"]
OPENS = tl.piece_word_index(PIECES)


def test_moses_tokens_fold_onto_the_whitespace_words_that_hold_them():
    assert tl.token_words("Ein Hund.", ["ein", "hund", "."]) == [0, 1, 1]
    assert tl.token_words("Er sagt: \"Ja!\"", ["er", "sagt", ":", '"', "ja", "!", '"']) == \
        [0, 1, 1, 2, 2, 2, 2]
    # A token the line does not spell stays with the word before it.
    assert tl.token_words("it's fine", ["it", "&apos;s", "fine"]) == [0, 0, 1]
    assert tl.token_words("  zwei   Hunde ", ["zwei", "hunde"]) == [0, 1]


def test_word_links_are_mapped_onto_every_piece_of_the_linked_words():
    # Source "▁a b ▁c </s>" (words 0 0 1), target "▁d e ▁a" (words 0 0 1).
    src, tgt = TokenArray.from_lists([[4, 5, 6, EOS_ID]]), TokenArray.from_lists([[7, 8, 4]])
    entry = tl.piece_links(src, tgt, [[(0, 1), (1, 0)]], OPENS, OPENS)[0]
    pairs = sorted(zip(entry[0::2].tolist(), entry[1::2].tolist(), strict=True))
    assert pairs == [(0, 2), (1, 2), (2, 0), (2, 1)]  # (target piece, source piece)
    assert len(tl.piece_links(src, tgt, [[]], OPENS, OPENS)[0]) == 0


def test_links_naming_a_word_the_pair_lacks_are_refused_with_the_line():
    src, tgt = TokenArray.from_lists([[4, EOS_ID], [4, 6, EOS_ID]]), \
        TokenArray.from_lists([[7], [7, 4]])
    with pytest.raises(UserError, match="line 2: link 2-0 but the pair has 2 source"):
        tl.piece_links(src, tgt, [[(0, 0)], [(2, 0)]], OPENS, OPENS)


def test_repeated_pairs_are_aligned_once_and_links_fold_onto_words(monkeypatch):
    seen = []

    def fake_eflomal(source, target, folder):  # token k of one side with token k of the other
        seen.append(list(source))
        diagonal = [[(k, k) for k in range(min(len(s.split()), len(t.split())))]
                    for s, t in zip(source, target, strict=True)]
        return diagonal, diagonal

    monkeypatch.setattr(tl, "eflomal_links", fake_eflomal)
    sources = ["Ein Hund.", "Zwei Katzen", "Ein Hund."]
    targets = ["A dog .", "Two cats", "A dog ."]
    links = tl.word_links(sources, targets, "de", "en")
    assert seen == [["ein hund .", "zwei katzen"]]  # Moses-tokenized, lowercased, once each
    # "." is token 2 of both sides: German word 1 ("Hund."), English word 2.
    assert links == [[(0, 0), (1, 1), (1, 2)], [(0, 0), (1, 1)], [(0, 0), (1, 1), (1, 2)]]


def test_the_batches_carry_each_rows_link_matrix():
    src = [[4, 5, 6, EOS_ID], [6, EOS_ID]]
    tgt = [[7, 8, 4], [4]]
    links = tl.piece_links(TokenArray.from_lists(src), TokenArray.from_lists(tgt),
                           [[(0, 1), (1, 0)], [(0, 0)]], OPENS, OPENS)
    batcher = TrainBatcher(src, tgt, batch_tokens=64, max_length=8,
                           fields={"teacher_links": tl.links_field(links)})
    seen = 0
    for index in range(batcher.num_batches):
        length, rows = batcher.epoch_plan(0)[index]
        batch = batcher.batch(0, index)
        assert batch["teacher_links"].shape == (len(batch["src"]), length, length)
        for r, pair in enumerate(rows):
            want = np.zeros((length, length), np.uint8)
            entry = links[pair]
            want[entry[0::2], entry[1::2]] = 1
            np.testing.assert_array_equal(batch["teacher_links"][r], want)
            seen += 1
    assert seen == 2
    assert "teacher_links" not in TrainBatcher(src, tgt, batch_tokens=64, max_length=8).batch(0, 0)


def test_link_teachers_spread_each_row_over_its_links_or_put_it_on_null():
    src = jnp.array([[5, 6, 7, EOS_ID, PAD_ID]])
    tgt_out = jnp.array([[8, 9, EOS_ID, PAD_ID]])
    links = np.zeros((1, 4, 5), np.uint8)
    links[0, 0, [0, 2]] = 1  # target piece 0 with source pieces 0 and 2
    links[0, 3, 4] = 1  # on padding: ignored
    forward, reverse = (np.asarray(t) for t in link_teachers(jnp.asarray(links), src, tgt_out))
    np.testing.assert_allclose(forward[0, 0], [0.5, 0, 0.5, 0, 0])
    np.testing.assert_allclose(forward[0, 1], [0, 0, 0, 1, 0])  # unlinked: NULL, the </s>
    np.testing.assert_allclose(reverse[0, 0], [1, 0, 0, 0])
    np.testing.assert_allclose(reverse[0, 1], [0, 0, 1, 0])  # source piece 1: the target </s>
    np.testing.assert_allclose(reverse[0, 2], [1, 0, 0, 0])


@pytest.mark.slow  # gradients of the whole aligner, twice: 15-25 s on a cold cache
def test_the_loss_teaches_the_student_the_batchs_links():
    """With "teacher_links" in the batch the student's cross-entropies are taken against
    them, not the heads' agreed posteriors; translation and the heads get the same
    gradient as without the student."""
    batch = toy_batch(PAIRS)
    b, t = batch["tgt_out"].shape
    s = batch["src"].shape[1]
    rng = np.random.default_rng(0)
    batch["teacher_links"] = jnp.asarray(rng.random((b, t, s)) < 0.2, jnp.uint8)
    model = aligner(small_config(dropout=0.0), jumps=True, reverse=True, student=True)
    nnx.update(model, nnx.state(reverse_model()))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, batch):
        return align_loss(nnx.merge(graphdef, p), batch, 0.1)

    # jitted, as training runs it: op by op, a cold compilation cache compiles each operation
    loss_and_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (_, sums), grads = loss_and_grads(params.to_pure_dict(), batch)
    terms = model.forward_with_alignment(batch["src"], batch["tgt_in"], batch["tgt_out"])[3]
    forward, reverse = link_teachers(batch["teacher_links"], batch["src"], batch["tgt_out"])
    real = {k: (batch[k] != PAD_ID) & (batch[k] != EOS_ID) for k in ("src", "tgt_out")}
    want = float(student_cross_entropy(terms["alignment_student_log_posterior"], forward,
                                       real["tgt_out"])
                 + student_cross_entropy(terms["alignment_student_reverse_log_posterior"],
                                         reverse, real["src"]))
    assert float(sums["align_student_sum"]) == pytest.approx(want, rel=1e-5)
    without = dict(batch)
    del without["teacher_links"]
    (_, heads_sums), heads_grads = loss_and_grads(params.to_pure_dict(), without)
    assert float(heads_sums["align_student_sum"]) != pytest.approx(want, rel=1e-3)
    grads.pop("alignment_student")
    heads_grads.pop("alignment_student")
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-7),
                 grads, heads_grads)


def test_teacher_links_refuse_a_run_without_the_student_or_with_resegmentation():
    from configs.align_de_en import get_config
    from training.plugins import active_plugins

    config = get_config()  # the recipe: the student, taught eflomal's links
    assert config.alignment.student and config.alignment.teacher_links
    active_plugins(config)
    config.alignment.student = False
    with pytest.raises(UserError, match="set alignment.student=True"):
        active_plugins(config)
    config.alignment.student = True
    active_plugins(config)
    config.data.spm_sampling_alpha = 0.1
    with pytest.raises(UserError, match="needs data.spm_sampling_alpha=0"):
        active_plugins(config)


def test_train_refuses_a_links_file_of_another_text(tmp_path):
    path = tmp_path / "links.txt"
    path.write_text("0-0\n0-0\n")
    links, sha256 = tl.read_teacher_links(str(path), 2)
    assert links == [[(0, 0)], [(0, 0)]]
    assert sha256 == hashlib.sha256(b"0-0\n0-0\n").hexdigest()
    with pytest.raises(UserError, match="has 2 lines, the training text 1 pairs"):
        tl.read_teacher_links(str(path), 1)
    with pytest.raises(UserError, match="1 training pairs were dropped"):
        tl.teacher_piece_links([[(0, 0)]], None, None, None, 1)
    path.write_text("0-x\n")
    with pytest.raises(UserError, match="not a Pharaoh link"):
        tl.read_teacher_links(str(path), 1)
    with pytest.raises(UserError, match="missing.txt is not a file \\(make it with python -m "
                                        "attention.teacher_links"):
        tl.read_teacher_links(str(tmp_path / "missing.txt"), 1)


def test_the_command_refuses_bad_input_in_one_line(tmp_path):
    from tests.conftest import run_module

    (tmp_path / "a.de").write_text("ein Hund\nzwei\n")
    (tmp_path / "a.en").write_text("a dog\n")
    sides = ["--source", str(tmp_path / "a.de"), "--target", str(tmp_path / "a.en")]
    cases = {
        "a side missing": (sides[:2] + ["--source_lang", "de", "--target_lang", "en"],
                           "--target is required"),
        "line counts": (sides + ["--source_lang", "de", "--target_lang", "en"],
                        "mismatched line counts"),
        "no file": (["--source", str(tmp_path / "none.de"), *sides[2:], "--source_lang", "de",
                     "--target_lang", "en"], "none.de"),
    }
    for name, (argv, message) in cases.items():
        result = run_module("attention.teacher_links", *argv)
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, \
            (name, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert result.stdout == ""


@pytest.mark.slow
def test_training_with_teacher_links_end_to_end(tmp_path):
    """train.py reads alignment.teacher_links, maps them onto the rows and teaches the student
    (its loss is logged); a file of another length is one error line, exit 2."""
    import gzip
    import json
    from pathlib import Path

    from tests.conftest import run_script

    def words(lang: str) -> list[int]:
        with gzip.open(Path("data/multi30k") / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            return [len(next(f).split()) for _ in range(2000)]

    path = tmp_path / "links.txt"
    path.write_text("".join(" ".join(f"{k}-{k}" for k in range(min(a, b))) + "\n"
                            for a, b in zip(words("de"), words("en"), strict=True)))
    args = ["--config", "configs/smoke.py:align", "--config.train.num_steps=4",
            "--config.data.max_length=160", "--config.data.bucket_step=80",  # drop no pair
            "--config.train.log_every_steps=2", "--config.eval.every_steps=100",
            "--config.alignment.jumps=True", "--config.alignment.reverse=True",
            "--config.alignment.student=True", f"--config.alignment.teacher_links={path}"]
    result = run_script("train.py", *args, "--workdir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").open()]
    assert all(r["align_student"] > 0 for r in logged if r["split"] == "train")
    # Other links under the same path: the resume refuses to switch teachers.
    path.write_text(path.read_text().replace("0-0", "1-1", 1))
    saved = sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir())
    result = run_script("train.py", *args, "--config.train.num_steps=6",
                        "--workdir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "error: the teacher_links file differs from the one checkpoint step 4" in result.stderr
    assert sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir()) == saved
    path.write_text("0-0\n")
    result = run_script("train.py", *args, "--workdir", str(tmp_path / "bad"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: alignment.teacher_links: {path} has 1 lines, the training text 2000 pairs"]
    assert not (tmp_path / "bad").exists()
