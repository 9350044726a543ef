"""Wall time JAX spends compiling, from its own monitoring events."""

from __future__ import annotations

import jax


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
