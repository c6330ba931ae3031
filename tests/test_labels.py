"""Labels by class name (docs/node-data.md#labels): a device's own class names are matched to the run's, so a device
that holds a subset of the classes trains with the server's labels; a class the run does not know, or data of
another shape, fails that node at discovery with one line naming the client, the path and what the run expects."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from hetfl.common.nodes import ClientMap, run_records
from hetfl.common.registry import NODE_QUERY
from hetfl.common.task import config_of
from hetfl.methods import SCHEMA, validate
from hetfl.common.rundata import client_data
from hetfl.data.byo import LocalDataError, class_ids
from hetfl.data.catalog import DATASETS
from hetfl.data.info import RUN_DATA, dataset_info
from hetfl.data.load import load_local_data

from .test_local_data import digits, write_pngs

FMNIST_NAMES = list(DATASETS["fashion_mnist"].class_names)


# --- the matching itself: hand-worked cases ---------------------------------------------------------------------

def test_a_subset_of_named_classes_takes_the_runs_ids():
    # an image folder of 4 classes: its own (sorted) ids are 0..3; the run's are those of the names
    assert class_ids(["Bag", "Coat", "Sandal", "Trouser"], FMNIST_NAMES, 10, "w").tolist() == [8, 4, 5, 1]
    # case, spaces and punctuation are not part of a name
    assert class_ids(["t-shirt/top", "ANKLE_BOOT"], FMNIST_NAMES, 10, "w").tolist() == [0, 9]
    # the same names in the run's order: the identity
    assert class_ids(FMNIST_NAMES, FMNIST_NAMES, 10, "w").tolist() == list(range(10))


def test_default_classlabel_names_and_unnamed_runs_keep_integer_ids():
    # ClassLabel(num_classes=10) names its classes '0'..'9': ids, whatever the run's names are
    assert class_ids([str(i) for i in range(10)], FMNIST_NAMES, 10, "w").tolist() == list(range(10))
    # a run whose classes have no names (plain integer labels): digit folders are ids, in any subset
    assert class_ids(["2", "7"], [], 10, "w").tolist() == [2, 7]
    # a digits-named run: folder '7' is class 7, not the folder's own id 1
    assert class_ids(["3", "7"], [str(i) for i in range(10)], 10, "w").tolist() == [3, 7]


def test_an_unknown_class_is_one_line_that_never_advises_more_classes():
    with pytest.raises(LocalDataError) as err:
        class_ids(["Bag", "hat"], FMNIST_NAMES, 10, "client 3: node data-path '/d'")
    msg = str(err.value)
    assert msg.startswith("client 3: node data-path '/d': holds 1 class(es) the run does not know ('hat')"), msg
    assert "'Ankle boot'" in msg and "num-classes" not in msg and "\n" not in msg
    with pytest.raises(LocalDataError, match="the run's classes have no names"):
        class_ids(["cat"], [], 10, "w")
    with pytest.raises(LocalDataError, match=r"match the run's class\(es\) \['Bag'\]"):
        class_ids(["bag", "Bag"], FMNIST_NAMES, 10, "w")
    with pytest.raises(LocalDataError, match="does not know \\('12'\\)"):  # an id outside the run's range
        class_ids(["12"], [], 10, "w")


# --- a device's data against the server's, through the ClientApp's own functions --------------------------------

NAMES = ["bag", "boot", "coat", "dress", "pullover", "sandal", "shirt", "sneaker", "trouser", "tshirt"]  # sorted


def _server_and_devices(tmp):
    """The server's image folder (10 named classes, 8x8 gray digits as pictures: class k = digit k) and devices."""
    d = digits(300)
    by_class = {NAMES[k]: list(d.x[d.y == k][:6, 0]) for k in range(10)}
    server = write_pngs(tmp / "server", by_class)
    subset = write_pngs(tmp / "subset", {n: by_class[n] for n in ("coat", "bag", "sandal", "trouser")})
    extra = write_pngs(tmp / "extra", {**{n: by_class[n] for n in ("coat", "bag")}, "hat": by_class["boot"]})
    big = write_pngs(tmp / "big", {n: [np.kron(a, np.ones((2, 2), np.uint8)) for a in by_class[n]]
                                   for n in ("coat", "bag")})  # 16x16 images against the run's 8x8
    return server, subset, extra, big


def _node(run_cfg: dict, path, client_id: int) -> Context:
    return Context(run_id=1, node_id=100 + client_id, node_config={"data-path": str(path), "client-id": client_id},
                   state=RecordDict(), run_config=dict(run_cfg))


def _query(records: dict) -> Message:
    return Message(RecordDict({**records, "config": ConfigRecord({})}), message_type=NODE_QUERY, dst_node_id=7)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labels")
    server, subset, extra, big = _server_and_devices(tmp)
    cfg = validate({"dataset": f"dir:{server}", "server-data-path": str(server), "min-available-nodes": 3})
    return cfg, server, subset, extra, big


def test_the_server_sends_its_classes_with_every_message(setup, task_identity):
    cfg, *_ = setup
    records = run_records(cfg)
    sent = dict(records[RUN_DATA])
    assert sent["class-names"] == NAMES and sent["num-classes"] == 10 and sent["shape"] == [1, 8, 8]
    cmap = ClientMap({5: {"client-ids": [0]}})
    cmap.records = records
    assert dict(cmap.message(0, RecordDict({}), "train").content[RUN_DATA]) == sent
    assert run_records(validate({"dataset": "fashion_mnist"})) == {}  # a named dataset: every node knows its classes


def test_a_device_with_a_subset_of_the_classes_trains_with_the_servers_labels(setup, task_identity):
    from hetfl.client_app import node_query

    cfg, server, subset, *_ = setup
    ctx = _node(cfg, subset, 1)
    reply = node_query(_query(run_records(cfg)), ctx)
    assert list(reply.content["config"]["client-ids"]) == [1]
    got = client_data(ctx, config_of(ctx, SCHEMA))
    # the server's labels of the same pictures: its own folder read as the run's evaluation set
    srv = load_local_data(server, dataset_info(cfg["dataset"]), "server", split="test")
    want = {bytes(x.tobytes()): int(y) for x, y in zip(srv.x, srv.y)}
    assert sorted(set(got.y.tolist())) == sorted(NAMES.index(n) for n in ("coat", "bag", "sandal", "trouser"))
    assert [want[x.tobytes()] for x in got.x] == got.y.tolist()  # every row labelled as the server labels it
    # its folders' own ids (bag, coat, sandal, trouser -> 0..3) are not the run's (0, 2, 5, 8): matched by name
    assert sorted(set(got.y.tolist())) == [0, 2, 5, 8]


@pytest.mark.parametrize("device,fragment", [
    ("extra", "holds 1 class(es) the run does not know ('hat'); the run's classes are ['bag'"),
    ("big", "images of shape (1, 16, 16) (channels, height, width); the run expects (1, 8, 8)"),
])
def test_a_device_that_does_not_fit_fails_discovery_with_one_line(setup, device, fragment, task_identity):
    from hetfl.client_app import node_query

    cfg, server, subset, extra, big = setup
    path = {"extra": extra, "big": big}[device]
    with pytest.raises(LocalDataError) as err:
        node_query(_query(run_records(cfg)), _node(cfg, path, 2))
    msg = str(err.value)
    assert msg.startswith(f"client 2: node data-path {str(path)!r}: ") and fragment in msg, msg
    assert "\n" not in msg and "num-classes" not in msg
