"""A sweep's plan file (TOML): which variants of which recipes, at which seeds, read how;
scripts/sweep.py runs it, scripts/plans/anchors.toml is one.

    seeds = [0, 1, 2]              # or 3: seeds 0..N-1, trained as `--seeds N`
    time_limit_minutes = 6         # optional: a run's training is stopped (SIGINT, which
                                   # saves) after this long; it is read at its newest
                                   # checkpoint that every seed has
    overrides = { "eval.every_steps" = 0 }   # optional, for every run
    pack = false                   # optional: also hand back each seed's newest checkpoint,
                                   # tokenizer and config (to finish training elsewhere)
    [read]                         # evaluate.py's flags, one evaluation per length penalty
    split = "valid"                # or splits = ["valid", "test"]
    checkpoint = "last"            # best | last | a step
    average_last = 10
    beam_size = 5
    compat_lc_tok = true
    length_penalties = [0.8, 1.0]  # or length_penalty = 1.0
    max_sentences = 0              # optional (0 = all)
    [directions]                   # name = config file
    de_en = "configs/multi30k_de_en.py"
    [[variants]]                   # in priority order: a deadline cuts the last ones
    name = "base"
    directions = ["de_en"]         # optional, default every direction
    overrides = { "train.batch_tokens" = 8192 }    # optional; also time_limit_minutes, pack,
                                   # length_penalties (in place of [read]'s)
    [[variants]]                   # sequence-level distillation (docs/training.md)
    name = "kd"
    teacher = "base"               # an earlier variant: its seeds, one ensemble, translate
                                   # the training split; this variant trains on that text
    overrides = { "data.distilled_mix" = "replace" }  # or "add"
    [distill]                      # optional: the teacher's decoding; checkpoint,
    length_penalty = 1.0           # average_last, beam_size, batch_size default to [read]'s,
                                   # length_penalty to the direction config's
    [nbest]                        # optional, after every run: each seed's n-best lists
    reverse = { de_en = "en_de" }  # (evaluation.nbest), reranked with the channel score of
                                   # the same seed of the same variant trained the other
                                   # way (both runs done here), read at [read]'s checkpoint
                                   # and average_last, on [read]'s first split
    beam_sizes = [5, 20]
    weights = [0.1, 0.3, 1.0]
    utilities = []                 # optional: MBR's utilities too (bleu, chrf)
    length_penalty = 1.25          # optional (default the direction config's)
    variants = ["base"]            # optional (default every variant)

`load_plan` reads and checks it (PlanError: one line saying why), `runs_of` lists its
runs (one variant of one direction each) in order.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

TEACH_KEYS = ("checkpoint", "average_last", "beam_size", "batch_size", "length_penalty")
NBEST_KEYS = ("reverse", "beam_sizes", "weights", "utilities", "length_penalty", "variants")
MBR_UTILITIES = ("bleu", "chrf")  # evaluation/mbr.py's UTILITIES (the driver imports no attnmt)


class PlanError(ValueError):
    """A plan file that cannot be run (one line saying why)."""


def load_plan(path: Path) -> dict:
    """The plan (module docstring) with its defaults filled in; PlanError if malformed."""
    try:
        plan = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise PlanError(f"cannot read plan {path}: {err}") from err
    seeds = plan.get("seeds", 1)
    seeds = list(range(seeds)) if isinstance(seeds, int) else seeds
    if not seeds or seeds != list(range(len(seeds))):
        raise PlanError(f"{path}: seeds must be N or [0, 1, ..., N-1] (train.py --seeds N), "
                        f"got {plan.get('seeds')!r}")
    directions = plan.get("directions") or {}
    variants = plan.get("variants") or []
    if not directions or not variants:
        raise PlanError(f"{path}: needs a [directions] table and at least one [[variants]]")
    names = [v.get("name") for v in variants]
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise PlanError(f"{path}: every variant needs a name of its own, got {names}")
    earlier: dict[str, dict] = {}
    for variant in variants:
        unknown = set(variant.get("directions", directions)) - set(directions)
        if unknown:
            raise PlanError(f"{path}: variant {variant['name']} names unknown directions "
                            f"{sorted(unknown)}")
        if "teacher" in variant:
            check_teacher(path, variant, earlier, plan.get("overrides", {}), directions)
        earlier[variant["name"]] = variant
    read = dict(plan.get("read") or {})
    read.setdefault("splits", [read.pop("split", "valid")])
    read.setdefault("length_penalties", [read.pop("length_penalty")]
                    if "length_penalty" in read else [None])
    read.setdefault("checkpoint", "last")
    distill = {**{k: read[k] for k in TEACH_KEYS if read.get(k) is not None},
               **(plan.get("distill") or {})}
    if set(distill) - set(TEACH_KEYS):
        raise PlanError(f"{path}: [distill] takes {', '.join(TEACH_KEYS)}, got "
                        f"{sorted(set(distill) - set(TEACH_KEYS))}")
    nbest = check_nbest(path, plan.get("nbest"), directions, names)
    return {**plan, "seeds": seeds, "directions": directions, "variants": variants,
            "read": read, "distill": distill, "nbest": nbest}


def check_nbest(path: Path, nbest: dict | None, directions: dict, names: list[str]) -> dict | None:
    """The [nbest] table with its defaults (module docstring), None when there is none;
    PlanError naming what is wrong."""
    if nbest is None:
        return None
    if set(nbest) - set(NBEST_KEYS):
        raise PlanError(f"{path}: [nbest] takes {', '.join(NBEST_KEYS)}, got "
                        f"{sorted(set(nbest) - set(NBEST_KEYS))}")
    reverse = nbest.get("reverse") or {}
    if not reverse or not set(reverse) | set(reverse.values()) <= set(directions) or any(
            a == b for a, b in reverse.items()):
        raise PlanError(f"{path}: [nbest] reverse must map directions to other directions "
                        f"of [directions], got {reverse!r}")
    sizes, weights = nbest.get("beam_sizes", [5]), nbest.get("weights", [])
    if not sizes or not all(isinstance(k, int) and k >= 2 for k in sizes):
        raise PlanError(f"{path}: [nbest] beam_sizes must be integers of at least 2, got {sizes!r}")
    if not weights or not all(isinstance(w, int | float) and w >= 0 for w in weights):
        raise PlanError(f"{path}: [nbest] weights must be numbers of at least 0, got {weights!r}")
    utilities = nbest.get("utilities", [])
    if set(utilities) - set(MBR_UTILITIES):
        raise PlanError(f"{path}: [nbest] utilities must be of {', '.join(MBR_UTILITIES)}, "
                        f"got {utilities!r}")
    variants = nbest.get("variants", names)
    if set(variants) - set(names):
        raise PlanError(f"{path}: [nbest] names unknown variants "
                        f"{sorted(set(variants) - set(names))}")
    return {"reverse": dict(reverse), "beam_sizes": list(sizes), "weights": list(weights),
            "utilities": list(utilities),
            "length_penalty": nbest.get("length_penalty"), "variants": list(variants)}


def check_teacher(path: Path, variant: dict, earlier: dict[str, dict], common: dict,
                  directions: dict) -> None:
    """PlanError unless the variant's teacher is an earlier variant that covers its
    directions and writes the same text protocol (the distilled lines are the teacher's
    text, taken as they are)."""
    name, teacher = variant["name"], earlier.get(variant["teacher"])
    if teacher is None:
        raise PlanError(f"{path}: variant {name}'s teacher {variant['teacher']!r} is not a "
                        "variant listed before it")
    missing = set(variant.get("directions", directions)) - set(
        teacher.get("directions", directions))
    if missing:
        raise PlanError(f"{path}: variant {name} trains {sorted(missing)}, which its teacher "
                        f"{teacher['name']} does not")
    if "data.distilled_targets" in variant.get("overrides", {}):
        raise PlanError(f"{path}: variant {name} has a teacher; data.distilled_targets is "
                        "set by the sweep")

    def protocol(v: dict) -> str:
        return {**common, **v.get("overrides", {})}.get("data.text_protocol", "")

    if protocol(variant) != protocol(teacher):
        raise PlanError(f"{path}: variant {name} and its teacher {teacher['name']} differ in "
                        "data.text_protocol")


def runs_of(plan: dict, only: set[str] | None = None) -> list[dict]:
    """The plan's runs in order, each {"direction", "variant", "config", "overrides",
    "teacher", "teaches" (a later variant of the plan is its student), "time_limit_minutes",
    "pack", "length_penalties"}; `only` keeps the variants of those names."""
    runs = []
    taught = {(v["teacher"], d) for v in plan["variants"] if v.get("teacher")
              for d in v.get("directions", plan["directions"])}
    for variant in plan["variants"]:
        if only and variant["name"] not in only:
            continue
        for direction in variant.get("directions", list(plan["directions"])):
            runs.append({
                "direction": direction, "variant": variant["name"],
                "config": plan["directions"][direction],
                "overrides": {**plan.get("overrides", {}), **variant.get("overrides", {})},
                "teacher": variant.get("teacher"),
                "teaches": (variant["name"], direction) in taught,
                "time_limit_minutes": variant.get("time_limit_minutes",
                                                  plan.get("time_limit_minutes", 0)),
                "pack": bool(variant.get("pack", plan.get("pack", False))),
                "length_penalties": variant.get("length_penalties",
                                                plan["read"]["length_penalties"])})
    return runs


def override_flags(overrides: dict) -> list[str]:
    """`--config.KEY=VALUE` flags of {dotted key: value} (TOML booleans as True / False)."""
    return [f"--config.{key}={value}" for key, value in overrides.items()]
