"""Data for run_authors.sh --smoke: a few exported clients, each cut to at most `per_class` rows of every class.

    python tools/smoke_data.py <export-dir> <out-dir> [per_class=40] [min_per_class=5]

Picks the smallest set of exported clients whose data together hold every class (>= min_per_class rows each):
their code divides by each class's total count over the clients (DataPartitioner.distribute_testset), so a run on
clients that miss a class fails. Writes <out-dir>/client-<j>.npz (j = 0..k-1, the j-th chosen client, rows in export
order), a link to the full server_test.npz, and smoke.json (which export clients, how many rows)."""
import itertools, json, os, sys

import numpy as np

src, out = sys.argv[1], sys.argv[2]
per_class = int(sys.argv[3]) if len(sys.argv) > 3 else 40
min_per_class = int(sys.argv[4]) if len(sys.argv) > 4 else 5
man = json.load(open(os.path.join(src, "manifest.json")))
cs, C = man["clients"], man["num-classes"]
best = None
for k in range(2, len(cs) + 1):
    for combo in itertools.combinations(range(len(cs)), k):
        if min(sum(cs[i]["label_counts"][c] for i in combo) for c in range(C)) >= min_per_class:
            rows = sum(cs[i]["rows"] for i in combo)
            if best is None or rows < best[1]:
                best = (combo, rows)
    if best:
        break
os.makedirs(out, exist_ok=True)
kept = []
for j, i in enumerate(best[0]):
    z = np.load(os.path.join(src, "npz", f"client-{cs[i]['client-id']}.npz"))
    idx = np.sort(np.concatenate([np.nonzero(z["y"] == c)[0][:per_class] for c in range(C)]))
    np.savez(os.path.join(out, f"client-{j}.npz"), x=z["x"][idx], y=z["y"][idx])
    kept.append(int(len(idx)))
link = os.path.join(out, "server_test.npz")
if not os.path.exists(link):
    os.symlink(os.path.join(src, "npz", "server_test.npz"), link)
json.dump({"export_clients": [cs[i]["client-id"] for i in best[0]], "rows": kept, "per_class_cap": per_class},
          open(os.path.join(out, "smoke.json"), "w"))
print(len(best[0]))
