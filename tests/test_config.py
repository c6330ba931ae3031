import dataclasses
import tomllib
from pathlib import Path

import pytest

from hetfl.common.config import ConfigError

from hetfl.methods import SCHEMA, validate

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_defaults_match_schema():
    app_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(app_cfg) == set(SCHEMA), set(app_cfg) ^ set(SCHEMA)
    for name, key in SCHEMA.items():
        assert app_cfg[name] == key.default, name
        assert key.check(app_cfg[name]) == key.default


def test_pyproject_config_block_is_generated_from_the_schema():
    """pyproject.toml's [tool.flwr.app.config] is `python -m hetfl.keys --write-pyproject`'s output: a key's default,
    doc or allowed values changed in its declaration and not regenerated fails here (the copies once drifted)."""
    from hetfl.keys import current_block, pyproject_block

    assert current_block() == pyproject_block(), "run: python -m hetfl.keys --write-pyproject"


def test_pyproject_comments_list_every_choice():
    """A key with a fixed set of values names every one of them in its pyproject.toml comment (the file users read
    first: `model` once lacked 'resnet18-afl', `fens-aggregator` 'voting'); the generator writes them."""
    import re


    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    for name, key in SCHEMA.items():
        if not key.choices:
            continue
        line = next(x for x in lines if re.match(rf"{re.escape(name)}\s*=", x))
        comment = line.partition("#")[2]
        assert [c for c in key.choices if repr(c) not in comment] == [], name


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


def test_unknown_key_is_one_line_with_did_you_mean():
    with pytest.raises(ConfigError) as err:
        validate({"num-server-round": 3, "zzz-nothing-like-it": 1})
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 200, msg  # not the list of every key
    assert "did you mean 'num-server-rounds'" in msg and "(and 1 more unknown)" in msg


@pytest.mark.parametrize("old,new", [
    ("device", "torch-device"), ("server-device", "server-torch-device"), ("proximal-mu", "fedprox-mu"),
    ("server-lr", "fedadam-server-lr"), ("adam-tau", "fedadam-tau"), ("aggregator", "fens-aggregator"),
    ("agg-server-lr", "fens-agg-server-lr"), ("coefficients", "shefl-coefficients"), ("topk-density", "shefl-topk-density"),
    ("error-feedback", "shefl-error-feedback"), ("hpc-local-epochs", "shefl-hpc-local-epochs"),
    ("device-proportions", "adaptivefl-tier-proportions"), ("device-capacity", "adaptivefl-tier-capacity"),
])
def test_old_key_names_fail_with_renamed_to(old, new):
    with pytest.raises(ConfigError) as err:
        validate({old: SCHEMA[new].default})
    assert str(err.value) == f"run-config key '{old}' was renamed to '{new}'"
    assert new in SCHEMA and old not in SCHEMA


def test_adaptivefl_variant_points_to_the_method_names():
    with pytest.raises(ConfigError, match="'adaptivefl-variant' was removed; .*method = 'heterofl'"):
        validate({"method": "adaptivefl", "adaptivefl-variant": "heterofl"})
    assert validate({"method": "heterofl"})["method"] == "heterofl"


def test_old_stored_configs_upgrade_to_new_names():
    old = {"method": "adaptivefl", "adaptivefl-variant": "decoupled", "device-proportions": "4:3:3", "device": "cpu",
           "proximal-mu": 0.1, "seed": 3}
    assert SCHEMA.upgrade(old) == {"method": "decoupled", "adaptivefl-tier-proportions": "4:3:3",
                                   "torch-device": "cpu", "fedprox-mu": 0.1, "seed": 3}
    assert SCHEMA.upgrade({"method": "adaptivefl", "adaptivefl-variant": "adaptivefl"}) == {"method": "adaptivefl"}


@pytest.mark.parametrize("method,key,value", [
    ("fedavg", "fedprox-mu", 0.5), ("shefl", "fens-aggregator", "linear"), ("fens", "shefl-models", 3),
    ("heterofl", "adaptivefl-selection", "random"), ("adaptivefl", "scalefl-kd", 0.5), ("fedprox", "fedadam-tau", 0.1),
])
def test_a_key_the_method_does_not_read_is_an_error(method, key, value):
    with pytest.raises(ConfigError) as err:
        validate({"method": method, key: value})
    assert f"'{key}' = {value!r} is not read by method '{method}'" in str(err.value)
    # the ServerApp sees every default (pyproject): a key at its default passes there, but not when the user set it
    validate({"method": method, key: SCHEMA[key].default})
    with pytest.raises(ConfigError, match="is not read by method"):
        validate({"method": method, key: SCHEMA[key].default}, given=[key])
    assert validate({"method": method, key: SCHEMA[key].default}, given=["method"])["method"] == method


def test_shared_keys_are_read_by_each_method_that_declares_them():
    validate({"method": "fens", "fedadam-tau": 0.01})  # FENS phase 2 runs FedAdam
    validate({"method": "decoupled", "adaptivefl-tier-proportions": "1:1:1"})
    validate({"method": "scalefl", "scalefl-kd": 0.5})


def test_every_preset_sets_only_keys_its_method_reads():

    presets = sorted((ROOT / "configs").rglob("*.toml")) + sorted((ROOT / "examples").rglob("*.toml"))
    assert len(presets) > 50
    for preset in presets:
        run_config = tomllib.loads(preset.read_text())
        if "tool" in run_config:  # a pyproject of an example app, not a preset
            continue
        validate(run_config, given=run_config)


def test_method_parameter_objects_match_the_schema():
    """Each method's frozen parameter object reads keys that exist, with the same defaults, and every method-specific
    key is read by the parameter object of each method it declares (docs/architecture.md#params)."""
    from hetfl.methods import METHODS, params_class

    read: dict[str, set[str]] = {}
    for method in METHODS:
        cls = params_class(method)
        run_config = {"method": method, **({"server-holdout": 100} if method in ("fedbe", "fedkd", "fedet") else {})}
        p = cls.from_config(validate(run_config))
        assert p == cls.from_config(validate(run_config))  # comparable
        if dataclasses.fields(p):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(p, dataclasses.fields(p)[0].name, None)
        keys = set(cls.config_keys())
        assert keys <= set(SCHEMA), keys - set(SCHEMA)
        read[method] = keys
        if method not in ("adaptivefl", "heterofl", "scalefl", "decoupled", "all-large"):  # their default is adaptivefl
            assert p == cls(), f"{cls.__name__}: field defaults differ from the run-config defaults"
    for name, key in SCHEMA.items():
        for method in key.methods:
            assert name in read[method], f"key {name!r} declares method {method!r}, whose parameters do not read it"


def test_cross_checks():
    with pytest.raises(ConfigError, match="local-steps"):
        validate({"local-steps": 0, "local-epochs": 0})
    with pytest.raises(ConfigError, match="ag_news"):
        validate({"dataset": "ag_news", "model": "cnn"})


@pytest.mark.parametrize("key,value", [("torch-device", "gpu"), ("torch-device", "cuda:"), ("torch-device", "cuda:x"), ("torch-device", ""),
                                       ("torch-device", "CPU"), ("server-torch-device", "cuda0"), ("server-torch-device", "tpu")])
def test_device_keys_name_key_value_and_allowed(key, value):
    with pytest.raises(ConfigError) as err:
        validate({key: value})
    msg = str(err.value)
    assert f"'{key}' = {value!r}" in msg and "'auto', 'cpu', 'cuda' or 'cuda:N'" in msg


def test_device_precision_augment_schedule_keys():
    cfg = validate({})
    assert (cfg["torch-device"], cfg["server-torch-device"], cfg["precision"], cfg["augment"]) == ("auto", "", "fp32", "none")
    assert (cfg["lr-schedule"], cfg["lr-min"], cfg["drop-last"]) == ("constant", 0.0, False)
    for dev in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert validate({"torch-device": dev, "server-torch-device": dev})["torch-device"] == dev
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


def _documented_errors():
    """Every `$ ... hetfl.launch ...` line of the README and docs followed by an `error:` line."""
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        for cmd, nxt in zip(lines, lines[1:]):
            if cmd.startswith("$ ") and "hetfl.launch" in cmd and nxt.startswith("error: "):
                out.append(pytest.param(cmd, nxt, id=f"{doc.name}:{cmd.split('launch', 1)[1].strip()[:40]}"))
    return out


@pytest.mark.parametrize("cmd,expected", _documented_errors())
def test_documented_error_examples_print_what_the_docs_show(cmd, expected, capsys, monkeypatch):
    """Each error example in the README and docs, run as written: exit code 2 and exactly the documented line."""
    import shlex

    from hetfl import launch

    monkeypatch.chdir(ROOT)
    argv = shlex.split(cmd[2:])
    argv = argv[argv.index("hetfl.launch") + 1:]
    assert launch.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected


def test_there_are_documented_error_examples():
    assert len(_documented_errors()) >= 5


def test_every_parameter_field_defaults_to_its_keys_default():
    """A frozen parameter object's field names its key and repeats the key's default (so that `SHEFLParams(num_models=3)`
    works without a config): the two must agree, for every method's parameter class and the shared ones."""
    from hetfl.common.params import FederationParams, LocalSGDParams
    from hetfl.common.registry import load
    from hetfl.methods import METHODS

    classes = {FederationParams, LocalSGDParams} | {load(p) for spec in METHODS.values() for p in spec.params.values()}
    checked = 0
    for cls in classes:
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if not meta.get("key") or meta.get("nested") is not None or f.default is dataclasses.MISSING:
                continue
            if meta["key"] == "method":  # a variant object named by the method itself, not by the key's default
                continue
            want = SCHEMA[meta["key"]].default
            want = meta["parse"](want) if meta.get("parse") else want
            assert f.default == want, (cls.__name__, f.name, meta["key"], f.default, want)
            checked += 1
    assert checked > 80, checked
