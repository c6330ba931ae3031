"""The data of a run: datasets by name or brought by the run or a node, read into arrays, partitioned by
flwr-datasets and cached. One job a module; each imports only modules above it in this list, and nothing of
``hetfl.common`` or of a method package:

* :mod:`~hetfl.data.catalog`: the named datasets (:class:`~hetfl.data.catalog.DatasetInfo`, ``DATASETS``).
* :mod:`~hetfl.data.arrays`: :class:`~hetfl.data.arrays.ArrayData`, a split in memory, and the row index.
* :mod:`~hetfl.data.cache`: the atomic ``.npz`` cache of arrays.
* :mod:`~hetfl.data.byo`: bring your own: references, directories, class names, descriptions, ``LocalDataError``.
* :mod:`~hetfl.data.info`: what a run's dataset is in this process (a catalog entry or a description).
* :mod:`~hetfl.data.convert`: a :class:`datasets.Dataset` split to checked arrays and back.
* :mod:`~hetfl.data.readers`: the named datasets' own files.
* :mod:`~hetfl.data.spec`: :class:`~hetfl.data.spec.DataSpec`, everything that determines a partition.
* :mod:`~hetfl.data.partition`: flwr-datasets partitioners, the resampling Dirichlet one included.
* :mod:`~hetfl.data.hub`: whether the Hugging Face hub can serve a dataset here.
* :mod:`~hetfl.data.load`: partitions, evaluation, held-out and node-local sets as cached arrays.
"""
