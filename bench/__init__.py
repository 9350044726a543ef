"""Benchmark scripts: matmul peak, training throughput and MFU, decoding speed.

Run them as scripts from the repository root (see bench/README.md); they are not tests.
"""

import json
from pathlib import Path


def write_json(path: Path, result: dict) -> None:
    """Write a benchmark's result as indented JSON, creating the parent folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
