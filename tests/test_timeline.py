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
    f.write_text("gw0 1.0 3.0 0.5 a::x\nmain 1.0 3.0 0.5 a::x\ngw1 1.5 2.0 0.25 a::y[2 1]\n")
    assert tl.read(str(f)) == [("gw0", 1.0, 3.0, 0.5, "a::x"), ("gw1", 1.5, 2.0, 0.25, "a::y[2 1]")]
    f.write_text("main 1.0 3.0 1.5 a::x\n")  # one process: its own lines are the timeline
    assert tl.read(str(f)) == [("main", 1.0, 3.0, 1.5, "a::x")]


def test_timelines_written_before_cpu_was_recorded_still_read(tmp_path):
    f = tmp_path / "tl.txt"
    f.write_text("gw0 1.0 3.0 a::x y\n")
    (w, a, b, cpu, n), = tl.read(str(f))
    assert (w, a, b, n) == ("gw0", 1.0, 3.0, "a::x y") and cpu != cpu


def test_the_worker_records_its_own_and_its_reaped_childrens_cpu(tmp_path, monkeypatch):
    """The conftest hooks: a test that starts a process burning ~0.3 s of CPU is charged at least that."""
    import subprocess
    import sys

    from . import conftest

    monkeypatch.setattr(conftest, "_TIMELINE", str(tmp_path / "tl.txt"))
    conftest.pytest_runtest_logstart("t::burn", None)
    subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"],
                   check=True)
    conftest.pytest_runtest_logfinish("t::burn", None)
    (w, a, b, cpu, n), = tl.read(str(tmp_path / "tl.txt"))
    assert n == "t::burn" and cpu >= 0.3 and b >= a
