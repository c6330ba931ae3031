import numpy as np
import pytest

from hetfl.data import cache, load
from hetfl.data.arrays import ROW, column
from hetfl.data.catalog import DATASETS, DatasetUnavailable
from hetfl.data.convert import from_hf
from hetfl.data.load import load_partition, load_test, local_datasetdict
from hetfl.data.partition import make_partitioner
from hetfl.data.spec import DataSpec

from .conftest import require_fmnist


def spec(**kw):
    base = dict(dataset="digits", source="local", partitioner="dirichlet", num_partitions=10, alpha=0.5,
                min_partition_size=5, seed=42)
    base.update(kw)
    return DataSpec(**base)


def all_parts(s):
    return [load_partition(s, i) for i in range(s.num_partitions)]


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "shards"])
def test_partitions_cover_train_split_disjointly(partitioner):
    s = spec(partitioner=partitioner, shards_per_client=2)
    parts = all_parts(s)
    n_train = len(local_datasetdict("digits")["train"])
    sizes = [len(p) for p in parts]
    if partitioner == "shards":  # num_partitions * shards_per_client shards of n // total samples
        assert sum(sizes) == (n_train // 20) * 20
    else:
        assert sum(sizes) == n_train
    # disjoint: no image (row) appears twice across partitions
    rows = np.concatenate([p.x.reshape(len(p), -1) for p in parts])
    ys = np.concatenate([p.y for p in parts])
    assert rows.dtype == np.uint8 and rows.shape[1] == 64
    assert len(np.unique(np.c_[rows, ys], axis=0)) >= len(rows) - 5  # digits has a few duplicate images


def test_a_train_fraction_partitions_the_first_rows_of_the_seeded_shuffle_and_keeps_the_servers_holdout():
    """FENS Sec. 3.3.1's data volume: the same clients share the first `train_fraction` of the shuffled rows left
    after the server's holdout; the holdout and, at 1.0, every cache key are those of a run without the key."""
    n_train = len(local_datasetdict("digits")["train"])
    whole = spec(server_holdout=100)
    assert spec().key() == spec(train_fraction=1.0).key() and spec(train_fraction=0.5).key() != spec().key()
    clients, server = load._local_train_splits(whole)
    for frac in (0.5, 0.1):
        s = spec(server_holdout=100, train_fraction=frac)
        k = round(frac * (n_train - 100))
        part_clients, part_server = load._local_train_splits(s)
        assert part_clients[ROW] == clients[ROW][:k] and part_server[ROW] == server[ROW]  # the first k, same holdout
        sizes = [len(load_partition(s, i)) for i in range(s.num_partitions)]
        assert sum(sizes) == k and min(sizes) >= s.min_partition_size, sizes  # every client keeps data


def test_partitions_are_deterministic_and_seeded(tmp_path):
    a = load_partition(spec(), 3, cache_dir=str(tmp_path / "a"))
    cache._MEM.clear()
    load._partitioner_for.cache_clear()
    b = load_partition(spec(), 3, cache_dir=str(tmp_path / "b"))  # recomputed from scratch
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    c = load_partition(spec(seed=7), 3, cache_dir=str(tmp_path / "c"))
    assert len(c) != len(a) or not np.array_equal(c.y, a.y)
    assert (tmp_path / "a" / "digits" / spec().key() / "part-00003.npz").exists()


def _mean_max_class_fraction(alpha):
    parts = all_parts(spec(alpha=alpha))
    return np.mean([np.bincount(p.y, minlength=10).max() / len(p) for p in parts])


def test_label_skew_grows_as_alpha_shrinks():
    skew = [_mean_max_class_fraction(a) for a in (100.0, 1.0, 0.1)]
    assert skew[0] < skew[1] < skew[2], skew
    assert skew[0] < 0.25 and skew[2] > 0.5, skew


def test_partition_id_checked():
    with pytest.raises(ValueError, match="partition-id"):
        load_partition(spec(), 10)


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetUnavailable, match="cifar-10-python.tar.gz"):
        load_partition(DataSpec(dataset="cifar10", source="local", data_dir=str(tmp_path)), 0, cache_dir=str(tmp_path))


def test_hub_path_gives_the_same_partitions_as_local(monkeypatch, tmp_path):
    """FederatedDataset (the hub path) fed the same rows yields identical partitions."""
    import flwr_datasets.federated_dataset as fdmod

    local = local_datasetdict("digits")
    monkeypatch.setattr(fdmod.datasets, "load_dataset", lambda *a, **k: local)
    monkeypatch.setitem(DATASETS, "digits", DATASETS["digits"].__class__(**{**DATASETS["digits"].__dict__, "hub_id": "fake/digits"}))
    # the local path partitions a row index (labels + row positions) and takes the rows from the arrays;
    # the hub path partitions the full rows, images included: both must give the same arrays
    for partitioner, holdout, frac in (("iid", 0, 1.0), ("dirichlet", 0, 1.0), ("shards", 0, 1.0), ("dirichlet", 100, 1.0),
                                       ("iid", 0, 0.25), ("dirichlet", 100, 0.5)):
        s_local = spec(partitioner=partitioner, shards_per_client=2, server_holdout=holdout, train_fraction=frac)
        s_hub = spec(partitioner=partitioner, shards_per_client=2, server_holdout=holdout, source="hub",
                     train_fraction=frac)
        hub_part = load._partitioner_for(s_hub)
        loc_part = load._partitioner_for(s_local)
        assert ROW in loc_part.dataset.column_names and "image" not in loc_part.dataset.column_names
        pairs = [(from_hf("digits", hub_part.load_partition(pid)), load._to_arrays(s_local, loc_part.load_partition(pid)))
                 for pid in (0, 4, 9)]
        if holdout:
            pairs.append((from_hf("digits", hub_part.load_split("server")),
                          load._to_arrays(s_local, load._local_train_splits(s_local)[1])))
        for h, l in pairs:
            assert len(h) > 0 and np.array_equal(h.x, l.x) and np.array_equal(h.y, l.y), (partitioner, holdout, frac)
    # the test split: the hub's shuffled rows
    h = from_hf("digits", load._partitioner_for(spec(partitioner="iid", num_partitions=1, source="hub")).load_split("test"))
    l = load_test("digits", "local", cache_dir=str(tmp_path))
    assert np.array_equal(h.x, l.x) and np.array_equal(h.y, l.y)


def test_fmnist_local_idx():
    require_fmnist()
    test = load_test("fashion_mnist", "local")
    assert test.x.shape == (10000, 1, 28, 28) and test.x.dtype == np.uint8
    assert np.array_equal(np.bincount(test.y), [1000] * 10)
    s = DataSpec(dataset="fashion_mnist", source="local", partitioner="shards", num_partitions=100, shards_per_client=4)
    parts = [load_partition(s, i) for i in range(0, 100, 10)]
    assert all(len(p) == 600 for p in parts)  # 400 shards of 150
    labels = [len(np.unique(p.y)) for p in parts]
    assert max(labels) <= 8 and np.mean(labels) <= 5, labels  # pathological: ~4 classes each


def test_empty_partitions_load_as_empty_arrays():
    s = spec(alpha=0.01, min_partition_size=0, num_partitions=30)
    parts = all_parts(s)
    empty = [p for p in parts if len(p) == 0]
    assert empty, [len(p) for p in parts]  # Dirichlet(0.01) over 30 clients leaves some without data
    assert all(p.x.shape == (0, 1, 8, 8) and p.x.dtype == np.uint8 and p.y.shape == (0,) for p in empty)
    assert sum(len(p) for p in parts) == len(local_datasetdict("digits")["train"])


def _rows(part, n=10):
    """Each partition's rows of the digits train split, through the public Partitioner interface."""
    return [column(part.load_partition(i), ROW).tolist() for i in range(n)]


@pytest.mark.parametrize("balance", [False, True])
def test_resampling_dirichlet_equals_flwr_datasets_where_flwr_succeeds(balance):
    # min size 60 on digits at Dir(0.5) needs 3 draws, within flwr-datasets' 11
    import warnings

    from flwr_datasets.partitioner import DirichletPartitioner

    s = spec(min_partition_size=60, balance=balance)
    ours = make_partitioner(s, 0)
    theirs = DirichletPartitioner(num_partitions=10, partition_by="label", alpha=0.5, min_partition_size=60,
                                  self_balancing=balance, seed=42)
    ours.dataset = theirs.dataset = load._local_train_splits(s)[0]  # the digits train split's row index, shuffled
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr-datasets warns once per redraw
        expected = _rows(theirs)
    assert _rows(ours) == expected
    assert 1 < ours.draws <= 11  # the case exercises redrawing


def test_resampling_dirichlet_fails_with_the_key_when_draws_run_out():
    s = spec(alpha=0.01, min_partition_size=10, num_partitions=30, max_draws=3)
    with pytest.raises(ValueError, match="dirichlet-max-draws = 3"):
        load_partition(s, 0)


def test_fens_dirichlet_001_gives_20_non_empty_clients_on_fmnist():
    # FENS authors: redraw until every client holds >= 10 samples (about 1,000 draws here)
    require_fmnist()
    import tomllib
    from pathlib import Path

    cfg = tomllib.loads((Path(__file__).parents[1] / "configs/fens/fmnist-dir0.01.toml").read_text())
    s = DataSpec(dataset="fashion_mnist", source="local", partitioner="dirichlet", num_partitions=20,
                 alpha=cfg["dirichlet-alpha"], min_partition_size=cfg["dirichlet-min-size"],
                 balance=cfg["dirichlet-balance"], max_draws=cfg["dirichlet-max-draws"])
    p = make_partitioner(s, 0)
    p.dataset = load._local_train_splits(s)[0]
    sizes = [len(v) for v in p.partition_indices().values()]
    assert cfg["dirichlet-alpha"] == 0.01 and p.draws > 11  # flwr-datasets alone would have given up
    assert min(sizes) >= 10 and sum(sizes) == 60_000, sizes
