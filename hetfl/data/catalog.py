"""The named datasets: the facts the code needs about each (:class:`DatasetInfo`) and the table of them
(:data:`DATASETS`), the single source of the names a run-config ``dataset`` may take.

A dataset a run brings itself (:mod:`hetfl.data.byo`) is described by a :class:`DatasetInfo` too
(:mod:`hetfl.data.info`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one dataset."""

    hub_id: str
    image_col: str  # or the text column for text datasets
    label_col: str
    num_classes: int
    shape: tuple[int, ...]  # (C, H, W) for images, () for text
    mean: tuple[float, ...]
    std: tuple[float, ...]
    threshold: float  # convergence threshold (SHEFL paper)
    subset: str | None = None
    kind: str = "image"
    local_dirs: tuple[str, ...] = ()
    how_to_get: str = ""
    class_names: tuple[str, ...] = ()  # the name of each class id (a ClassLabel's names); () = plain integer ids
    features: tuple[str, ...] = ()  # a table's feature columns, in order (kind "tabular"; shape = (len(features),))


DATASETS: dict[str, DatasetInfo] = {
    "fashion_mnist": DatasetInfo(
        "zalando-datasets/fashion_mnist", "image", "label", 10, (1, 28, 28), (0.2860,), (0.3530,), 0.80,
        local_dirs=("/usr/share/datasets/fashion-mnist",),
        how_to_get="apt-get install dataset-fashion-mnist (IDX files in /usr/share/datasets/fashion-mnist), "
        "or put train/t10k-*-idx*-ubyte[.gz] in data-dir/fashion_mnist",
        class_names=("T - shirt / top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                     "Ankle boot"),
    ),
    "mnist": DatasetInfo(
        "ylecun/mnist", "image", "label", 10, (1, 28, 28), (0.1307,), (0.3081,), 0.90,
        local_dirs=("/usr/share/datasets/mnist",),
        how_to_get="put the MNIST IDX files (train/t10k-*-idx*-ubyte[.gz]) in data-dir/mnist",
        class_names=tuple(str(i) for i in range(10)),
    ),
    "cifar10": DatasetInfo(
        "uoft-cs/cifar10", "img", "label", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0.70,
        how_to_get="extract cifar-10-python.tar.gz so that data-dir/cifar10/cifar-10-batches-py exists",
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    ),
    "cifar100": DatasetInfo(
        "uoft-cs/cifar100", "img", "fine_label", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 0.50,
        how_to_get="extract cifar-100-python.tar.gz so that data-dir/cifar100/cifar-100-python exists",
    ),
    "svhn": DatasetInfo(
        "ufldl-stanford/svhn", "image", "label", 10, (3, 32, 32), (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), 0.90,
        subset="cropped_digits",
        how_to_get="put train_32x32.mat and test_32x32.mat in data-dir/svhn",
        class_names=tuple(str(i) for i in range(10)),
    ),
    "ag_news": DatasetInfo(
        "fancyzhx/ag_news", "text", "label", 4, (), (), (), 0.85, kind="text",
        how_to_get="put train.csv and test.csv (class index 1-4, title, description) in data-dir/ag_news",
        class_names=("World", "Sports", "Business", "Sci/Tech"),
    ),
    "digits": DatasetInfo(
        "", "image", "label", 10, (1, 8, 8), (0.3031,), (0.3763,), 0.90,
        how_to_get="ships with scikit-learn (sklearn.datasets.load_digits)",
        class_names=tuple(str(i) for i in range(10)),
    ),
}


class DatasetUnavailable(RuntimeError):
    """The dataset is neither in local files nor reachable on the hub."""
