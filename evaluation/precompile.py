"""Validation's programs compiled ahead, on background threads, while training runs.

A run's first validation would otherwise stop training to compile one loss program per
eval batch shape, one beam search per decode shape and the attention maps' two programs
(a dozen for Multi30k's validation split: 32 s on an H200, before its first BLEU). Their
shapes are fixed at launch (the split, the tokenizer and the batching are), so
`compile_validation_ahead` lowers and compiles each of them (`jax.jit(...).lower(...)
.compile()`, which fills the in-process caches that the later calls find) on a thread
pool. XLA releases the GIL while it compiles, so the training loop keeps dispatching
steps meanwhile; `validate` waits for the programs first (`ValidationPrograms.wait`).

Seeds trained together (training/together.py) share one graph and one eval step: a
program another seed already compiles ahead is awaited, not compiled twice. A program
that fails to compile ahead is not an error here: its validation compiles it as before.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

import jax
from flax import nnx

from data.batching import eval_batches
from evaluation.corpus import validation_split
from models.translate import compile_record_maps, compile_translate, decode_shapes

_LOCK = threading.Lock()
_STARTED: dict[Hashable, Future] = {}  # every program compiled ahead in this process
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """One pool for the process, half the CPU cores: the other half keeps feeding the
    training loop (on a 2-core machine, one compile at a time)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2),
                                   thread_name_prefix="attnmt-compile")
    return _POOL


def _spec(x) -> jax.ShapeDtypeStruct:
    """The shape, dtype and sharding of `x` as a call passing it is compiled: a committed
    jax.Array's sharding (a train state put on a mesh) is part of the program; an
    uncommitted one (or a NumPy batch) leaves the sharding to jit."""
    committed = isinstance(x, jax.Array) and x.committed
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None)


class ValidationPrograms:
    """The programs one run's validation needs, compiling ahead (`compile_validation_ahead`)."""

    def __init__(self, futures: dict[Hashable, Future]):
        self.futures = futures
        self.failed: list[Hashable] = []  # keys of the programs that failed to compile ahead

    def wait(self) -> None:
        """Blocks until every program is compiled (or has failed or been cancelled); the
        first failure is said once on stderr."""
        for key, future in self.futures.items():
            try:
                future.result()
            except CancelledError:
                pass
            except Exception as error:  # noqa: BLE001 - the validation compiles it itself
                if key in self.failed:
                    continue
                if not self.failed:
                    print(f"attnmt: compiling validation program {key[0]} ahead failed "
                          f"({type(error).__name__}: {error}); validation compiles it",
                          file=sys.stderr)
                self.failed.append(key)

    def cancel(self) -> None:
        """Drops the programs not yet started (a run that ends before validating); one
        compiling finishes on its thread."""
        for future in self.futures.values():
            future.cancel()


def _submit(futures: dict[Hashable, Future], key: Hashable, compile_fn: Callable[[], None]) -> None:
    with _LOCK:
        if key not in _STARTED or _STARTED[key].cancelled():
            _STARTED[key] = _pool().submit(compile_fn)
        futures[key] = _STARTED[key]


def compile_validation_ahead(cfg, graphdef: nnx.GraphDef, params: dict, eval_step, tokenizer,
                             valid: tuple[list[str], list[str]]) -> ValidationPrograms:
    """Starts compiling, in the background, every program `evaluation.corpus.validate`
    runs on `valid` with this config: the eval step per batch shape, and unless
    `eval.decode` is off the decoder per decode shape and the attention maps' programs.

    params: the train state's parameters ({name: array}); only their shapes, dtypes and
    shardings are read, here, so the training loop may donate them afterwards.
    eval_step: the jitted `(params, batch) -> sums` validate is given.
    Returns the `ValidationPrograms`, to `wait` for before validating.
    """
    sources, targets = validation_split(cfg, valid)
    src_ids, tgt_ids = tokenizer.encode_source(sources), tokenizer.encode_target(targets)
    params_spec = jax.tree.map(_spec, params)
    futures: dict[Hashable, Future] = {}
    for batch, _ in eval_batches(src_ids, tgt_ids, batch_size=cfg.eval.batch_size,
                                 bucket_step=cfg.data.bucket_step):
        batch_spec = {k: _spec(v) for k, v in batch.items() if k != "num_tokens"}
        shapes = tuple(sorted((k, v.shape) for k, v in batch_spec.items()))
        _submit(futures, ("eval step", eval_step, shapes),
                lambda batch_spec=batch_spec: eval_step.lower(params_spec, batch_spec).compile())
    if not cfg.eval.get("decode", True):
        return ValidationPrograms(futures)
    # Decoding splits the merged model again (models/translate.py); so does this.
    model_graph, model_spec = nnx.split(nnx.merge(graphdef, params_spec))
    beam = int(cfg.eval.beam_size)
    decoded = tokenizer.encode_source([s for s in sources if s])  # as translate_lines does
    for src_shape, max_length in decode_shapes(decoded, batch_size=cfg.eval.batch_size,
                                               bucket_step=cfg.data.bucket_step):
        _submit(futures, ("decode", model_graph, src_shape, max_length, beam),
                lambda s=src_shape, m=max_length: compile_translate(
                    model_graph, model_spec, s, m, beam_size=beam))
    n = cfg.attention_maps.num_examples
    if cfg.attention_maps.enabled and n > 0 and jax.process_index() == 0:
        maps_src = tokenizer.encode_source(valid[0][:n])
        # Teacher-forced, then decoded: as validate records them.
        for maps_tgt in (tokenizer.encode_target(valid[1][:n]), None):
            lengths = (tuple(map(len, maps_src)),
                       None if maps_tgt is None else tuple(map(len, maps_tgt)))
            _submit(futures, ("attention maps", model_graph, lengths, beam),
                    lambda t=maps_tgt: compile_record_maps(model_graph, model_spec, maps_src, t,
                                                           beam_size=beam))
    return ValidationPrograms(futures)
