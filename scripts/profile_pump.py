"""One pass of Flower 1.41's simulation message pump over N SuperNodes with M stored messages (docs/architecture.md#scale).

Flower's Simulation Engine (`flwr/server/superlink/fleet/vce/vce_api.py: add_messages_to_queue`) calls
`get_message_ins(node_id, limit=1)` for every registered SuperNode every 0.1 s; the in-memory LinkState walks and
re-validates every stored message in each call. This builds an in-memory LinkState with N nodes, stores M messages
(as discovery of every node at once did: M = N) and times two such passes.

    .venv/bin/python scripts/profile_pump.py 1000:10 1000:1000 2000:2000 4000:4000 10000:10 100000:10
"""
import secrets, sys, time
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import HEARTBEAT_INTERVAL_INF, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid
from flwr.supercore.constant import NOOP_FEDERATION_ID as NOOP_FEDERATION

def setup(n):
    f = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    st = f.state()
    nodes = []
    for _ in range(n):
        nid = st.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        st.acknowledge_node_heartbeat(node_id=nid, heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        nodes.append(nid)
    run_id = st.create_run(None, None, None, {}, NOOP_FEDERATION, None, NOOP_FLWR_AID, "simulation")
    return f, st, nodes, run_id

for n, m in [(int(a.split(":")[0]), int(a.split(":")[1])) for a in sys.argv[1:]]:
    f, st, nodes, run_id = setup(n)
    grid = InMemoryGrid(f)
    grid.set_run(st.get_run_info(run_ids=[run_id])[0])
    from flwr.supercore.task_identity import TaskIdentity; TaskIdentity.run_id = run_id; from flwr.common.constant import SUPERLINK_NODE_ID; TaskIdentity.node_id = SUPERLINK_NODE_ID; TaskIdentity.task_id = 1
    msgs = [Message(RecordDict({"config": ConfigRecord({})}), message_type="query.node", dst_node_id=nodes[i]) for i in range(m)]
    t = time.perf_counter(); grid.push_messages(msgs); push = time.perf_counter() - t
    t = time.perf_counter()
    for nid in nodes:  # one pass of add_messages_to_queue
        st.get_message_ins(node_id=nid, limit=1)
    one = time.perf_counter() - t
    t = time.perf_counter()
    for nid in nodes:  # a second pass: the messages are delivered but still stored until their replies are pulled
        st.get_message_ins(node_id=nid, limit=1)
    two = time.perf_counter() - t
    print(f"nodes={n:6d} stored={m:6d} push {push:7.3f}s  pump pass 1 {one:8.3f}s  pass 2 {two:8.3f}s", flush=True)
