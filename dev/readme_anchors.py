#!/usr/bin/env python3
"""Keeps the line anchors into the code of README.md and docs/*.md true.

A link [`name`](path#L123) in a Markdown file claims that `name` is defined at
line 123 of path, which is relative to the Markdown file's folder (from
docs/x.md: `../llmc/x.h#L12`), as a Markdown viewer resolves it. Only
definitions at file scope count (inside a namespace or extern "C" block is
file scope; inside a function, struct or table is not):
a function with a body, a struct/class/enum with a body, a table or variable
initialised at file scope (`name[] = {`, `name = `), a `#define`, or a
top-level Python `def`/`class`. A local such as a `static const std::string
train` inside a function is not the function `train`, and a prototype ending
in `;` is not its definition.

A name defined more than once at file scope in that file (overloads, or one
body per #if branch) fails unless the link picks one with a Markdown title:

    [`matmul_forward`](llmc/kernels/matmul.cuh#L221 "const float* bias")

The title is text that must appear in exactly one of the candidates'
signatures (from the line holding the name to the `{` that opens the body).

--check (the default) prints one PASS/FAIL line per link and a tally, and
fails where the name is not uniquely defined at that line; --fix rewrites each
number to the line where the name is defined now (an ambiguous or missing
name still fails). With no file named it checks the project's README.md and
every docs/*.md.

    python3 dev/readme_anchors.py [--check | --fix] [FILE.md ...]
"""
import os
import re
import sys

LINK = re.compile(r'\[`([A-Za-z_][A-Za-z0-9_:]*)`\]\(([^)#\s]+)#L(\d+)(\s+"([^"]*)")?\)')


def strip_code(text):
    """text with comments, string and char literals blanked to spaces (newlines
    kept), so that braces and names in them do not count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + (c if j - 1 > i else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_depths(code):
    """For each line of stripped code, the brace depth at its start, counting
    only braces that open a scope (not those of a namespace or extern "C")."""
    depths, stack, depth, since = [0], [], 0, ""
    for c in code:
        if c == "{":
            scope = not re.search(r'(\bnamespace(\s+\w+)?|\bextern\s+"\s*")\s*$', since)
            stack.append(scope)
            depth += scope
            since = ""
        elif c == "}":
            depth -= stack.pop() if stack else 0
            since = ""
        elif c == ";":
            since = ""
        elif c == "\n":
            depths.append(depth)
            since += c
        else:
            since += c
    return depths


def body_follows(code_lines, i, col):
    """Whether the declaration whose name ends at line i, column col opens a
    body ('{', after any parameter list and ':' initialisers) before a ';'."""
    rest = code_lines[i][col:] + "\n" + "\n".join(code_lines[i + 1:i + 40])
    m = re.search(r"[{;]", rest)
    return bool(m) and m.group(0) == "{"


def definitions(path, lines, name):
    """Line numbers (1-based) of name's file-scope definitions in lines."""
    n = re.escape(name.split("::")[-1])
    if path.endswith(".py"):
        return [i for i, line in enumerate(lines, 1) if re.match(r"(def|class)\s+%s\b" % n, line)]
    code_lines = strip_code("\n".join(lines)).split("\n")
    depths = line_depths("\n".join(code_lines))
    found = []
    for i, code in enumerate(code_lines):
        if depths[i] != 0:
            continue
        if re.match(r"\s*#\s*define\s+%s\b" % n, lines[i]):
            found.append(i + 1)
            continue
        m = (re.match(r"\s*(template\s*<[^>]*>\s*)?(typedef\s+)?(struct|class|enum(\s+class)?|union)\s+%s\b" % n, code)
             or re.match(r"\s*(template\s*<[^>]*>\s*)?([A-Za-z_][\w:<>,*&\s]*[\s*&])%s\s*\(" % n, code))
        if m and not re.match(r"\s*(return|if|while|for|else|switch|case)\b", code):
            if body_follows(code_lines, i, m.end()):
                found.append(i + 1)
            continue
        if re.match(r"\s*((static|constexpr|const|inline|extern)\s+)*[\w:<>]+(\s*\*)?\s*(const\s+)?%s\s*(\[[^\]]*\])?\s*(=|\{)"
                    % n, code):
            found.append(i + 1)
    return found


def signature(lines, number):
    """The text from line number to the '{' or ';' that ends its declaration."""
    text = []
    for line in lines[number - 1:number + 39]:
        text.append(line)
        if "{" in line or ";" in line:
            break
    return " ".join(text)


def resolve(path, lines, name, pick):
    """(line, None) for the one definition the link means, or (0, why not)."""
    found = definitions(path, lines, name)
    if pick is not None:
        found = [d for d in found if pick in signature(lines, d)]
    if not found:
        return 0, "defined nowhere at file scope" + (' with "%s" in its signature' % pick if pick else "")
    if len(found) > 1:
        where = ", ".join(str(d) for d in found)
        if pick is None:
            return 0, ('defined %d times at file scope (lines %s): add a title naming text from one signature, '
                       '[`%s`](%s#L%d "text")' % (len(found), where, name, path, found[0]))
        return 0, '"%s" is in %d of its signatures (lines %s): pick longer text' % (pick, len(found), where)
    return found[0], None


def project_markdown():
    """[(path, name shown)] of the project's README.md and docs/*.md (sorted), named from the project's root."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    docs = os.path.join(root, "docs")
    names = ["README.md"]
    if os.path.isdir(docs):
        names += sorted("docs/" + n for n in os.listdir(docs) if n.endswith(".md"))
    return [(os.path.join(root, n), n) for n in names]


def check_file(markdown, shown, fix, cache):
    """(passed, failed) for the links of one Markdown file (named shown in the output); None if it cannot be
    read."""
    folder = os.path.dirname(os.path.abspath(markdown))
    try:
        text = open(markdown, encoding="utf-8").read()
    except OSError as e:
        print("error: %s: %s" % (shown, e.strerror), file=sys.stderr)
        return None
    counts = [0, 0]

    def lines_of(path):
        full = os.path.normpath(os.path.join(folder, path))
        if full not in cache:
            cache[full] = open(full, encoding="utf-8").read().split("\n") if os.path.isfile(full) else None
        return cache[full]

    def check(m):
        name, path, number, title, pick = m.group(1), m.group(2), int(m.group(3)), m.group(4) or "", m.group(5)
        lines = lines_of(path)
        where, why = resolve(path, lines, name, pick) if lines is not None else (0, "no such file")
        if fix and where:
            number = where
        if where and where == number:
            counts[0] += 1
            print("PASS %s: %s is defined at %s:%d" % (shown, name, path, number))
        else:
            counts[1] += 1
            hint = " (it is at line %d: run dev/readme_anchors.py --fix)" % where if where else " (%s)" % why
            print("FAIL %s: %s is not defined at %s:%d%s" % (shown, name, path, number, hint))
        return "[`%s`](%s#L%d%s)" % (name, path, number, title)

    new_text = LINK.sub(check, text)
    if fix and new_text != text:
        with open(markdown, "w", encoding="utf-8") as f:
            f.write(new_text)
    return counts


def main(argv):
    fix = "--fix" in argv
    files = [(a, a) for a in argv if not a.startswith("--")] or project_markdown()
    cache, passed, failed = {}, 0, 0
    for markdown, shown in files:
        counts = check_file(markdown, shown, fix, cache)
        if counts is None:
            return 1
        passed, failed = passed + counts[0], failed + counts[1]
    print("readme_anchors: %d file(s) checked" % len(files))
    print("readme_anchors: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
