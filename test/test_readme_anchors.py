#!/usr/bin/env python3
"""dev/readme_anchors.py: a README link passes only when its line is the one
file-scope definition of its name (or the one its title picks). Planted wrong
anchors (a local variable of the same name, a stale line number, a name
defined twice, a prototype) each fail; --fix moves a stale number and keeps a
title; a link in docs/ is read relative to docs/ (`../demo.cu#L18`), and with
no file named the checker covers README.md and every docs/*.md, so a wrong
anchor planted in a docs/ file fails; and the project's README and docs pass,
with `train` on the function.

Usage: test/test_readme_anchors.py
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # test/checks.py
from checks import Checks  # noqa: E402

SCRIPT = os.path.join(ROOT, "dev", "readme_anchors.py")
check = Checks()

# line numbers below are 1-based lines of this text
SOURCE = """\
// a comment naming train( and struct Plan {
namespace demo {
static const int TABLE[] = {
    1, 2,
};
struct Plan {
    int train = 0;
};
static void use_corpus() {
    static const char* train = "{ not a brace";
    int scale(int x);
}
static float scale(float x) { return x; }
static int scale(int x) {
    return x;
}
static void prototype_only(int x);
static int train(int argc) {
    return argc;
}
}  // namespace demo
"""
LINE = {"TABLE": 3, "Plan": 6, "local train": 10, "scale(float)": 13, "scale(int)": 14, "prototype": 17,
        "train": 18}


def run(tmp, links, *flags):
    """(exit status, output, README text after) for a README of these links."""
    readme = os.path.join(tmp, "README.md")
    with open(readme, "w") as f:
        f.write("\n".join(links) + "\n")
    r = subprocess.run([sys.executable, SCRIPT, *flags, readme], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, open(readme).read()


def expect(tmp, what, link, ok, pattern=""):
    rc, out, _ = run(tmp, [link])
    check("%s: %s (%s)" % ("passes" if ok else "fails", what, link),
          (rc == 0) == ok and re.search(pattern, out) is not None)
    if (rc == 0) != ok:
        print(out, end="")


def check_docs(tmp):
    """Links from docs/x.md are relative to docs/; the default set (no file named) includes docs/*.md."""
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "docs"))
    os.makedirs(os.path.join(tree, "dev"))
    shutil.copy(SCRIPT, os.path.join(tree, "dev"))
    shutil.copy(os.path.join(tmp, "demo.cu"), tree)
    good = "[`train`](demo.cu#L%d)" % LINE["train"]
    with open(os.path.join(tree, "README.md"), "w") as f:
        f.write(good + "\n")
    doc = os.path.join(tree, "docs", "x.md")

    def run_docs(links, *args):
        with open(doc, "w") as f:
            f.write("\n".join(links) + "\n")
        r = subprocess.run([sys.executable, os.path.join(tree, "dev", "readme_anchors.py"), *args],
                           capture_output=True, text=True, cwd=tmp)
        return r.returncode, r.stdout + r.stderr

    rc, out = run_docs(["[`train`](../demo.cu#L%d)" % LINE["train"]])
    check("docs/: a link relative to docs/ passes, README.md and docs/x.md both checked",
          rc == 0 and "2 file(s) checked" in out and "readme_anchors: 2 passed, 0 failed\n" in out and
          "PASS docs/x.md: train" in out)
    rc, out = run_docs(["[`train`](../demo.cu#L%d)" % LINE["local train"]])
    check("docs/: a planted wrong anchor fails, naming docs/x.md",
          rc != 0 and "FAIL docs/x.md: train is not defined at ../demo.cu:%d (it is at line %d" % (
              LINE["local train"], LINE["train"]) in out)
    rc, out = run_docs(["[`train`](demo.cu#L%d)" % LINE["train"]])
    check("docs/: a link read from the project's root instead of docs/ fails", rc != 0 and "no such file" in out)
    rc, out = run_docs(["[`train`](../demo.cu#L1)"], "--fix")
    check("docs/: --fix moves the number in docs/x.md",
          open(doc).read() == "[`train`](../demo.cu#L%d)\n" % LINE["train"] and rc == 0)
    if rc != 0:
        print(out, end="")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "demo.cu"), "w") as f:
            f.write(SOURCE)
        expect(tmp, "the function", "[`train`](demo.cu#L%d)" % LINE["train"], True)
        expect(tmp, "a table", "[`TABLE`](demo.cu#L%d)" % LINE["TABLE"], True)
        expect(tmp, "a struct", "[`Plan`](demo.cu#L%d)" % LINE["Plan"], True)
        expect(tmp, "a local variable of the function's name", "[`train`](demo.cu#L%d)" % LINE["local train"],
               False, "it is at line %d" % LINE["train"])
        expect(tmp, "a stale line number", "[`train`](demo.cu#L%d)" % (LINE["train"] - 1), False,
               "it is at line %d" % LINE["train"])
        expect(tmp, "a name defined twice, no pick", "[`scale`](demo.cu#L%d)" % LINE["scale(int)"], False,
               "defined 2 times at file scope")
        expect(tmp, "a name defined twice, a title picks one", '[`scale`](demo.cu#L%d "int x")' % LINE["scale(int)"],
               True)
        expect(tmp, "the pick on the other line", '[`scale`](demo.cu#L%d "int x")' % LINE["scale(float)"], False)
        expect(tmp, "a pick that matches both", '[`scale`](demo.cu#L%d "scale")' % LINE["scale(int)"], False,
               "is in 2 of its signatures")
        expect(tmp, "a prototype is not a definition", "[`prototype_only`](demo.cu#L%d)" % LINE["prototype"], False,
               "defined nowhere")
        expect(tmp, "a missing file", "[`train`](nofile.cu#L1)", False, "no such file")

        links = ["[`train`](demo.cu#L%d)" % LINE["local train"], '[`scale`](demo.cu#L1 "float x")',
                 "[`scale`](demo.cu#L1)"]
        rc, out, text = run(tmp, links, "--fix")
        fixed = ["[`train`](demo.cu#L%d)" % LINE["train"], '[`scale`](demo.cu#L%d "float x")' % LINE["scale(float)"],
                 "[`scale`](demo.cu#L1)"]
        check("--fix moves numbers to the definitions, keeps titles, leaves the ambiguous link failing",
              text == "\n".join(fixed) + "\n" and rc != 0 and "1 failed" in out)

        check_docs(tmp)

    # no file named: the project's README.md and docs/*.md, from any working folder
    r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, cwd=tempfile.gettempdir())
    rc, out = r.returncode, r.stdout + r.stderr
    docs = sorted(n for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
    check("the project's README and docs pass (%d files)" % (1 + len(docs)),
          rc == 0 and "%d file(s) checked" % (1 + len(docs)) in out and
          re.search(r"^readme_anchors: [0-9]+ passed, 0 failed$", out, re.M) is not None and
          re.search(r"^PASS docs/", out, re.M) is not None)
    if rc != 0:
        print(out, end="")
    readme = open(os.path.join(ROOT, "README.md")).read()
    # the program: the function train that train_gpt.cu's main runs
    m = re.search(r"\[`train`\]\(train_gpt\.cu#L(\d+)\)", readme)
    source = open(os.path.join(ROOT, "train_gpt.cu")).read().split("\n")
    check("README's `train` points to the function train of train_gpt.cu",
          m is not None and re.search(r"\bint train\(", source[int(m.group(1)) - 1]) is not None)
    check.tally("test_readme_anchors")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
