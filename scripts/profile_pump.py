"""One pass of Flower 1.41's simulation message pump over N SuperNodes with M stored messages (docs/architecture.md#scale).

Flower's Simulation Engine (`flwr/server/superlink/fleet/vce/vce_api.py: add_messages_to_queue`) calls
`get_message_ins(node_id, limit=1)` for every registered SuperNode every 0.1 s; the in-memory LinkState walks and
re-validates every stored message in each call. This builds an in-memory LinkState with N nodes, stores M messages
(as discovery of every node at once did: M = N) and times two such passes.

    .venv/bin/python scripts/profile_pump.py 1000:10 1000:1000 2000:2000 4000:4000 10000:10 100000:10
"""

from __future__ import annotations

import secrets
import sys
import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import HEARTBEAT_INTERVAL_INF, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID, SUPERLINK_NODE_ID
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid


def state_with_nodes(n: int):
    """An in-memory LinkState with `n` registered SuperNodes and one run, as the Simulation Engine makes it."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    nodes = []
    for _ in range(n):
        nid = state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32),
                                heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        state.acknowledge_node_heartbeat(node_id=nid, heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        nodes.append(nid)
    run_id = state.create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, "simulation")
    return factory, state, nodes, run_id


def pump_pass(state, nodes) -> float:
    """Seconds of one pass of `add_messages_to_queue`: get_message_ins(node, limit=1) for every node."""
    t = time.perf_counter()
    for nid in nodes:
        state.get_message_ins(node_id=nid, limit=1)
    return time.perf_counter() - t


def main(argv: list[str]) -> int:
    for n, m in ((int(a.split(":")[0]), int(a.split(":")[1])) for a in argv):
        factory, state, nodes, run_id = state_with_nodes(n)
        grid = InMemoryGrid(factory)
        grid.set_run(state.get_run_info(run_ids=[run_id])[0])
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SUPERLINK_NODE_ID, 1
        msgs = [Message(RecordDict({"config": ConfigRecord({})}), message_type="query.node", dst_node_id=nodes[i])
                for i in range(m)]
        grid.push_messages(msgs)
        first = pump_pass(state, nodes)
        second = pump_pass(state, nodes)  # the messages are delivered but stay stored until their replies are pulled
        print(f"nodes={n:7d} stored={m:7d}  pump pass 1 {first:8.3f} s  pass 2 {second:8.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1000:10", "1000:1000", "2000:2000"]))
