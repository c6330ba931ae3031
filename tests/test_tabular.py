"""Device data beyond images (issue #77): ``dir:`` tables (CSV or Parquet with a ``label`` column, every other numeric
column a feature in file order), checked on a node like image data, the zoo's width-prunable MLP, and runs on
scikit-learn's breast cancer (docs/node-data.md#tables)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from hetfl.data.byo import LocalDataError
from hetfl.data.info import describe_from_directory, from_run_description, run_description
from hetfl.data.load import load_local_data
from hetfl.data.tables import main as tables_main
from hetfl.data.tables import write_table


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return write_table("breast_cancer", tmp_path_factory.mktemp("tables") / "bc")


def _info(path, where="run"):
    return describe_from_directory(path, f"dir:{path}", "", "", 0, where)


def test_a_table_is_described_by_its_numeric_columns_in_file_order_standardised_by_its_train_split(table):
    info = _info(table)
    frame = pd.read_csv(table / "train.csv")
    assert info.kind == "tabular" and info.shape == (30,) and info.num_classes == 2
    assert list(info.features) == [c for c in frame.columns if c != "label"] and info.features[0] == "mean_radius"
    x = frame.drop(columns="label").to_numpy(np.float64)
    assert np.allclose(info.mean, x.mean(0)) and np.allclose(info.std, x.std(0))
    again = from_run_description(run_description(info))  # what the server sends the nodes
    assert (again.features, again.mean, again.std, again.shape) == (info.features, info.mean, info.std, info.shape)


def test_csv_and_parquet_give_the_same_arrays_and_the_normaliser_standardises(table, tmp_path):
    from hetfl.common.train import Normalizer

    pq = write_table("breast_cancer", tmp_path / "pq", fmt="parquet")
    info = _info(table)
    a = load_local_data(table, info, "csv")
    b = load_local_data(pq, info, "parquet")
    assert a.x.dtype == np.float32 and a.x.shape == (455, 30) and np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    z = Normalizer(info)(torch.as_tensor(a.x))
    assert torch.allclose(z.mean(0), torch.zeros(30), atol=1e-4) and torch.allclose(z.std(0, unbiased=False),
                                                                                    torch.ones(30), atol=1e-3)


def test_a_node_whose_table_lacks_or_adds_a_feature_column_fails_in_one_line(table, tmp_path):
    run = _info(table)
    frame = pd.read_csv(table / "train.csv")
    (tmp_path / "less").mkdir()
    frame.drop(columns="mean_area").to_csv(tmp_path / "less" / "train.csv", index=False)
    with pytest.raises(LocalDataError) as err:
        describe_from_directory(tmp_path / "less", f"dir:{table}", "", "", 0, "node data-path 'less'", run=run)
    msg = str(err.value)
    assert "\n" not in msg and re.search(r"missing \['mean_area'\], extra \[\]", msg), msg
    (tmp_path / "more").mkdir()
    frame.assign(battery=1.0).to_csv(tmp_path / "more" / "train.csv", index=False)
    with pytest.raises(LocalDataError, match=r"missing \[\], extra \['battery'\]"):
        load_local_data(tmp_path / "more", run, "node data-path 'more'")
    (tmp_path / "gap").mkdir()
    frame.assign(mean_area=frame["mean_area"].where(frame.index != 3)).to_csv(tmp_path / "gap" / "train.csv", index=False)
    with pytest.raises(LocalDataError, match=r"feature column\(s\) \['mean_area'\] hold missing or infinite values"):
        load_local_data(tmp_path / "gap", run, "node data-path 'gap'")
    # a node's table with the columns in another order is read in the run's order
    (tmp_path / "shuffled").mkdir()
    frame[["label", *reversed(run.features)]].to_csv(tmp_path / "shuffled" / "train.csv", index=False)
    assert np.array_equal(load_local_data(tmp_path / "shuffled", run, "s").x, load_local_data(table, run, "t").x)


def test_the_mlp_is_width_prunable_and_its_pool_grows_strictly():
    from hetfl.adaptivefl_app.core import SubmodelPool
    from hetfl.common.models import build_model, hidden_widths

    assert hidden_widths("mlp") == (16, 64, 256)
    full, narrow = build_model("mlp", 2, (30,)), build_model("mlp", 2, (30,), widths=(16, 32, 64))
    assert all(n.shape[i] <= f.shape[i] for (_, n), (_, f) in zip(narrow.state_dict().items(), full.state_dict().items())
               for i in range(n.dim()))
    pool = SubmodelPool("mlp", 2, (30,))
    sizes = [e.size for e in pool.entries]
    assert sizes == sorted(set(sizes)) and [e.name for e in pool.entries] == ["S2", "S1", "M2", "M1", "L1"]
    from hetfl import methods

    with pytest.raises(ValueError, match="it is a tabular model and the dataset holds image data"):
        methods.validate({"dataset": "fashion_mnist", "model": "mlp"})


@pytest.mark.parametrize("method", ["fedavg", "adaptivefl"])
def test_a_federated_run_on_a_table_learns(method, table, tmp_path):
    from hetfl.inprocess import run_in_process, task_identity

    cfg = {"dataset": f"dir:{table}", "model": "mlp", "method": method, "partitioner": "dirichlet",
           "dirichlet-alpha": 0.6, "num-server-rounds": 4, "fraction-train": 1.0, "local-steps": 10,
           "batch-size": 16, "lr": 0.1, "min-available-nodes": 4, "checkpoint": False}
    with task_identity():
        m = run_in_process(cfg, 4, tmp_path, method)
    acc = [r["accuracy"] for r in m["rounds"]]
    assert acc[-1] > 0.85 and acc[-1] > acc[0], acc


def test_hetfl_tables_writes_a_dir_dataset_and_refuses_an_unknown_table(tmp_path, capsys):
    assert tables_main(["wine", str(tmp_path / "wine"), "--format", "parquet"]) == 0
    assert sorted(p.name for p in (tmp_path / "wine").iterdir()) == ["test.parquet", "train.parquet"]
    assert tables_main(["digits", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == ("error: table 'digits' is not allowed; expected one of breast_cancer, "
                                               "wine, iris")
