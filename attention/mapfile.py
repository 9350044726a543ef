"""The attention map file: one `.npz` per set of recorded sentences (README: "The
attention map file").

A map file is written with `np.savez_compressed` and holds only plain arrays, so it
loads with `np.load(path, allow_pickle=False)` (no pickled objects, ever):

| array            | dtype          | shape                   | meaning                                  |
|------------------|----------------|-------------------------|------------------------------------------|
| `encoder_self`   | float32        | [N, L_enc, H, S, S]     | encoder self-attention                   |
| `decoder_self`   | float32        | [N, L_dec, H, T, T]     | decoder causal self-attention            |
| `cross`          | float32        | [N, L_dec, H, T, S]     | decoder-to-encoder (cross) attention     |
| `source_tokens`  | str (`<U..`)   | [N, S]                  | source pieces, padded with ""            |
| `target_tokens`  | str (`<U..`)   | [N, T]                  | decoder-input pieces, padded with ""     |
| `source_lengths` | int32          | [N]                     | valid source positions per example       |
| `target_lengths` | int32          | [N]                     | valid target positions per example       |
| `step`           | int64, 0-d     | []                      | training step of the weights             |
| `decode`         | str, 0-d       | []                      | "teacher_forced", "greedy" or "beam"     |

Axes: the second-to-last axis is the query, the last axis the key; layers and heads
are 0-indexed. S and T are the longest source / target of the file.

Tokens. The source row holds the SentencePiece pieces followed by `</s>`:
`▁Ein ▁Mann ▁spiel t </s>`. The target row holds the *decoder input*: position t is
the token fed to the decoder at step t, so it starts with `<s>` and has no `</s>`:
`<s> ▁A ▁man ▁play s`. Query row t therefore *predicts* the next token (the one at
position t + 1, or `</s>` for the last row): the cross-attention row t is where the
model looks while producing target word t + 1. Alignment extraction reads either
that row or the row where the word itself is the input (the "shift" variant, see
`alignment/links.py`).

Invariants (checked by `validate_maps`): for every valid query row, the weights over
the valid keys sum to 1; padded keys and padded query rows are exactly 0;
`decoder_self` is causal (its upper triangle is exactly 0). Under beam search the
maps are those of the returned hypothesis.

Contributions (optional: all of these arrays or none; written when asked for, e.g.
`evaluate.py --save_attention N --contributions`; models/contributions.py defines them):

| array                       | shape               | meaning                                         |
|-----------------------------|---------------------|-------------------------------------------------|
| `norm_encoder_self`         | [N, L_enc, H, S, S] | norm-based attention ||alpha f(x)|| per head      |
| `norm_decoder_self`         | [N, L_dec, H, T, T] | (Kobayashi et al. 2020)                         |
| `norm_cross`                | [N, L_dec, H, T, S] |                                                 |
| `norm_resln_encoder_self`   | [N, L_enc, S, S]    | per layer, heads summed, residual and layer     |
| `norm_resln_decoder_self`   | [N, L_dec, T, T]    | norm folded in (Kobayashi et al. 2021)          |
| `norm_resln_cross`          | [N, L_dec, T, S]    |                                                 |
| `norm_resln_cross_residual` | [N, L_dec, T]       | the same for the cross block's residual term    |
| `alti_source`               | [N, T, S]           | ALTI+ (Ferrando et al. 2022): each source and   |
| `alti_target`               | [N, T, T]           | decoder-input token's share in the prediction   |
|                             |                     | at step t; a valid row of the two sums to 1     |
| `source_share`              | [N, T]              | the source's total share: `alti_source` summed  |

All float32, exactly 0 outside the valid lengths; `alti_target` is causal. A file
without them loads as before (the fields are None).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.files import atomic_file

KINDS = ("encoder_self", "decoder_self", "cross")
DECODE_MODES = ("teacher_forced", "greedy", "beam")
ARRAY_NAMES = (*KINDS, "source_tokens", "target_tokens", "source_lengths", "target_lengths",
               "step", "decode")
# The optional contribution arrays: the axes after N of each, "Le" / "Ld" the encoder /
# decoder layers, "H" heads, "S" / "T" source / target positions.
CONTRIBUTION_AXES = {
    "norm_encoder_self": ("Le", "H", "S", "S"),
    "norm_decoder_self": ("Ld", "H", "T", "T"),
    "norm_cross": ("Ld", "H", "T", "S"),
    "norm_resln_encoder_self": ("Le", "S", "S"),
    "norm_resln_decoder_self": ("Ld", "T", "T"),
    "norm_resln_cross": ("Ld", "T", "S"),
    "norm_resln_cross_residual": ("Ld", "T"),
    "alti_source": ("T", "S"),
    "alti_target": ("T", "T"),
    "source_share": ("T",),
}
CONTRIBUTION_NAMES = tuple(CONTRIBUTION_AXES)
# What a map shows: the attention weights, the norm-based map (per layer and head, as the
# weights) or ALTI+ (source and target-prefix contributions of each prediction).
MEASURES = ("weights", "norm", "alti")


class MapFormatError(UserError, ValueError):
    """A file or object that is not an attention map in the map file format (a UserError:
    the command lines report it as one `error:` line)."""


@dataclasses.dataclass
class AttentionMaps:
    """Attention maps of N sentences; the fields are the arrays of the file format."""

    encoder_self: np.ndarray  # float32 [N, L_enc, H, S, S]
    decoder_self: np.ndarray  # float32 [N, L_dec, H, T, T]
    cross: np.ndarray  # float32 [N, L_dec, H, T, S]
    source_tokens: np.ndarray  # str [N, S], "" = padding
    target_tokens: np.ndarray  # str [N, T], "" = padding
    source_lengths: np.ndarray  # int32 [N]
    target_lengths: np.ndarray  # int32 [N]
    step: int
    decode: str
    # Contributions (module docstring), None in a file recorded without them.
    norm_encoder_self: np.ndarray | None = None  # float32 [N, L_enc, H, S, S]
    norm_decoder_self: np.ndarray | None = None  # float32 [N, L_dec, H, T, T]
    norm_cross: np.ndarray | None = None  # float32 [N, L_dec, H, T, S]
    norm_resln_encoder_self: np.ndarray | None = None  # float32 [N, L_enc, S, S]
    norm_resln_decoder_self: np.ndarray | None = None  # float32 [N, L_dec, T, T]
    norm_resln_cross: np.ndarray | None = None  # float32 [N, L_dec, T, S]
    norm_resln_cross_residual: np.ndarray | None = None  # float32 [N, L_dec, T]
    alti_source: np.ndarray | None = None  # float32 [N, T, S]
    alti_target: np.ndarray | None = None  # float32 [N, T, T]
    source_share: np.ndarray | None = None  # float32 [N, T]

    @property
    def has_contributions(self) -> bool:
        """Whether the contribution arrays are present (they come all together)."""
        return self.alti_source is not None

    @property
    def num_examples(self) -> int:
        """N."""
        return int(self.source_lengths.shape[0])

    @property
    def num_heads(self) -> int:
        """H (the same for all kinds)."""
        return int(self.cross.shape[2])

    def num_layers(self, kind: str) -> int:
        """L_enc for "encoder_self", L_dec for the two decoder kinds."""
        return int(self.weights(kind).shape[1])

    def weights(self, kind: str, measure: str = "weights") -> np.ndarray:
        """The array of one kind: float32 [N, L, H, Q, K], the attention weights or (measure
        "norm") the norm-based map. ValueError for an unknown kind or measure, or "norm" in
        maps recorded without contributions."""
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}; expected one of {', '.join(KINDS)}")
        if measure == "weights":
            return getattr(self, kind)
        if measure != "norm":
            raise ValueError(f"measure {measure!r} has no per-layer, per-head {kind} map "
                             "(weights or norm)")
        if not self.has_contributions:
            raise ValueError("these maps were recorded without contributions (no norm-based "
                             "maps): record them with contributions")
        return getattr(self, f"norm_{kind}")

    def as_measure(self, measure: str) -> AttentionMaps:
        """These maps with the weights replaced by a contribution measure, for the tools
        that read weights (word alignment): "weights" -> self; "norm" -> the norm-based
        map of every kind; "alti" -> `cross` is `alti_source` on every layer and head
        (ALTI+ has neither), the other kinds stay the weights. The result is for reading:
        its rows do not sum to 1."""
        if measure == "weights":
            return self
        if measure not in MEASURES:
            raise ValueError(f"unknown measure {measure!r}; expected one of {', '.join(MEASURES)}")
        if not self.has_contributions:
            raise ValueError(f"these maps were recorded without contributions (no {measure} "
                             "maps): record them with contributions")
        if measure == "norm":
            kinds = {kind: getattr(self, f"norm_{kind}") for kind in KINDS}
        else:
            kinds = {"cross": np.broadcast_to(self.alti_source[:, None, None],
                                              self.cross.shape).copy()}
        return dataclasses.replace(self, **kinds)

    def alti(self, example: int) -> tuple[np.ndarray, np.ndarray]:
        """ALTI+ of one example's valid region: (source [T, S], target prefix [T, T]), row t
        the shares in the prediction made at step t (each row of the two sums to 1)."""
        if not self.has_contributions:
            raise ValueError("these maps were recorded without contributions (no ALTI+): "
                             "record them with contributions")
        t, s = int(self.target_lengths[example]), int(self.source_lengths[example])
        return self.alti_source[example, :t, :s], self.alti_target[example, :t, :t]

    def query_tokens(self, example: int, kind: str) -> list[str]:
        """Valid query tokens of one example: source pieces for encoder_self, else target."""
        if kind == "encoder_self":
            return [str(t) for t in self.source_tokens[example, : self.source_lengths[example]]]
        return [str(t) for t in self.target_tokens[example, : self.target_lengths[example]]]

    def key_tokens(self, example: int, kind: str) -> list[str]:
        """Valid key tokens of one example: target pieces for decoder_self, else source."""
        if kind == "decoder_self":
            return [str(t) for t in self.target_tokens[example, : self.target_lengths[example]]]
        return [str(t) for t in self.source_tokens[example, : self.source_lengths[example]]]

    def matrix(
        self,
        example: int,
        kind: str,
        layer: int | str | Sequence[int] = "mean",
        head: int | str | Sequence[int] = "mean",
        measure: str = "weights",
    ) -> np.ndarray:
        """Valid region of one example's map, averaged as asked.

        Args:
          layer, head: an index, "mean" (all of them) or a sequence of indices to average.
          measure: "weights" or "norm" (`weights`).
        Returns:
          float32 [Q, K] with Q, K the valid query / key lengths (padding cut off).
        """
        w = self.weights(kind, measure)
        if not 0 <= example < w.shape[0]:
            raise IndexError(f"example {example} out of range (file has {w.shape[0]})")
        q = len(self.query_tokens(example, kind))
        k = len(self.key_tokens(example, kind))
        w = w[example][:, :, :q, :k]  # [L, H, Q, K]
        w = w[_index(layer, w.shape[0], "layer")].mean(axis=0)
        return w[_index(head, w.shape[0], "head")].mean(axis=0).astype(np.float32)


def _index(sel: int | str | Sequence[int], size: int, what: str) -> list[int]:
    """A layer/head selection as a list of indices (negative ones count from the end)."""
    if isinstance(sel, str):
        if sel != "mean":
            raise ValueError(f"{what} must be an index or 'mean', got {sel!r}")
        return list(range(size))
    items = [sel] if isinstance(sel, int | np.integer) else list(sel)
    if not items:
        raise ValueError(f"empty {what} selection")
    for i in items:
        if not -size <= int(i) < size:
            raise IndexError(f"{what} {i} out of range (0..{size - 1})")
    return [int(i) % size for i in items]


def _check_format(maps: AttentionMaps, name: str) -> None:
    """Ranks, dtypes and shape agreement of the arrays (not the numerical invariants)."""

    def fail(problem: str) -> None:
        raise MapFormatError(f"{name}: {problem}")

    for kind in KINDS:
        a = getattr(maps, kind)
        if not isinstance(a, np.ndarray) or a.ndim != 5:
            fail(f"'{kind}' must be a rank-5 array, got {getattr(a, 'shape', type(a).__name__)}")
        if a.dtype != np.float32:
            fail(f"'{kind}' must be float32, got {a.dtype}")
    for field, rank, kinds in (("source_tokens", 2, "U"), ("target_tokens", 2, "U"),
                               ("source_lengths", 1, "iu"), ("target_lengths", 1, "iu")):
        a = getattr(maps, field)
        if not isinstance(a, np.ndarray) or a.ndim != rank:
            fail(f"'{field}' must be a rank-{rank} array, got {getattr(a, 'shape', None)}")
        if a.dtype.kind not in kinds:
            fail(f"'{field}' has dtype {a.dtype}, expected {'str' if kinds == 'U' else 'int'}")
    n, s, t = maps.source_lengths.shape[0], maps.source_tokens.shape[1], maps.target_tokens.shape[1]
    n_enc, l_enc, h, s1, s2 = maps.encoder_self.shape
    n_dec, l_dec, h_dec, t1, t2 = maps.decoder_self.shape
    expected = {"encoder_self": (n, l_enc, h, s, s), "decoder_self": (n, l_dec, h, t, t),
                "cross": (n, l_dec, h, t, s), "source_tokens": (n, s), "target_tokens": (n, t),
                "source_lengths": (n,), "target_lengths": (n,)}
    for field, shape in expected.items():
        if getattr(maps, field).shape != shape:
            fail(f"inconsistent shapes: '{field}' is {getattr(maps, field).shape}, expected "
                 f"{shape} from N={n}, L_enc={l_enc}, L_dec={l_dec}, H={h}, S={s}, T={t}")
    for field, limit in (("source_lengths", s), ("target_lengths", t)):
        lengths = getattr(maps, field)
        if n and (lengths.min() < 1 or lengths.max() > limit):
            fail(f"'{field}' out of range: values must lie in 1..{limit}, "
                 f"got {int(lengths.min())}..{int(lengths.max())}")
    present = [a for a in CONTRIBUTION_NAMES if getattr(maps, a) is not None]
    if present and len(present) != len(CONTRIBUTION_NAMES):
        missing = [a for a in CONTRIBUTION_NAMES if a not in present]
        fail(f"contribution arrays come all together: has {present[0]} but not "
             f"{', '.join(missing)}")
    sizes = {"Le": l_enc, "Ld": l_dec, "H": h, "S": s, "T": t}
    for field in present:
        a = getattr(maps, field)
        shape = (n, *(sizes[axis] for axis in CONTRIBUTION_AXES[field]))
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != shape:
            fail(f"'{field}' must be a float32 array of shape {shape} (N, "
                 f"{', '.join(CONTRIBUTION_AXES[field])}), got {getattr(a, 'dtype', None)} "
                 f"{getattr(a, 'shape', type(a).__name__)}")
    if isinstance(maps.step, bool) or not isinstance(maps.step, int | np.integer):
        fail(f"'step' must be an int, got {maps.step!r}")
    if maps.decode not in DECODE_MODES:
        fail(f"'decode' must be one of {', '.join(DECODE_MODES)}, got {maps.decode!r}")


def save_maps(path: str | os.PathLike, maps: AttentionMaps) -> Path:
    """Write `maps` to `path` atomically (`common.files.atomic_file`); returns the path.

    The file is a compressed `.npz` of plain arrays (strings as fixed-width unicode); a
    crash mid-write never leaves a truncated map file behind. Raises MapFormatError on
    malformed maps (nothing is written then).
    """
    path = Path(path)
    _check_format(maps, str(path))
    arrays = {kind: np.ascontiguousarray(getattr(maps, kind), dtype=np.float32) for kind in KINDS}
    arrays["source_tokens"] = np.asarray(maps.source_tokens, dtype=np.str_)
    arrays["target_tokens"] = np.asarray(maps.target_tokens, dtype=np.str_)
    arrays["source_lengths"] = np.asarray(maps.source_lengths, dtype=np.int32)
    arrays["target_lengths"] = np.asarray(maps.target_lengths, dtype=np.int32)
    arrays["step"] = np.asarray(int(maps.step), dtype=np.int64)
    arrays["decode"] = np.asarray(maps.decode, dtype=np.str_)
    for name in CONTRIBUTION_NAMES:
        if getattr(maps, name) is not None:
            arrays[name] = np.ascontiguousarray(getattr(maps, name), dtype=np.float32)
    with atomic_file(path) as f:  # a file object: numpy would append ".npz" to a name
        np.savez_compressed(f, **arrays)
    return path


def load_maps(path: str | os.PathLike) -> AttentionMaps:
    """Read and format-check a map file (never unpickles anything).

    Raises:
      FileNotFoundError / IsADirectoryError: no such file, or a folder (naming the path,
        so the command lines word it like every OSError on a user path).
      MapFormatError: not an .npz, an object array, a missing array, a wrong rank or
        dtype, inconsistent N/L/H/S/T, lengths out of range. One line naming the file.
    """
    name = str(path)
    if not Path(path).is_file():
        code = errno.EISDIR if Path(path).is_dir() else errno.ENOENT
        raise OSError(code, os.strerror(code), name)  # the subclass OSError picks
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy array
            raise MapFormatError(f"{name}: a single .npy array, not an .npz map file")
        with z:
            missing = [a for a in ARRAY_NAMES if a not in z.files]
            if missing:
                raise MapFormatError(f"{name}: not an attention map file, missing arrays: "
                                     f"{', '.join(missing)}")
            arrays = {a: z[a] for a in (*ARRAY_NAMES, *CONTRIBUTION_NAMES) if a in z.files}
    except MapFormatError:
        raise
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        # Object arrays land here too: numpy refuses them without allow_pickle.
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise MapFormatError(f"{name}: not a readable .npz map file ({reason})") from None
    step, decode = arrays.pop("step"), arrays.pop("decode")
    if step.shape != () or step.dtype.kind not in "iu":
        raise MapFormatError(f"{name}: 'step' must be a 0-d integer array, got {step.dtype} "
                             f"{step.shape}")
    if decode.shape != () or decode.dtype.kind != "U":
        raise MapFormatError(f"{name}: 'decode' must be a 0-d string array, got {decode.dtype} "
                             f"{decode.shape}")
    maps = AttentionMaps(**arrays, step=int(step), decode=str(decode))
    _check_format(maps, name)
    maps.source_lengths = maps.source_lengths.astype(np.int32)
    maps.target_lengths = maps.target_lengths.astype(np.int32)
    return maps


def validate_maps(maps: AttentionMaps, atol: float = 1e-4) -> None:
    """Check the numerical invariants of §4.5; raises MapFormatError naming the first breach.

    Valid query rows sum to 1 (within `atol`) over valid keys; padded keys and padded
    query rows are exactly 0; `decoder_self` has an exactly-zero upper triangle; all
    weights are finite and non-negative; tokens are non-empty exactly within the lengths.
    """
    _check_format(maps, "maps")
    s, t = maps.source_tokens.shape[1], maps.target_tokens.shape[1]
    src_valid = np.arange(s)[None, :] < maps.source_lengths[:, None]  # [N, S]
    tgt_valid = np.arange(t)[None, :] < maps.target_lengths[:, None]  # [N, T]
    for field, valid in (("source_tokens", src_valid), ("target_tokens", tgt_valid)):
        tokens = getattr(maps, field)
        bad = np.argwhere((tokens != "") != valid)
        if bad.size:
            n, pos = bad[0]
            raise MapFormatError(f"{field}[{n}, {pos}] is {str(tokens[n, pos])!r} but the length is "
                                 f"{int(valid[n].sum())}: tokens must be non-empty exactly "
                                 "within the length")
    for kind, q_valid, k_valid in (("encoder_self", src_valid, src_valid),
                                   ("decoder_self", tgt_valid, tgt_valid),
                                   ("cross", tgt_valid, src_valid)):
        w = getattr(maps, kind)  # [N, L, H, Q, K]
        if not np.isfinite(w).all() or (w < 0).any():
            raise MapFormatError(f"{kind}: weights must be finite and non-negative")
        cell_valid = (q_valid[:, :, None] & k_valid[:, None, :])[:, None, None]  # [N,1,1,Q,K]
        outside = np.argwhere((w != 0) & ~cell_valid)
        if outside.size:
            n, layer, head, q, k = outside[0]
            where = "padded query row" if not q_valid[n, q] else "padded key"
            raise MapFormatError(f"{kind}[example {n}, layer {layer}, head {head}]: {where} "
                                 f"(query {q}, key {k}) has weight {w[n, layer, head, q, k]:g}, "
                                 "expected exactly 0")
        sums = w.sum(axis=-1)  # [N, L, H, Q]
        off = np.argwhere((np.abs(sums - 1.0) > atol) & q_valid[:, None, None, :])
        if off.size:
            n, layer, head, q = off[0]
            raise MapFormatError(f"{kind}[example {n}, layer {layer}, head {head}]: query row {q} "
                                 f"sums to {sums[n, layer, head, q]:.6f} over its valid keys, "
                                 f"expected 1 (atol {atol:g})")
    upper = np.triu(np.ones((t, t), dtype=bool), k=1)
    future = np.argwhere((maps.decoder_self != 0) & upper)
    if future.size:
        n, layer, head, q, k = future[0]
        raise MapFormatError(f"decoder_self[example {n}, layer {layer}, head {head}] is not causal: "
                             f"query {q} attends to future key {k}")
    if maps.has_contributions:
        _validate_contributions(maps, src_valid, tgt_valid, atol)


def _valid_cells(axes: Sequence[str], src_valid: np.ndarray, tgt_valid: np.ndarray) -> np.ndarray:
    """bool [N, *axes] (size 1 on layer / head axes): the cells within the lengths."""
    n = src_valid.shape[0]
    mask = np.ones((n,) + (1,) * len(axes), dtype=bool)
    for i, axis in enumerate(axes):
        valid = {"S": src_valid, "T": tgt_valid}.get(axis)
        if valid is not None:
            shape = [n] + [1] * len(axes)
            shape[i + 1] = valid.shape[1]
            mask = mask & valid.reshape(shape)
    return mask


def _validate_contributions(maps: AttentionMaps, src_valid: np.ndarray, tgt_valid: np.ndarray,
                            atol: float) -> None:
    """Finite, non-negative, exactly 0 outside the lengths; ALTI+ rows sum to 1 over the
    source and the target prefix, `alti_target` is causal, `source_share` is the row sum
    of `alti_source`."""
    for name, axes in CONTRIBUTION_AXES.items():
        a = getattr(maps, name)
        if not np.isfinite(a).all() or (a < 0).any():
            raise MapFormatError(f"{name}: values must be finite and non-negative")
        outside = np.argwhere((a != 0) & ~_valid_cells(axes, src_valid, tgt_valid))
        if outside.size:
            raise MapFormatError(f"{name}{list(map(int, outside[0]))} lies outside the lengths "
                                 f"but is {a[tuple(outside[0])]:g}, expected exactly 0")
    rows = maps.alti_source.sum(-1) + maps.alti_target.sum(-1)  # [N, T]
    off = np.argwhere((np.abs(rows - 1.0) > atol) & tgt_valid)
    if off.size:
        n, q = off[0]
        raise MapFormatError(f"alti_source + alti_target [example {n}] row {q} sums to "
                             f"{rows[n, q]:.6f}, expected 1 (atol {atol:g})")
    t = maps.alti_target.shape[-1]
    if (maps.alti_target[:, np.triu(np.ones((t, t), dtype=bool), k=1)] != 0).any():
        raise MapFormatError("alti_target is not causal: a step draws on a later target token")
    if np.abs(maps.source_share - maps.alti_source.sum(-1)).max(initial=0) > atol:
        raise MapFormatError("source_share differs from alti_source summed over the source")


def _pad_tokens(rows: Sequence[Sequence[str]], width: int) -> np.ndarray:
    """Token lists -> fixed-width unicode array [N, width] padded with ""."""
    longest = max((len(tok) for row in rows for tok in row), default=1)
    out = np.full((len(rows), width), "", dtype=f"<U{max(longest, 1)}")
    for i, row in enumerate(rows):
        out[i, : len(row)] = list(row)
    return out


def maps_from_arrays(
    weights: Mapping[str, np.ndarray],
    source_pieces: Sequence[Sequence[str]],
    target_pieces: Sequence[Sequence[str]],
    step: int,
    decode: str,
    contributions: Mapping[str, np.ndarray] | None = None,
) -> AttentionMaps:
    """Build maps from the model's per-layer stacked weights.

    Args:
      weights: {"encoder_self": [L_enc, B, H, S_in, S_in], "decoder_self":
        [L_dec, B, H, T_in, T_in], "cross": [L_dec, B, H, T_in, S_in]} (numpy or jax,
        float32; batch second, as the model returns them). S_in / T_in may exceed the
        longest example (batch padding); anything beyond an example's lengths is dropped.
      source_pieces: B lists of source pieces ending with "</s>"; their lengths are the
        source lengths.
      target_pieces: B lists of decoder-input pieces starting with "<s>" (no "</s>");
        their lengths are the target lengths.
      step: training step of the weights; decode: "teacher_forced", "greedy" or "beam".
      contributions: None, or every array of `CONTRIBUTION_AXES`, batch FIRST
        ([B, L, H, T_in, S_in] etc., as `models.contributions.contributions` returns
        them), cut and zeroed like the weights.
    Returns:
      AttentionMaps with S = longest source, T = longest target, zeros outside the lengths.
    """
    b = len(source_pieces)
    if len(target_pieces) != b:
        raise ValueError(f"{b} source but {len(target_pieces)} target piece lists")
    src_len = np.array([len(p) for p in source_pieces], dtype=np.int32)
    tgt_len = np.array([len(p) for p in target_pieces], dtype=np.int32)
    s, t = int(src_len.max(initial=1)), int(tgt_len.max(initial=1))
    lengths = {"encoder_self": (src_len, src_len), "decoder_self": (tgt_len, tgt_len),
               "cross": (tgt_len, src_len)}
    out = {}
    for kind, (q_len, k_len) in lengths.items():
        w = np.asarray(weights[kind], dtype=np.float32)
        if w.ndim != 5 or w.shape[1] != b:
            raise ValueError(f"weights[{kind!r}] must be [L, B={b}, H, Q, K], got {w.shape}")
        q, k = (t if kind != "encoder_self" else s), (s if kind != "decoder_self" else t)
        if w.shape[3] < q_len.max(initial=0) or w.shape[4] < k_len.max(initial=0):
            raise ValueError(f"weights[{kind!r}] {w.shape} is shorter than the tokens")
        w = np.transpose(w, (1, 0, 2, 3, 4))[:, :, :, :q, :k]  # [B, L, H, Q, K]
        w = np.pad(w, [(0, 0)] * 3 + [(0, q - w.shape[3]), (0, k - w.shape[4])])
        valid = ((np.arange(q)[None, :, None] < q_len[:, None, None])
                 & (np.arange(k)[None, None, :] < k_len[:, None, None]))  # [B, Q, K]
        # The model masks padded keys but a padded query row still attends somewhere.
        out[kind] = np.where(valid[:, None, None], w, np.float32(0)).astype(np.float32)
    if contributions is not None:
        src_valid = np.arange(s)[None, :] < src_len[:, None]
        tgt_valid = np.arange(t)[None, :] < tgt_len[:, None]
        for name, axes in CONTRIBUTION_AXES.items():
            a = _fit(np.asarray(contributions[name], dtype=np.float32), axes, s, t)
            if a.shape[0] != b:
                raise ValueError(f"contributions[{name!r}] must have B={b} first, got {a.shape}")
            out[name] = np.where(_valid_cells(axes, src_valid, tgt_valid), a, np.float32(0))
    return AttentionMaps(**out, source_tokens=_pad_tokens(source_pieces, s),
                         target_tokens=_pad_tokens(target_pieces, t), source_lengths=src_len,
                         target_lengths=tgt_len, step=int(step), decode=decode)


def _fit(a: np.ndarray, axes: Sequence[str], s: int, t: int) -> np.ndarray:
    """[N, *axes] cut or zero-padded to S = s and T = t on its source / target axes."""
    size = {"S": s, "T": t}
    a = a[(slice(None), *(slice(0, size[x]) if x in size else slice(None) for x in axes))]
    return np.pad(a, [(0, 0)] + [(0, size[x] - a.shape[i + 1]) if x in size else (0, 0)
                                 for i, x in enumerate(axes)])


def concatenate_maps(parts: Sequence[AttentionMaps],
                     order: Sequence[int] | None = None) -> AttentionMaps:
    """Join maps recorded batch by batch into one set (N = sum of the parts' N).

    All parts need the same layers, heads, step and decode mode; S and T become the
    largest of the parts (zero / "" padded). `order` int [N]: the row of the result that
    each example of the parts, taken in turn, goes to (e.g. to undo a sort by length);
    None keeps them in turn.
    """
    if not parts:
        raise ValueError("nothing to concatenate")
    first, n = parts[0], sum(p.num_examples for p in parts)
    if any((p.step, p.decode) != (first.step, first.decode) for p in parts):
        raise ValueError("cannot concatenate maps of different steps or decode modes")
    rows = np.arange(n) if order is None else np.asarray(order, dtype=np.int64)
    if sorted(rows.tolist()) != list(range(n)):
        raise ValueError(f"order must be a permutation of 0..{n - 1}")
    part_rows = np.split(rows, np.cumsum([p.num_examples for p in parts])[:-1])
    s = max(p.source_tokens.shape[1] for p in parts)
    t = max(p.target_tokens.shape[1] for p in parts)
    out = {}
    for kind, (q, k) in {"encoder_self": (s, s), "decoder_self": (t, t), "cross": (t, s)}.items():
        arrs = [getattr(p, kind) for p in parts]
        if len({a.shape[1:3] for a in arrs}) != 1:
            raise ValueError(f"cannot concatenate {kind} maps with different layers or heads")
        # Filled in place: padded copies of the parts, then their concatenation, would
        # hold the (mostly zero) result twice, gigabytes beside one very long sentence.
        out[kind] = np.zeros((n, *arrs[0].shape[1:3], q, k), np.float32)
        for a, r in zip(arrs, part_rows, strict=True):
            out[kind][r, :, :, : a.shape[3], : a.shape[4]] = a
    if len({p.has_contributions for p in parts}) != 1:
        raise ValueError("cannot concatenate maps with and without contributions")
    for name, axes in CONTRIBUTION_AXES.items() if first.has_contributions else ():
        shape = _fit(getattr(first, name)[:0], axes, s, t).shape[1:]
        out[name] = np.zeros((n, *shape), np.float32)  # filled in place, as the weights
        for p, r in zip(parts, part_rows, strict=True):
            a = getattr(p, name)
            out[name][(r, *(slice(0, d) for d in a.shape[1:]))] = a
    back = np.argsort(rows)  # result row j <- example back[j] of the parts in turn
    src = [p.key_tokens(i, "cross") for p in parts for i in range(p.num_examples)]
    tgt = [p.query_tokens(i, "cross") for p in parts for i in range(p.num_examples)]
    return AttentionMaps(
        **out,
        source_tokens=_pad_tokens([src[i] for i in back], s),
        target_tokens=_pad_tokens([tgt[i] for i in back], t),
        source_lengths=np.concatenate([p.source_lengths for p in parts])[back].astype(np.int32),
        target_lengths=np.concatenate([p.target_lengths for p in parts])[back].astype(np.int32),
        step=first.step,
        decode=first.decode,
    )
