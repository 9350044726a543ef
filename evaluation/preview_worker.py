"""The drawing process behind `evaluation.previews.PreviewDrawer`.

    python -m evaluation.preview_worker    (started by PreviewDrawer, not by hand)

Reads jobs from stdin, one JSON line each, `{"map_file": PATH}`; draws that map file's
previews (`attention.heatmaps.preview_images`) as PNGs beside it, named after its stem;
answers each job on stdout with one JSON line, in order:

    {"map_file": PATH, "step": int, "decode": str, "means": [[example, PNG path], ...]}
    {"map_file": PATH, "error": "Type: message"[, "errno": int, "strerror": str, "filename": str]}

(`means`: the all-layer previews, which the drawer logs to TensorBoard). Exits at the end
of stdin: when the drawer closes it, or when the training process dies. It imports
neither JAX nor the trainer.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from attention.heatmaps import png_name, preview_images, write_previews
from attention.mapfile import load_maps


def draw(map_file: str) -> dict:
    """One job's reply (see the module docstring)."""
    path = Path(map_file)
    try:
        maps = load_maps(path)
        images = preview_images(maps)
        write_previews(images, path.parent, path.stem)
    except OSError as error:  # the trainer words it like any OSError on a path
        return {"map_file": map_file, "error": f"{type(error).__name__}: {error}",
                "errno": error.errno, "strerror": error.strerror,
                "filename": None if error.filename is None else str(error.filename)}
    except Exception as error:  # a bug: its traceback goes to the run's stderr
        traceback.print_exc()
        return {"map_file": map_file, "error": f"{type(error).__name__}: {error}"}
    means = [[example, str(path.parent / png_name(path.stem, example, "cross", layer, "mean"))]
             for example, layer in images if layer == "mean"]
    return {"map_file": map_file, "step": maps.step, "decode": maps.decode, "means": means}


def main() -> int:
    # Replies own the real stdout; anything else that prints goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            replies.write(json.dumps(draw(json.loads(line)["map_file"])) + "\n")
            replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
