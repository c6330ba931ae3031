import tomllib
from pathlib import Path

import pytest

from hetfl.common.config import SCHEMA, ConfigError, validate

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_defaults_match_schema():
    app_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(app_cfg) == set(SCHEMA), set(app_cfg) ^ set(SCHEMA)
    for name, key in SCHEMA.items():
        assert app_cfg[name] == key.default, name
        assert key.check(app_cfg[name]) == key.default


def test_defaults_validate():
    cfg = validate({})
    assert cfg["method"] == "fedavg" and cfg["num-server-rounds"] >= 1


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("dirichlet-alpha", 0.0, "(0.0, inf)"),
        ("dirichlet-alpha", -1.0, "dirichlet-alpha"),
        ("fraction-train", 1.5, "(0.0, 1.0]"),
        ("lr", 0, "lr"),
        ("momentum", 1.0, "[0.0, 1.0)"),
        ("dataset", "imagenet", "'fashion_mnist'"),
        ("method", "fedfoo", "'fedavg'"),
        ("num-server-rounds", 0, "[1, inf)"),
        ("batch-size", 2.5, "batch-size"),
        ("seed", True, "seed"),
        ("lr", float("nan"), "not finite"),
    ],
)
def test_bad_values_name_key_and_range(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        validate({key: value})
    assert f"'{key}'" in str(err.value) and fragment in str(err.value)


def test_unknown_key_rejected():
    with pytest.raises(ConfigError, match="unknown run-config key"):
        validate({"num-rounds": 3})


def test_cross_checks():
    with pytest.raises(ConfigError, match="local-steps"):
        validate({"local-steps": 0, "local-epochs": 0})
    with pytest.raises(ConfigError, match="ag_news"):
        validate({"dataset": "ag_news", "model": "cnn"})


@pytest.mark.parametrize("key,value", [("device", "gpu"), ("device", "cuda:"), ("device", "cuda:x"), ("device", ""),
                                       ("device", "CPU"), ("server-device", "cuda0"), ("server-device", "tpu")])
def test_device_keys_name_key_value_and_allowed(key, value):
    with pytest.raises(ConfigError) as err:
        validate({key: value})
    msg = str(err.value)
    assert f"'{key}' = {value!r}" in msg and "'auto', 'cpu', 'cuda' or 'cuda:N'" in msg


def test_device_precision_augment_schedule_keys():
    cfg = validate({})
    assert (cfg["device"], cfg["server-device"], cfg["precision"], cfg["augment"]) == ("auto", "", "fp32", "none")
    assert (cfg["lr-schedule"], cfg["lr-min"], cfg["drop-last"]) == ("constant", 0.0, False)
    for dev in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert validate({"device": dev, "server-device": dev})["device"] == dev
    cfg = validate({"precision": "bf16", "augment": "crop-flip", "dataset": "cifar10", "model": "resnet8",
                    "lr-schedule": "cosine-epoch", "lr-min": 0.001, "drop-last": True})
    assert cfg["lr-min"] == 0.001 and cfg["drop-last"] is True
    with pytest.raises(ConfigError, match="'precision' = 'fp16'.*'fp32', 'bf16'"):
        validate({"precision": "fp16"})
    with pytest.raises(ConfigError, match="'augment' = 'crop'.*'ag_news'"):
        validate({"augment": "crop", "dataset": "ag_news", "model": "text"})
    with pytest.raises(ConfigError, match="'lr-min' = 0.1 is above lr"):
        validate({"lr-schedule": "cosine-epoch", "lr": 0.01, "lr-min": 0.1})
    assert validate({"lr": 0.01, "lr-min": 0.1})["lr-min"] == 0.1  # only the cosine schedules read it


def test_int_float_coercion():
    cfg = validate({"lr": 1, "num-server-rounds": 5.0})
    assert cfg["lr"] == 1.0 and isinstance(cfg["lr"], float)
    assert cfg["num-server-rounds"] == 5 and isinstance(cfg["num-server-rounds"], int)


@pytest.mark.parametrize("preset", sorted((ROOT / "configs").rglob("*.toml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_presets_validate(preset):
    validate(tomllib.loads(preset.read_text()))
