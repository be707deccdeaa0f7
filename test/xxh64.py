"""XXH64 (seed 0) in plain Python, for tests that write a DONE marker vouching for a file
they changed on purpose (llmc/formats/checkpoint.h checks each file's XXH64 against its DONE).
test/trainer/test_train_cli.sh checks it against the digests in the trainer's own DONE files.

    python3 test/xxh64.py DIR STEP    rewrites DIR/DONE_<STEP> with the sizes and digests of
                                      the files it lists as they are now"""
import struct

P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
M = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M, 31) * P1) & M


def _merge(acc, v):
    return ((acc ^ _round(0, v)) * P1 + P4) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), data)
        for j in range(0, len(lanes), 4):
            v = [_round(v[k], lanes[j + k]) for k in range(4)]
        i = n // 32 * 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M
        for k in range(4):
            h = _merge(h, v[k])
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * P1) & M
        h = (_rotl(h, 23) * P2 + P3) & M
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M
        h = (_rotl(h, 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    h ^= h >> 32
    return h


def rewrite_done(folder, step):
    path = "%s/DONE_%08d" % (folder, step)
    lines = open(path).read().splitlines()
    out = []
    for line in lines:
        if line.startswith("file "):
            name = line.split()[1]
            data = open("%s/%s" % (folder, name), "rb").read()
            line = "file %s %d %016x" % (name, len(data), xxh64(data))
        out.append(line)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    import sys
    assert xxh64(b"") == 0xEF46DB3751D8E999, hex(xxh64(b""))
    rewrite_done(sys.argv[1], int(sys.argv[2]))
