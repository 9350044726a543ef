"""Load a trained run for inference: its tokenizer and the parameters of one checkpoint
(or the element-wise mean of several), checked against the run's config.json.

Used by evaluate.py (which also checks the members of an ensemble here),
the alignment command and bench/decode_speed.py. Heavy imports (JAX, orbax) happen
inside the functions, so evaluate.py checks its inputs first.

`reinitialised` (and `load_params(..., reinit_seed=N)`) gives the same architecture with
fresh random parameters: the model-randomisation sanity check of Adebayo et al. 2018.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import ml_collections

from common.errors import UserError
from configs import resolved


def load_tokenizer(workdir: Path, cfg: ml_collections.ConfigDict):
    """The run's tokenizer, checked against config.json (UserError if missing or foreign)."""
    from data.tokenizer import META_FILE, Tokenizer, tokenizer_meta, with_meta_defaults

    directory = workdir / "tokenizer"
    if not directory.is_dir():
        raise UserError(f"{directory} not found: {workdir} has no tokenizer (train first)")
    meta_path = directory / META_FILE
    if meta_path.is_file():
        try:
            saved = with_meta_defaults(json.loads(meta_path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{meta_path}: invalid JSON ({e})") from None
        expected = tokenizer_meta(cfg.data)
        changed = [f"{k}: {saved.get(k)!r} in the tokenizer, {v!r} in config.json"
                   for k, v in expected.items() if saved.get(k) != v]
        if changed:
            raise UserError(f"tokenizer in {directory} does not match {workdir}/config.json "
                            f"({'; '.join(changed)})")
    try:
        return Tokenizer.load(directory)
    except (OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load the tokenizer in {directory}: {first}") from None


def check_ensemble(workdirs: list[Path], cfgs: list[ml_collections.ConfigDict],
                   tokenizers: list) -> None:
    """Refuses members that cannot be decoded as one ensemble (models/ensemble.py): they
    must translate the same direction with one tokenizer, the same SentencePiece model
    bytes (`tokenizer_fingerprint`), hence the same vocabulary ids and sizes.

    workdirs, cfgs, tokenizers: one per member, the first one first. Raises UserError.
    """
    from data.tokenizer import tokenizer_fingerprint

    first, sizes = workdirs[0], (tokenizers[0].source_vocab_size, tokenizers[0].target_vocab_size)
    direction = (cfgs[0].data.source_lang, cfgs[0].data.target_lang)
    fingerprint = tokenizer_fingerprint(first / "tokenizer")
    for workdir, cfg, tokenizer in zip(workdirs[1:], cfgs[1:], tokenizers[1:], strict=True):
        other = (tokenizer.source_vocab_size, tokenizer.target_vocab_size)
        if other != sizes:
            raise UserError(f"--ensemble: {workdir} has vocabulary sizes {other[0]}/{other[1]}, "
                            f"{first} has {sizes[0]}/{sizes[1]}: members must share one tokenizer")
        if tokenizer_fingerprint(workdir / "tokenizer") != fingerprint:
            raise UserError(f"--ensemble: the tokenizer in {workdir / 'tokenizer'} differs from "
                            f"the one in {first / 'tokenizer'} (other SentencePiece model "
                            "bytes): members must share one tokenizer")
        if (cfg.data.source_lang, cfg.data.target_lang) != direction:
            raise UserError(f"--ensemble: {workdir} translates {cfg.data.source_lang}->"
                            f"{cfg.data.target_lang}, {first} {direction[0]}->{direction[1]}")


# ----------------------------------------------------------------------- checkpoints


@dataclasses.dataclass
class LoadedParams:
    """A model with restored (possibly averaged) parameters."""

    model: object  # models.transformer.Transformer
    params: dict  # the parameters as plain nested dicts (the train state's "params")
    steps: list[int]  # the checkpoint step(s) the parameters come from, oldest first
    requested: str  # the --checkpoint value the steps were resolved from
    # Set when the parameters are not the checkpoint's but a fresh initialisation with
    # this seed (`reinitialised`); `steps` still names the checkpoint that was read.
    reinit_seed: int | None = None


def checkpoint_dir(workdir: Path) -> Path:
    """`<workdir>/checkpoints`, or one clear error if the run has saved no step yet."""
    directory = workdir / "checkpoints"
    has_steps = directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())
    if not has_steps:
        raise UserError(f"no checkpoint in {directory}: train first "
                        f"(python train.py --config ... --workdir {workdir})")
    return directory


def kept_steps(workdir: str | Path) -> list[int]:
    """The steps of a run's saved checkpoints, oldest first (UserError: none)."""
    from training import checkpoint as ckpt

    cfg = resolved.load_config_json(workdir)
    manager = ckpt.make_manager(checkpoint_dir(Path(workdir)), cfg.checkpoint.keep,
                                read_only=True)
    return sorted(manager.all_steps())


def unfinished_training(workdir: str | Path) -> str:
    """"" when the run in `workdir` has finished training (`training.loop.finished_reason` of
    its newest checkpoint), else where it stands, "step S of N" (UserError: no checkpoint)."""
    from training import checkpoint as ckpt
    from training.loop import LoopState, finished_reason

    cfg = resolved.load_config_json(workdir)
    manager = ckpt.make_manager(checkpoint_dir(Path(workdir)), cfg.checkpoint.keep,
                                read_only=True)
    step = max(manager.all_steps())
    loop = LoopState.from_meta(ckpt.restore_meta(manager, step))
    return "" if finished_reason(step, loop, cfg.train) else f"step {step} of {cfg.train.num_steps}"


def resolve_steps(manager, checkpoint: str | None, average_last: int = 0) -> list[int]:
    """Checkpoint step(s) to load, oldest first.

    checkpoint: "best" | "last" | a step number; None = "best", or "last" when averaging.
    average_last: N > 0 averages the N most recent saved steps up to that step.
    """
    from training import checkpoint as ckpt

    steps = sorted(manager.all_steps())
    if not steps:
        raise UserError(f"no checkpoint in {manager.directory}: train first")
    newest = ckpt.choose_step(manager, checkpoint or ("last" if average_last else "best"))
    if average_last <= 0:
        return [newest]
    window = [s for s in steps if s <= newest][-average_last:]
    if len(window) < average_last:
        upto = "" if newest == steps[-1] else f" up to step {newest}"
        raise UserError(f"--average_last {average_last}: only {len(window)} checkpoint(s) "
                        f"saved{upto} in {manager.directory} (steps {window})")
    return window


def load_params(workdir: str | Path, checkpoint: str | None = None, average_last: int = 0,
                *, cfg: ml_collections.ConfigDict | None = None, tokenizer=None,
                reinit_seed: int | None = None) -> LoadedParams:
    """Builds the run's model and restores the parameters of one checkpoint, or the
    element-wise mean of the last `average_last` ones (see `resolve_steps`).

    reinit_seed: replace them by `reinitialised(..., reinit_seed)` (the checkpoint is still
    read and checked); None = the checkpoint's parameters.

    Raises UserError: no checkpoint, a damaged one, or one that does not fit the
    model built from config.json and the tokenizer.
    """
    from flax import nnx

    from training import checkpoint as ckpt
    from training.step import create_train_state

    workdir = Path(workdir)
    cfg = cfg if cfg is not None else resolved.load_config_json(workdir)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(workdir, cfg)
    manager = ckpt.make_manager(checkpoint_dir(workdir), cfg.checkpoint.keep, read_only=True)
    steps = resolve_steps(manager, checkpoint, average_last)
    graphdef, state = create_train_state(cfg, tokenizer.source_vocab_size,
                                         tokenizer.target_vocab_size)
    abstract = ckpt.abstract_of(state)
    trees = []
    for step in steps:
        try:
            state, _ = ckpt.restore(manager, step, abstract)
        except UserError as err:
            shapes = re.search(r"Requested shape: (\(.*?\)) is not compatible with the "
                               r"stored shape: (\(.*?\))", str(err))
            detail = (f"a stored array has shape {shapes[2]}, the model expects {shapes[1]}"
                      if shapes else "its tree of arrays differs from the model's (other "
                      "layers or modules)" if "tree structures do not match" in str(err)
                      else None)
            if detail:
                raise UserError(
                    f"checkpoint step {step} in {manager.directory} does not fit the model "
                    f"built from {workdir}/config.json and the tokenizer in {workdir}/tokenizer "
                    f"(vocab {tokenizer.source_vocab_size}/{tokenizer.target_vocab_size}): "
                    f"{detail}; was the tokenizer or config.json replaced?") from err
            # TensorStore appends a dump of its spec; the reason comes before it.
            reason = str(err).split(" See full TensorStore details")[0].rstrip(" .")
            others = [s for s in manager.all_steps() if s != step]
            raise UserError(f"{reason} -- the checkpoint is truncated or damaged"
                            + (f"; other saved steps: {sorted(others)} (--checkpoint STEP)"
                               if others else "")) from err
        trees.append(state["params"])
    params = trees[0] if len(trees) == 1 else ckpt.average_params(trees)
    model = nnx.merge(graphdef, params)
    loaded = LoadedParams(model, params, list(steps), checkpoint or ("last" if average_last
                                                                     else "best"))
    return loaded if reinit_seed is None else reinitialised(loaded, cfg, tokenizer, reinit_seed)


# --------------------------------------------------------------- random parameters

def reinitialised(loaded: LoadedParams, cfg: ml_collections.ConfigDict, tokenizer,
                  seed: int) -> LoadedParams:
    """The same architecture as `loaded` with fresh random parameters: the run's model
    (config.json's `cfg`, the tokenizer's vocabulary sizes, its plug-ins) initialised as
    training initialises it, from `nnx.Rngs(seed)` in place of `train.seed` (so a seed
    equal to the run's train.seed gives the run's own step-0 parameters).

    Every leaf keeps the tree path, shape and dtype of `loaded.params`; `steps` and
    `requested` stay (they name the checkpoint read), `reinit_seed` is set. The same seed
    gives the same parameters.
    """
    import jax
    from flax import nnx

    from training.plugins import active_plugins
    from training.step import build_model

    seeded = ml_collections.ConfigDict(cfg.to_dict())
    seeded.train.seed = int(seed)
    fresh = nnx.state(build_model(seeded, tokenizer.source_vocab_size,
                                  tokenizer.target_vocab_size, active_plugins(seeded)),
                      nnx.Param).to_pure_dict()
    if jax.tree.structure(fresh) != jax.tree.structure(loaded.params):
        raise UserError(f"--reinit_seed: the model built from config.json has other "
                        f"parameters than the checkpoint of steps {loaded.steps}")
    params = jax.tree.map(lambda new, old: new.astype(old.dtype), fresh, loaded.params)
    graphdef = nnx.graphdef(loaded.model)
    return dataclasses.replace(loaded, model=nnx.merge(graphdef, params), params=params,
                               reinit_seed=int(seed))
