#!/usr/bin/env python3
"""Keeps README.md's line anchors into the code true.

A link [`name`](path#L123) in README.md claims that `name` is defined at line
123 of path (a function, struct, macro or table whose definition line holds
the name). --check (the default) prints one PASS/FAIL line per link and a
tally, and fails where the name is not defined at that line; --fix rewrites
each number to the line where the name is defined now. A name defined nowhere
in the file fails either way.

    python3 dev/readme_anchors.py [--check | --fix] [README.md]
"""
import os
import re
import sys

LINK = re.compile(r"\[`([A-Za-z_][A-Za-z0-9_:]*)`\]\(([^)#\s]+)#L(\d+)\)")


def is_definition(line, name):
    """A line that defines name: `name(` after a return type, `struct name`,
    `#define name`, `def name`, or `name[] = {` / `name = ` at the start."""
    n = re.escape(name.split("::")[-1])
    if re.match(r"\s*(struct|class|enum( class)?)\s+%s\b" % n, line):
        return True
    if re.match(r"\s*#define\s+%s\b" % n, line) or re.match(r"\s*def\s+%s\b" % n, line):
        return True
    # a function definition or declaration: a type before the name, '(' after it,
    # not a call statement (no leading 'return', no ';' right after ')')
    m = re.match(r"\s*(template\s*<[^>]*>\s*)?([A-Za-z_][\w:<>,*&\s]*[\s*&])%s\s*\(" % n, line)
    if m and not re.match(r"\s*(return|if|while|for|else)\b", line):
        return True
    return bool(re.match(r"\s*((static|constexpr|const|inline)\s+)*[\w:<>]+(\s*\*)?\s*(const\s+)?%s\s*(\[[^\]]*\])?\s*=" % n,
                         line))


def definition_line(lines, name):
    for i, line in enumerate(lines, 1):
        if is_definition(line, name):
            return i
    return 0


def main(argv):
    fix = "--fix" in argv
    args = [a for a in argv if not a.startswith("--")]
    readme = args[0] if args else "README.md"
    root = os.path.dirname(os.path.abspath(readme))
    text = open(readme, encoding="utf-8").read()
    cache, passed, failed = {}, 0, 0

    def lines_of(path):
        if path not in cache:
            full = os.path.join(root, path)
            cache[path] = open(full, encoding="utf-8").read().split("\n") if os.path.isfile(full) else None
        return cache[path]

    def check(m):
        nonlocal passed, failed
        name, path, number = m.group(1), m.group(2), int(m.group(3))
        lines = lines_of(path)
        where = definition_line(lines, name) if lines else 0
        at = lines is not None and 1 <= number <= len(lines) and is_definition(lines[number - 1], name)
        if fix and where:
            at, number = True, where
        if at:
            passed += 1
            print("PASS %s is defined at %s:%d" % (name, path, number))
        else:
            failed += 1
            hint = " (it is at line %d: run dev/readme_anchors.py --fix)" % where if where else " (defined nowhere)"
            print("FAIL %s is not defined at %s:%d%s" % (name, path, number, hint))
        return "[`%s`](%s#L%d)" % (name, path, number)

    new_text = LINK.sub(check, text)
    if fix and new_text != text:
        with open(readme, "w", encoding="utf-8") as f:
            f.write(new_text)
    print("readme_anchors: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
