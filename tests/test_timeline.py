"""scripts/test_timeline.py: the longest-first schedule and the timeline reader, on hand-worked cases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("test_timeline_script",
                                               Path(__file__).resolve().parent.parent / "scripts" / "test_timeline.py")
tl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tl)


def test_longest_first_makespan_by_hand():
    # 3 workers: 7 | 5+1+... : 7->w1, 5->w2, 4->w3, 3->w3 (4+3=7), 2->w2 (5+2=7), 1->w1/w2/w3 at 7 -> 8
    assert tl.lpt([1, 2, 3, 4, 5, 7], 3) == 8
    assert tl.lpt([10, 1, 1], 3) == 10  # one long test bounds the wall however many workers
    assert tl.lpt([2, 2, 2, 2], 1) == 8


def test_controller_copies_are_left_out_under_xdist(tmp_path):
    f = tmp_path / "tl.txt"
    f.write_text("gw0 1.0 3.0 a::x\nmain 1.0 3.0 a::x\ngw1 1.5 2.0 a::y y\n")
    assert tl.read(str(f)) == [("gw0", 1.0, 3.0, "a::x"), ("gw1", 1.5, 2.0, "a::y y")]
    f.write_text("main 1.0 3.0 a::x\n")  # one process: its own lines are the timeline
    assert tl.read(str(f)) == [("main", 1.0, 3.0, "a::x")]
