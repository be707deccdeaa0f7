"""The Python tests' PASS/FAIL lines and their "<program>: N passed, M failed"
tally, the form test/run_tests.sh counts."""


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name, ok):
        print(("PASS " if ok else "FAIL ") + name, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def tally(self, program):
        print("%s: %d passed, %d failed" % (program, self.passed, self.failed))
