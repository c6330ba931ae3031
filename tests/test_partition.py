"""The resampling Dirichlet partitioner, a flwr-datasets Partitioner on its public interface, pinned to the partitions
of the partitioner it replaced (which overrode DirichletPartitioner's private drawing method and attributes): the
indices below were computed with that code, and any change to them changes every Dirichlet run's clients."""

import hashlib
import json

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, Features, Value
from flwr_datasets.partitioner import Partitioner

from hetfl.data.load import _local_train_splits
from hetfl.data.partition import ResamplingDirichletPartitioner
from hetfl.data.spec import DataSpec

# (rows, classes, partitions, alpha, seed, min size, balance, max draws) -> (draws taken, each partition's rows)
SMALL = [
    ((40, 4, 3, 0.5, 42, 2, False, 11), (1, [
        [2, 5, 10, 3, 4, 16, 11, 6, 0, 8, 22],
        [24, 23, 7, 1, 9, 25, 35, 19, 13, 28, 30, 14, 12, 29, 17, 18],
        [32, 20, 38, 15, 33, 34, 36, 27, 37, 31, 39, 21, 26]])),
    ((30, 3, 4, 0.1, 7, 3, True, 1000), (14, [
        [16, 9, 0, 7, 5, 14],
        [15, 8, 24, 6, 12, 22, 10, 1, 4, 2, 20, 13, 3, 11, 17],
        [19, 21, 26],
        [29, 18, 28, 27, 23, 25]])),
    ((50, 5, 5, 1.0, 0, 0, False, 11), (1, [
        [11, 0, 3, 16, 18, 8, 5, 1, 14],
        [10, 25, 12, 28, 15, 26, 30, 23, 13],
        [2, 6, 4, 44, 31, 33, 29, 7, 27],
        [17, 9, 19, 20],
        [37, 42, 40, 48, 47, 24, 46, 41, 32, 39, 43, 35, 21, 49, 36, 38, 34, 45, 22]])),
    ((36, 4, 4, 0.3, 3, 4, False, 1000), (2, [
        [21, 20, 8, 14, 3, 9, 2, 15],
        [27, 6, 26, 1, 16, 0, 4, 10, 5, 7],
        [23, 32, 28, 12, 11, 18, 17, 22, 24],
        [33, 31, 19, 35, 30, 34, 29, 25, 13]])),
]

# digits' train split as the local path shuffles it: (alpha, seed, partitions, min size, balance) -> (draws, SHA-256
# of the JSON list of every partition's indices)
DIGITS = [
    ((0.5, 42, 10, 5, False), (1, "b9561a10d0c53078fc843c4ea9a04bcbcc278b0ee302f4071393aa5d61e4d237")),
    ((0.5, 42, 10, 60, True), (3, "adf504f4ce686954cf38b84cd2cb0b3de385f0607d634f8e0bfababcc1161455")),
    ((0.05, 3, 10, 5, False), (4, "021abd7640c7981a2784c3e02c9427799154700ac360f5db9f71abbc8314e5b4")),
    ((1.0, 7, 7, 10, True), (1, "0b82fdd92ba13b4d4dda758a5f53d36ad6957a0a4a37e789157fd07ac4cd3a67")),
    ((0.1, 42, 30, 0, False), (1, "301ef3ce6e6d2389af91a79194a2bf1b0f26ed5bb35145d8941871b456b223d3")),
    ((0.1, 5, 20, 10, False), (38, "01544f124bce6295f52cc7f6d66d354ecd2a8243b0ff517a0ebd0de0022f16ea")),
    ((0.05, 11, 12, 10, True), (14, "ec20b138bc93c764be0b2fbf3efe07387945895c51c19b5ee2239bb65ef5ca1f")),
    ((0.2, 1, 25, 15, False), (7, "a3e7c56bc24f0358e9d663526bd0a927af339b6fa362024cb7c7abbd95810e45")),
]


def _labelled(n: int, k: int) -> Dataset:
    feats = Features({"label": ClassLabel(num_classes=k), "row": Value("int64")})
    return Dataset.from_dict({"label": [(i * 7 + i // 3) % k for i in range(n)], "row": list(range(n))}, features=feats)


def _partitioner(parts, alpha, seed, min_size, balance, max_draws, dataset) -> ResamplingDirichletPartitioner:
    p = ResamplingDirichletPartitioner(num_partitions=parts, partition_by="label", alpha=alpha, min_partition_size=min_size,
                                       self_balancing=balance, seed=seed, max_draws=max_draws)
    p.dataset = dataset  # the public setter
    return p


@pytest.mark.parametrize("case,expected", SMALL)
def test_small_cases_give_the_pinned_partitions(case, expected):
    n, k, parts, alpha, seed, min_size, balance, max_draws = case
    p = _partitioner(parts, alpha, seed, min_size, balance, max_draws, _labelled(n, k))
    assert isinstance(p, Partitioner) and p.num_partitions == parts
    rows = [list(np.asarray(p.load_partition(i)["row"])) for i in range(parts)]
    assert (p.draws, rows) == expected
    assert [p.partition_indices()[i] for i in range(parts)] == expected[1]  # rows are positions here


@pytest.mark.parametrize("case,expected", DIGITS)
def test_digits_partitions_are_pinned(case, expected):
    alpha, seed, parts, min_size, balance = case
    spec = DataSpec(dataset="digits", source="local", partitioner="dirichlet", num_partitions=parts, alpha=alpha,
                    min_partition_size=min_size, balance=balance, seed=seed)
    p = _partitioner(parts, alpha, seed, min_size, balance, 100_000, _local_train_splits(spec)[0])
    indices = p.partition_indices()
    digest = hashlib.sha256(json.dumps([indices[i] for i in range(parts)]).encode()).hexdigest()
    assert (p.draws, digest) == expected


def test_more_partitions_than_rows_is_refused_as_flwr_datasets_does():
    p = _partitioner(5, 0.5, 0, 0, False, 11, _labelled(4, 2))
    with pytest.raises(ValueError, match="smaller than the number of samples"):
        p.load_partition(0)
