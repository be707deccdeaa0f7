#!/usr/bin/env python3
"""Rewrites the two pieces of CUDA syntax that C++ cannot parse, in a translation
unit already run through the C preprocessor (g++ -E), for the CUDA-on-CPU runtime.

    kernel<<<grid, block, smem, stream>>>(args)
 -> (::cpucuda::Launcher("kernel", grid, block, smem, stream)
        % [=](auto... cpucuda_a) { kernel(cpucuda_a...); })(args)

    extern __shared__ T name[];         (__shared__ reaches us as __cpucuda_shared__)
 -> T* const name = (T*)::cpucuda::dynamic_shared_memory();
    (static thread_local at namespace scope)

and every other `__shared__` becomes `static thread_local`. Line numbers are kept
(removed newlines are re-emitted), so compiler messages point at the .cu source.

usage: cudapp.py < unit.ii > unit.rewritten.ii     (or: cudapp.py IN OUT)
"""
import re
import sys

SHARED = "__cpucuda_shared__"
EXTERN_SHARED = re.compile(r"extern\s+" + SHARED + r"\b([^;\[\]]*?)\b(\w+)\s*\[\s*\]\s*;")


class RewriteError(Exception):
    pass


def line_of(text, pos):
    """Best-effort source location from the last line marker before pos."""
    marker = None
    for m in re.finditer(r'^# (\d+) "([^"]*)"', text[:pos], re.M):
        marker = m
    if not marker:
        return "line %d" % (text.count("\n", 0, pos) + 1)
    return "%s:%d" % (marker.group(2), int(marker.group(1)) + text.count("\n", marker.end(), pos) - 1)


def skip_literal(text, i):
    """If text[i] opens a string or character literal, return the index after it."""
    quote = text[i]
    if quote not in "\"'":
        return i
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def inside_literal(text, p):
    """Whether position p lies inside a string or character literal on its line
    (literals cannot span lines in preprocessed code)."""
    i = text.rfind("\n", 0, p) + 1
    while i < p:
        c = text[i]
        # a ' between digits is a C++14 digit separator, not a literal
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            j = skip_literal(text, i)
            if j > p:
                return True
            i = j
        else:
            i += 1
    return False


def find_launches(text):
    """Positions of '<<<' outside string and character literals."""
    for m in re.finditer("<<<", text):
        if not inside_literal(text, m.start()):
            yield m.start()


def kernel_start(text, p):
    """Start of the kernel expression that ends just before position p: an
    optionally qualified name, optionally followed by template arguments."""
    j = p - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    if j >= 0 and text[j] == ">":  # template arguments: match back to '<'
        depth = 0
        while j >= 0:
            if text[j] == ">":
                depth += 1
            elif text[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        j -= 1
        while j >= 0 and text[j].isspace():
            j -= 1
    end = j + 1
    while True:
        while j >= 0 and (text[j].isalnum() or text[j] == "_"):
            j -= 1
        if j >= 1 and text[j - 1 : j + 1] == "::":
            j -= 2
            continue
        break
    start = j + 1
    if start >= end:
        raise RewriteError("%s: cannot find the kernel name before <<<" % line_of(text, p))
    return start


def config_end(text, p):
    """Index of the '>>>' that closes the launch configuration opened at p."""
    depth, i = 0, p + 3
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = skip_literal(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(">>>", i):
            return i
        i += 1
    raise RewriteError("%s: unterminated <<< launch configuration" % line_of(text, p))


def rewrite_launches(text):
    out, cursor = [], 0
    for p in find_launches(text):
        if p < cursor:
            continue
        start = kernel_start(text, p)
        q = config_end(text, p)
        kernel = " ".join(text[start:p].split())
        config = text[p + 3 : q].strip()
        if not config:
            raise RewriteError("%s: empty launch configuration" % line_of(text, p))
        newlines = text.count("\n", start, q + 3)
        out.append(text[cursor:start])
        out.append('(::cpucuda::Launcher("%s", %s) %% [=](auto... cpucuda_a) { %s(cpucuda_a...); })%s'
                   % (kernel, " ".join(config.split()), kernel, "\n" * newlines))
        cursor = q + 3
    out.append(text[cursor:])
    return "".join(out)


def strip_attributes(type_text):
    """Removes __attribute__((...)) and alignas(...) from a declaration's type."""
    out, i = [], 0
    while i < len(type_text):
        m = re.compile(r"__attribute__\s*\(|alignas\s*\(").match(type_text, i)
        if not m:
            out.append(type_text[i])
            i += 1
            continue
        depth, j = 1, m.end()
        while j < len(type_text) and depth:
            depth += {"(": 1, ")": -1}.get(type_text[j], 0)
            j += 1
        i = j
    return " ".join("".join(out).split())


def in_function_body(text, pos):
    """Whether pos lies inside braces other than a namespace's or an extern "C"
    block's (extern __shared__ cannot be a class member, so: a function body)."""
    stack = []
    token = re.compile(r"[{}\"']")
    i = 0
    while True:
        m = token.search(text, i, pos)
        if not m:
            return any(not ns for ns in stack)
        j = m.start()
        c = text[j]
        if c in "\"'":
            # a ' between digits is a C++14 digit separator, not a literal
            i = j + 1 if c == "'" and j > 0 and text[j - 1].isalnum() else skip_literal(text, j)
            continue
        if c == "{":
            head = text[max(0, j - 200):j]
            stack.append(bool(re.search(r'(\bnamespace\b[\w\s:]*|\bextern\s*"C(\+\+)?"\s*)$', head)))
        elif stack:
            stack.pop()
        i = j + 1


def rewrite_shared(text):
    def extern_shared(m):
        t = strip_attributes(m.group(1))
        newlines = m.group(0).count("\n")
        # In a function, a plain local that each GPU thread sets: a thread_local
        # would be initialised by the first thread of a block and read by the
        # others, which the racecheck build rightly reports as a race.
        storage = "" if in_function_body(text, m.start()) else "static thread_local "
        return ("%s%s* const %s = (%s*)::cpucuda::dynamic_shared_memory();%s"
                % (storage, t, m.group(2), t, "\n" * newlines))

    text = EXTERN_SHARED.sub(extern_shared, text)
    return re.sub(r"\b" + SHARED + r"\b", "static thread_local", text)


def main():
    if len(sys.argv) == 3:
        with open(sys.argv[1]) as f:
            text = f.read()
    else:
        text = sys.stdin.read()
    try:
        result = rewrite_shared(rewrite_launches(text))
    except RewriteError as e:
        sys.stderr.write("cudapp.py: %s\n" % e)
        sys.exit(1)
    if len(sys.argv) == 3:
        with open(sys.argv[2], "w") as f:
            f.write(result)
    else:
        sys.stdout.write(result)


if __name__ == "__main__":
    main()
