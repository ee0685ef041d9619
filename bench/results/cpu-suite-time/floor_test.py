# Copied to tests/ for one run, then removed: a 4-step job with no event, four times in one pytest process
# (templates kept by tests/conftest.py): `OMP_NUM_THREADS=1 pytest -q -s tests/floor_test.py` -> floor.txt
import time
from test_run import liver

def test_floor(tmp_path):
    ev = tmp_path / "none.txt"; ev.write_text("# none\n")
    for i in range(4):
        t = time.perf_counter()
        rep = liver(tmp_path / f"r{i}", "--events", str(ev), "--steps", "4", "--end-after-events", "-1")
        print("run", i, round(time.perf_counter() - t, 2), rep["rc"])
