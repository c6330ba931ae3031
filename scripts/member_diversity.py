"""Members' accuracy and pairwise disagreement at an ensemble run's last checkpoint (docs/readings.md#shefl-diversity).

    python scripts/member_diversity.py results/reproduce/shefl-fmnist-dir0.6-r30/runs/*-s0

For ensemble runs (SHEFL, Fed-Ensemble) made before metrics.json recorded `disagreement` every round: loads the
members saved in the run's checkpoint (its last round), evaluates them on the run's test set at the run's
precision (on the CPU), and prints the round, the ensemble's accuracy, each member's, and the members'
disagreement. Checkpoints are not committed (tens of MB a run), so this reads a local results directory.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flwr.app import Array, ArrayRecord  # noqa: E402
from hetfl.common.checkpoint import read_checkpoint  # noqa: E402
from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.methods import SCHEMA  # noqa: E402
from hetfl.common.models import set_state  # noqa: E402
from hetfl.common.task import make_model, unpack_models
from hetfl.common.rundata import test_data
from hetfl.common.train import Normalizer, ensemble_metrics, member_disagreement, predict_proba  # noqa: E402


def main(run_dirs: list[str]) -> int:
    for d in map(Path, run_dirs):
        if not (d / "checkpoint.json").exists():
            print(f"{d}: no checkpoint.json (the run had checkpoint = false, or is not a run directory)")
            return 1
        cfg = load_metrics(d / "metrics.json", SCHEMA)["config"]
        state = read_checkpoint(d / "checkpoint.json")
        odd = next((k for k in state["arrays"] if not re.match(r"m\d+\.", k)), None)
        if odd is not None:
            print(f"{d}: not an ensemble run (array {odd!r}; expected m<j>.<name>)")
            return 1
        arrays = ArrayRecord({k: Array(v) for k, v in state["arrays"].items()})
        members = []
        for st in unpack_models(arrays, cfg["shefl-models"]):
            model = make_model(cfg)
            set_state(model, st)
            members.append(model.eval())
        data = test_data(cfg)
        probs = predict_proba(members, data, Normalizer(cfg["dataset"]), cfg["eval-batch-size"], precision=cfg["precision"])
        _, acc, accs = ensemble_metrics(probs, data.y)
        print(f"{d.name}: round {state['round']}, ensemble {100 * acc:.2f}%, members "
              f"{' '.join(f'{100 * a:.2f}' for a in accs)}%, disagreement {100 * member_disagreement(probs):.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
