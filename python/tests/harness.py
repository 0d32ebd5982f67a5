"""The Python tests' runner: each test a function, counted as passed, failed (its traceback
printed) or skipped (it raised Skip with the reason), one line each in the test suites' one format
("ok    name", "FAIL  name", "SKIP  name: why": common/tests/report.sh), ending with "N passed, M
failed, K skipped"; python/tests/run.sh records each line. Imported by test_binding.py,
test_compare.py and test_train_gpt.py (each run as a script from any folder: Python puts this
folder first on the import path)."""

import sys
import traceback

results = {"passed": 0, "failed": 0, "skipped": 0}


class Skip(Exception):
    pass


def run(name, fn, *args):
    try:
        fn(*args)
    except Skip as e:
        results["skipped"] += 1
        print(f"SKIP  {name}: {e}")
        return
    except Exception:
        results["failed"] += 1
        print(f"FAIL  {name}")
        traceback.print_exc(file=sys.stdout)
        return
    results["passed"] += 1
    print(f"ok    {name}")


def summary():
    """Prints the counts; the exit status: 1 if any test failed."""
    p, f, s = results["passed"], results["failed"], results["skipped"]
    print(f"{p} passed, {f} failed, {s} skipped")
    return 1 if f else 0
