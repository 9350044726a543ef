"""scripts/plans/anchors.toml: every variant of every direction is a valid config."""

import importlib
import tomllib

import pytest
from conftest import REPO

from configs.validation import validate_config

PLAN = REPO / "scripts" / "plans" / "anchors.toml"


def runs():
    plan = tomllib.loads(PLAN.read_text())
    common = plan.get("overrides", {})  # for every run; a variant's own win
    return [pytest.param(plan["directions"][d], {**common, **v["overrides"]},
                         id=f"{v['name']}-{d}")
            for v in plan["variants"] for d in v["directions"]]


def test_plan_reads_on_validation_at_three_seeds():
    plan = tomllib.loads(PLAN.read_text())
    assert plan["seeds"] == [0, 1, 2] and plan["judge_on"] == plan["read"]["split"] == "valid"
    names = [v["name"] for v in plan["variants"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("config_file", "overrides"), runs())
def test_every_variant_is_a_valid_config(config_file, overrides):
    cfg = importlib.import_module(config_file.removesuffix(".py").replace("/", ".")).get_config()
    for key, value in overrides.items():
        group, name = key.split(".")
        assert name in cfg[group], key  # a key the config has
        cfg[group][name] = value  # ml_collections refuses a value of the wrong type
    validate_config(cfg)
