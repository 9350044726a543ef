"""What choosing from beam search's n-best list does to a run's scores: beam search's own
answer (`top1`) read beside minimum-Bayes-risk selection (evaluation/mbr.py) and, given a
run trained the other way, reranking with its channel score (evaluation/rerank.py).

    python -m evaluation.nbest --workdir W [--split valid] [--checkpoint last --average_last 10]
        [--beam_sizes 5,10,20] [--utilities bleu,chrf] [--length_penalty P]
        [--reverse_workdir R [--reverse_checkpoint last --reverse_average_last 10]
         --weights 0.1,0.3,1.0] --output OUT.json

decodes the split's n-best lists once per beam size and scores each selection as
evaluate.py scores a reading (BLEU, lc-tok BLEU, chrF), with how many sentences it
changed. Writes OUT.json and, beside it, each reading's hypotheses
(`<OUT stem>.beam<K>.<top1|mbr-bleu|mbr-chrf|reverse<weight>>.hyp.txt`) for
`python -m evaluation.significance`. Empty source lines stay empty lines.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError
from evaluation.mbr import UTILITIES, mbr_select


def study(workdir: Path, *, split: str, checkpoint: str | None, average_last: int,
          beam_sizes: list[int], utilities: list[str], length_penalty: float | None,
          batch_size: int | None, max_sentences: int, reverse_workdir: Path | None = None,
          weights: tuple[float, ...] = (), reverse_checkpoint: str = "last",
          reverse_average_last: int = 0) -> tuple[dict, dict[str, list[str]]]:
    """The command's readings: (result, {reading label: hypotheses, one a line}); the
    reverse run read at `reverse_checkpoint`, averaging its `reverse_average_last` newest
    saves as `average_last` does the run's."""
    from configs import resolved
    from data.protocol import protocol_of
    from evaluation.corpus import clean_line
    from evaluation.inputs import read_inputs
    from evaluation.loading import load_params, load_tokenizer
    from evaluation.rerank import channel_scores, check_reverse, rerank_select
    from evaluation.scoring import score
    from models.translate import translate_ids

    cfg = resolved.load_config_json(workdir)
    inputs = read_inputs(cfg, split, None, None, max_sentences)
    tokenizer = load_tokenizer(workdir, cfg)
    reverse = None
    if reverse_workdir is not None:
        reverse_cfg = resolved.load_config_json(reverse_workdir)
        check_reverse(cfg, reverse_cfg, reverse_workdir)
        reverse_tok = load_tokenizer(reverse_workdir, reverse_cfg)
        reverse_run = load_params(reverse_workdir, reverse_checkpoint, reverse_average_last,
                                  cfg=reverse_cfg, tokenizer=reverse_tok)
        reverse = (reverse_run.model, reverse_tok)
    loaded = load_params(workdir, checkpoint, average_last, cfg=cfg, tokenizer=tokenizer)
    alpha = float(cfg.eval.length_penalty) if length_penalty is None else length_penalty
    batch = {"batch_size": batch_size or int(cfg.eval.batch_size),
             "bucket_step": int(cfg.data.bucket_step)}
    protocol = protocol_of(cfg.data)
    todo = [i for i, s in enumerate(inputs.sources) if s]
    sources = [inputs.sources[i] for i in todo]
    readings, hyps = [], {}
    for k in beam_sizes:
        nbest = translate_ids(loaded.model, tokenizer.encode_source(sources), beam_size=k,
                              length_penalty=alpha, nbest=True, **batch)
        texts = [[clean_line(t) for t in tokenizer.decode_target([ids for ids, _ in c])]
                 if c else [] for c in nbest]
        picks = {"top1": [0 if c else -1 for c in texts]}
        picks.update({f"mbr-{u}": mbr_select(texts, u) for u in utilities})
        if reverse is not None:
            direct = [[s for _, s in c] for c in nbest]
            channel = channel_scores(reverse, sources, texts, alpha=alpha, **batch)
            picks.update({f"reverse{w:g}": rerank_select(direct, channel, w) for w in weights})
        for selection, chosen in picks.items():
            lines = [""] * len(inputs.sources)
            for i, candidates, j in zip(todo, texts, chosen, strict=True):
                lines[i] = candidates[j] if j >= 0 else ""
            scores = score(lines, inputs.references, compat_lc_tok=True,
                           target_lang=cfg.data.target_lang, text_protocol=protocol)
            label = f"beam{k}.{selection}"
            hyps[label] = lines
            readings.append({"label": label, "beam_size": k, "selection": selection,
                             "changed": sum(j > 0 for j in chosen),
                             **{key: scores[key] for key in ("bleu", "bleu_lc_tok", "chrf")},
                             # sacreBLEU's lines: precisions, brevity penalty, length ratio
                             **{f"{key}_text": scores[f"{key}_text"]
                                for key in ("bleu", "bleu_lc_tok", "chrf")}})
    result = {"workdir": str(workdir), "split": inputs.split, "text_protocol": protocol,
              "num_sentences": len(inputs.sources), "checkpoint_step": loaded.steps[-1],
              "checkpoint": {"requested": loaded.requested, "steps": loaded.steps},
              "length_penalty": alpha, "readings": readings,
              "signatures": {key: scores[f"{key}_signature"]
                             for key in ("bleu", "bleu_lc_tok", "chrf")}}
    if reverse_workdir is not None:
        result["reverse"] = {"workdir": str(reverse_workdir),
                             "checkpoint_step": reverse_run.steps[-1],
                             "checkpoint": {"requested": reverse_run.requested,
                                            "steps": reverse_run.steps},
                             "weights": list(weights)}
    return result, hyps


def define_flags() -> None:
    """The flags (only when run as a script: importing never adds global flags)."""
    from absl import flags

    flags.DEFINE_string("workdir", None, "The training run.")
    flags.DEFINE_enum("split", "valid", ["valid", "test"], "The split decoded.")
    flags.DEFINE_string("checkpoint", None, "best | last | STEP (as evaluate.py).")
    flags.DEFINE_integer("average_last", 0, "Average the N newest checkpoints (as evaluate.py).")
    flags.DEFINE_list("beam_sizes", ["5", "10", "20"], "n-best sizes, one decoding each.")
    flags.DEFINE_list("utilities", list(UTILITIES), f"MBR utilities, of {UTILITIES} (none: '').")
    flags.DEFINE_string("reverse_workdir", None, "A run trained the other way: reranks "
                        "with its channel score.")
    flags.DEFINE_string("reverse_checkpoint", "last", "The reverse run's checkpoint: best | "
                        "last | STEP.")
    flags.DEFINE_integer("reverse_average_last", 0, "Average the reverse run's N newest "
                         "checkpoints.")
    flags.DEFINE_list("weights", ["0.1", "0.3", "1.0"], "The channel's weights, with "
                      "--reverse_workdir.")
    flags.DEFINE_float("length_penalty", None, "GNMT alpha (default: the config's).")
    flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: the config's).")
    flags.DEFINE_integer("max_sentences", 0, "Only the first N lines (0 = all).")
    flags.DEFINE_string("output", None, "The result (.json); the hypotheses beside it.")


def numbers(flag: str, values: list[str], kind: type, low: float) -> list:
    """The flag's values as numbers of at least `low`; UserError naming the flag otherwise."""
    try:
        parsed = [kind(v) for v in values]
    except ValueError:
        parsed = []
    if not parsed or min(parsed) < low:
        what = "integers" if kind is int else "numbers"
        raise UserError(f"--{flag} {','.join(values)}: {what} of at least {low:g}")
    return parsed


def main(argv: list[str]) -> None:
    """absl main: checks every flag before decoding, then writes the result and texts."""
    from absl import flags
    from absl import logging as absl_logging

    from common import cli
    from common.files import write_atomic

    f = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not f.workdir or not f.output:
        raise UserError("--workdir and --output are required")
    output = Path(f.output)
    if output.suffix != ".json":
        raise UserError(f"--output {output}: must be a .json file")
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: its folder does not exist")
    if any(u not in UTILITIES for u in f.utilities):
        raise UserError(f"--utilities {','.join(f.utilities)}: each one of {', '.join(UTILITIES)}")
    beam_sizes = numbers("beam_sizes", f.beam_sizes, int, 2)
    weights = tuple(numbers("weights", f.weights, float, 0)) if f.reverse_workdir else ()
    if f.length_penalty is not None and f.length_penalty < 0:
        raise UserError(f"--length_penalty must be >= 0, got {f.length_penalty}")
    if not cli.debug_enabled():
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's INFO lines on every restore
    result, hyps = study(Path(f.workdir), split=f.split, checkpoint=f.checkpoint,
                         average_last=f.average_last, beam_sizes=beam_sizes,
                         utilities=list(f.utilities), length_penalty=f.length_penalty,
                         batch_size=f.batch_size, max_sentences=f.max_sentences,
                         reverse_workdir=Path(f.reverse_workdir) if f.reverse_workdir else None,
                         weights=weights, reverse_checkpoint=f.reverse_checkpoint,
                         reverse_average_last=f.reverse_average_last)
    files = {}
    for label, lines in hyps.items():
        path = output.with_name(f"{output.stem}.{label}.hyp.txt")
        write_atomic(path, "".join(line + "\n" for line in lines))
        files[label] = str(path)
    result["files"] = files
    for r in result["readings"]:
        print(f"{r['label']:<20} BLEU {r['bleu']:.2f}  lc-tok {r['bleu_lc_tok']:.2f}  "
              f"chrF {r['chrf']:.2f}  changed {r['changed']}")
    write_atomic(output, json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    from common import cli

    define_flags()
    cli.run(main)
