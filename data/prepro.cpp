// prepro: text files or JSONL -> llm.c token shards (GPT-2's BPE, or a tiktoken ranks
// file such as Llama 3's tokenizer.model).
//
//   build/host/prepro --out data/tinyshakespeare/tinyshakespeare --split-on-blank-lines
//                     --val-tokens 32768 tinyshakespeare.txt
//   build/host/prepro --out data/fineweb/fineweb --format jsonl --field text docs.jsonl
//   build/host/prepro --tiktoken Llama-3.2-1B/original/tokenizer.model --out data/ts/ts_llama3 ...
//
// Each document gets the tokenizer's document token before it: GPT-2's <|endoftext|>
// (50256), Llama 3's <|begin_of_text|> (128000; the trainers' --doc-token); the summary
// names it. Output: <prefix>_val_000000.bin (the
// first --val-tokens tokens; none when 0), then <prefix>_train_000001.bin, ... of
// --shard-size tokens each (the last one shorter). Shard format: 256 x int32 header
// [0]=20240520, [1]=1, [2]=token count, then uint16 tokens; for vocabularies above 65536 (or with --uint32)
// tokens (an id >= 65536 can occur) [0]=20240801, [1]=7 and uint32 tokens (llmc/data/dataloader.h). Shards are written under temporary names and
// renamed only when the whole run succeeded; a failed run leaves no new or partial shard.
// Every shard carries the run id (a hash of the run's tokens and sharding), the run's number
// of train shards and its own number (header[248..252], llmc/data/dataloader.h), so that the
// trainers refuse a pattern that mixes two runs' shards or misses one. A run into a prefix
// that has shards of a set the run writes (<prefix>_train_*.bin; <prefix>_val_*.bin unless
// --val-tokens 0: the trainers' patterns) is refused, unless --replace: then every one of
// them must be a shard of an earlier prepro run (a run id), and the new set replaces the
// whole old set (none of it is left).
// The output is the same for every --threads value.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/data/dataloader.h"
#include "llmc/formats/regular_file.h"
#include "llmc/data/tokenizer.h"

namespace {

using llmc::fail;

void usage(FILE* f) {
    fprintf(f,
            "usage: prepro [options] INPUT...\n"
            "Tokenizes text files or JSONL (GPT-2's BPE or a tiktoken ranks file) into llm.c data shards:\n"
            "  PREFIX_val_000000.bin, PREFIX_train_000001.bin, PREFIX_train_000002.bin, ...\n"
            "options:\n"
            "  -o, --out PREFIX        output path prefix, e.g. data/tinyshakespeare/tinyshakespeare (required)\n"
            "  --format text|jsonl     input format (default: jsonl for *.jsonl and *.json, else text)\n"
            "  --field NAME            JSONL: the field holding each document's text (default: text)\n"
            "  --split-on-blank-lines  text: split each file on \"\\n\\n\" into documents, keeping the\n"
            "                          \"\\n\\n\" at the end of each (llm.c's tinyshakespeare recipe);\n"
            "                          default: each text file is one document\n"
            "  --split-on SEP          text: split each file on the string SEP (e.g. \"<|endoftext|>\");\n"
            "                          each document is stripped of surrounding white space, empty\n"
            "                          ones are dropped (TinyStories' text files)\n"
            "  --shard-size N          tokens per train shard (default 100000000)\n"
            "  --val-tokens N          tokens in the val shard, the first of the stream (default: the\n"
            "                          shard size, llm.c's convention; 0: no val shard)\n"
            "  --threads N             encoding threads (default: all CPUs)\n"
            "  --gpt2-dir DIR          directory with encoder.json and vocab.bpe (default: data/gpt2,\n"
            "                          else $SHARED_DATA/gpt2, else ../shared/data/gpt2)\n"
            "  --tokenizer FILE        an llm.c tokenizer .bin instead of the GPT-2 files\n"
            "  --tiktoken FILE         a tiktoken ranks file (\"<base64 token> <rank>\" lines, e.g. Llama 3's\n"
            "                          tokenizer.model) instead of the GPT-2 files; the special tokens\n"
            "                          follow its N ranks: Llama 3's 256 (<|begin_of_text|> = N starts each\n"
            "                          document, <|end_of_text|> = N+1, ...), or with --pattern gpt2\n"
            "                          <|endoftext|> = N\n"
            "  --pattern llama3|gpt2   --tiktoken: the pre-tokenisation pattern and specials (default llama3)\n"
            "  --write-tokenizer FILE  also write the tokenizer as llm.c's .bin (e.g. gpt2_tokenizer.bin)\n"
            "  --allow-special         special tokens' strings in the text (\"<|endoftext|>\", \"<|eot_id|>\", ...)\n"
            "                          are those tokens (default: plain text)\n"
            "  --uint32                uint32 shards for any vocabulary (default: uint32 only above 65536\n"
            "                          tokens, as Llama 3's 128,256 need; the trainers read both)\n"
            "  --replace               replace an earlier prepro run's shards at PREFIX: all of its train\n"
            "                          shards (and val shards, unless --val-tokens 0) go once this run\n"
            "                          succeeded (default: refuse when PREFIX has such shards). Each shard\n"
            "                          carries its run's id; the trainers refuse a pattern mixing runs\n"
            "  -q, --quiet             no summary\n");
}

long long parse_count(const std::string& opt, const char* v, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || !end || *end || end == v || x < lo || x > hi)
        fail("option " + opt + ": expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
             ", got \"" + v + "\"");
    return x;
}

bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

std::string with_commas(unsigned long long x) {
    std::string s = std::to_string(x), out;
    for (size_t i = 0; i < s.size(); i++) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

// The files at prefix that the trainers' patterns PREFIX_train_*.bin and (with_val)
// PREFIX_val_*.bin match (whatever wrote them), sorted.
std::vector<std::string> shards_at(const std::string& prefix, bool with_val) {
    const size_t slash = prefix.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
    std::vector<std::string> found;
    DIR* d = opendir(dir.c_str());
    if (!d) return found;  // no folder: no shards (creating the first shard reports it)
    for (struct dirent* e; (e = readdir(d));) {
        const std::string n = e->d_name;
        for (const char* set : {"_val_", "_train_"}) {
            const std::string head = base + set;
            if (!with_val && head == base + "_val_") continue;
            if (n.size() >= head.size() + 4 && n.compare(0, head.size(), head) == 0 &&
                n.compare(n.size() - 4, 4, ".bin") == 0) {
                found.push_back(slash == std::string::npos ? n : dir + n);
                break;
            }
        }
    }
    closedir(d);
    std::sort(found.begin(), found.end());
    return found;
}

// "" when path is a shard an earlier prepro run wrote (a regular file, not a link, whose
// header carries a run id), else why it is not.
std::string not_a_prepro_shard(const std::string& path) {
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) return std::string("cannot stat: ") + strerror(errno);
    if (S_ISLNK(st.st_mode)) return "a symbolic link";
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    int32_t h[DATALOADER_HEADER_INTS];
    const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    const bool read = fd >= 0 && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h;
    if (fd >= 0) close(fd);
    if (!read) return "not a token shard (no header)";
    const bool magic = h[0] == DATALOADER_MAGIC_U16 || h[0] == DATALOADER_MAGIC_U32;
    if (!magic || h[DATALOADER_RUN_SLOT] != DATALOADER_RUN_MARKER) return "not a shard of a prepro run (no run id)";
    return "";
}

// Refuses a run into a prefix that has shards of the sets it writes (train; val unless
// --val-tokens 0), unless replace and every one is an earlier prepro run's (never another
// writer's file). Returns them.
std::vector<std::string> check_earlier_shards(const std::string& prefix, bool with_val, bool replace) {
    std::vector<std::string> old = shards_at(prefix, with_val);
    for (const std::string& p : old) {
        if (!replace)
            fail(p + ": exists; a run would leave a set of shards no single run wrote: pass --replace to replace "
                     "the earlier run's shards, or remove them");
        const std::string why = not_a_prepro_shard(p);
        if (!why.empty())
            fail(p + ": " + why + "; --replace replaces only an earlier prepro run's shards: move or remove it");
    }
    return old;
}

// Shards written under temporary names; commit() renames them all, abort() removes them.
// Their run id hashes the sharding and every token, so two runs share an id only when
// they wrote the same shards.
class ShardWriter {
  public:
    ShardWriter(std::string prefix, long long shard_size, long long val_tokens, bool wide)
        : prefix_(std::move(prefix)), shard_size_(shard_size), val_tokens_(val_tokens), wide_(wide) {
        index_ = val_tokens_ > 0 ? 0 : 1;
        hash_ = splitmix64(splitmix64(splitmix64((uint64_t)shard_size_) ^ (uint64_t)val_tokens_) ^ (wide_ ? 4 : 2));
    }
    ~ShardWriter() { abort(); }

    void write(const std::vector<int>& ids) {
        size_t i = 0;
        while (i < ids.size()) {
            if (!f_) open_next();
            long long room = cap_ - count_;
            size_t n = (size_t)std::min<long long>(room, (long long)(ids.size() - i));
            for (size_t k = i; k < i + n; k++) hash_ = splitmix64(hash_ ^ (uint32_t)ids[k]);
            if (wide_) {
                buf32_.assign(ids.begin() + i, ids.begin() + i + n);
                put(buf32_.data(), n * 4);
            } else {
                buf16_.resize(n);
                for (size_t k = 0; k < n; k++) buf16_[k] = (uint16_t)ids[i + k];
                put(buf16_.data(), n * 2);
            }
            count_ += (long long)n;
            total_ += (long long)n;
            i += n;
            if (count_ == cap_) close_current();
        }
    }

    // Finishes the last shard, marks every shard with the run, and renames each to its
    // final name; then removes the earlier run's shards that no new one replaced (with
    // replace; check_earlier_shards refuses any other file at the prefix).
    void commit(bool replace) {
        if (f_) close_current();
        mark_run();
        const std::vector<std::string> old = check_earlier_shards(prefix_, val_tokens_ > 0, replace);
        for (auto& s : shards_) {
            if (rename(s.tmp.c_str(), s.path.c_str()) != 0)
                fail(s.path + ": cannot rename from " + s.tmp + ": " + strerror(errno));
            s.tmp.clear();
        }
        committed_ = true;
        for (const std::string& p : old) {
            bool replaced = false;
            for (const auto& s : shards_) replaced = replaced || s.path == p;
            if (!replaced && unlink(p.c_str()) != 0 && errno != ENOENT)
                fail(p + ": cannot remove this earlier run's shard: " + strerror(errno));
        }
    }
    void abort() {
        if (f_) {
            fclose(f_);
            f_ = nullptr;
        }
        if (committed_) return;
        for (auto& s : shards_)
            if (!s.tmp.empty()) remove(s.tmp.c_str());
        shards_.clear();
    }

    struct Shard {
        std::string path, tmp;
        long long tokens;
    };
    const std::vector<Shard>& shards() const { return shards_; }
    long long total() const { return total_; }
    long long val_written() const { return std::min(total_, val_tokens_); }

  private:
    // Writes the run's slots into every shard's header (the count of train shards is
    // known only now).
    void mark_run() {
        const uint64_t id = hash_ ? hash_ : 1;  // 0 means "no run id"
        const int32_t train = (int32_t)(index_ - 1);
        for (size_t i = 0; i < shards_.size(); i++) {
            const Shard& s = shards_[i];
            int32_t h[DATALOADER_HEADER_INTS];
            dataloader_shard_header(h, wide_ ? 4 : 2, (uint64_t)s.tokens);
            dataloader_set_run(h, id, train, (int32_t)(val_tokens_ > 0 ? i : i + 1));
            const int fd = open(s.tmp.c_str(), O_WRONLY | O_CLOEXEC);
            const bool ok = fd >= 0 && pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h;
            const int err = errno;
            if ((fd >= 0 && close(fd) != 0) || !ok)
                fail(s.path + ": cannot write the header of " + s.tmp + ": " + strerror(ok ? errno : err));
        }
    }
    std::string name(int index) const {
        char buf[32];
        snprintf(buf, sizeof buf, "_%s_%06d.bin", index == 0 ? "val" : "train", index);
        return prefix_ + buf;
    }
    void open_next() {
        Shard s;
        s.path = name(index_);
        s.tmp = s.path + ".tmp." + std::to_string(getpid());
        s.tokens = 0;
        std::string why;
        f_ = fopen_regular_file_for_writing(s.tmp.c_str(), O_WRONLY | O_TRUNC, &why);
        if (!f_) fail(s.path + ": cannot create " + s.tmp + ": " + why);
        shards_.push_back(s);
        cap_ = index_ == 0 ? val_tokens_ : shard_size_;
        count_ = 0;
        int32_t h[256] = {0};
        put(h, sizeof h);  // header placeholder, rewritten on close
    }
    void put(const void* p, size_t n) {
        if (fwrite(p, 1, n, f_) != n) fail(shards_.back().path + ": write failed: " + strerror(errno));
    }
    void close_current() {
        int32_t h[DATALOADER_HEADER_INTS];
        dataloader_shard_header(h, wide_ ? 4 : 2, (uint64_t)count_);
        if (fseek(f_, 0, SEEK_SET) != 0) fail(shards_.back().path + ": seek failed");
        put(h, sizeof h);
        FILE* f = f_;
        f_ = nullptr;
        if (fclose(f) != 0) fail(shards_.back().path + ": write failed: " + strerror(errno));
        shards_.back().tokens = count_;
        index_++;
    }

    std::string prefix_;
    long long shard_size_, val_tokens_;
    bool wide_;
    int index_;
    FILE* f_ = nullptr;
    long long cap_ = 0, count_ = 0, total_ = 0;
    std::vector<Shard> shards_;
    std::vector<uint16_t> buf16_;
    std::vector<uint32_t> buf32_;
    uint64_t hash_;
    bool committed_ = false;
};

template <class F>
void parallel_for(size_t n, int threads, F&& fn) {
    size_t nt = std::min<size_t>((size_t)std::max(1, threads), n);
    if (nt <= 1) {
        for (size_t i = 0; i < n; i++) fn(i);
        return;
    }
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(nt);
    for (size_t w = 0; w < nt; w++)
        pool.emplace_back([&, w] {
            try {
                for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
            } catch (...) {
                errors[w] = std::current_exception();
                next.store(n);
            }
        });
    for (auto& t : pool) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

struct Options {
    std::string out, format, field = "text", gpt2_dir, tokenizer_bin, tiktoken, pattern, write_tokenizer, split_on;
    bool split_blank = false, allow_special = false, quiet = false, uint32 = false, replace = false;
    long long shard_size = 100000000, val_tokens = -1;
    int threads = 0;
    std::vector<std::string> inputs;
};

struct Stats {
    size_t files = 0, docs = 0, bytes = 0;
    std::vector<std::string> empty_files;
};

// JSONL: one document per line, streamed in blocks; lines parse on the worker threads.
void process_jsonl(const std::string& path, const Options& opt, const llmc::Tokenizer& tok, llmc::ParallelEncoder& enc,
                   ShardWriter& sw, Stats& st) {
    std::string why;
    FILE* f = fopen_regular_file(path.c_str(), &why);
    if (!f) fail(path + ": cannot open: " + why);
    struct Closer {
        FILE* f;
        ~Closer() { fclose(f); }
    } closer{f};
    const size_t kBlock = 32 << 20;
    std::string carry, block;
    std::vector<char> buf(kBlock);
    size_t line_no = 0;
    std::vector<int> ids;
    bool eof = false;
    while (!eof) {
        size_t got = fread(buf.data(), 1, buf.size(), f);
        if (ferror(f)) fail(path + ": read error");
        if (got < buf.size()) eof = true;
        block.swap(carry);
        block.append(buf.data(), got);
        carry.clear();
        size_t end = block.size();
        if (!eof) {
            size_t nl = block.rfind('\n');
            if (nl == std::string::npos) {  // a line longer than the block: keep reading
                carry.swap(block);
                continue;
            }
            carry.assign(block, nl + 1, std::string::npos);
            end = nl + 1;
        }
        st.bytes += end;
        // split into lines
        std::vector<std::string_view> lines;
        for (size_t p = 0; p < end;) {
            size_t nl = block.find('\n', p);
            if (nl == std::string::npos || nl >= end) nl = end;
            std::string_view line(block.data() + p, nl - p);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            lines.push_back(line);
            p = nl + 1;
        }
        std::vector<std::string> texts(lines.size());
        std::vector<std::string> errs(lines.size());
        std::vector<char> has(lines.size(), 0);
        parallel_for(lines.size(), enc.threads(), [&](size_t i) {
            std::string_view line = lines[i];
            if (line.find_first_not_of(" \t") == std::string_view::npos) return;  // blank line
            try {
                auto j = nlohmann::json::parse(line);
                if (!j.is_object()) {
                    errs[i] = "not a JSON object";
                    return;
                }
                auto it = j.find(opt.field);
                if (it == j.end()) {
                    errs[i] = "no field \"" + opt.field + "\"";
                    return;
                }
                if (!it->is_string()) {
                    errs[i] = "field \"" + opt.field + "\" is not a string";
                    return;
                }
                texts[i] = it->get<std::string>();
                has[i] = 1;
            } catch (const nlohmann::json::exception& e) {
                errs[i] = std::string("invalid JSON: ") + e.what();
            }
        });
        std::vector<std::string_view> docs;
        for (size_t i = 0; i < lines.size(); i++) {
            if (!errs[i].empty()) fail(path + ":" + std::to_string(line_no + i + 1) + ": " + errs[i]);
            if (has[i]) docs.push_back(texts[i]);
        }
        line_no += lines.size();
        ids.clear();
        enc.encode_documents(docs, true, opt.allow_special, &ids);
        sw.write(ids);
        st.docs += docs.size();
    }
    if (!carry.empty()) fail(path + ": internal error: unprocessed tail");
    st.files++;
}

// A read-only memory map of a whole file (no copy of big inputs).
class MappedFile {
  public:
    explicit MappedFile(const std::string& path) {
        std::string why;
        int fd = open_regular_file(path.c_str(), &why);
        if (fd < 0) fail(path + ": cannot open: " + why);
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            fail(path + ": not a regular file");
        }
        size_ = (size_t)st.st_size;
        if (size_ > 0) {
            void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                close(fd);
                fail(path + ": cannot map: " + strerror(errno));
            }
            data_ = static_cast<const char*>(p);
            madvise(p, size_, MADV_SEQUENTIAL);
        }
        close(fd);
    }
    ~MappedFile() {
        if (data_) munmap(const_cast<char*>(data_), size_);
    }
    std::string_view view() const { return std::string_view(data_ ? data_ : "", size_); }

  private:
    const char* data_ = nullptr;
    size_t size_ = 0;
};

void process_text(const std::string& path, const Options& opt, llmc::ParallelEncoder& enc, ShardWriter& sw, Stats& st) {
    MappedFile file(path);
    std::string_view all = file.view();
    st.files++;
    if (all.empty()) {
        st.empty_files.push_back(path);
        return;
    }
    st.bytes += all.size();
    std::vector<std::string_view> docs;
    if (opt.split_blank) {
        // Python's text.split("\n\n"), with "\n\n" appended to all but the last section
        size_t start = 0;
        while (true) {
            size_t p = all.find("\n\n", start);
            if (p == std::string_view::npos) break;
            docs.push_back(all.substr(start, p + 2 - start));
            start = p + 2;
        }
        docs.push_back(all.substr(start));
    } else if (!opt.split_on.empty()) {
        const char* ws = " \t\r\n\v\f";
        size_t start = 0;
        while (start <= all.size()) {
            size_t p = all.find(opt.split_on, start);
            if (p == std::string_view::npos) p = all.size();
            std::string_view d = all.substr(start, p - start);
            size_t b = d.find_first_not_of(ws);
            if (b != std::string_view::npos) {
                size_t e = d.find_last_not_of(ws);
                docs.push_back(d.substr(b, e + 1 - b));
            }
            start = p + opt.split_on.size();
        }
    } else {
        docs.push_back(all);
    }
    // encode and write in batches of about 64 MB of text (bounded memory for big files)
    std::vector<int> ids;
    std::vector<std::string_view> batch;
    size_t bytes = 0;
    for (size_t i = 0; i <= docs.size(); i++) {
        if (i == docs.size() || (bytes >= (64u << 20) && !batch.empty())) {
            ids.clear();
            enc.encode_documents(batch, true, opt.allow_special, &ids);
            sw.write(ids);
            batch.clear();
            bytes = 0;
            if (i == docs.size()) break;
        }
        batch.push_back(docs[i]);
        bytes += docs[i].size();
    }
    st.docs += docs.size();
}

bool ends_with(const std::string& s, const char* suf) {
    size_t n = strlen(suf);
    return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

int run(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) fail("option " + a + " needs a value");
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "-o" || a == "--out") opt.out = value();
        else if (a == "--format") opt.format = value();
        else if (a == "--field") opt.field = value();
        else if (a == "--split-on-blank-lines") opt.split_blank = true;
        else if (a == "--split-on") {
            opt.split_on = value();
            if (opt.split_on.empty()) fail("--split-on needs a non-empty separator");
        } else if (a == "--shard-size") opt.shard_size = parse_count(a, value(), 1, INT32_MAX);
        else if (a == "--val-tokens") opt.val_tokens = parse_count(a, value(), 0, INT32_MAX);
        else if (a == "--threads") opt.threads = (int)parse_count(a, value(), 1, 1024);
        else if (a == "--gpt2-dir") opt.gpt2_dir = value();
        else if (a == "--tokenizer") opt.tokenizer_bin = value();
        else if (a == "--tiktoken") opt.tiktoken = value();
        else if (a == "--pattern") opt.pattern = value();
        else if (a == "--write-tokenizer") opt.write_tokenizer = value();
        else if (a == "--allow-special") opt.allow_special = true;
        else if (a == "-q" || a == "--quiet") opt.quiet = true;
        else if (a == "--uint32") opt.uint32 = true;
        else if (a == "--replace") opt.replace = true;
        else if (a.size() > 1 && a[0] == '-') fail("unknown option " + a + " (see --help)");
        else opt.inputs.push_back(a);
    }
    if (opt.out.empty()) fail("no output prefix (--out PREFIX; see --help)");
    if (opt.inputs.empty()) fail("no input files (see --help)");
    if (!opt.format.empty() && opt.format != "text" && opt.format != "jsonl")
        fail("--format must be text or jsonl, not \"" + opt.format + "\"");
    if ((opt.split_blank || !opt.split_on.empty()) && opt.format == "jsonl")
        fail("--split-on-blank-lines and --split-on apply to text input");
    if (opt.split_blank && !opt.split_on.empty()) fail("--split-on-blank-lines and --split-on exclude each other");
    if (!opt.tiktoken.empty() && (!opt.tokenizer_bin.empty() || !opt.gpt2_dir.empty()))
        fail("--tiktoken excludes --tokenizer and --gpt2-dir");
    if (!opt.pattern.empty() && opt.tiktoken.empty()) fail("--pattern applies to --tiktoken");
    if (!opt.pattern.empty() && opt.pattern != "llama3" && opt.pattern != "gpt2")
        fail("--pattern must be llama3 or gpt2, not \"" + opt.pattern + "\"");
    if (opt.threads <= 0) opt.threads = (int)std::max(1u, std::thread::hardware_concurrency());
    if (opt.val_tokens < 0) opt.val_tokens = opt.shard_size;
    for (const auto& in : opt.inputs)
        if (!file_exists(in)) fail(in + ": no such file");
    check_earlier_shards(opt.out, opt.val_tokens > 0, opt.replace);  // early, before the work; again at the commit

    auto t0 = std::chrono::steady_clock::now();
    llmc::Tokenizer tok;
    if (!opt.tiktoken.empty()) {
        tok.load_tiktoken(opt.tiktoken, opt.pattern == "gpt2" ? llmc::Pattern::Gpt2 : llmc::Pattern::Llama3);
    } else if (!opt.tokenizer_bin.empty()) {
        tok.load_bin(opt.tokenizer_bin);
        if (!tok.can_encode()) fail(opt.tokenizer_bin + ": this vocabulary cannot encode (no single-byte tokens)");
    } else {
        std::string dir = opt.gpt2_dir;
        if (dir.empty()) dir = llmc::find_gpt2_dir();
        if (dir.empty()) fail(llmc::GPT2_DIR_NOT_FOUND);
        tok.load_gpt2(dir + "/encoder.json", dir + "/vocab.bpe");
    }
    if (!opt.write_tokenizer.empty()) tok.save_bin(opt.write_tokenizer);
    auto t1 = std::chrono::steady_clock::now();

    const bool wide = opt.uint32 || dataloader_token_size(tok.vocab_size()) == 4;
    ShardWriter sw(opt.out, opt.shard_size, opt.val_tokens, wide);
    llmc::ParallelEncoder enc(tok, opt.threads);
    Stats st;
    for (const auto& in : opt.inputs) {
        bool jsonl = opt.format == "jsonl" ||
                     (opt.format.empty() && (ends_with(in, ".jsonl") || ends_with(in, ".json")));
        if (jsonl) process_jsonl(in, opt, tok, enc, sw, st);
        else process_text(in, opt, enc, sw, st);
    }
    if (sw.total() == 0)
        fail("no documents in the input (" +
             (opt.inputs.size() == 1 ? opt.inputs[0] + " is empty" : "every input file is empty") + ")");
    sw.commit(opt.replace);
    for (const auto& e : st.empty_files)
        fprintf(stderr, "prepro: warning: %s is empty; it adds no document\n", e.c_str());
    auto t2 = std::chrono::steady_clock::now();
    if (!opt.quiet) {
        double enc_s = std::chrono::duration<double>(t2 - t1).count();
        printf("prepro: %zu file(s), %s documents, %s bytes -> %s tokens (%s val, %s train) in %.2f s "
               "(tokenizer load %.2f s; %.1f MB/s on %d thread(s))\n",
               st.files, with_commas(st.docs).c_str(), with_commas(st.bytes).c_str(), with_commas(sw.total()).c_str(),
               with_commas(sw.val_written()).c_str(), with_commas(sw.total() - sw.val_written()).c_str(), enc_s,
               std::chrono::duration<double>(t1 - t0).count(), st.bytes / 1e6 / std::max(enc_s, 1e-9), opt.threads);
        printf("  vocabulary %d (%s pattern, %s shards); each document starts with token %d (%s)\n", tok.vocab_size(),
               llmc::pattern_name(tok.pattern()), wide ? "uint32" : "uint16", tok.doc_token(),
               tok.token_bytes(tok.doc_token()).c_str());
        for (const auto& s : sw.shards()) printf("  %s: %s tokens\n", s.path.c_str(), with_commas(s.tokens).c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
