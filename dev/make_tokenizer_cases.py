#!/usr/bin/env python3
"""Writes test/data/tokenizer_cases.json (--family gpt2) or tokenizer_cases_llama3.json
(--family llama3): inputs and the token ids tiktoken gives for them, for
test/host/test_tokenizer.cpp.

The reference is tiktoken (pip install tiktoken regex) with an encoding built from local
files (no download):
    gpt2:   tiktoken.Encoding(name="gpt2_local", pat_str=GPT-2's pattern,
                              mergeable_ranks=<encoder.json ids, checked against vocab.bpe>,
                              special_tokens={"<|endoftext|>": 50256})
    llama3: tiktoken.Encoding(name="llama3_test", pat_str=Llama 3's pattern,
                              mergeable_ranks=load_tiktoken_bpe(test/data/tiktoken_test.ranks),
                              special_tokens=Llama 3's 256, ids N..N+255)
    Meta's tokenizer.model cannot be downloaded here; test/data/tiktoken_test.ranks is a
    small BPE (dev/make_tiktoken_ranks.py). Each llama3 case also holds the ids under GPT-2's
    50,256 ranks with Llama 3's pattern ("ids_gpt2_ranks"; the C++ test rewrites encoder.json
    as a ranks file), and "corpora" the count and sha256 of the ids of the shared corpora
    (tinyshakespeare, HellaSwag's text) under both vocabularies; "pieces" the byte lengths
    of each case's pieces (checked against tiktoken's through an encoding whose tokens are
    all byte pairs: its ids change with where a piece ends).

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

usage: python3 dev/make_tokenizer_cases.py [--family gpt2|llama3] [--gpt2-dir DIR] [--out FILE]
"""
import argparse
import hashlib
import json
import os
import struct

import regex
import tiktoken

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
              r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"] +
                   [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
TEST_RANKS = "test/data/tiktoken_test.ranks"


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


def gpt2_ranks(gpt2_dir):
    """GPT-2's 50,256 tokens (all but <|endoftext|>) as tiktoken ranks: bytes -> id."""
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
    return ranks


def load_encoding(gpt2_dir):
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PAT, mergeable_ranks=gpt2_ranks(gpt2_dir),
                             special_tokens={EOT: 50256})


def llama3_encoding(ranks):
    """Llama 3's pattern and specials (Meta's tokenizer.py) over the given ranks."""
    n = len(ranks)
    return tiktoken.Encoding(name="llama3_test", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                             special_tokens={t: n + i for i, t in enumerate(LLAMA3_SPECIALS)})


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


def splitter(classes, family="gpt2"):
    """The family's pattern for the `regex` module with tiktoken's classes as explicit sets."""
    def cls(name):
        return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in classes[name])
    L, N, S = cls("letter"), cls("number"), cls("space")
    if family == "llama3":
        pat = (rf"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{S}{L}{N}]+[\r\n]*|"""
               rf"""[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+""")
    else:
        pat = (rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+""")
    return regex.compile(pat)


def reference_bytes(enc, split, data: bytes):
    """The surrogateescape procedure described above (no special tokens)."""
    text = data.decode("utf-8", errors="surrogateescape")
    ids = []
    for piece in split.findall(text):
        ids += enc._encode_single_piece(piece.encode("utf-8", errors="surrogateescape"))
    return ids


def piece_lengths(split, data: bytes):
    """The byte lengths of the pieces of data (invalid UTF-8 as in reference_bytes)."""
    text = data.decode("utf-8", errors="surrogateescape")
    return [len(p.encode("utf-8", errors="surrogateescape")) for p in split.findall(text)]


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


# What Llama 3's pattern does differently: case-insensitive contractions (U+017F long s is
# an s to tiktoken's engine), one non-letter joining the letters after it, numbers in threes,
# line breaks joining the punctuation before them, white space up to its last line break.
LLAMA3_CASES = [
    ("llama3: contractions in any case", "IT'S It'S it's I'M YOU'RE We'Ve THEY'LL HE'D DON'T 'S 'T 'Ll"),
    ("llama3: long s and kelvin after '", "it\u017fs it'\u017f x'\u017ft 'K '\u212a 'k '\u017f\u017f"),
    ("llama3: a non-letter before letters", "'hello \"quoted\" (paren) $dollar \tTab \u00a0nbsp _under 1abc"),
    ("llama3: numbers in threes", "1 12 123 1234 12345 123456 1234567 3.14159265 ١٢٣٤٥ 2024-05-20 x1234y"),
    ("llama3: line breaks after punctuation", "end.\n\nNext!\r\n\r\n?\n \n...\n\t\n"),
    ("llama3: white space and line breaks", "a \n b\t\n\n  c  \r\n  d \n\n\n   e\r\r\rf \n"),
    ("llama3: tabs and spaces before words", "\t\tword  \t word \u3000word \u2028word \u0085word"),
]

LLAMA3_SPECIAL_CASES = [
    ("llama3: chat template", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"),
    ("llama3: document ends", "one<|end_of_text|><|begin_of_text|>two"),
    ("llama3: reserved tokens", "<|reserved_special_token_0|><|reserved_special_token_250|><|reserved_special_token_251|>"),
    ("llama3: partial specials", "<|begin_of_text <|eot_id| |eot_id|> <|<|eot_id|>|>"),
]

LLAMA3_SWEEPS = [
    ("llama3: all scalar values: \"'C \" + \"x'Cx\"", "'C x'Cx"),
    ("llama3: all scalar values: 'xC1234C\\r\\n'", "xC1234C\r\n"),
    ("llama3: all scalar values: ' C.\\n\\tC'", " C.\n\tC"),
]


def sha_u32(values):
    return hashlib.sha256(struct.pack(f"<{len(values)}I", *values)).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=("gpt2", "llama3"), default="gpt2")
    ap.add_argument("--gpt2-dir", default=os.path.join(os.environ.get("SHARED_DATA", "../shared/data"), "gpt2"))
    ap.add_argument("--ranks", default=TEST_RANKS, help="llama3: the tiktoken ranks file")
    ap.add_argument("--out")
    args = ap.parse_args()
    llama3 = args.family == "llama3"
    out_path = args.out or ("test/data/tokenizer_cases_llama3.json" if llama3 else "test/data/tokenizer_cases.json")
    classes = tiktoken_classes()
    split = splitter(classes, args.family)
    for name, n in (("letter", 141028), ("number", 1911), ("space", 25)):  # Unicode 16.0.0
        count = sum(b - a + 1 for a, b in classes[name])
        assert count == n, f"tiktoken {tiktoken.__version__}: {count} {name} code points, not Unicode 16's {n}"
    if llama3:
        from tiktoken.load import load_tiktoken_bpe
        enc = llama3_encoding(load_tiktoken_bpe(args.ranks))  # tiktoken's own reader of the format
        big = llama3_encoding(gpt2_ranks(args.gpt2_dir))  # GPT-2's ranks, Llama 3's pattern
        # every byte pair a token: the ids show where tiktoken's pieces end (a piece boundary
        # changes the pairing), to check the `regex` split against
        pairs = {bytes([b]): b for b in range(256)}
        pairs.update({bytes([a, b]): 256 + a * 256 + b for a in range(256) for b in range(256)})
        probe = tiktoken.Encoding(name="pair_probe", pat_str=LLAMA3_PAT, mergeable_ranks=pairs, special_tokens={})
        special, cases_in = LLAMA3_SPECIALS[0], CASES + LLAMA3_CASES
        special_cases, sweeps_in = LLAMA3_SPECIAL_CASES, SWEEPS + LLAMA3_SWEEPS
    else:
        enc = load_encoding(args.gpt2_dir)
        assert enc.encode("Hello world") == [15496, 995]
        assert enc.encode("hello " + EOT, allowed_special="all") == [31373, 220, 50256]
        special, cases_in, special_cases, sweeps_in = EOT, CASES, SPECIAL_CASES, SWEEPS
    assert enc.encode(special, allowed_special="all") == [enc.n_vocab - (256 if llama3 else 1)]

    cases = []
    for name, text in cases_in:
        ids = enc.encode_ordinary(text)
        data = text.encode("utf-8")
        assert reference_bytes(enc, split, data) == ids, name  # the procedure for invalid bytes
        assert enc.decode_bytes(ids) == data
        case = {"name": name, "hex": data.hex(), "text": text, "allow_special": False, "ids": ids}
        if llama3:
            case["ids_gpt2_ranks"] = big.encode_ordinary(text)
            case["pieces"] = piece_lengths(split, data)
            assert [i for p in split.findall(text) for i in probe._encode_single_piece(p.encode())] == \
                probe.encode_ordinary(text), name
        cases.append(case)
    for name, text in special_cases:
        ids = enc.encode(text, allowed_special="all")
        case = {"name": name, "hex": text.encode().hex(), "text": text, "allow_special": True, "ids": ids}
        if llama3:
            case["ids_gpt2_ranks"] = big.encode(text, allowed_special="all")
        cases.append(case)
    for name, data in INVALID_CASES:
        ids = reference_bytes(enc, split, data)
        assert enc.decode_bytes(ids) == data
        case = {"name": name, "hex": data.hex(), "allow_special": False, "ids": ids,
                "reference": "surrogateescape + regex + tiktoken _encode_single_piece"}
        if llama3:
            case["ids_gpt2_ranks"] = reference_bytes(big, split, data)
            case["pieces"] = piece_lengths(split, data)
        cases.append(case)

    sweeps = []
    for name, context in sweeps_in:
        text = sweep_text(context)
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        # the pre-tokenisation itself: sha256 of the pieces' byte lengths
        pieces = split.findall(text)
        if llama3:  # the explicit-set pattern splits as tiktoken's engine does
            assert [i for p in pieces for i in probe._encode_single_piece(p.encode())] == probe.encode_ordinary(text), name
        lengths = [len(p.encode()) for p in pieces]
        sweeps.append({"name": name, "context": context, "bytes": len(text.encode()), "count": len(ids),
                       "sha256": sha_u32(ids), "pieces": len(lengths), "pieces_sha256": sha_u32(lengths)})
        print(f"sweep {name}: {len(text.encode())} bytes, {len(ids)} tokens")

    corpora = []
    if llama3:
        shared = os.path.dirname(os.path.abspath(args.gpt2_dir))
        for fname in ("tinyshakespeare.txt", "hellaswag_val_full.txt"):
            with open(os.path.join(shared, fname), encoding="utf-8") as f:
                text = f.read()
            for ranks_name, e in (("test", enc), ("gpt2", big)):
                ids = e.encode_ordinary(text)
                corpora.append({"file": fname, "ranks": ranks_name, "bytes": len(text.encode()), "count": len(ids),
                                "sha256": sha_u32(ids)})
                print(f"corpus {fname}, {ranks_name} ranks: {len(ids)} tokens")

    out = {
        "generator": "dev/make_tokenizer_cases.py" + (" --family llama3" if llama3 else ""),
        "reference": (f"tiktoken {tiktoken.__version__}, Llama 3 pattern and specials, ranks {args.ranks} "
                      f"(ids_gpt2_ranks: GPT-2's encoder.json as ranks)" if llama3 else
                      f"tiktoken {tiktoken.__version__}, GPT-2 pattern, local encoder.json/vocab.bpe"),
        "cases": cases,
        "sweeps": sweeps,
    }
    if llama3:
        out["corpora"] = corpora
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:  # one case per line
        f.write("{\n")
        for key in ("generator", "reference"):
            f.write(f" {json.dumps(key)}: {json.dumps(out[key])},\n")
        lists = ("cases", "sweeps", "corpora") if llama3 else ("cases", "sweeps")
        for k, key in enumerate(lists):
            f.write(f' {json.dumps(key)}: [\n  ')
            f.write(",\n  ".join(json.dumps(c, ensure_ascii=True) for c in out[key]))
            f.write("\n ]\n" if llama3 and k + 1 == len(lists) else "\n ],\n")
        if not llama3:
            f.write(' "classes": {\n  ')
            f.write(",\n  ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in classes.items()))
            f.write("\n }\n")
        f.write("}\n")
    json.load(open(out_path))
    print(f"{out_path}: {len(cases)} cases, {len(sweeps)} sweeps")


if __name__ == "__main__":
    main()
