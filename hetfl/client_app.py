"""The one ClientApp: every handler comes from the method registry (:mod:`hetfl.methods`).

For each message type some method declares (``train``, ``train.shefl``, ``train.fens_local``,
...), one dispatcher is registered that runs the handler of the run's ``method``. Every
node also answers the discovery query :data:`~hetfl.common.registry.NODE_QUERY` with its
client ids it hosts and the fields its method adds per client (SHEFL's device class, ...).
Every reply names the host it was computed on (:func:`~hetfl.common.comm.tag_host`; docs/ray-cluster.md).
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from hetfl import methods
from hetfl.common.comm import tag_host
from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.registry import NODE_QUERY
from hetfl.common.nodes import CLIENT_IDS
from hetfl.common.task import config_of
from hetfl.common.hosting import node_clients
from hetfl.common.rundata import client_data

app = ClientApp()


def dispatch(msg: Message, context: Context) -> Message:
    """Run the handler that the run's `method` declares for this message type."""
    cfg = config_of(context, methods.SCHEMA, msg)
    torch.set_num_threads(cfg["client-threads"])  # all of the handler's work, as local training (task.server_threads)
    return tag_host(methods.handler_for(cfg["method"], msg.metadata.message_type)(msg, context, cfg))


def node_query(msg: Message, context: Context) -> Message:
    """Answer discovery: the client ids this node hosts and, per client, its method's extra fields (as lists).

    The whole node config is checked first (docs/deployment.md#node-config): a bad key or value fails the query
    with one line naming the key, the value and what is allowed, which the server logs. A node with data of its own
    (``data-path``) then reads it against the run (classes by name, input shape, labels): data that does not fit
    fails the query with one line naming the client, the path, what it holds and what the run expects, and the
    server leaves the node out of the run (docs/node-data.md).
    """
    methods.NODE_SCHEMA.validate(context.node_config)
    cfg = config_of(context, methods.SCHEMA, msg)
    if NodeProfile(context.node_config).own_data:
        client_data(context, cfg)  # read and checked once here (and cached for the rounds)
    clients = node_clients(context, cfg)
    answer: dict = {CLIENT_IDS: clients}
    measured = measured_profile(context, cfg, clients[0]) if cfg["measure-devices"] and clients else {}
    for c in clients:
        for k, v in {**measured, **methods.node_info(cfg["method"], context, cfg, c)}.items():
            answer.setdefault(k, []).append(v)
    return tag_host(Message(RecordDict({"config": ConfigRecord(answer)}), reply_to=msg))


def measured_profile(context: Context, cfg: dict, client: int) -> dict:
    """This node's measured profile (:func:`hetfl.common.profile.measure_run`, on `client`'s data), measured once
    per run and kept in the node state (AdaptiveFL's client reads it back): the discovery answer's fields."""
    from hetfl.common.profile import PROFILE, measure_run

    if PROFILE not in context.state:
        torch.set_num_threads(cfg["client-threads"])  # as the node's training runs
        context.state[PROFILE] = ConfigRecord(measure_run(cfg, client_data(context, cfg, client)).answer())
    return dict(context.state[PROFILE])


def _register(message_type: str, handler) -> None:
    category, _, action = message_type.partition(".")
    register = getattr(app, category)  # app.train / app.query / app.evaluate
    (register(action) if action else register())(handler)


for _message_type in methods.message_types():
    _register(_message_type, dispatch)
_register(NODE_QUERY, node_query)
