// Byte-level BPE tokenizer of GPT-2 and Llama 3 (header-only host C++17): encode and decode.
//
// Sources of a vocabulary:
//   - OpenAI's GPT-2 files, encoder.json + vocab.bpe (load_gpt2): id -> token and the
//     ranked merges;
//   - a tiktoken ranks file (load_tiktoken; the format of Llama 3's tokenizer.model): one
//     line "<base64 of the token's bytes> <rank>" per token, ranks 0..N-1 = the ids; a pair
//     merges when its concatenation is a token, with that token's rank. The pattern is a
//     parameter (Llama 3's by default); the special tokens follow the N ranks: Llama 3's
//     256 (<|begin_of_text|> = N, <|end_of_text|> = N+1, ... <|eot_id|> = N+9; N = 128000
//     in Meta's file) or, with GPT-2's pattern, <|endoftext|> = N;
//   - llm.c's tokenizer .bin (load_bin / save_bin): little-endian header of 256 int32
//     ([0]=20240328, [1]=version 2 (1 is read too), [2]=vocab size V, [3]=EOT id), then
//     for each token a uint8 length (1..255) and its bytes. The .bin holds no merges;
//     encoding from it merges a pair when their concatenation is a token, with the
//     token's id as its rank (tiktoken's rule; for GPT-2 it gives the same ids).
//
// Encoding (same ids as tiktoken's Encoding of the same ranks, pattern and specials):
//   1. with allow_special, the text is split on the special tokens' strings, each of which
//      becomes its id; otherwise they are ordinary text;
//   2. pre-tokenisation by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      or Llama 3's (tiktoken's cl100k_base pattern)
//        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      with Unicode letter/number/white-space classes (llmc/data/tokenizer_unicode.h, generated
//      by dev/gen_unicode_tables.py) of Unicode 16.0.0, the version of tiktoken's engine;
//   3. each piece: one token where the whole piece is a token, otherwise byte-level BPE:
//      repeatedly merge the adjacent pair of lowest rank (leftmost on ties).
//   Invalid UTF-8: each byte that is not part of a valid UTF-8 sequence (strictly: no
//   overlong forms, no surrogates, nothing above U+10FFFF) is a character of its own in
//   the "other" class (what Python's surrogateescape decoding gives), so it pre-tokenises
//   like punctuation; byte-level BPE then covers every byte, so decode(encode(x)) == x
//   for any byte string.
//
// Speed: a per-thread cache of piece -> ids; pieces up to 256 bytes merge by scanning,
// longer ones through a heap, pieces over 64 KB through per-rank buckets (all O(n log n)
// or better for long pieces, same result); ParallelEncoder encodes many documents (and long
// documents, split at points where the pattern always splits) on N threads with the same
// output for any N.
//
// Errors (unreadable, garbled or inconsistent files) throw llmc::Error (llmc/error.h)
// with one line "PATH: problem".
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <queue>
#include <string>
#include <string_view>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "llmc/error.h"
#include "llmc/formats/regular_file.h"
#include "llmc/data/tokenizer_unicode.h"

namespace llmc {

// The pre-tokenisation pattern (the regular expression that splits text into pieces).
enum class Pattern { Gpt2, Llama3 };

namespace tok_detail {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };
constexpr uint32_t kInvalidCp = 0xFFFFFFFFu;

// Decodes one strict UTF-8 character at s[0..n) (n >= 1). Returns its length; *cp is
// kInvalidCp (length 1) where s[0] does not start a valid sequence.
inline int utf8_decode(const uint8_t* s, size_t n, uint32_t* cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    auto cont = [&](size_t i) { return i < n && (s[i] & 0xC0) == 0x80; };
    if (b >= 0xC2 && b <= 0xDF) {
        if (cont(1)) {
            *cp = ((b & 0x1Fu) << 6) | (s[1] & 0x3Fu);
            return 2;
        }
    } else if (b >= 0xE0 && b <= 0xEF) {
        if (n >= 3 && cont(1) && cont(2)) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;  // no surrogates
            if (s[1] >= lo && s[1] <= hi) {
                *cp = ((b & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
                return 3;
            }
        }
    } else if (b >= 0xF0 && b <= 0xF4) {
        if (n >= 4 && cont(1) && cont(2) && cont(3)) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
            if (s[1] >= lo && s[1] <= hi) {
                *cp = ((b & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
                return 4;
            }
        }
    }
    *cp = kInvalidCp;
    return 1;
}

// Class of every code point: a two-stage table (256-code-point blocks, deduplicated).
struct ClassTable {
    std::vector<uint16_t> stage1;  // cp >> 8 -> block
    std::vector<uint8_t> blocks;   // 256 classes per block
    ClassTable() {
        std::vector<uint8_t> all(0x110000, kOther);
        auto fill = [&](const uint32_t(*r)[2], size_t n, uint8_t c) {
            for (size_t i = 0; i < n; i++)
                for (uint32_t cp = r[i][0]; cp <= r[i][1]; cp++) all[cp] = c;
        };
        using namespace llmc_unicode;
        fill(kLetterRanges, sizeof(kLetterRanges) / sizeof(kLetterRanges[0]), kLetter);
        fill(kNumberRanges, sizeof(kNumberRanges) / sizeof(kNumberRanges[0]), kNumber);
        fill(kSpaceRanges, sizeof(kSpaceRanges) / sizeof(kSpaceRanges[0]), kSpace);
        std::map<std::string, uint16_t> seen;
        stage1.resize(0x110000 >> 8);
        for (size_t blk = 0; blk < stage1.size(); blk++) {
            std::string key(reinterpret_cast<const char*>(&all[blk << 8]), 256);
            auto it = seen.find(key);
            if (it == seen.end()) {
                uint16_t idx = (uint16_t)(blocks.size() / 256);
                blocks.insert(blocks.end(), key.begin(), key.end());
                it = seen.emplace(key, idx).first;
            }
            stage1[blk] = it->second;
        }
    }
    uint8_t get(uint32_t cp) const { return blocks[(size_t)stage1[cp >> 8] * 256 + (cp & 255)]; }
};
inline const ClassTable& class_table() {
    static const ClassTable t;
    return t;
}

// Pre-tokenisation by one of two patterns: next_piece(s, n, i) is the end of the match
// starting at i.
class PreTokenizer {
  public:
    PreTokenizer() : ct_(&class_table()) {
        for (int b = 0; b < 128; b++) ascii_[b] = ct_->get((uint32_t)b);
    }
    void set_pattern(Pattern p) { pattern_ = p; }
    Pattern pattern() const { return pattern_; }
    uint8_t ascii_class(uint8_t b) const { return b < 128 ? ascii_[b] : kOther; }

    // Class and byte length of the character at s[i].
    inline uint8_t cls(const uint8_t* s, size_t n, size_t i, int* len) const {
        uint8_t b = s[i];
        if (b < 0x80) {
            *len = 1;
            return ascii_[b];
        }
        uint32_t cp;
        *len = utf8_decode(s + i, n - i, &cp);
        return cp == kInvalidCp ? kOther : ct_->get(cp);
    }

    size_t next_piece(const uint8_t* s, size_t n, size_t i) const {
        return pattern_ == Pattern::Llama3 ? next_piece_llama3(s, n, i) : next_piece_gpt2(s, n, i);
    }

    // A position p >= from where the pattern always splits, so the pieces of s[0,p) and
    // s[p,n) are those of s; n if none. GPT-2: s[p-1] an ASCII non-space, s[p] ASCII white
    // space. Llama 3 the same with s[p] not \r or \n (an "other" run takes the line breaks
    // after it: ".\n" is one piece).
    size_t safe_split(const uint8_t* s, size_t n, size_t from) const {
        const bool llama3 = pattern_ == Pattern::Llama3;
        for (size_t p = std::max<size_t>(from, 1); p < n; p++) {
            uint8_t b = s[p];
            if (b < 0x80 && ascii_[b] == kSpace && s[p - 1] < 0x80 && ascii_[s[p - 1]] != kSpace &&
                !(llama3 && (b == '\r' || b == '\n')))
                return p;
        }
        return n;
    }

  private:
    //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    size_t next_piece_gpt2(const uint8_t* s, size_t n, size_t i) const {
        uint8_t b = s[i];
        // 's 't 're 've 'm 'll 'd
        if (b == '\'' && i + 1 < n) {
            uint8_t c = s[i + 1];
            if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
            if (i + 2 < n) {
                uint8_t d = s[i + 2];
                if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return i + 3;
            }
        }
        int len;
        uint8_t c = cls(s, n, i, &len);
        size_t j = i + len;
        if (b == ' ' && j < n) {  // ' ?' followed by a letter, number or other character
            int len2;
            uint8_t c2 = cls(s, n, j, &len2);
            if (c2 != kSpace) {
                c = c2;
                j += len2;
            }
        }
        if (c != kSpace) return run_end(s, n, j, c);  // \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+
        return space_run_end(s, n, i, j);
    }

    //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    size_t next_piece_llama3(const uint8_t* s, size_t n, size_t i) const {
        if (s[i] == '\'') {
            size_t e = contraction_end(s, n, i + 1);
            if (e) return e;
        }
        int len;
        uint8_t c = cls(s, n, i, &len);
        size_t j = i + len;
        if (c == kLetter) return run_end(s, n, j, kLetter);  // \p{L}+
        const bool line_break = s[i] == '\r' || s[i] == '\n';
        int len2 = 0;
        uint8_t c2 = j < n ? cls(s, n, j, &len2) : kSpace;
        if (c != kNumber && !line_break && c2 == kLetter)  // [^\r\n\p{L}\p{N}]\p{L}+
            return run_end(s, n, j + len2, kLetter);
        if (c == kNumber) {  // \p{N}{1,3}
            for (int k = 1; k < 3 && j < n; k++) {
                int l;
                if (cls(s, n, j, &l) != kNumber) break;
                j += l;
            }
            return j;
        }
        if (c == kOther || (s[i] == ' ' && c2 == kOther)) {  //  ?[^\s\p{L}\p{N}]+[\r\n]*
            size_t e = run_end(s, n, c == kOther ? j : j + len2, kOther);
            while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
            return e;
        }
        // white space: \s*[\r\n]+ takes the run up to its last line break, if it has one
        size_t e = j, after_break = line_break ? j : 0;
        while (e < n) {
            int l;
            if (cls(s, n, e, &l) != kSpace) break;
            if (s[e] == '\r' || s[e] == '\n') after_break = e + 1;
            e += l;
        }
        if (after_break) return after_break;
        return space_run_end(s, n, i, j);
    }

    // The end of (?i:'s|'t|'re|'ve|'m|'ll|'d) after the apostrophe at s[k-1], or 0. Case-
    // insensitive as tiktoken's regex engine: Unicode simple case folding, under which
    // U+017F (long s, C5 BF) is also an s.
    static size_t contraction_end(const uint8_t* s, size_t n, size_t k) {
        auto letter = [&](size_t i) -> uint8_t {  // the ASCII letter s[i] in lower case, else 0
            uint8_t b = i < n ? (uint8_t)(s[i] | 0x20) : 0;
            return b >= 'a' && b <= 'z' ? b : 0;
        };
        if (k + 1 < n && s[k] == 0xC5 && s[k + 1] == 0xBF) return k + 2;
        uint8_t c = letter(k), d = letter(k + 1);
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return k + 1;
        if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return k + 2;
        return 0;
    }

    // The end of the run of class c that continues at j.
    size_t run_end(const uint8_t* s, size_t n, size_t j, uint8_t c) const {
        while (j < n) {
            int l;
            if (cls(s, n, j, &l) != c) break;
            j += l;
        }
        return j;
    }

    // \s+(?!\S) | \s+ for the white space at i (its first character ends at j): the run; if
    // a non-space follows, the run less its last character (when that leaves at least one)
    size_t space_run_end(const uint8_t* s, size_t n, size_t i, size_t j) const {
        size_t last = i;
        int count = 1;
        while (j < n) {
            int l;
            if (cls(s, n, j, &l) != kSpace) break;
            last = j;
            j += l;
            count++;
        }
        if (j == n || count < 2) return j;
        return last;
    }

    const ClassTable* ct_;
    uint8_t ascii_[128];
    Pattern pattern_ = Pattern::Gpt2;
};

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h ? h : 1;
}

// Open-addressing map from byte strings to short id sequences (keys and values in arenas).
class StrTable {
  public:
    size_t size() const { return count_; }
    void clear() {
        slots_.clear();
        keys_.clear();
        vals_.clear();
        count_ = 0;
        mask_ = 0;
    }
    // The ids stored for key, or nullptr; *nval gets their count.
    const int* find(std::string_view key, uint64_t h, size_t* nval) const {
        if (slots_.empty()) return nullptr;
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& sl = slots_[i];
            if (sl.hash == 0) return nullptr;
            if (sl.hash == h && sl.key_len == key.size() &&
                memcmp(keys_.data() + sl.key_off, key.data(), key.size()) == 0) {
                *nval = sl.val_len;
                return vals_.data() + sl.val_off;
            }
        }
    }
    // Inserts key (not present) -> ids.
    void insert(std::string_view key, uint64_t h, const int* ids, size_t n) {
        if ((count_ + 1) * 2 > slots_.size()) grow();
        size_t i = h & mask_;
        while (slots_[i].hash != 0) i = (i + 1) & mask_;
        slots_[i] = Slot{h, (uint32_t)keys_.size(), (uint32_t)key.size(), (uint32_t)vals_.size(), (uint32_t)n};
        keys_.append(key.data(), key.size());
        vals_.insert(vals_.end(), ids, ids + n);
        count_++;
    }
    size_t arena_bytes() const { return keys_.size() + vals_.size() * sizeof(int); }

  private:
    struct Slot {
        uint64_t hash;
        uint32_t key_off, key_len, val_off, val_len;
    };
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        size_t cap = old.empty() ? 1024 : old.size() * 2;
        slots_.assign(cap, Slot{0, 0, 0, 0, 0});
        mask_ = cap - 1;
        for (const Slot& sl : old) {
            if (sl.hash == 0) continue;
            size_t i = sl.hash & mask_;
            while (slots_[i].hash != 0) i = (i + 1) & mask_;
            slots_[i] = sl;
        }
    }
    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<int> vals_;
    size_t count_ = 0, mask_ = 0;
};

// Pair (left id, right id) -> (rank, merged id), open addressing.
class PairTable {
  public:
    static constexpr uint32_t kNone = 0xFFFFFFFFu;
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap *= 2;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, 0);
        mask_ = cap - 1;
        count_ = 0;
    }
    size_t size() const { return count_; }
    // Keeps the lower rank where the pair is already present.
    void insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
        if ((count_ + 1) * 2 > keys_.size()) rehash(keys_.size() * 2);
        uint64_t k = key(a, b);
        size_t i = slot(k);
        while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
        if (keys_[i] == k) {
            if ((uint32_t)(vals_[i] >> 32) <= rank) return;
        } else {
            count_++;
        }
        keys_[i] = k;
        vals_[i] = ((uint64_t)rank << 32) | merged;
    }
    // Rank of the pair (kNone if it does not merge); *merged its token.
    inline uint32_t find(uint32_t a, uint32_t b, uint32_t* merged) const {
        uint64_t k = key(a, b);
        for (size_t i = slot(k);; i = (i + 1) & mask_) {
            if (keys_[i] == k) {
                *merged = (uint32_t)vals_[i];
                return (uint32_t)(vals_[i] >> 32);
            }
            if (keys_[i] == kEmpty) return kNone;
        }
    }

  private:
    static constexpr uint64_t kEmpty = ~0ull;
    static uint64_t key(uint32_t a, uint32_t b) { return ((uint64_t)a << 32) | b; }
    size_t slot(uint64_t k) const { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
    void rehash(size_t cap) {
        std::vector<uint64_t> ok, ov;
        ok.swap(keys_);
        ov.swap(vals_);
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, 0);
        mask_ = cap - 1;
        for (size_t i = 0; i < ok.size(); i++) {
            if (ok[i] == kEmpty) continue;
            size_t j = slot(ok[i]);
            while (keys_[j] != kEmpty) j = (j + 1) & mask_;
            keys_[j] = ok[i];
            vals_[j] = ov[i];
        }
    }
    std::vector<uint64_t> keys_{16, kEmpty};
    std::vector<uint64_t> vals_{std::vector<uint64_t>(16, 0)};
    size_t mask_ = 15, count_ = 0;
};

// GPT-2's byte <-> printable character map (bytes_to_unicode): printable Latin-1 bytes map
// to themselves, the others to U+0100.. in byte order.
struct ByteMap {
    uint32_t to_cp[256];
    int16_t to_byte[512];
    ByteMap() {
        std::fill(std::begin(to_byte), std::end(to_byte), (int16_t)-1);
        int n = 0;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
            to_byte[to_cp[b]] = (int16_t)b;
        }
    }
};
inline const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

// The file's bytes; a file over max_bytes is an error before anything is read.
inline std::string read_whole_file(const std::string& path, size_t max_bytes = SIZE_MAX) {
    std::string why;
    FILE* f = fopen_regular_file(path.c_str(), &why);
    if (!f) throw Error(path + ": cannot open: " + why);
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size > max_bytes) {
        fclose(f);
        throw Error(path + ": " + std::to_string((long long)st.st_size) + " bytes, more than the " +
                    std::to_string(max_bytes) + " a tokenizer file may have");
    }
    std::string data;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, got);
    bool bad = ferror(f);
    fclose(f);
    if (bad) throw Error(path + ": read error");
    return data;
}

inline std::string printable(std::string_view s, size_t max = 40) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max; i++) {
        unsigned char c = s[i];
        if (c >= 32 && c < 127 && c != '\\') {
            out += (char)c;
        } else {
            char b[8];
            snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        }
    }
    if (s.size() > max) out += "...";
    return out;
}

// Standard base64 (A-Z a-z 0-9 + /, "=" padding to a multiple of 4) -> bytes; false on
// anything else.
inline bool base64_decode(std::string_view in, std::string* out) {
    auto value = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        return -1;
    };
    out->clear();
    if (in.empty() || in.size() % 4 != 0) return false;
    size_t pad = in.back() != '=' ? 0 : in[in.size() - 2] == '=' ? 2 : 1;
    for (size_t i = 0; i < in.size(); i += 4) {
        uint32_t w = 0;
        const bool last = i + 4 == in.size();
        for (size_t k = 0; k < 4; k++) {
            int v = last && k >= 4 - pad ? 0 : value(in[i + k]);
            if (v < 0) return false;
            w = (w << 6) | (uint32_t)v;
        }
        size_t bytes = last ? 3 - pad : 3;
        for (size_t k = 0; k < bytes; k++) *out += (char)(uint8_t)(w >> (16 - 8 * k));
    }
    return true;
}

}  // namespace tok_detail

// Llama 3's special tokens in id order after the ranks (Meta's llama3 tokenizer.py: ten
// named or reserved, then <|reserved_special_token_5|> .. _250|>: 256 in all).
inline std::vector<std::string> llama3_special_tokens() {
    std::vector<std::string> t = {"<|begin_of_text|>",
                                  "<|end_of_text|>",
                                  "<|reserved_special_token_0|>",
                                  "<|reserved_special_token_1|>",
                                  "<|reserved_special_token_2|>",
                                  "<|reserved_special_token_3|>",
                                  "<|start_header_id|>",
                                  "<|end_header_id|>",
                                  "<|reserved_special_token_4|>",
                                  "<|eot_id|>"};
    for (int i = 5; i < 251; i++) t.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
    return t;
}

inline const char* pattern_name(Pattern p) { return p == Pattern::Llama3 ? "llama3" : "gpt2"; }

// Per-thread memo of piece -> ids (bounded: cleared when it reaches max_entries).
class alignas(128) EncodeCache {
  public:
    explicit EncodeCache(size_t max_entries = 1 << 18) : max_entries_(max_entries) {}
    tok_detail::StrTable table;
    size_t max_entries_;
};

class Tokenizer {
  public:
    static constexpr int kBinMagic = 20240328;
    static constexpr size_t kCacheMaxPiece = 128;  // longer pieces are not cached
    static constexpr size_t kSmallPiece = 256;     // longer pieces merge through a heap
    static constexpr size_t kHeapPiece = 1 << 16;  // longer ones through rank buckets

    Tokenizer() = default;

    // --- loading and saving (throw Error) -----------------------------------
    static Tokenizer from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
        Tokenizer t;
        t.load_gpt2(encoder_json, vocab_bpe);
        return t;
    }
    static Tokenizer from_tiktoken(const std::string& path, Pattern pattern = Pattern::Llama3) {
        Tokenizer t;
        t.load_tiktoken(path, pattern);
        return t;
    }
    static Tokenizer from_bin(const std::string& path) {
        Tokenizer t;
        t.load_bin(path);
        return t;
    }

    void load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe) {
        std::string text = tok_detail::read_whole_file(encoder_json);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            throw Error(encoder_json + ": invalid JSON: " + e.what());
        }
        if (!j.is_object()) throw Error(encoder_json + ": expected a JSON object of token -> id");
        if (j.empty()) throw Error(encoder_json + ": no tokens");
        std::vector<std::string> tokens(j.size());
        std::vector<bool> have(j.size(), false);
        int eot = -1;
        for (auto it = j.begin(); it != j.end(); ++it) {
            const std::string& key = it.key();
            const auto& v = it.value();
            if (!v.is_number_integer())
                throw Error(encoder_json + ": token \"" + tok_detail::printable(key) + "\": id is not an integer");
            long long id = v.get<long long>();
            if (id < 0 || id >= (long long)tokens.size())
                throw Error(encoder_json + ": token \"" + tok_detail::printable(key) + "\": id " + std::to_string(id) +
                            " outside 0.." + std::to_string(tokens.size() - 1) + " (ids must be 0..N-1)");
            if (have[id]) throw Error(encoder_json + ": id " + std::to_string(id) + " appears twice");
            have[id] = true;
            if (key == "<|endoftext|>") {
                eot = (int)id;
                tokens[id] = key;
                continue;
            }
            std::string bytes;
            if (!symbol_to_bytes(key, &bytes) || bytes.empty())
                throw Error(encoder_json + ": token \"" + tok_detail::printable(key) +
                            "\" is not made of GPT-2 byte symbols");
            tokens[id] = std::move(bytes);
        }
        if (eot < 0) throw Error(encoder_json + ": no \"<|endoftext|>\" entry");
        pre_.set_pattern(Pattern::Gpt2);
        set_vocab(std::move(tokens), {eot}, eot, eot, encoder_json);
        for (int b = 0; b < 256; b++) {
            if (byte_id_[b] >= 0) continue;
            char hex[8];
            snprintf(hex, sizeof hex, "0x%02x", b);
            throw Error(encoder_json + ": no token for the byte " + hex + " (byte-level BPE needs all 256)");
        }

        // merges: rank = line order
        std::string bpe = tok_detail::read_whole_file(vocab_bpe);
        pairs_ = tok_detail::PairTable();
        pairs_.reserve(bpe.size() / 8 + 16);
        size_t pos = 0, line_no = 0, nmerges = 0;
        std::string left, right;
        while (pos < bpe.size()) {
            size_t eol = bpe.find('\n', pos);
            if (eol == std::string::npos) eol = bpe.size();
            std::string_view line(bpe.data() + pos, eol - pos);
            pos = eol + 1;
            line_no++;
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (line.empty()) continue;
            if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
            size_t sp = line.find(' ');
            auto where = [&] { return vocab_bpe + ":" + std::to_string(line_no) + ": "; };
            if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
                line.find(' ', sp + 1) != std::string_view::npos)
                throw Error(where() + "expected two symbols separated by one space, got \"" +
                            tok_detail::printable(line) + "\"");
            if (!symbol_to_bytes(line.substr(0, sp), &left) || !symbol_to_bytes(line.substr(sp + 1), &right))
                throw Error(where() + "\"" + tok_detail::printable(line) + "\" is not made of GPT-2 byte symbols");
            int a = find_token(left), b = find_token(right), m = find_token(left + right);
            if (a < 0 || b < 0 || m < 0)
                throw Error(where() + "merge \"" + tok_detail::printable(line) + "\": " +
                            (a < 0   ? "left part"
                             : b < 0 ? "right part"
                                     : "result") +
                            " is not a token of " + encoder_json);
            pairs_.insert((uint32_t)a, (uint32_t)b, (uint32_t)nmerges, (uint32_t)m);
            max_rank_ = (uint32_t)nmerges;
            nmerges++;
        }
        if (nmerges == 0) throw Error(vocab_bpe + ": no merges");
        can_encode_ = true;
        source_ = encoder_json;
    }

    // Bounds of a ranks file, so that a hostile one costs at most a few hundred MB.
    static constexpr size_t kMaxRanksFileBytes = 64 << 20;  // Llama 3's is 2.2 MB
    static constexpr size_t kMaxRanksLine = 4096;            // a token of about 3 KB
    static constexpr size_t kMaxRanks = 1 << 22;             // Llama 3 has 128,000

    // A tiktoken ranks file (see the top of this file). Its tokens must form a byte-level
    // BPE: ranks 0..N-1, each once; no token twice; every single byte a token; every longer
    // token the concatenation of two tokens of lower rank (the merge that makes it).
    void load_tiktoken(const std::string& path, Pattern pattern = Pattern::Llama3) {
        can_encode_ = false;
        std::string text = tok_detail::read_whole_file(path, kMaxRanksFileBytes);
        struct Entry {
            std::string bytes;
            long long rank;
            size_t line;
        };
        std::vector<Entry> entries;
        size_t pos = 0, line_no = 0;
        while (pos < text.size()) {
            size_t eol = text.find('\n', pos);
            if (eol == std::string::npos) eol = text.size();
            std::string_view line(text.data() + pos, eol - pos);
            pos = eol + 1;
            line_no++;
            auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
            if (line.size() > kMaxRanksLine)
                throw Error(where() + "line of " + std::to_string(line.size()) + " bytes, more than " +
                            std::to_string(kMaxRanksLine));
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (line.empty()) continue;
            size_t sp = line.find(' ');
            std::string_view b64 = line.substr(0, sp), rank = sp == std::string_view::npos ? "" : line.substr(sp + 1);
            if (sp == std::string_view::npos || b64.empty() || rank.empty() ||
                rank.find_first_not_of("0123456789") != std::string_view::npos)
                throw Error(where() + "expected \"<base64 token> <rank>\", got \"" + tok_detail::printable(line) +
                            "\"");
            Entry e;
            if (!tok_detail::base64_decode(b64, &e.bytes))
                throw Error(where() + "bad base64 \"" + tok_detail::printable(b64) + "\"");
            if (rank.size() > 9) throw Error(where() + "rank " + tok_detail::printable(rank) + " is too large");
            e.rank = std::stoll(std::string(rank));
            e.line = line_no;
            if (entries.size() == kMaxRanks)
                throw Error(where() + "more than " + std::to_string(kMaxRanks) + " tokens");
            entries.push_back(std::move(e));
        }
        const size_t N = entries.size();
        if (N == 0) throw Error(path + ": no tokens");
        std::vector<std::string> tokens(N);
        std::vector<size_t> line_of(N, 0);
        for (auto& e : entries) {
            std::string where = path + ":" + std::to_string(e.line) + ": ";
            if (e.rank >= (long long)N)
                throw Error(where + "rank " + std::to_string(e.rank) + " outside 0.." + std::to_string(N - 1) +
                            " (the ranks of " + std::to_string(N) + " tokens are 0..N-1)");
            if (line_of[(size_t)e.rank])
                throw Error(where + "rank " + std::to_string(e.rank) + " appears twice (also on line " +
                            std::to_string(line_of[(size_t)e.rank]) + ")");
            line_of[(size_t)e.rank] = e.line;
            tokens[(size_t)e.rank] = std::move(e.bytes);
        }
        std::vector<Entry>().swap(entries);
        const std::vector<std::string> names = pattern == Pattern::Llama3 ? llama3_special_tokens()
                                                                          : std::vector<std::string>{"<|endoftext|>"};
        std::vector<int> specials;
        for (const auto& name : names) {
            specials.push_back((int)tokens.size());
            tokens.push_back(name);
        }
        pre_.set_pattern(pattern);
        const int first = (int)N;
        set_vocab(std::move(tokens), specials, pattern == Pattern::Llama3 ? first + 1 : first, first, path);
        for (int b = 0; b < 256; b++) {
            if (byte_id_[b] >= 0) continue;
            char hex[8];
            snprintf(hex, sizeof hex, "0x%02x", b);
            throw Error(path + ": no token for the byte " + hex + " (byte-level BPE needs all 256)");
        }
        for (size_t r = 0; r < N; r++) {
            std::string_view t = vocab_[r];
            bool made = t.size() == 1;
            for (size_t k = 1; k < t.size() && !made; k++) {
                int a = find_token(t.substr(0, k)), b = find_token(t.substr(k));
                made = a >= 0 && b >= 0 && (size_t)a < r && (size_t)b < r;
            }
            if (!made)
                throw Error(path + ":" + std::to_string(line_of[r]) + ": the token of rank " + std::to_string(r) +
                            " (\"" + tok_detail::printable(t) +
                            "\") is not two tokens of lower rank joined: the ranks do not form a BPE");
        }
        merges_from_vocab();
        can_encode_ = true;
        source_ = path;
    }

    void load_bin(const std::string& path) {
        std::string data = tok_detail::read_whole_file(path);
        if (data.size() < 1024)
            throw Error(path + ": truncated header (" + std::to_string(data.size()) +
                        " bytes; an llm.c tokenizer file starts with 1024)");
        int32_t h[256];
        memcpy(h, data.data(), 1024);
        if (h[0] != kBinMagic)
            throw Error(path + ": bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(kBinMagic) +
                        ": not an llm.c tokenizer file)");
        if (h[1] != 1 && h[1] != 2) throw Error(path + ": unsupported version " + std::to_string(h[1]) + " (1 or 2)");
        int64_t V = h[2];
        if (V < 257 || V > (1 << 24)) throw Error(path + ": implausible vocabulary size " + std::to_string(V));
        int eot = h[1] == 1 ? 50256 : h[3];
        if (eot < 0 || eot >= V)
            throw Error(path + ": EOT id " + std::to_string(eot) + " outside 0.." + std::to_string(V - 1));
        std::vector<std::string> tokens((size_t)V);
        size_t pos = 1024;
        for (int64_t i = 0; i < V; i++) {
            if (pos >= data.size())
                throw Error(path + ": truncated at token " + std::to_string(i) + " of " + std::to_string(V));
            size_t len = (uint8_t)data[pos++];
            if (len == 0) throw Error(path + ": token " + std::to_string(i) + " has length 0");
            if (pos + len > data.size())
                throw Error(path + ": truncated at token " + std::to_string(i) + " of " + std::to_string(V));
            tokens[i].assign(data.data() + pos, len);
            pos += len;
        }
        if (pos != data.size())
            throw Error(path + ": " + std::to_string(data.size() - pos) + " bytes after the last token");
        pre_.set_pattern(Pattern::Gpt2);
        set_vocab(std::move(tokens), {eot}, eot, eot, path);
        merges_from_vocab();
        can_encode_ = true;
        for (int b = 0; b < 256; b++)
            if (byte_id_[b] < 0) can_encode_ = false;  // decode only
        source_ = path;
    }

    // Writes llm.c's tokenizer .bin (version 2), atomically (temporary file + rename).
    void save_bin(const std::string& path) const {
        if (vocab_.empty()) throw Error(path + ": no vocabulary loaded");
        std::string out(1024, '\0');
        int32_t h[256] = {0};
        h[0] = kBinMagic;
        h[1] = 2;
        h[2] = (int32_t)vocab_.size();
        h[3] = eot_;
        memcpy(&out[0], h, 1024);
        for (size_t i = 0; i < vocab_.size(); i++) {
            size_t len = vocab_[i].size();
            if (len == 0 || len > 255)
                throw Error(path + ": token " + std::to_string(i) + " has " + std::to_string(len) +
                            " bytes; the format holds 1..255");
            out += (char)(uint8_t)len;
            out += vocab_[i];
        }
        std::string tmp = path + ".tmp." + std::to_string(getpid());
        std::string why;
        FILE* f = fopen_regular_file_for_writing(tmp.c_str(), O_WRONLY | O_TRUNC, &why);
        if (!f) throw Error(path + ": cannot create " + tmp + ": " + why);
        bool ok = fwrite(out.data(), 1, out.size(), f) == out.size();
        ok = (fclose(f) == 0) && ok;
        if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
            int e = errno;
            remove(tmp.c_str());
            throw Error(path + ": write failed: " + strerror(e));
        }
    }

    // --- vocabulary ------------------------------------------------------------------
    int vocab_size() const { return (int)vocab_.size(); }
    // The end-of-text token (the .bin's EOT field): GPT-2's <|endoftext|>, Llama 3's
    // <|end_of_text|>.
    int eot_token() const { return eot_; }
    // The token before each document in a data shard (prepro, --doc-token of the trainers):
    // GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>.
    int doc_token() const { return doc_; }
    const std::vector<int>& special_tokens() const { return specials_; }
    Pattern pattern() const { return pre_.pattern(); }
    bool can_encode() const { return can_encode_; }
    const std::string& source() const { return source_; }
    const std::string& token_bytes(int id) const { return vocab_.at((size_t)id); }
    // The id of the token whose bytes are exactly s (not the special EOT), or -1.
    int find_token(std::string_view s) const {
        size_t n;
        const int* v = by_bytes_.find(s, tok_detail::hash_bytes((const uint8_t*)s.data(), s.size()), &n);
        return v ? v[0] : -1;
    }

    // --- decoding --------------------------------------------------------------------
    // Appends the bytes of ids to out; false (out holds the prefix) at an id outside the vocabulary.
    bool decode(const int* ids, size_t n, std::string* out) const {
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= (int)vocab_.size()) return false;
            *out += vocab_[ids[i]];
        }
        return true;
    }
    std::string decode(const std::vector<int>& ids) const {
        std::string out;
        if (!decode(ids.data(), ids.size(), &out))
            throw Error("decode: token id outside 0.." + std::to_string(vocab_.size() - 1));
        return out;
    }

    // --- encoding --------------------------------------------------------------------
    // Appends the ids of text to out. allow_special: a special token's string in text
    // (GPT-2: "<|endoftext|>") is its id.
    void encode(std::string_view text, std::vector<int>* out, bool allow_special = false,
                EncodeCache* cache = nullptr) const {
        require_encode();
        EncodeCache local(1 << 14);
        if (!cache) cache = &local;
        if (!allow_special) {
            encode_ordinary(text, out, cache);
            return;
        }
        int id = -1;
        for (size_t p; (p = find_special(text, &id)) != std::string_view::npos;) {
            encode_ordinary(text.substr(0, p), out, cache);
            out->push_back(id);
            text.remove_prefix(p + vocab_[(size_t)id].size());
        }
        encode_ordinary(text, out, cache);
    }
    std::vector<int> encode(std::string_view text, bool allow_special = false) const {
        std::vector<int> out;
        encode(text, &out, allow_special);
        return out;
    }

    // The pieces of text under GPT-2's pre-tokenisation pattern.
    std::vector<std::string_view> pretokenize(std::string_view text) const {
        std::vector<std::string_view> out;
        const uint8_t* s = (const uint8_t*)text.data();
        for (size_t i = 0, n = text.size(); i < n;) {
            size_t e = pre_.next_piece(s, n, i);
            out.push_back(text.substr(i, e - i));
            i = e;
        }
        return out;
    }
    size_t safe_split(std::string_view text, size_t from) const {
        return pre_.safe_split((const uint8_t*)text.data(), text.size(), from);
    }

    // BPE of one piece. whole_piece_lookup: a piece that is itself a token is that token
    // (tiktoken's shortcut). Pieces up to small_limit bytes merge by repeated scans, up to
    // heap_limit through a heap, longer ones through per-rank buckets (same result).
    void bpe(std::string_view piece, std::vector<int>* out, bool whole_piece_lookup = true,
             size_t small_limit = kSmallPiece, size_t heap_limit = kHeapPiece) const {
        require_encode();
        const uint8_t* s = (const uint8_t*)piece.data();
        size_t n = piece.size();
        if (n == 0) return;
        if (n == 1) {
            out->push_back(byte_id_[s[0]]);
            return;
        }
        if (whole_piece_lookup) {
            int id = find_token(piece);
            if (id >= 0) {
                out->push_back(id);
                return;
            }
        }
        if (n <= small_limit) bpe_small(s, n, out);
        else if (n <= heap_limit) bpe_heap(s, n, out);
        else bpe_buckets(s, n, out);
    }

  private:
    // Converts a string of GPT-2 byte symbols (UTF-8) to the bytes they stand for.
    static bool symbol_to_bytes(std::string_view sym, std::string* out) {
        const auto& bm = tok_detail::byte_map();
        out->clear();
        const uint8_t* s = (const uint8_t*)sym.data();
        for (size_t i = 0; i < sym.size();) {
            uint32_t cp;
            i += tok_detail::utf8_decode(s + i, sym.size() - i, &cp);
            if (cp >= 512 || bm.to_byte[cp] < 0) return false;
            *out += (char)bm.to_byte[cp];
        }
        return true;
    }

    // specials: the ids whose strings are special tokens (not ordinary bytes).
    void set_vocab(std::vector<std::string> tokens, std::vector<int> specials, int eot, int doc,
                   const std::string& file) {
        vocab_ = std::move(tokens);
        specials_ = std::move(specials);
        eot_ = eot;
        doc_ = doc;
        by_bytes_.clear();
        std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
        std::vector<bool> special(vocab_.size(), false);
        special_starts_.clear();
        for (int id : specials_) {
            special[(size_t)id] = true;
            if (special_starts_.find(vocab_[(size_t)id][0]) == std::string::npos)
                special_starts_ += vocab_[(size_t)id][0];
        }
        for (int id = 0; id < (int)vocab_.size(); id++) {
            if (special[(size_t)id]) continue;
            const std::string& t = vocab_[id];
            uint64_t h = tok_detail::hash_bytes((const uint8_t*)t.data(), t.size());
            size_t n;
            if (by_bytes_.find(t, h, &n))
                throw Error(file + ": token " + std::to_string(id) + " (\"" + tok_detail::printable(t) +
                            "\") appears twice");
            by_bytes_.insert(t, h, &id, 1);
            if (t.size() == 1) byte_id_[(uint8_t)t[0]] = id;
        }
    }

    // tiktoken's rule: a pair merges when its concatenation is a token, rank = that id.
    void merges_from_vocab() {
        pairs_ = tok_detail::PairTable();
        pairs_.reserve(vocab_.size() * 2);
        max_rank_ = (uint32_t)vocab_.size();
        std::vector<bool> special(vocab_.size(), false);
        for (int id : specials_) special[(size_t)id] = true;
        for (int id = 0; id < (int)vocab_.size(); id++) {
            if (special[(size_t)id]) continue;
            const std::string& t = vocab_[id];
            for (size_t k = 1; k < t.size(); k++) {
                int a = find_token(std::string_view(t).substr(0, k));
                int b = find_token(std::string_view(t).substr(k));
                if (a >= 0 && b >= 0) pairs_.insert((uint32_t)a, (uint32_t)b, (uint32_t)id, (uint32_t)id);
            }
        }
    }

    // The leftmost special token in text (the longest where several start there): its
    // position, or npos; *id its id.
    size_t find_special(std::string_view text, int* id) const {
        for (size_t p = text.find_first_of(special_starts_); p != std::string_view::npos;
             p = text.find_first_of(special_starts_, p + 1)) {
            size_t best = 0;
            for (int s : specials_) {
                const std::string& t = vocab_[(size_t)s];
                if (t.size() > best && text.compare(p, t.size(), t) == 0) {
                    best = t.size();
                    *id = s;
                }
            }
            if (best) return p;
        }
        return std::string_view::npos;
    }

    void require_encode() const {
        if (!can_encode_) {
            if (vocab_.empty()) throw Error("tokenizer: nothing loaded");
            throw Error(source_ + ": the vocabulary lacks single-byte tokens; it can only decode");
        }
    }

    void encode_ordinary(std::string_view text, std::vector<int>* out, EncodeCache* cache) const {
        const uint8_t* s = (const uint8_t*)text.data();
        size_t n = text.size();
        size_t i = 0;
        while (i < n) {
            size_t e = pre_.next_piece(s, n, i);
            encode_piece(s + i, e - i, out, cache);
            i = e;
        }
    }

    void encode_piece(const uint8_t* s, size_t n, std::vector<int>* out, EncodeCache* cache) const {
        if (n == 1) {
            out->push_back(byte_id_[s[0]]);
            return;
        }
        std::string_view key((const char*)s, n);
        uint64_t h = 0;
        if (n <= kCacheMaxPiece) {
            h = tok_detail::hash_bytes(s, n);
            size_t nv;
            const int* v = cache->table.find(key, h, &nv);
            if (v) {
                out->insert(out->end(), v, v + nv);
                return;
            }
        }
        size_t before = out->size();
        bpe(key, out);
        if (n <= kCacheMaxPiece) {
            if (cache->table.size() >= cache->max_entries_) cache->table.clear();
            cache->table.insert(key, h, out->data() + before, out->size() - before);
        }
    }

    // Leftmost lowest-rank merge, repeated: O(n^2), for short pieces.
    void bpe_small(const uint8_t* s, size_t n, std::vector<int>* out) const {
        uint32_t ids_buf[kSmallPiece], rk_buf[kSmallPiece], mg_buf[kSmallPiece];
        std::vector<uint32_t> big;
        uint32_t *ids = ids_buf, *rk = rk_buf, *mg = mg_buf;
        if (n > kSmallPiece) {
            big.resize(3 * n);
            ids = big.data();
            rk = ids + n;
            mg = rk + n;
        }
        constexpr uint32_t kNone = tok_detail::PairTable::kNone;
        size_t m = n;
        for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)byte_id_[s[i]];
        for (size_t i = 0; i + 1 < m; i++) rk[i] = pairs_.find(ids[i], ids[i + 1], &mg[i]);
        rk[m - 1] = kNone;
        while (m > 1) {
            size_t best = 0;
            uint32_t br = rk[0];
            for (size_t i = 1; i + 1 < m; i++)
                if (rk[i] < br) {
                    br = rk[i];
                    best = i;
                }
            if (br == kNone) break;
            ids[best] = mg[best];
            size_t tail = m - best - 2;
            memmove(ids + best + 1, ids + best + 2, tail * sizeof(uint32_t));
            memmove(rk + best + 1, rk + best + 2, tail * sizeof(uint32_t));
            memmove(mg + best + 1, mg + best + 2, tail * sizeof(uint32_t));
            m--;
            if (best > 0) rk[best - 1] = pairs_.find(ids[best - 1], ids[best], &mg[best - 1]);
            rk[best] = best + 1 < m ? pairs_.find(ids[best], ids[best + 1], &mg[best]) : kNone;
            rk[m - 1] = kNone;
        }
        for (size_t i = 0; i < m; i++) out->push_back((int)ids[i]);
    }

    // The same merge order through a heap of (rank, position) over a linked list: O(n log n).
    void bpe_heap(const uint8_t* s, size_t n, std::vector<int>* out) const {
        constexpr uint32_t kNone = tok_detail::PairTable::kNone;
        std::vector<uint32_t> id(n), nxt(n), prv(n);
        for (size_t i = 0; i < n; i++) {
            id[i] = (uint32_t)byte_id_[s[i]];
            nxt[i] = (uint32_t)(i + 1);  // n = end
            prv[i] = (uint32_t)(i == 0 ? kNone : i - 1);
        }
        struct Entry {
            uint32_t rank, left, right;
            bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
        };
        std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
        uint32_t merged = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            uint32_t r = pairs_.find(id[i], id[i + 1], &merged);
            if (r != kNone) heap.push(Entry{r, (uint32_t)i, (uint32_t)(i + 1)});
        }
        std::vector<bool> dead(n, false);
        while (!heap.empty()) {
            Entry e = heap.top();
            heap.pop();
            if (dead[e.left] || nxt[e.left] != e.right || e.right >= n) continue;
            uint32_t r = pairs_.find(id[e.left], id[e.right], &merged);
            if (r != e.rank) continue;  // stale: one side has changed since
            id[e.left] = merged;
            dead[e.right] = true;
            uint32_t after = nxt[e.right];
            nxt[e.left] = after;
            if (after < n) prv[after] = e.left;
            if (prv[e.left] != kNone) {
                uint32_t p = prv[e.left];
                uint32_t r2 = pairs_.find(id[p], id[e.left], &merged);
                if (r2 != kNone) heap.push(Entry{r2, p, e.left});
            }
            if (after < n) {
                uint32_t r2 = pairs_.find(id[e.left], id[after], &merged);
                if (r2 != kNone) heap.push(Entry{r2, e.left, after});
            }
        }
        for (size_t i = 0; i < n; i = nxt[i]) out->push_back((int)id[i]);
    }

    // For very long pieces: every merge of one rank at a time, leftmost first, from buckets
    // of positions per rank (a merge never creates a pair of the rank it merged; a new pair
    // of a lower rank sends the scan back). Cache-friendly where a heap of millions is not.
    void bpe_buckets(const uint8_t* s, size_t n, std::vector<int>* out) const {
        constexpr uint32_t kNone = tok_detail::PairTable::kNone;
        struct Node {
            uint32_t id, nxt, prv, dead;  // one cache line holds four
        };
        std::vector<Node> nd(n);
        std::vector<std::vector<uint32_t>> bucket((size_t)max_rank_ + 1);
        uint32_t cur = kNone, merged = 0;
        for (size_t i = 0; i < n; i++)
            nd[i] = Node{(uint32_t)byte_id_[s[i]], (uint32_t)(i + 1), (uint32_t)(i == 0 ? kNone : i - 1), 0};
        for (size_t i = 0; i + 1 < n; i++) {
            uint32_t r = pairs_.find(nd[i].id, nd[i + 1].id, &merged);
            if (r != kNone) {
                bucket[r].push_back((uint32_t)i);
                cur = std::min(cur, r);
            }
        }
        bool back = false;
        auto add = [&](uint32_t p) {  // the pair starting at node p, if it merges
            uint32_t q = nd[p].nxt;
            if (q >= n) return;
            uint32_t r = pairs_.find(nd[p].id, nd[q].id, &merged);
            if (r == kNone) return;
            bucket[r].push_back(p);
            if (r <= cur) {
                cur = r;
                back = true;
            }
        };
        std::vector<uint32_t> work;
        while (cur <= max_rank_) {
            if (bucket[cur].empty()) {
                cur++;
                continue;
            }
            uint32_t r = cur;
            work.clear();
            work.swap(bucket[r]);
            std::sort(work.begin(), work.end());
            back = false;
            size_t k = 0;
            while (k < work.size() && !back) {
                uint32_t p = work[k++];
                Node& a = nd[p];
                if (a.dead || a.nxt >= n) continue;
                Node& b = nd[a.nxt];
                if (pairs_.find(a.id, b.id, &merged) != r) continue;
                a.id = merged;
                b.dead = 1;
                a.nxt = b.nxt;
                if (a.nxt < n) nd[a.nxt].prv = p;
                if (a.prv != kNone) add(a.prv);
                add(p);
            }
            bucket[r].insert(bucket[r].end(), work.begin() + k, work.end());
        }
        for (size_t i = 0; i < n; i = nd[i].nxt) out->push_back((int)nd[i].id);
    }

    std::vector<std::string> vocab_;
    std::vector<int> specials_;
    std::string special_starts_;  // the first bytes of the special tokens
    uint32_t max_rank_ = 0;
    int eot_ = -1, doc_ = -1;
    bool can_encode_ = false;
    std::string source_;
    tok_detail::StrTable by_bytes_;
    int byte_id_[256];
    tok_detail::PairTable pairs_;
    tok_detail::PreTokenizer pre_;
};

// Encodes many documents on N threads, each with its own cache (kept between calls).
// Documents longer than chunk_bytes are split at points where the pattern always splits,
// so the output is the same for every thread count.
class ParallelEncoder {
  public:
    static constexpr size_t kChunkBytes = 128 << 10;

    ParallelEncoder(const Tokenizer& tok, int threads)
        : tok_(tok), threads_(std::max(1, threads)), caches_((size_t)std::max(1, threads)) {}
    int threads() const { return threads_; }

    // Appends the ids of every document, in order, to out; doc_token_before_each: the
    // tokenizer's doc_token() before each document (llm.c's data shards).
    void encode_documents(const std::vector<std::string_view>& docs, bool doc_token_before_each, bool allow_special,
                          std::vector<int>* out) {
        std::vector<Chunk> chunks = make_chunks(docs);
        std::vector<Task> tasks = make_tasks(chunks);
        std::vector<std::vector<int>> results(tasks.size());
        run(tasks.size(), [&](size_t t, EncodeCache* cache) {
            std::vector<int> r;  // local: no false sharing with the neighbouring task's vector
            for (size_t c = tasks[t].begin; c < tasks[t].end; c++) {
                const Chunk& ch = chunks[c];
                if (doc_token_before_each && ch.first) r.push_back(tok_.doc_token());
                tok_.encode(docs[ch.doc].substr(ch.begin, ch.end - ch.begin), &r, allow_special, cache);
            }
            results[t] = std::move(r);
        });
        size_t total = out->size();
        for (auto& r : results) total += r.size();
        out->reserve(total);
        for (auto& r : results) {
            out->insert(out->end(), r.begin(), r.end());
            std::vector<int>().swap(r);
        }
    }

    // The ids of each document (tiktoken's encode_ordinary_batch / encode_batch).
    std::vector<std::vector<int>> encode_batch(const std::vector<std::string_view>& docs, bool allow_special = false) {
        std::vector<Chunk> chunks = make_chunks(docs);
        std::vector<Task> tasks = make_tasks(chunks);
        std::vector<std::vector<int>> per_chunk(chunks.size());
        run(tasks.size(), [&](size_t t, EncodeCache* cache) {
            for (size_t c = tasks[t].begin; c < tasks[t].end; c++) {
                const Chunk& ch = chunks[c];
                std::vector<int> r;
                tok_.encode(docs[ch.doc].substr(ch.begin, ch.end - ch.begin), &r, allow_special, cache);
                per_chunk[c] = std::move(r);
            }
        });
        std::vector<std::vector<int>> out(docs.size());
        for (size_t c = 0; c < chunks.size(); c++) {
            auto& dst = out[chunks[c].doc];
            if (dst.empty()) dst.swap(per_chunk[c]);
            else dst.insert(dst.end(), per_chunk[c].begin(), per_chunk[c].end());
        }
        return out;
    }

  private:
    struct Chunk {
        size_t doc, begin, end;
        bool first;
    };
    struct Task {
        size_t begin, end;
    };

    std::vector<Chunk> make_chunks(const std::vector<std::string_view>& docs) const {
        std::vector<Chunk> chunks;
        for (size_t d = 0; d < docs.size(); d++) {
            size_t n = docs[d].size(), b = 0;
            bool first = true;
            while (n - b > kChunkBytes) {
                size_t p = tok_.safe_split(docs[d], b + kChunkBytes);
                if (p >= n) break;
                chunks.push_back(Chunk{d, b, p, first});
                first = false;
                b = p;
            }
            chunks.push_back(Chunk{d, b, n, first});
        }
        return chunks;
    }
    std::vector<Task> make_tasks(const std::vector<Chunk>& chunks) const {
        std::vector<Task> tasks;
        size_t b = 0, bytes = 0;
        for (size_t c = 0; c < chunks.size(); c++) {
            bytes += chunks[c].end - chunks[c].begin + 16;
            if (bytes >= kChunkBytes) {
                tasks.push_back(Task{b, c + 1});
                b = c + 1;
                bytes = 0;
            }
        }
        if (b < chunks.size()) tasks.push_back(Task{b, chunks.size()});
        return tasks;
    }
    template <class F>
    void run(size_t ntasks, F&& fn) {
        size_t nthreads = std::min<size_t>((size_t)threads_, ntasks);
        if (nthreads <= 1) {
            for (size_t t = 0; t < ntasks; t++) fn(t, &caches_[0]);
            return;
        }
        std::atomic<size_t> next{0};
        std::vector<std::thread> pool;
        std::vector<std::exception_ptr> errors(nthreads);  // e.g. bad_alloc: rethrown here
        for (size_t w = 0; w < nthreads; w++)
            pool.emplace_back([&, w] {
                try {
                    for (size_t t; (t = next.fetch_add(1)) < ntasks;) fn(t, &caches_[w]);
                } catch (...) {
                    errors[w] = std::current_exception();
                    next.store(ntasks);
                }
            });
        for (auto& th : pool) th.join();
        for (auto& e : errors)
            if (e) std::rethrow_exception(e);
    }

    const Tokenizer& tok_;
    int threads_;
    std::vector<EncodeCache> caches_;
};

// Where the GPT-2 BPE files (encoder.json, vocab.bpe) are, when the user gave
// no folder: data/gpt2, then $SHARED_DATA/gpt2, then ../shared/data/gpt2.
// Returns "" when none has them.
inline std::string find_gpt2_dir() {
    std::vector<std::string> candidates = {"data/gpt2"};
    const char* shared = getenv("SHARED_DATA");
    if (shared && *shared) candidates.push_back(std::string(shared) + "/gpt2");
    candidates.push_back("../shared/data/gpt2");
    for (const auto& dir : candidates) {
        struct stat st;
        if (stat((dir + "/encoder.json").c_str(), &st) == 0) return dir;
    }
    return "";
}
constexpr const char* GPT2_DIR_NOT_FOUND =
    "no GPT-2 tokenizer files: encoder.json not found in data/gpt2, $SHARED_DATA/gpt2 or ../shared/data/gpt2 "
    "(use --gpt2-dir DIR or --tokenizer FILE.bin)";

}  // namespace llmc
