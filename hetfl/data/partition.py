"""flwr-datasets partitioners for a :class:`~hetfl.data.spec.DataSpec`: IID, pathological shards, and Dirichlet(alpha)
by class, redrawn until every partition is large enough (:class:`ResamplingDirichletPartitioner`, a flwr-datasets
:class:`~flwr_datasets.partitioner.Partitioner` on its public interface).

Imported when the first partition is made (:mod:`hetfl.data.load`): flwr-datasets loads `datasets`.
"""

from __future__ import annotations

import datasets
import numpy as np
from flwr_datasets.partitioner import IidPartitioner, Partitioner, ShardPartitioner

from .arrays import column
from .spec import DataSpec


class ResamplingDirichletPartitioner(Partitioner):
    """Dirichlet(alpha) by class that redraws until every partition holds ``min_partition_size``.

    flwr-datasets' :class:`~flwr_datasets.partitioner.DirichletPartitioner` gives up after 11 draws; the FENS authors
    redraw without limit (about 1,000 draws for Dir(0.01) on 20 clients): docs/readings.md#fens-partitions.
    DirichletPartitioner's algorithm and random stream (one Dirichlet per class, balancing, redraw, final shuffle), so
    within its 11 draws the partitions are its own, index for index; a draw is judged on counts, so 1,000 draws take
    seconds.

    Parameters
    ----------
    num_partitions, partition_by, min_partition_size, self_balancing, shuffle, seed
        As for DirichletPartitioner.
    alpha : float
        The concentration of every partition.
    max_draws : int
        Give up (``ValueError`` naming the key) after this many draws; 11 is flwr-datasets' limit.
    """

    def __init__(self, *, num_partitions: int, partition_by: str, alpha: float, min_partition_size: int = 10,
                 self_balancing: bool = False, shuffle: bool = True, seed: int | None = 42, max_draws: int = 11) -> None:
        super().__init__()
        if not num_partitions > 0:
            raise ValueError("The number of partitions needs to be greater than zero.")
        if not alpha > 0:
            raise ValueError(f"Alpha values should be strictly greater than zero; got {alpha}")
        self.partition_by = partition_by
        self.alpha = float(alpha)
        self.min_partition_size = min_partition_size
        self.self_balancing = self_balancing
        self.shuffle = shuffle
        self.max_draws = max(int(max_draws), 1)
        self.draws = 0  # the draws the partitioning took (0 until it is drawn)
        self._num_partitions = int(num_partitions)
        self._rng = np.random.default_rng(seed=seed)
        self._indices: dict[int, list[int]] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        return self.dataset.select(self.partition_indices()[partition_id])

    def partition_indices(self) -> dict[int, list[int]]:
        """Every partition's rows (positions in :attr:`dataset`), drawn on the first call."""
        if self._indices is None:
            if self._num_partitions > self.dataset.num_rows:
                raise ValueError("The number of partitions needs to be smaller than the number of samples in the dataset.")
            members = self._class_members()
            self._indices = self._assign(members, self._draw_until_large_enough(members))
        return self._indices

    def _class_members(self) -> list[np.ndarray]:
        """The rows of each class, classes in sorted order."""
        targets = column(self.dataset, self.partition_by)
        return [np.nonzero(targets == k)[0] for k in sorted(self.dataset.unique(self.partition_by))]

    def _draw_until_large_enough(self, members: list[np.ndarray]) -> list[np.ndarray]:
        """The cuts of the first draw (:meth:`_draw`) that gives every partition ``min_partition_size`` rows."""
        n = self._num_partitions
        alpha = np.full(n, self.alpha)
        avg = self.dataset.num_rows / n
        for draw in range(1, self.max_draws + 1):
            cuts, counts = self._draw(members, alpha, avg)
            if counts.min() >= self.min_partition_size:
                self.draws = draw
                return cuts
        raise ValueError(
            f"dirichlet-max-draws = {self.max_draws}: no Dirichlet({self.alpha:g}) draw gave every one of "
            f"{n} partitions >= {self.min_partition_size} samples (dirichlet-min-size); "
            "raise dirichlet-max-draws or alpha, or lower dirichlet-min-size"
        )

    def _draw(self, members: list[np.ndarray], alpha: np.ndarray, avg: float) -> tuple[list[np.ndarray], np.ndarray]:
        """One Dirichlet per class: where each class's rows are cut between the partitions, and the partitions' sizes."""
        counts = np.zeros(self._num_partitions, np.int64)
        cuts = []
        for idx in members:
            prop = self._rng.dirichlet(alpha)
            if self.self_balancing:
                prop = np.where(counts > avg, 0.0, prop)
                prop = prop / sum(prop.tolist())  # DirichletPartitioner's left-to-right sum, bit for bit
            cut = (np.cumsum(prop) * len(idx)).astype(int)[:-1]
            cuts.append(cut)
            counts += np.diff(np.concatenate(([0], cut, [len(idx)])))
        return cuts, counts

    def _assign(self, members: list[np.ndarray], cuts: list[np.ndarray]) -> dict[int, list[int]]:
        """Each partition's rows, class by class, shuffled within the partition."""
        parts: dict[int, list[int]] = {p: [] for p in range(self._num_partitions)}
        for idx, cut in zip(members, cuts):
            for p, chunk in enumerate(np.split(idx, cut)):
                parts[p].extend(chunk.tolist())
        if self.shuffle:
            for indices in parts.values():
                self._rng.shuffle(indices)
        return parts


def make_partitioner(spec: DataSpec, num_train: int):
    """The flwr-datasets partitioner for a spec (IID, Dirichlet(alpha), pathological shards)."""
    label = spec.info.label_col
    if spec.partitioner == "iid":
        return IidPartitioner(num_partitions=spec.num_partitions)
    if spec.partitioner == "dirichlet":
        return ResamplingDirichletPartitioner(
            num_partitions=spec.num_partitions, partition_by=label, alpha=spec.alpha,
            min_partition_size=spec.min_partition_size, self_balancing=spec.balance, seed=spec.seed,
            max_draws=spec.max_draws,
        )
    if spec.partitioner == "shards":
        # McMahan et al.: num_partitions * shards_per_client equal shards of label-sorted data
        total = spec.num_partitions * spec.shards_per_client
        return ShardPartitioner(
            num_partitions=spec.num_partitions, partition_by=label,
            num_shards_per_partition=spec.shards_per_client, shard_size=num_train // total,
            seed=spec.seed,
        )
    raise ValueError(f"unknown partitioner {spec.partitioner!r}")
