#!/usr/bin/env python3
"""Writes test/data/tokenizer_cases.json: inputs and the GPT-2 token ids tiktoken gives for
them, for test/host/test_tokenizer.cpp.

The reference is tiktoken (pip install tiktoken regex) with an encoding built from the
local OpenAI files (no download):
    tiktoken.Encoding(name="gpt2_local", pat_str=GPT-2's pattern,
                      mergeable_ranks=<encoder.json ids, checked against vocab.bpe>,
                      special_tokens={"<|endoftext|>": 50256})

"classes": the letter, number and white-space classes of every code point as tiktoken's own
pattern engine sees them (the Rust regex crates, Unicode 16.0.0 in tiktoken 0.14; see
dev/gen_unicode_tables.py): an Encoding whose pattern is just \\p{L} (or \\p{N}, \\s) and
whose tokens are the 256 bytes encodes all code points; tiktoken drops text the pattern does
not match, so the decoded output is exactly the class's members.

Splitting in Python (the pieces of the sweeps, the invalid-UTF-8 cases) uses the `regex`
module with GPT-2's pattern in which \\p{L}, \\p{N} and \\s are replaced by tiktoken's
classes as explicit sets, so the result does not depend on the `regex` module's own Unicode
version (Unicode 17 since 2025, which tiktoken does not use).

Invalid UTF-8 (tiktoken's str API cannot take it): the project's tokenizer treats every
byte that is not part of a valid UTF-8 sequence as a character of its own in the "other"
class. The expected ids are derived the same way in Python: decode with
errors="surrogateescape" (each such byte becomes a lone surrogate U+DC80..U+DCFF, a
"[^\\s\\p{L}\\p{N}]" character), split as above, encode each piece back to its bytes and BPE
it with tiktoken's _encode_single_piece. The same procedure is checked to equal tiktoken's
encode on every valid case.

"sweep" entries: every Unicode scalar value in a few contexts; the C++ test builds the same
text and compares the count and the sha256 of its ids (little-endian uint32).

usage: python3 dev/make_tokenizer_cases.py [--gpt2-dir DIR] [--out FILE]
"""
import argparse
import hashlib
import json
import os
import struct

import regex
import tiktoken

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def byte_symbols():
    """GPT-2's bytes_to_unicode: byte -> printable character."""
    printable = [b for b in range(256) if (33 <= b <= 126) or (161 <= b <= 172) or (174 <= b <= 255)]
    table = {}
    n = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def load_encoding(gpt2_dir):
    sym_to_byte = {c: b for b, c in byte_symbols().items()}
    with open(os.path.join(gpt2_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    ranks = {}
    for sym, i in encoder.items():
        if sym == EOT:
            continue
        ranks[bytes(sym_to_byte[c] for c in sym)] = i
    # tiktoken ranks merges by token id; check that the ids follow vocab.bpe's order
    with open(os.path.join(gpt2_dir, "vocab.bpe"), encoding="utf-8") as f:
        merges = [line.split() for line in f.read().split("\n")[1:] if line]
    for k, (a, b) in enumerate(merges):
        merged = bytes(sym_to_byte[c] for c in a + b)
        assert ranks[merged] == 256 + k, (a, b, k)
    assert encoder[EOT] == 50256
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


def tiktoken_classes():
    """{"letter": ranges, "number": ranges, "space": ranges} as tiktoken's engine classes them."""
    ranks = {bytes([b]): b for b in range(256)}
    every = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    out = {}
    for name, cls in (("letter", r"\p{L}"), ("number", r"\p{N}"), ("space", r"\s")):
        probe = tiktoken.Encoding(name="class_probe", pat_str=cls, mergeable_ranks=ranks, special_tokens={})
        members = sorted(map(ord, probe.decode_bytes(probe.encode_ordinary(every)).decode()))
        ranges = []
        for cp in members:
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
        out[name] = ranges
    return out


def splitter(classes):
    """GPT-2's pattern for the `regex` module with tiktoken's classes as explicit sets."""
    def cls(name):
        return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in classes[name])
    L, N, S = cls("letter"), cls("number"), cls("space")
    pat = (rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+""")
    return regex.compile(pat)


def reference_bytes(enc, split, data: bytes):
    """The surrogateescape procedure described above (no special tokens)."""
    text = data.decode("utf-8", errors="surrogateescape")
    ids = []
    for piece in split.findall(text):
        ids += enc._encode_single_piece(piece.encode("utf-8", errors="surrogateescape"))
    return ids


def sweep_text(context):
    """Every scalar value (no surrogates) in the context; the C++ test builds the same."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        parts.append(context.replace("C", chr(cp)))
    return "".join(parts)


CASES = [
    ("hello world", "Hello world"),
    ("empty", ""),
    ("accents", "café naïve résumé Ærøskøbing Straße ÉCOLE über Ünïcödé"),
    ("cjk", "你好，世界！日本語のテキスト、カタカナ。한국어 텍스트 漢字"),
    ("emoji", "I ❤️ pizza 🍕🍕🍕 family 👨‍👩‍👧‍👦 flags 🇫🇷🇩🇪 skin 👍🏽 done"),
    ("combining marks", "e\u0301 a\u0308o\u0308 n\u0303 Z\u0351\u0352a\u0367l\u0489g\u035co\u0310 "
                        "\u0915\u093f\u0924\u093e\u092c \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"),
    ("scripts", "Привет мир Καλημέρα κόσμε مرحبا بالعالم שלום עולם Ողջույն ሰላም"),
    ("non-BMP letters and digits", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈𐌰𐌹 𝒳² 𠀀𠀁"),
    ("spaces", "a  b   c    d"),
    ("tabs and newlines", "a\t\tb\n\n\nc \n \nd\r\n\r\ne\t \t f"),
    ("trailing whitespace", "end with spaces   "),
    ("trailing newlines", "line\n\n"),
    ("leading whitespace", "   leading\n\tand tab"),
    ("only whitespace", " \t\n  \n\t "),
    ("unicode spaces", "x\u00a0y\u3000z\u2003w \u2028v\u0085u\u1680t  \u00a0s"),
    ("not white space (\\x1c-\\x1f, \\u200b)", "a\x1cb\x1d c\x1e\x1f d\u200be \u180ef"),
    ("digits", "1234567890 3.14159 1,000,000 2024-05-20 0x1F 12abc34 ab12"),
    ("other numbers", "٣٤٥ ०१२ ²³¹ ½¾ ⅫⅣ ①② 五"),
    ("contractions", "I'm you're we've they'll he'd it's don't can't"),
    ("uppercase contractions", "IT'S I'M YOU'RE WE'VE THEY'LL HE'D DON'T 'S 'T"),
    ("apostrophes", "'s's ''s ' s 'sss rock'n'roll '' ' 'x 'll've '\n's"),
    ("punctuation runs", "!!!??? ... --- ==> (a+b)*c; {}[]<>@#$%^&*_~`|\\/ !@#$ %^&*"),
    ("code", "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
    ("json", '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}'),
    ("url", "https://example.com/path?q=1&r=two#frag user@example.org"),
    ("controls", "\x00\x01\x02 \x07\x08\x1b[0m\x7f\x7f end"),
    ("long letter run", "a" * 300),
    ("long mixed run", "abcdefghij" * 40),
    ("long punctuation run", "=" * 500 + "\n" + "-." * 200),
    ("long space run", " " * 300 + "x" + " " * 300),
    ("many newlines", "\n" * 100 + "x"),
    ("eot as text", "hello <|endoftext|> world"),
    ("partial eot", "<|endoftext <|endof|> endoftext|>"),
    # U+088F is a letter in Unicode 17 but not in 16 (tiktoken's): the apostrophe then joins it
    ("U+088F before 's", "\u088f's"),
    ("shakespeare", "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
                    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n"),
]

SPECIAL_CASES = [
    ("eot spot check", "hello " + EOT),
    ("eot alone", EOT),
    ("eot between", "a" + EOT + "b" + EOT + EOT + " c " + EOT + "\n"),
]

INVALID_CASES = [
    ("invalid: lone 0xff 0xfe", b"abc\xff\xfedef"),
    ("invalid: truncated 2-byte", b"\xc3( ok"),
    ("invalid: truncated 3-byte at end", b"euro \xe2\x82"),
    ("invalid: stray continuation bytes", b" \x80\x80x \xbf"),
    ("invalid: lead byte at end", b"caf\xc3"),
    ("invalid: encoded surrogate", b"a\xed\xa0\x80b"),
    ("invalid: above U+10FFFF", b"x\xf4\x90\x80\x80y"),
    ("invalid: overlong", b"\xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf"),
    ("invalid: mixed with words", b" \xffabc's \xff\xff 12\xff\xfe!! \xe4\xbd\xa0\xe4\xbd"),
    ("invalid: every byte 0x80-0xff", bytes(range(0x80, 0x100))),
    ("invalid: spaces around", b"\xff \xff  \xff\n\xff"),
]

SWEEPS = [
    ("all scalar values: C", "C"),
    ("all scalar values: ' Ca' + 'CC' + '1C' + '\\n'", " CaCC1C\n"),
    ("all scalar values: 'C  ' + 'C\\n'", "C  C\n"),
    # 's splits off after a letter or number but joins an "other" character: the class shows
    ("all scalar values: 'C' + \"'s \"", "C's "),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt2-dir", default=os.path.join(os.environ.get("SHARED_DATA", "../shared/data"), "gpt2"))
    ap.add_argument("--out", default="test/data/tokenizer_cases.json")
    args = ap.parse_args()
    enc = load_encoding(args.gpt2_dir)
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("hello " + EOT, allowed_special="all") == [31373, 220, 50256]

    classes = tiktoken_classes()
    split = splitter(classes)
    for name, n in (("letter", 141028), ("number", 1911), ("space", 25)):  # Unicode 16.0.0
        count = sum(b - a + 1 for a, b in classes[name])
        assert count == n, f"tiktoken {tiktoken.__version__}: {count} {name} code points, not Unicode 16's {n}"

    cases = []
    for name, text in CASES:
        ids = enc.encode_ordinary(text)
        data = text.encode("utf-8")
        assert reference_bytes(enc, split, data) == ids, name  # the procedure for invalid bytes
        assert enc.decode_bytes(ids) == data
        cases.append({"name": name, "hex": data.hex(), "text": text, "allow_special": False, "ids": ids})
    for name, text in SPECIAL_CASES:
        ids = enc.encode(text, allowed_special="all")
        cases.append({"name": name, "hex": text.encode().hex(), "text": text, "allow_special": True, "ids": ids})
    for name, data in INVALID_CASES:
        ids = reference_bytes(enc, split, data)
        assert enc.decode_bytes(ids) == data
        cases.append({"name": name, "hex": data.hex(), "allow_special": False, "ids": ids,
                      "reference": "surrogateescape + regex + tiktoken _encode_single_piece"})

    sweeps = []
    for name, context in SWEEPS:
        text = sweep_text(context)
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        sha = hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()
        # the pre-tokenisation itself: sha256 of the pieces' byte lengths
        lengths = [len(p.encode()) for p in split.findall(text)]
        piece_sha = hashlib.sha256(struct.pack(f"<{len(lengths)}I", *lengths)).hexdigest()
        sweeps.append({"name": name, "context": context, "bytes": len(text.encode()), "count": len(ids),
                       "sha256": sha, "pieces": len(lengths), "pieces_sha256": piece_sha})
        print(f"sweep {name}: {len(text.encode())} bytes, {len(ids)} tokens")

    out = {
        "generator": "dev/make_tokenizer_cases.py",
        "reference": f"tiktoken {tiktoken.__version__}, GPT-2 pattern, local encoder.json/vocab.bpe",
        "cases": cases,
        "sweeps": sweeps,
        "classes": classes,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:  # one case per line
        f.write("{\n")
        for key in ("generator", "reference"):
            f.write(f" {json.dumps(key)}: {json.dumps(out[key])},\n")
        for key in ("cases", "sweeps"):
            f.write(f' {json.dumps(key)}: [\n  ')
            f.write(",\n  ".join(json.dumps(c, ensure_ascii=True) for c in out[key]))
            f.write("\n ],\n")
        f.write(' "classes": {\n  ')
        f.write(",\n  ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in classes.items()))
        f.write("\n }\n")
        f.write("}\n")
    json.load(open(args.out))
    print(f"{args.out}: {len(cases)} cases, {len(sweeps)} sweeps")


if __name__ == "__main__":
    main()
