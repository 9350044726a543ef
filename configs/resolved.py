"""The resolved config: read from a `DEFINE_config_file` flag and checked, written to
`<workdir>/config.json` and read back from it."""

import json
from pathlib import Path

import ml_collections
from absl import flags
from ml_collections import config_flags

from common.errors import UserError
from common.files import write_atomic
from configs import alignment_group
from configs.base import get_config
from configs.validation import validate_config

CONFIG_JSON = "config.json"


def resolve_config(config_flag: flags.FlagHolder) -> ml_collections.ConfigDict:
    """The parsed config of a `DEFINE_config_file` flag, checked.

    Args:
      config_flag: the holder returned by `config_flags.DEFINE_config_file`
        (or the ConfigDict itself).
    Returns:
      The config, validated by `validate_config`.
    Raises:
      UserError: no --config given, the file could not be loaded, or a value
        is invalid.
    """
    if isinstance(config_flag, ml_collections.ConfigDict):
        config = config_flag
    else:
        config = config_flag.value
        if config is None:
            raise UserError(f"--{config_flag.name} is required, e.g. "
                            f"--{config_flag.name} configs/multi30k_de_en.py")
        try:
            config.keys()  # The placeholder of a config that failed to load raises OSError.
        except OSError as e:
            path = config_flags.get_config_filename(flags.FLAGS[config_flag.name])
            if not Path(path.split(":")[0]).is_file():
                raise UserError(f"config file not found: {path}") from e
            raise UserError(f"cannot load config file {path}: "
                            f"{str(e).strip().splitlines()[-1].strip()}") from e
    validate_config(config)
    return config


def config_to_json(config: ml_collections.ConfigDict) -> str:
    """The config as stable JSON text: sorted keys, 2-space indent, final newline."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"


def write_config_json(config: ml_collections.ConfigDict, workdir: str | Path) -> Path:
    """Writes `<workdir>/config.json` atomically."""
    return write_atomic(Path(workdir) / CONFIG_JSON, config_to_json(config))


def load_config_json(workdir: str | Path) -> ml_collections.ConfigDict:
    """Reads `<workdir>/config.json` back into a ConfigDict (tuples come back as lists), in
    today's layout (configs/alignment_group.py `upgrade_legacy`).

    Raises:
      UserError: the file is missing, not UTF-8, not valid JSON, or not a config
        (a JSON object whose groups, data and model at least, are objects).
    """
    path = Path(workdir) / CONFIG_JSON
    if not path.is_file():
        raise UserError(f"{path} not found: {workdir} is not a training workdir")
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e})") from None
    # Valid JSON of another shape would fail later as an AttributeError deep inside.
    groups = [k for k, v in get_config().items() if isinstance(v, ml_collections.ConfigDict)]
    if not isinstance(tree, dict):
        raise UserError(f"{path}: not a training config (a JSON {type(tree).__name__}, "
                        "expected an object)")
    # Keys a newer layout keeps elsewhere, moved there: old runs read as today's.
    tree = alignment_group.upgrade_legacy(tree)
    bad = [g for g in groups if (g in ("data", "model") or g in tree)
           and not isinstance(tree.get(g), dict)]
    if bad:
        raise UserError(f"{path}: not a training config (no group {', '.join(bad)}); "
                        f"{workdir} is damaged or not a training workdir")
    return ml_collections.ConfigDict(tree)
