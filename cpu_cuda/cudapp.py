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

A launch of a kernel whose threads never meet gets `.threads_never_meet()` after
the Launcher, and the runtime runs its blocks as plain loops: no barrier, warp
operation, warp-wide instruction, cp.async or shared memory is reachable from the
kernel's body (see threads_never_meet below).

usage: cudapp.py < unit.ii > unit.rewritten.ii     (or: cudapp.py IN OUT)
"""
import re
import sys

SHARED = "__cpucuda_shared__"
EXTERN_SHARED = re.compile(r"extern\s+" + SHARED + r"\b([^;\[\]]*?)\b(\w+)\s*\[\s*\]\s*;")


# What makes threads meet, by the names the runtime's headers call it with: every
# barrier, warp collective, vote, cooperative-groups operation, mma/ldmatrix and
# cp.async of cpu_cuda/include reaches one of these, and shared memory is one.
MEETS = {"block_barrier", "warp_collective", "warp_wide", "tile_reduce", "cp_async", "cp_async_commit", "cp_async_wait",
         "active_mask", "dynamic_shared_memory", SHARED}
TOKEN = re.compile(r"""[A-Za-z_]\w*|\d[\w.']*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|[{}();<>,]""")
# words that open a block or follow a parameter list without naming a function
NOT_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "noexcept",
             "static_assert", "alignas", "__attribute__", "throw", "new", "delete", "const", "volatile", "override",
             "final", "mutable", "constexpr", "requires", "do", "else", "try", "struct", "class", "union", "enum",
             "namespace", "template", "typename", "operator", "auto", "void", "int", "unsigned", "float", "double",
             "char", "bool", "long", "short", "signed", "inline", "static", "extern"}


def project_text(text):
    """The parts of a preprocessed unit that come from the project (the .cu, llmc/, cpu_cuda/include/: relative
    paths in the line markers), not from system or toolkit headers, which never reach MEETS."""
    parts, keep, pos = [], True, 0
    for m in re.finditer(r'^# \d+ "([^"]*)".*$', text, re.M):
        if keep:
            parts.append(text[pos:m.start()])
        keep = not m.group(1).startswith("/") and not m.group(1).startswith("<")
        pos = m.end()
    if keep:
        parts.append(text[pos:])
    return "\n".join(parts)


def header_name(header):
    """The name a definition's header declares: for a function, the identifier before the first parenthesis at
    depth 0 that is not a keyword's (template arguments skipped: f<int>(...)); else, for a class, the identifier
    after its last struct/class/union keyword; else None."""
    depth = 0
    for k, h in enumerate(header):
        if h == "(":
            if depth == 0:
                j = k - 1
                if j >= 0 and header[j] == ">":  # explicit template arguments: back to their '<'
                    angle = 0
                    while j >= 0:
                        angle += {">": 1, "<": -1}.get(header[j], 0)
                        if angle == 0:
                            break
                        j -= 1
                    j -= 1
                name = header[j] if j >= 0 else ""
                if (name[:1].isalpha() or name[:1] == "_") and name not in NOT_NAMES:
                    return name, False
            depth += 1
        elif h == ")":
            depth -= 1
    for k in range(len(header) - 2, -1, -1):
        if header[k] in ("struct", "class", "union"):
            return header[k + 1], True
    return None, False


def definitions(tokens):
    """(name, body identifiers) of every brace block at namespace or class scope: a function's body, or a
    class's (with all of its members' identifiers, so that a class whose member reaches MEETS does, and with
    its member functions as definitions of their own)."""
    defs, i, n = [], 0, len(tokens)
    header_start = 0
    while i < n:
        t = tokens[i]
        if t in (";", "}"):
            header_start = i + 1
        elif t == "{":
            header = tokens[header_start:i]
            if "namespace" in header or (header and header[-1] == "extern"):  # (its "C" went with the literals)
                i += 1  # a namespace's or extern "C" block's members are definitions of their own
                header_start = i
                continue
            j, depth = i + 1, 1
            while j < n and depth:
                depth += {"{": 1, "}": -1}.get(tokens[j], 0)
                j += 1
            name, is_class = header_name(header)
            if name:
                defs.append((name, {b for b in tokens[i + 1:j - 1] if b[0].isalpha() or b[0] == "_"}))
            if is_class:
                i += 1  # its member functions are definitions too
                header_start = i
                continue
            i = j
            header_start = i
            continue
        i += 1
    return defs


def meeting_names(text):
    """Every name one of whose definitions reaches MEETS, directly or through other names (a fixed point)."""
    tokens = [t for t in TOKEN.findall(project_text(text)) if t[0] not in "\"'0123456789"]
    defs = definitions(tokens)
    meets = set(MEETS)
    changed = True
    while changed:
        changed = False
        for name, body in defs:
            if name not in meets and not body.isdisjoint(meets):
                meets.add(name)
                changed = True
    return meets, {name for name, _ in defs}


def threads_never_meet(kernel, arguments, meets, defined):
    """Whether a launch of `kernel` (its expression, template arguments included) with these argument
    texts can run its threads as a loop: the kernel is defined in the unit and neither it nor any name in
    the launch (a functor type, a device function passed in) reaches MEETS. A name the analysis cannot
    follow (a call through a pointer) is caught at run time: the runtime stops the program if a looped
    kernel reaches a barrier or collective."""
    base = re.sub(r"<.*", "", kernel).split("::")[-1].strip()
    words = set(re.findall(r"[A-Za-z_]\w*", kernel + " " + arguments))
    return base in defined and words.isdisjoint(meets)


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


def argument_text(text, q):
    """The text of the parenthesised argument list that follows the '>>>' at q (empty if none is found)."""
    i = q + 3
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "(":
        return ""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c in "\"'":
            j = skip_literal(text, j)
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return text[i:j + 1]
        j += 1
    return ""


def rewrite_launches(text):
    meets, defined = meeting_names(text)
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
        loop = ".threads_never_meet()" if threads_never_meet(kernel, argument_text(text, q), meets, defined) else ""
        out.append('(::cpucuda::Launcher("%s", %s)%s %% [=](auto... cpucuda_a) { %s(cpucuda_a...); })%s'
                   % (kernel, " ".join(config.split()), loop, kernel, "\n" * newlines))
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
