"""Node-local data (`data-path`), the exported split (`python -m hetfl.export`), the server's own data
(`server-data-path`) and bring-your-own datasets and models (docs/node-data.md, docs/bring-your-own.md).

Everything runs on scikit-learn's digits and a few hand-made images, so each test takes seconds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from PIL import Image

from hetfl.common.config import ConfigError

from hetfl.common.task import config_of, make_model
from hetfl.methods import SCHEMA, validate
from hetfl.common.hosting import node_client_id
from hetfl.common.rundata import client_data, eval_splits
from hetfl.common.train import Normalizer
from hetfl.data import info, load
from hetfl.data.arrays import ArrayData
from hetfl.data.byo import LocalDataError, content_client_id, is_local_data_error
from hetfl.data.convert import to_hf
from hetfl.data.info import dataset_info
from hetfl.data.load import load_eval, load_local_data, load_partition, load_server_set, local_arrays, local_datasetdict
from hetfl.data.spec import DataSpec
from hetfl.launch import PreflightError, preflight

ROOT = Path(__file__).resolve().parent.parent
DIGITS = {"dataset": "digits", "partitioner": "dirichlet", "dirichlet-alpha": 0.5, "dirichlet-min-size": 5,
          "partition-seed": 42, "min-available-nodes": 4}


def ctx(run_config: dict, **node_config) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=dict(run_config))


def digits(n: int = 40) -> ArrayData:
    train = local_arrays("digits")[0]
    return ArrayData(train.x[:n], train.y[:n])


def save(ds, path: Path) -> Path:
    ds.save_to_disk(str(path))
    return path


def write_pngs(root: Path, images: dict[str, list[np.ndarray]]) -> Path:
    """An image folder: one subfolder per class."""
    for cls, arrays in images.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for k, a in enumerate(arrays):
            Image.fromarray(a).save(root / cls / f"{k:03d}.png")
    return root


# --- formats ------------------------------------------------------------------------------------------------


def _save_to_disk_dataset(tmp: Path):
    d = digits()
    return save(to_hf("digits", d), tmp / "ds"), d


def _save_to_disk_datasetdict(tmp: Path):
    """A DatasetDict (train + test) with PIL image features, as a hub dataset is saved: the train split is taken."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as ImageFeature

    d, other = digits(40), digits(60)
    feats = Features({"image": ImageFeature(), "label": ClassLabel(num_classes=10)})
    split = lambda a: Dataset.from_dict({"image": [Image.fromarray(i[0]) for i in a.x], "label": a.y.tolist()},  # noqa: E731
                                        features=feats)
    return save(DatasetDict({"train": split(d), "test": split(ArrayData(other.x[40:], other.y[40:]))}), tmp / "dd"), d


def _image_folder(tmp: Path):
    d = digits(12)
    cls = {"3": d.x[:5, 0], "7": d.x[5:12, 0]}  # the folders' own ids are 0, 1; the run's (digits') are 3, 7
    root = write_pngs(tmp / "imgs", {k: list(v) for k, v in cls.items()})
    return root, ArrayData(d.x, np.array([3] * 5 + [7] * 7, np.int64))


FORMATS = {"save_to_disk Dataset": _save_to_disk_dataset, "save_to_disk DatasetDict": _save_to_disk_datasetdict,
           "imagefolder": _image_folder}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_loads_through_the_node_path(fmt, tmp_path, monkeypatch):
    path, expected = FORMATS[fmt](tmp_path)
    # the node never reads the run's dataset: every way to the global data fails here
    for module, name in ((load, "local_arrays"), (load, "read_reference"), (info, "read_reference"),
                         (load, "_partitioner_for"), (load, "source_arrays")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a node with data-path read the global dataset"))
    cfg = validate(DIGITS)
    got = client_data(ctx(DIGITS, **{"data-path": str(path)}), cfg)
    assert got.x.dtype == np.uint8 and got.x.shape == expected.x.shape == (len(expected), 1, 8, 8)
    assert np.array_equal(got.x, expected.x) and np.array_equal(got.y, expected.y)


def test_text_csv_loads_for_a_text_run(tmp_path):
    """AG News-shaped node data as a CSV file (columns text, label): read by datasets' csv reader."""
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "train.csv").write_text("text,label\nstocks rally,2\nnew chip,3\nelection day,0\n")
    run = {"dataset": "ag_news", "model": "text"}
    got = load_local_data(tmp_path / "news", dataset_info("ag_news"), "node data-path 'news'")
    assert got.x.tolist() == ["stocks rally", "new chip", "election day"] and got.y.tolist() == [2, 3, 0]
    assert validate(run)["dataset"] == "ag_news"


# --- data that does not fit the run: one clear error -------------------------------------------------------


def _bad(tmp: Path, case: str) -> tuple[Path, str, dict]:
    """(data-path, a fragment the message must hold, run config) for each way node data can miss the run."""
    from datasets import Dataset

    d = digits(20)
    if case == "shape":  # 8x8 digits for a 28x28 Fashion-MNIST run
        return save(to_hf("digits", d), tmp / case), "images of shape (1, 8, 8) (channels, height, width); the run expects (1, 28, 28)", {"dataset": "fashion_mnist"}
    if case == "channels":  # RGB images for a grayscale run
        rgb = [np.repeat(i[0][:, :, None], 3, axis=2) for i in d.x[:4]]
        return write_pngs(tmp / case, {"a": rgb[:2], "b": rgb[2:]}), "images of shape (3, 8, 8)", DIGITS
    if case == "label":  # a label outside [0, 10)
        y = d.y.copy()
        y[3] = 10  # the boundary: classes are 0..9
        ds = Dataset.from_dict({"image": d.x[:, 0].tolist(), "label": y.tolist()})
        return save(ds, tmp / case), "label(s) outside [0, 10) (e.g. 10 at row 3", DIGITS
    if case == "columns":  # other column names
        ds = Dataset.from_dict({"pixels": d.x[:, 0].tolist(), "target": d.y.tolist()})
        return save(ds, tmp / case), "has the columns ['pixels', 'target']; the run expects the columns ['image', 'label']", DIGITS
    if case == "empty":  # as python -m hetfl.export writes an empty partition: one empty shard
        to_hf("digits", ArrayData(d.x[:0], d.y[:0])).save_to_disk(str(tmp / case), num_shards=1)
        return tmp / case, "holds no rows; the run expects at least one labelled example", DIGITS
    if case == "empty-no-shards":  # save_to_disk's default for no rows: no data file, which load_from_disk cannot read
        return save(to_hf("digits", ArrayData(d.x[:0], d.y[:0])), tmp / case), "holds no rows", DIGITS
    if case == "missing":
        return tmp / case, "no such directory", DIGITS
    if case == "unreadable":
        (tmp / case).mkdir()
        (tmp / case / "weights.bin").write_bytes(b"\0" * 64)
        return tmp / case, "could not be read as a dataset", DIGITS
    if case == "truncated-arrow":  # a copy cut short: the Arrow file ends mid-record
        path = save(to_hf("digits", d), tmp / case)
        arrow = next(path.glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
        return path, "could not be read as a dataset", DIGITS
    if case == "bad-image":  # an image folder with one file that is not an image
        root = write_pngs(tmp / case, {"a": [i[0] for i in d.x[:2]], "b": [i[0] for i in d.x[2:4]]})
        (root / "b" / "002.png").write_bytes(b"not a png")
        return root, "could not be read as a dataset", DIGITS
    if case == "string-labels":  # class names as plain strings, not a ClassLabel, on a run of a named dataset
        ds = Dataset.from_dict({"image": d.x[:, 0].tolist(), "label": [f"c{v}" for v in d.y]})
        return save(ds, tmp / case), "label column 'label' holds <U2 values (e.g. 'c3'); the run expects integer class ids in [0, 10)", DIGITS
    if case == "two-label-columns":  # 'label' and a second label column: the run reads 'label' only
        ds = Dataset.from_dict({"image": d.x[:, 0].tolist(), "label": d.y.tolist(), "fine_label": d.y.tolist()})
        return save(ds, tmp / case), "has the columns ['image', 'label', 'fine_label']", DIGITS
    raise KeyError(case)


@pytest.mark.parametrize("case", ["shape", "channels", "label", "columns", "empty", "empty-no-shards", "missing", "unreadable",
                                  "truncated-arrow", "bad-image", "string-labels", "two-label-columns"])
def test_bad_node_data_raises_one_clear_error(case, tmp_path):
    path, fragment, run = _bad(tmp_path, case)
    with pytest.raises(LocalDataError) as err:
        client_data(ctx(run, **{"data-path": str(path)}), validate(run))
    msg = str(err.value)
    assert re.match(rf"(client \d+: )?node data-path {re.escape(repr(str(path)))}: ", msg), msg
    assert fragment in msg and "\n" not in msg, msg
    # the server recognises it in a failed reply, from either engine
    assert is_local_data_error(f"<class 'hetfl.data.byo.LocalDataError'>:<'{msg}'>")
    assert is_local_data_error(f"<class 'ClientAppException'>:<'\nException ClientAppException occurred. Message: {msg}'>")
    assert not is_local_data_error("<class 'ValueError'>:<'state mismatch'>")


def test_a_bad_server_data_path_names_the_key(tmp_path):
    path, fragment, run = _bad(tmp_path, "label")
    run = {**run, "server-data-path": str(path)}
    with pytest.raises(LocalDataError, match=rf"^run-config key 'server-data-path' = '{path}': .*label\(s\) outside"):
        eval_splits(validate(run))
    with pytest.raises(PreflightError, match=r"'server-data-path'.*outside \[0, 10\)"):
        preflight(run)


# --- client ids ----------------------------------------------------------------------------------------------


def test_client_id_from_node_config_or_data_content(tmp_path):
    a = save(to_hf("digits", digits(30)), tmp_path / "a")
    shutil.copytree(a, tmp_path / "copy")
    b = save(to_hf("digits", digits(31)), tmp_path / "b")
    assert node_client_id(ctx({}, **{"data-path": str(a), "client-id": 5, "partition-id": 2})) == 5
    assert node_client_id(ctx({}, **{"data-path": str(a), "partition-id": 2, "num-partitions": 4})) == 2
    content = node_client_id(ctx({}, **{"data-path": str(a)}))
    assert 0 <= content < 2**31 and content == content_client_id(a)
    assert node_client_id(ctx({}, **{"data-path": str(tmp_path / "copy")})) == content  # a copy is the same client
    assert node_client_id(ctx({}, **{"data-path": str(b)})) != content  # one more row: another client
    with pytest.raises(ValueError, match="client-id='x'; expected a non-negative integer"):
        node_client_id(ctx({}, **{"client-id": "x"}))
    with pytest.raises(KeyError, match='data-path="<dir>"'):
        node_client_id(ctx({}))


# --- export == simulation -------------------------------------------------------------------------------------


def _export(tmp: Path, *sets: str, clients: int = 4) -> Path:
    from hetfl import export

    out = tmp / "split"
    assert export.main([str(ROOT / "configs/quickstart.toml"), "--out", str(out), "--clients", str(clients),
                        "--set", *sets]) == 0
    return out


def _overrides(sets) -> dict:
    from hetfl.launch import parse_set

    return parse_set(list(sets))


@pytest.mark.parametrize("sets", [
    ('dataset="digits"', 'partitioner="dirichlet"', "dirichlet-alpha=0.5", "dirichlet-min-size=5"),
    ('dataset="digits"', 'partitioner="shards"', "shards-per-client=2", "server-holdout=100"),
], ids=["dirichlet", "shards+holdout"])
def test_exported_split_is_the_simulations_split(sets, tmp_path, capsys):
    import tomllib

    out = _export(tmp_path, *sets)
    run = {**tomllib.loads((ROOT / "configs/quickstart.toml").read_text()), **_overrides(sets)}
    cfg = validate(run)
    spec = DataSpec.from_config(cfg, 4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num-partitions"] == 4 and manifest["partition-key"] == spec.key()
    for i in range(4):
        sim = load_partition(spec, i, cfg["cache-dir"])
        node = client_data(ctx(run, **{"data-path": str(out / f"client-{i}"), "client-id": i}), cfg)
        assert len(sim) > 0 and np.array_equal(node.x, sim.x) and np.array_equal(node.y, sim.y), i  # same rows, same order
        assert manifest["clients"][i]["rows"] == len(sim)
    served = {**cfg, "server-data-path": manifest["run-config"]["server-data-path"]}
    for a, b in zip(eval_splits(cfg), eval_splits(served)):
        assert (a is None and b is None) or (np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y))
    half = {**cfg, "eval-split": "test-half", "max-test-samples": 101}  # eval-split semantics kept
    for a, b in zip(eval_splits(half), eval_splits({**half, "server-data-path": served["server-data-path"]})):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    if cfg["server-holdout"]:
        assert np.array_equal(load_server_set(spec).x, load_server_set(DataSpec.from_config(served, 1)).x)
    from flwr.common.config import parse_config_args

    printed = capsys.readouterr().out.split("--node-config ", 1)[1].splitlines()[0]  # as flower-supernode parses it
    for text in (printed.strip("'"), manifest["node-config"]):
        assert parse_config_args([text.replace("<i>", "2")]) == {"data-path": str(out / "client-2"), "client-id": 2}


def test_export_refuses_a_non_empty_directory_and_bad_keys(tmp_path, capsys):
    from hetfl import export

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SystemExit) as err:
        export.main([str(ROOT / "configs/quickstart.toml"), "--out", str(tmp_path / "full"), "--set", 'dataset="digits"'])
    assert err.value.code == 2 and "is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        export.main([str(ROOT / "configs/quickstart.toml"), "--out", str(tmp_path / "o"), "--set", 'partitioner="random"'])
    assert err.value.code == 2 and "'partitioner' = 'random'" in capsys.readouterr().err


# --- bring your own dataset ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> Path:
    """scikit-learn's digits as a save_to_disk DatasetDict: the named 'digits' dataset's rows, in its order."""
    return save(local_datasetdict("digits"), tmp_path_factory.mktemp("byo") / "digits")


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "shards"])
def test_a_dir_dataset_partitions_like_the_named_one(partitioner, digits_dir):
    named = DataSpec(dataset="digits", source="local", partitioner=partitioner, num_partitions=5, alpha=0.5,
                     min_partition_size=5, shards_per_client=2, seed=3)
    own = DataSpec(**{**named.__dict__, "dataset": f"dir:{digits_dir}"})
    assert own.key() != named.key() and own.info.shape == (1, 8, 8) and own.info.num_classes == 10
    for i in range(5):
        a, b = load_partition(named, i), load_partition(own, i)
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    t1, t2 = load_eval(named), load_eval(own)
    assert np.array_equal(t1.x, t2.x) and np.array_equal(t1.y, t2.y)


def test_a_hub_dataset_partitions_like_the_named_one(digits_dir, monkeypatch):
    """`hub:<id>` goes through datasets.load_dataset (its cache serves offline runs); here it returns digits."""
    import datasets

    seen = []
    monkeypatch.setattr(datasets, "load_dataset", lambda ref, subset=None, **k: seen.append((ref, subset)) or
                        datasets.load_from_disk(str(digits_dir)))
    own = DataSpec(dataset="hub:someone/digits:plain", partitioner="dirichlet", num_partitions=4, alpha=0.5,
                   min_partition_size=5)
    named = DataSpec(**{**own.__dict__, "dataset": "digits", "source": "local"})
    assert np.array_equal(load_partition(own, 2).x, load_partition(named, 2).x)
    assert seen[0] == ("someone/digits", "plain")


def test_columns_and_classes_come_from_the_keys(tmp_path):
    from datasets import Dataset, DatasetDict

    d = digits(30)
    rows = {"pixels": d.x[:, 0].tolist(), "digit": d.y.tolist()}  # plain int labels: no ClassLabel
    path = save(DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict(rows)}), tmp_path / "own")
    run = {"dataset": f"dir:{path}", "input-column": "pixels", "label-column": "digit", "min-available-nodes": 2}
    with pytest.raises(PreflightError, match=r"^run-config key 'dataset' = .*plain integers.*'num-classes'"):
        preflight(run)
    cfg = preflight({**run, "num-classes": 10})
    got = client_data(ctx(cfg, **{"partition-id": 0, "num-partitions": 2}), cfg)
    assert got.x.shape[1:] == (1, 8, 8) and len(got) > 0 and eval_splits(cfg)[1].y.max() == 9
    fewer = validate({**run, "num-classes": 5})  # the cached evaluation set of 10 classes is not reused unchecked
    with pytest.raises(LocalDataError, match=r"label\(s\) outside \[0, 5\)"):
        eval_splits(fewer)
    with pytest.raises(LocalDataError, match=r"label\(s\) outside \[0, 5\)"):
        client_data(ctx(fewer, **{"partition-id": 0, "num-partitions": 2}), fewer)
    with pytest.raises(PreflightError, match=r"has the columns \['pixels', 'digit'\]; expected an input column"):
        preflight({"dataset": f"dir:{path}"})


@pytest.mark.parametrize("run,fragment", [
    ({"dataset": "imagenet"}, "'dataset' = 'imagenet' is not allowed; expected one of 'fashion_mnist'"),
    ({"dataset": "hub:"}, "'hub:<id>[:<subset>]' or 'dir:<directory>'"),
    ({"dataset": "cifar10", "input-column": "image"}, "'input-column' = 'image' does not fit dataset 'cifar10'; expected '' or 'img'"),
    ({"dataset": "digits", "num-classes": 12}, "'num-classes' = 12 does not fit dataset 'digits'; expected 0 or 10"),
    ({"model": "my models:build"}, "'model' = 'my models:build' is not allowed"),
    ({"model": "my_model:build", "width": 0.5}, "'width' = 0.5 does not apply to model 'my_model:build'"),
    ({"method": "adaptivefl", "model": "my_model:build"}, "AdaptiveFL needs a width-prunable model"),
])
def test_new_keys_are_validated_with_one_line(run, fragment):
    with pytest.raises(ConfigError) as err:
        validate(run)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("dataset,fragment", [
    ("dir:/nonexistent/hetfl-data", "run-config key 'dataset' = 'dir:/nonexistent/hetfl-data': no such directory"),
    ("train-only", "has no split named 'test' for the server's evaluation"),
    ("fewer-classes", "label column 'label' is a ClassLabel of 10 classes; run-config key 'num-classes' = 5 is fewer"),
])
def test_preflight_checks_a_dir_dataset(dataset, fragment, tmp_path):
    run = {}
    if dataset == "train-only":
        dataset = f"dir:{save(to_hf('digits', digits(20)), tmp_path / 'train-only')}"
    if dataset == "fewer-classes":
        dataset, run = f"dir:{save(local_datasetdict('digits'), tmp_path / 'dd')}", {"num-classes": 5}
    with pytest.raises(PreflightError) as err:
        preflight({"dataset": dataset, **run})
    assert fragment in str(err.value)


# --- bring your own model -------------------------------------------------------------------------------------

BUILDERS = '''
import torch
from torch import nn

def mlp(num_classes, input_shape):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))

def wrong_head(num_classes, input_shape):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))

def not_a_module(num_classes, input_shape):
    return "mlp"

def crashes(num_classes, input_shape):
    raise RuntimeError("no GPU here")
'''


@pytest.fixture
def builders(tmp_path, monkeypatch):
    (tmp_path / "hetfl_test_builders.py").write_text(BUILDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hetfl_test_builders"


@pytest.mark.parametrize("fn,fragment", [
    ("wrong_head", "to (2, 3); expected logits of shape (2, 10)"),
    ("not_a_module", "returned str; expected fn(num_classes: int, input_shape: tuple[int, ...]) -> torch.nn.Module"),
    ("crashes", "raised RuntimeError: no GPU here when called as fn(10, (1, 8, 8))"),
    ("missing", "has no callable 'missing'"),
])
def test_preflight_checks_the_model_builder(fn, fragment, builders):
    with pytest.raises(PreflightError) as err:
        preflight({"dataset": "digits", "model": f"{builders}:{fn}"})
    msg = str(err.value)
    assert msg.startswith(f"run-config key 'model' = '{builders}:{fn}'") and fragment in msg and "\n" not in msg, msg
    with pytest.raises(PreflightError, match=r"cannot import module 'no_such_module' \(ModuleNotFoundError"):
        preflight({"dataset": "digits", "model": "no_such_module:build"})


def test_a_builder_builds_the_runs_model(builders):
    cfg = preflight({"dataset": "digits", "model": f"{builders}:mlp"})
    a, b = make_model(cfg), make_model(cfg)
    assert [tuple(p.shape) for p in a.parameters()] == [(10, 64), (10,)]
    assert all(np.array_equal(p.detach(), q.detach()) for p, q in zip(a.parameters(), b.parameters()))  # seeded


def test_a_node_describes_a_reference_from_its_own_data(tmp_path, monkeypatch):
    """A node with data-path never reads the server's `dir:` reference: model and checks follow its own data."""
    path = save(to_hf("digits", digits(30)), tmp_path / "node")
    run = {"dataset": "dir:/server/only/digits", "num-classes": 10, "model": "cnn"}
    monkeypatch.setattr(info, "_DESCRIBED", {})
    monkeypatch.setattr(info, "_BY_NAME", {})
    context = ctx(run, **{"data-path": str(path)})
    cfg = config_of(context, SCHEMA)
    assert make_model(cfg)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert len(client_data(context, cfg)) == 30
    assert Normalizer(cfg["dataset"]).mean.flatten().tolist() == [0.5 * 255]  # by name, as the server apps ask


# --- end to end: the real ServerApp and ClientApp code on an in-process grid -----------------------------------


def _run(run_config: dict, node_configs: list[dict], results: Path, name: str) -> dict:
    """run_in_process with the given node configs (e.g. data-path nodes) instead of partition ids."""
    from hetfl.inprocess import InProcessGrid, task_identity
    from hetfl.server_app import main

    run_config = {**run_config, "results-dir": str(results), "run-name": name}
    grid = InProcessGrid(run_config, len(node_configs))
    grid.contexts = {nid: Context(run_id=1, node_id=nid, node_config=nc, state=RecordDict(), run_config=run_config)
                     for nid, nc in zip(grid.contexts, node_configs)}
    with task_identity():
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    return json.loads((results / name / "metrics.json").read_text())


E2E = {"method": "fedavg", "num-server-rounds": 2, "fraction-train": 0.5, "local-steps": 20, "lr": 0.05, "momentum": 0.9,
       "batch-size": 16, "checkpoint": False, "seed": 1}


def test_nodes_on_the_exported_split_repeat_the_simulation(tmp_path):
    """FedAvg on 4 SuperNodes with data-path = the exported client-<i> and client-id = i, server-data-path = the
    exported server/: the run of the simulation, round for round (same clients, accuracy, loss and bytes)."""
    from .test_determinism import _rows

    sets = ('dataset="digits"', "dirichlet-alpha=0.5", "dirichlet-min-size=5", "min-available-nodes=4")
    out = _export(tmp_path, *sets)
    run = {**E2E, **_overrides(sets)}
    sim = _run(run, [{"partition-id": i, "num-partitions": 4} for i in range(4)], tmp_path, "sim")
    dep = _run({**run, "server-data-path": str(out / "server")},
               [{"data-path": str(out / f"client-{i}"), "client-id": i} for i in range(4)], tmp_path, "dep")
    assert _rows(dep) == _rows(sim) and len(sim["rounds"]) == 3
    assert sim["rounds"][-1]["accuracy"] > sim["rounds"][0]["accuracy"]


def test_own_dataset_and_own_model_end_to_end(digits_dir, tmp_path, monkeypatch):
    """The guide's example (docs/bring-your-own.md): a dir: dataset and examples/byo/my_model.py:build."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "byo"))
    run = {**E2E, "dataset": f"dir:{digits_dir}", "model": "my_model:build", "min-available-nodes": 4,
           "fraction-train": 1.0, "dirichlet-min-size": 5}
    preflight(run, 4)
    m = _run(run, [{"partition-id": i, "num-partitions": 4} for i in range(4)], tmp_path, "byo")
    acc = [r["accuracy"] for r in m["rounds"]]
    assert acc[0] < 0.2 and acc[-1] > 0.5, acc  # 10 classes: chance is 0.1
    assert m["config"]["model"] == "my_model:build"
