"""What determines a partition: :class:`DataSpec` (the dataset, the partitioner and its keys, the seed, the server's
share, where the server's data comes from) and the cache key derived from it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .byo import is_byo, reference_token
from .catalog import DatasetInfo
from .info import dataset_info


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines a partition (and where the server's data comes from)."""

    dataset: str = "fashion_mnist"
    source: str = "auto"
    data_dir: str = ""
    partitioner: str = "dirichlet"
    num_partitions: int = 10
    alpha: float = 0.6
    min_partition_size: int = 10
    balance: bool = False
    max_draws: int = 11
    shards_per_client: int = 4
    seed: int = 42
    server_holdout: int = 0  # train samples kept out of every partition for the server (FedBE's unlabeled set)
    train_fraction: float = 1.0  # the share of the (shuffled) train split the clients partition (FENS Sec. 3.3.1)
    input_col: str = ""  # bring your own dataset: run-config input-column, label-column, num-classes
    label_col: str = ""
    num_classes: int = 0
    server_data_path: str = ""  # run-config server-data-path: the server's evaluation (and holdout) set

    @classmethod
    def from_config(cls, cfg: dict[str, Any], num_partitions: int) -> DataSpec:
        return cls(
            dataset=cfg["dataset"], source=cfg["data-source"], data_dir=cfg["data-dir"],
            partitioner=cfg["partitioner"], num_partitions=int(num_partitions),
            alpha=cfg["dirichlet-alpha"], min_partition_size=cfg["dirichlet-min-size"],
            balance=cfg["dirichlet-balance"], max_draws=cfg["dirichlet-max-draws"],
            shards_per_client=cfg["shards-per-client"], seed=cfg["partition-seed"],
            server_holdout=cfg["server-holdout"], train_fraction=cfg["train-fraction"],
            input_col=cfg["input-column"], label_col=cfg["label-column"],
            num_classes=cfg["num-classes"], server_data_path=cfg["server-data-path"],
        )

    @property
    def info(self) -> DatasetInfo:
        """The dataset's description (:func:`dataset_info`)."""
        return dataset_info(self.dataset, self.input_col, self.label_col, self.num_classes)

    def key(self) -> str:
        # hub and local give the same rows; a draw that succeeds is the same under any max_draws
        d = {k: v for k, v in self.__dict__.items() if k not in ("source", "max_draws", "server_data_path")}
        if self.partitioner != "dirichlet":
            d.pop("alpha"), d.pop("min_partition_size"), d.pop("balance")
        if self.partitioner != "shards":
            d.pop("shards_per_client")
        if not self.server_holdout:  # keys of specs without a holdout are unchanged
            d.pop("server_holdout")
        if self.train_fraction == 1.0:  # nor those of specs on the whole train split
            d.pop("train_fraction")
        for k in ("input_col", "label_col", "num_classes"):  # '' / 0 for named datasets: their keys are unchanged
            if not d[k]:
                d.pop(k)
        if is_byo(self.dataset):
            d["reference"] = reference_token(self.dataset)
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
