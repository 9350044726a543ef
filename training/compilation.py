"""XLA compilation: the persistent cache every entry point uses, and the time spent compiling."""

from __future__ import annotations

import os
from pathlib import Path

import jax

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "attnmt" / "xla"


def enable_compilation_cache() -> None:
    """Reuse compiled XLA programs across runs (resume, evaluate, alignment): seconds instead
    of minutes. The folder is $JAX_COMPILATION_CACHE_DIR, else ~/.cache/attnmt/xla; one that
    cannot be created or written leaves the cache off (compiling as without it) rather than
    failing a run. Every program is kept, not only those JAX's default thresholds keep
    (over a second of compiling): a tiny model's programs compile faster than that on a CPU,
    yet a run compiles dozens of them."""
    folder = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR", str(DEFAULT_CACHE_DIR)))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        writable = False
    if not writable:
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileTimer:
    """Wall time JAX spends tracing/lowering/compiling (or loading compiled programs from
    the persistent cache) while active: the union of its `/jax/core/compile/*` spans."""

    def __init__(self):
        self.spans: list[tuple[float, float]] = []

    def _listener(self, event: str, start: float, end: float, **kwargs) -> None:
        if event.startswith("/jax/core/compile/"):
            self.spans.append((start, end))

    def start(self) -> CompileTimer:
        jax.monitoring.register_event_time_span_listener(self._listener)
        return self

    def stop(self) -> None:
        jax.monitoring.unregister_event_time_span_listener(self._listener)

    def __enter__(self) -> CompileTimer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def seconds(self) -> float:
        return covered_length(self.spans)


def covered_length(spans) -> float:
    """Length of the union of (start, end) intervals: overlaps count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
