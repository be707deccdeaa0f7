// Tests of llmc/formats/checkpoint.h: the training-state file (bitwise round trip, header layout,
// every mismatch and damage error), atomic writes that fail without touching the old file,
// finding the newest complete checkpoint, the DONE marker (run id, sizes, hashes) and its
// verification and what it must list, pruning (only the run's own checkpoints, counting only
// proven ones, and orphans), a model folder (written whole, verified, pruned), the folder lock
// (also when train.lock is removed), no symbolic link followed, llm.c's state told apart, and
// stale temporary files.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/formats/checkpoint.h"
#include "test/test_util.h"

#include "test/host/host_util.h"

static bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
static bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }
static void touch(const std::string& p) { write_file(p, ""); }
static std::string mkdir_in_tmp(const std::string& name) {
    std::string d = g_tmp + "/" + name;
    mkdir(d.c_str(), 0755);
    return d;
}
static off_t file_size(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 ? st.st_size : -1;
}

// A state with random bits (NaN patterns included) in every array and in the blob.
struct State {
    TrainingStateHeader h;
    std::vector<float> m, v, master;
    std::vector<unsigned char> extra;
};
static State random_state(uint32_t seed, uint64_t n, uint32_t extra_bytes) {
    std::mt19937 rng(seed);
    State s;
    s.h.num_processes = 4;
    s.h.rank = 3;
    s.h.shuffle = 1;
    s.h.step = 1234;
    s.h.zero_stage = 1;
    s.h.shard_elements = n;
    s.h.num_parameters = 0x123456789ull;  // needs both uint64 slots
    s.h.extra_bytes = extra_bytes;
    for (auto* a : {&s.m, &s.v, &s.master}) {
        a->resize(n);
        for (auto& x : *a) {
            uint32_t bits = rng();
            memcpy(&x, &bits, 4);
        }
    }
    s.extra.resize(extra_bytes);
    for (auto& b : s.extra) b = (unsigned char)rng();
    return s;
}
// The message of state_write's error, "NO ERROR" when it writes the file.
static std::string write_state(const std::string& path, const State& s) {
    return error_of([&] { state_write(path, s.h, s.m.data(), s.v.data(), s.master.data(), s.extra.data()); });
}
static const std::string NO_ERROR = "NO ERROR";
static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

static void test_paths() {
    CHECK(checkpoint_model_path("out", 5000) == "out/model_00005000.bin" &&
              checkpoint_state_path("out", 5000, 7) == "out/state_00005000_00007.bin" &&
              checkpoint_done_path("out", 5000) == "out/DONE_00005000",
          "paths: model_%%08d.bin, state_%%08d_%%05d.bin, DONE_%%08d");
    CHECK(fsync_directory(g_tmp) && !fsync_directory(g_tmp + "/no_such_dir"),
          "fsync_directory: true on a folder, false on a missing one");
}

static void test_round_trip() {
    const std::string d = mkdir_in_tmp("rt");
    const std::string p = checkpoint_state_path(d, 1234, 3);
    const uint64_t n = 10007;
    const uint32_t eb = 77;
    State s = random_state(1, n, eb);
    std::string err = write_state(p, s);
    CHECK(err == NO_ERROR, "state_write succeeds %s", err == NO_ERROR ? "" : err.c_str());
    CHECK(file_size(p) == (off_t)(1024 + 12 * n + eb) && !exists(p + ".tmp"),
          "the file is exactly 1024 + 12n + extra bytes (%lld) and no .tmp is left", (long long)file_size(p));

    // the raw header layout
    std::string raw = read_file(p);
    std::vector<int32_t> hd(256, -1);
    if (raw.size() >= 1024) memcpy(hd.data(), raw.data(), 1024);
    bool layout = hd[0] == 20240527 && hd[1] == 1 && hd[2] == 4 && hd[3] == 3 && hd[4] == 1 && hd[5] == 1 &&
                  hd[10] == 1234 && hd[11] == 1 && hd[12] == (int32_t)n && hd[13] == 0 && hd[14] == 0x23456789 &&
                  hd[15] == 1 && hd[16] == (int32_t)eb;
    for (int i : {6, 7, 8, 9}) layout = layout && hd[i] == 0;
    for (int i = 17; i < 256; i++) layout = layout && hd[i] == 0;
    CHECK(layout, "header layout: magic, version, processes, rank, master flag, shuffle, step, zero stage, n, "
                  "parameters (low/high), extra bytes; other slots 0");
    bool body = raw.size() == 1024 + 12 * n + eb && memcmp(raw.data() + 1024, s.m.data(), n * 4) == 0 &&
                memcmp(raw.data() + 1024 + 4 * n, s.v.data(), n * 4) == 0 &&
                memcmp(raw.data() + 1024 + 8 * n, s.master.data(), n * 4) == 0 &&
                memcmp(raw.data() + 1024 + 12 * n, s.extra.data(), eb) == 0;
    CHECK(body, "body layout: m, v, master, then the extra blob");

    TrainingStateHeader h;
    memset(&h, 0, sizeof(h));
    err = error_of([&] { h = state_read_header(p); });
    const bool hok = err == NO_ERROR;
    CHECK(hok && h.num_processes == 4 && h.rank == 3 && h.shuffle == 1 && h.step == 1234 && h.zero_stage == 1 &&
              h.shard_elements == n && h.num_parameters == 0x123456789ull && h.extra_bytes == eb,
          "state_read_header returns every field %s", hok ? "" : err.c_str());

    State r;
    r.m.assign(n, 0.f);
    r.v.assign(n, 0.f);
    r.master.assign(n, 0.f);
    r.extra.assign(eb, 0);
    err = error_of([&] { state_read(p, s.h, r.m.data(), r.v.data(), r.master.data(), r.extra.data()); });
    bool rok = err == NO_ERROR;
    CHECK(rok && same_bits(r.m, s.m) && same_bits(r.v, s.v) && same_bits(r.master, s.master) && r.extra == s.extra,
          "state_read: m, v, master and the extra blob come back bitwise (NaN patterns included) %s",
          rok ? "" : err.c_str());

    std::vector<float> only_master(n, 0.f);
    rok = error_of([&] { state_read(p, s.h, nullptr, nullptr, only_master.data(), nullptr); }) == NO_ERROR;
    CHECK(rok && same_bits(only_master, s.master), "state_read with null pointers skips those parts");

    // overwrite with new content: the new one replaces the old
    State s2 = random_state(2, n, eb);
    rok = write_state(p, s2) == NO_ERROR &&
          error_of([&] { state_read(p, s2.h, r.m.data(), r.v.data(), r.master.data(), r.extra.data()); }) == NO_ERROR;
    CHECK(rok && same_bits(r.m, s2.m) && r.extra == s2.extra && !exists(p + ".tmp"), "writing again replaces the file");

    // an empty shard and no blob
    State e = random_state(3, 0, 0);
    rok = write_state(d + "/empty.bin", e) == NO_ERROR && file_size(d + "/empty.bin") == 1024 &&
          error_of([&] { state_read(d + "/empty.bin", e.h, nullptr, nullptr, nullptr, nullptr); }) == NO_ERROR;
    CHECK(rok, "a state with n = 0 and no extra blob is the 1024-byte header and reads back");
}

static void test_mismatch() {
    const std::string d = mkdir_in_tmp("mm");
    const std::string p = d + "/state.bin";
    const uint64_t n = 100;
    State s = random_state(4, n, 16);
    write_state(p, s);
    std::vector<float> buf(4 * n + 1000);
    std::vector<unsigned char> ex(1 << 12);
    struct Case {
        const char* field;
        void (*change)(TrainingStateHeader&);
        std::vector<std::string> needles;
    };
    const std::vector<Case> cases = {
        {"num_processes",
         [](TrainingStateHeader& h) { h.num_processes = 8; },
         {"saved with 4 processes", "this run has 8"}},
        {"rank", [](TrainingStateHeader& h) { h.rank = 1; }, {"rank 3", "rank 1"}},
        {"step", [](TrainingStateHeader& h) { h.step = 2000; }, {"step 1234", "step 2000"}},
        {"zero_stage", [](TrainingStateHeader& h) { h.zero_stage = 0; }, {"zero stage 1", "zero stage 0"}},
        {"shard_elements", [](TrainingStateHeader& h) { h.shard_elements = 200; }, {"100", "200", "elements"}},
        {"num_parameters",
         [](TrainingStateHeader& h) { h.num_parameters = 124439808; },
         {"4886718345", "124439808", "parameters"}},
        {"extra_bytes", [](TrainingStateHeader& h) { h.extra_bytes = 32; }, {"16 bytes", "32"}},
    };
    for (const Case& c : cases) {
        TrainingStateHeader want = s.h;
        c.change(want);
        const std::string err =
            error_of([&] { state_read(p, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); });
        bool msg = one_line(err) && contains(err, p);
        for (const std::string& nd : c.needles) msg = msg && contains(err, nd);
        CHECK(err != NO_ERROR && msg, "mismatch of %s is refused: %s", c.field, err.c_str());
    }
    TrainingStateHeader want = s.h;
    want.shuffle = 0;
    CHECK(error_of([&] { state_read(p, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); }) == NO_ERROR,
          "the shuffle flag is not part of the match (the caller decides)");
    want = s.h;
    want.zero_stage = 2;  // the file says 1: ZeRO-1 and ZeRO-2 keep the same shard
    CHECK(error_of([&] { state_read(p, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); }) == NO_ERROR,
          "a ZeRO-1 state resumes under ZeRO-2 (the same shard)");
    const std::string p2 = p + ".zero2";
    State s2 = s;
    s2.h.zero_stage = 2;
    write_state(p2, s2);
    CHECK(error_of([&] { state_read(p2, s.h, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); }) == NO_ERROR,
          "a ZeRO-2 state resumes under ZeRO-1");
    want = s.h;
    want.zero_stage = 0;
    const std::string err =
        error_of([&] { state_read(p2, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); });
    CHECK(contains(err, "zero stage 2") && contains(err, "zero stage 0"), "a ZeRO-2 state under ZeRO-0 is refused: %s",
          err.c_str());
    // ZeRO-3 shards the optimizer state as ZeRO-1 and 2 (only the staging of weights and gradients differs)
    const std::string p3 = p + ".zero3";
    State s3 = s;
    s3.h.zero_stage = 3;
    write_state(p3, s3);
    for (int stage : {1, 2}) {
        want = s.h;
        want.zero_stage = stage;
        CHECK(error_of([&] { state_read(p3, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); }) ==
                  NO_ERROR,
              "a ZeRO-3 state resumes under ZeRO-%d", stage);
    }
    want = s3.h;
    CHECK(error_of([&] { state_read(p2, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); }) ==
              NO_ERROR,
          "a ZeRO-2 state resumes under ZeRO-3");
    want.zero_stage = 0;
    const std::string err3 =
        error_of([&] { state_read(p3, want, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); });
    CHECK(contains(err3, "zero stage 3") && contains(err3, "zero stage 0"),
          "a ZeRO-3 state under ZeRO-0 is refused: %s", err3.c_str());
}

static void test_damage() {
    const std::string d = mkdir_in_tmp("dmg");
    const uint64_t n = 50;
    const uint32_t eb = 8;
    State s = random_state(5, n, eb);
    const std::string good = d + "/good.bin";
    write_state(good, s);
    const std::string raw = read_file(good);
    const size_t full = raw.size();
    auto expect_error = [&](const std::string& name, const std::string& bytes,
                            std::initializer_list<const char*> needles, const char* what) {
        const std::string p = d + "/" + name;
        write_file(p, bytes);
        const std::string err = error_of([&] { state_read_header(p); });
        bool msg = one_line(err) && contains(err, p);
        for (const char* nd : needles) msg = msg && contains(err, nd);
        std::vector<float> buf(3 * n);
        std::vector<unsigned char> ex(eb);
        const std::string err2 =
            error_of([&] { state_read(p, s.h, buf.data(), buf.data() + n, buf.data() + 2 * n, ex.data()); });
        CHECK(err != NO_ERROR && msg && err2 == err, "%s: %s", what, err.c_str());
    };
    const std::string F = std::to_string(full);
    expect_error("cut.bin", raw.substr(0, full - 1), {"truncated", std::to_string(full - 1).c_str(), F.c_str()},
                 "a file one byte short: truncated, both sizes named");
    expect_error("cut_body.bin", raw.substr(0, 1024 + 4 * n), {"truncated", F.c_str()},
                 "a file cut inside m: truncated");
    expect_error("cut_header.bin", raw.substr(0, 500), {"truncated", "500"}, "a file cut inside the header");
    expect_error("long.bin", raw + "x", {"wrong size", std::to_string(full + 1).c_str(), F.c_str()},
                 "a file one byte long: wrong size");
    std::string bad = raw;
    int32_t mg = 20240520;
    memcpy(&bad[0], &mg, 4);
    expect_error("magic.bin", bad, {"not a training state file", "magic 20240520"}, "wrong magic (a token shard's)");
    expect_error("tiny.bin", "ab", {"not a training state file"}, "a 2-byte file");
    expect_error("zero.bin", "", {"not a training state file"}, "an empty file");
    bad = raw;
    int32_t ver = 2;
    memcpy(&bad[4], &ver, 4);
    expect_error("version.bin", bad, {"version 2"}, "unsupported version");
    bad = raw;
    int32_t rank = 9;
    memcpy(&bad[12], &rank, 4);
    expect_error("rank.bin", bad, {"rank 9 of 4"}, "rank outside the process count");
    bad = raw;
    int32_t nohigh = 1;
    memcpy(&bad[13 * 4], &nohigh, 4);  // n + 2^32: the file is far too short
    expect_error("nhigh.bin", bad, {"truncated"}, "the high word of n counts (file far too short)");
    bad = raw;
    int32_t big = -1;
    memcpy(&bad[12 * 4], &big, 4);
    memcpy(&bad[13 * 4], &big, 4);  // n = 2^64 - 1: no size fits
    expect_error("nhuge.bin", bad, {"bad header"}, "n = 2^64-1 is refused without overflow");

    std::string err = error_of([&] { state_read_header(d + "/missing.bin"); });
    CHECK(one_line(err) && contains(err, "missing.bin") && contains(err, strerror(ENOENT)), "a missing file: %s",
          err.c_str());

    State inv = random_state(6, 4, 0);
    inv.h.rank = 4;  // of 4 processes
    err = write_state(d + "/inv.bin", inv);
    CHECK(err != NO_ERROR && !exists(d + "/inv.bin") && !exists(d + "/inv.bin.tmp") && one_line(err),
          "state_write refuses a header with rank >= processes: %s", err.c_str());
}

static void test_atomic() {
    const std::string d = mkdir_in_tmp("atomic");
    const std::string p = d + "/file.bin";
    const std::string old = "the old content\n";
    write_file(p, old);
    std::string err = error_of([&] {
        write_file_atomic(p, [](FILE* f) {
            std::vector<char> half(100000, 'z');
            fwrite(half.data(), 1, half.size(), f);
            errno = ENOSPC;  // as a failing write would report it
            return false;
        });
    });
    CHECK(err != NO_ERROR && read_file(p) == old && !exists(p + ".tmp") && one_line(err) && contains(err, p) &&
              contains(err, strerror(ENOSPC)),
          "a writer failing midway: an error, old file unchanged, no .tmp left: %s", err.c_str());

    err = error_of([&] { write_file_atomic(p, [](FILE*) { return false; }); });
    CHECK(err != NO_ERROR && read_file(p) == old && !exists(p + ".tmp") && one_line(err),
          "a writer failing without errno: still a one-line reason: %s", err.c_str());

    // a failed state_write over an existing state keeps the old state readable
    const std::string sp = d + "/state.bin";
    State s = random_state(7, 64, 4);
    write_state(sp, s);
    const std::string before = read_file(sp);
    State big = random_state(8, 64, 4);
    big.h.extra_bytes = 0x80000000u;  // invalid: does not fit the int32 slot
    err = write_state(sp, big);
    CHECK(err != NO_ERROR && read_file(sp) == before && !exists(sp + ".tmp"),
          "a refused state_write leaves the existing state file as it was: %s", err.c_str());

    err = error_of(
        [] { write_file_atomic(g_tmp + "/no_such_dir/file.bin", [](FILE* f) { return fputs("x", f) >= 0; }); });
    CHECK(one_line(err) && contains(err, "no_such_dir") && contains(err, strerror(ENOENT)), "a missing folder: %s",
          err.c_str());

    bool ok = error_of([&] { write_file_atomic(p, [](FILE* f) { return fputs("new", f) >= 0; }); }) == NO_ERROR;
    CHECK(ok && read_file(p) == "new" && !exists(p + ".tmp"), "a successful write replaces the file");

    ok = error_of([] {
             write_file_atomic("checkpoint_test_relative.tmpfile", [](FILE* f) { return fputs("r", f) >= 0; });
         }) == NO_ERROR;
    CHECK(ok && read_file("checkpoint_test_relative.tmpfile") == "r", "a bare file name (folder \".\") works");
    unlink("checkpoint_test_relative.tmpfile");
}

static const DoneRecord OWN{"00000000000000aa", {}};

static void test_find_latest() {
    const std::string d = mkdir_in_tmp("latest");
    CHECK(checkpoint_find_latest(d) == -1 && checkpoint_find_latest(g_tmp + "/nope") == -1,
          "find_latest: -1 for an empty and for a missing folder");
    for (const char* junk :
         {"DONE_0000030", "DONE_000000300", "DONE_00000999.tmp", "DONE_0000a999", "xDONE_00000500", "DONE_00000400x",
          "DONE_-0000001", "DONE_", "done_00000800", "model_00000900.bin", "state_00000900_00000.bin"})
        touch(d + "/" + junk);
    mkdir((d + "/DONE_99999999.d").c_str(), 0755);
    CHECK(checkpoint_find_latest(d) == -1, "junk names and checkpoints without DONE are not complete");
    const std::string err = error_of([&] {
        for (int step : {10, 200, 50}) checkpoint_write_done(d, step, OWN);
    });
    CHECK(err == NO_ERROR &&
              read_file(checkpoint_done_path(d, 200)) == "gpt-trainer checkpoint 1\nrun 00000000000000aa\n" &&
              !exists(checkpoint_done_path(d, 200) + ".tmp"),
          "checkpoint_write_done writes the title and the run id, no .tmp left");
    CHECK(checkpoint_find_latest(d) == 200, "find_latest picks the largest DONE step (got %d)",
          checkpoint_find_latest(d));
    touch(d + "/DONE_00000000");
    CHECK(checkpoint_find_latest(d) == 200, "step 0 counts but is not the latest");
    const std::string missing = error_of([] { checkpoint_write_done(g_tmp + "/nope", 5, OWN); });
    CHECK(missing != NO_ERROR && one_line(missing), "write_done into a missing folder: %s", missing.c_str());
}

// OWN's DONE of step listing its model file and P ranks' state files (sizes and hashes unchecked here).
static DoneRecord own_listing(int step, int P) {
    DoneRecord r = OWN;
    r.files.push_back(CheckpointFile{checkpoint_model_path("", step).substr(1), 0, 0});
    for (int k = 0; k < P; k++) r.files.push_back(CheckpointFile{checkpoint_state_path("", step, k).substr(1), 0, 0});
    return r;
}

static void test_prune() {
    const std::string d = mkdir_in_tmp("prune");
    const int P = 2;
    const auto make_ckpt = [&](int step, bool done) {
        touch(checkpoint_model_path(d, step));
        for (int r = 0; r < P; r++) touch(checkpoint_state_path(d, step, r));
        if (done) checkpoint_write_done(d, step, own_listing(step, P));
    };
    for (int s : {10, 20, 30, 40, 50}) make_ckpt(s, true);
    make_ckpt(60, false);  // being written: no DONE
    touch(checkpoint_state_path(d, 10, 5));  // from an earlier run with more processes
    for (const char* other : {"main.log", "model_00000010.bin.tmp", "notes.txt", "state_0000010_00000.bin"})
        touch(d + "/" + other);
    auto present = [&](int step) {
        bool all = exists(checkpoint_model_path(d, step));
        for (int r = 0; r < P; r++) all = all && exists(checkpoint_state_path(d, step, r));
        return all;
    };
    auto absent = [&](int step) {
        bool none = !exists(checkpoint_model_path(d, step)) && !exists(checkpoint_done_path(d, step));
        for (int r = 0; r < P; r++) none = none && !exists(checkpoint_state_path(d, step, r));
        return none;
    };
    const std::vector<int> ALL = {10, 20, 30, 40, 50};  // written by this run: proven
    checkpoint_prune(d, 0, OWN.run_id, ALL);
    checkpoint_prune(d, -1, OWN.run_id, ALL);
    checkpoint_prune(d, 5, OWN.run_id, ALL);
    bool all_kept = true;
    for (int s : {10, 20, 30, 40, 50}) all_kept = all_kept && present(s) && exists(checkpoint_done_path(d, s));
    CHECK(all_kept, "prune with keep_last <= 0 or >= the count deletes nothing");

    checkpoint_prune(d, 2, "00000000000000bb", ALL);
    bool foreign_kept = true;
    for (int s : {10, 20, 30, 40, 50}) foreign_kept = foreign_kept && present(s);
    CHECK(foreign_kept, "prune for another run id deletes none of these checkpoints");
    checkpoint_prune(d, 2, OWN.run_id, ALL);
    CHECK(absent(10) && absent(20) && absent(30),
          "prune keep 2: steps 10, 20, 30 gone (DONE, model, every rank's state)");
    CHECK(exists(checkpoint_state_path(d, 10, 5)),
          "prune keeps a pruned step's state of a rank beyond the process count (its DONE does not list it)");
    CHECK(present(40) && present(50) && exists(checkpoint_done_path(d, 40)) && exists(checkpoint_done_path(d, 50)),
          "prune keep 2: steps 40 and 50 kept whole");
    CHECK(present(60) && !exists(checkpoint_done_path(d, 60)), "the newer incomplete step 60 is untouched");
    bool others = true;
    for (const char* other : {"main.log", "model_00000010.bin.tmp", "notes.txt", "state_0000010_00000.bin"})
        others = others && exists(d + "/" + other);
    CHECK(others, "other files are untouched");
    CHECK(checkpoint_find_latest(d) == 50, "find_latest after prune: 50");

    checkpoint_prune(d, 1, OWN.run_id, ALL);
    CHECK(absent(40) && present(50) && present(60), "prune keep 1: only step 50 (and the incomplete 60) left");

    // files without a DONE are not the run's by any DONE: kept, also older than the newest DONE;
    // another run's DONE stays
    make_ckpt(45, false);
    checkpoint_write_done(d, 5, DoneRecord{"00000000000000bb", {}});
    touch(checkpoint_model_path(d, 5));
    touch(d + "/DONE_00000003");  // llm.c's empty DONE: no owner
    touch(checkpoint_model_path(d, 3));
    checkpoint_prune(d, 0, OWN.run_id, ALL);
    checkpoint_prune(d, 1, OWN.run_id, ALL);
    CHECK(present(45) && present(60), "the model and states of steps 45 and 60 without DONE are kept");
    checkpoint_prune(d, 1, OWN.run_id, ALL);
    CHECK(exists(checkpoint_done_path(d, 5)) && exists(checkpoint_model_path(d, 5)) &&
              exists(checkpoint_done_path(d, 3)) && exists(checkpoint_model_path(d, 3)) && present(50),
          "another run's checkpoint and an ownerless (empty) DONE are never pruned");

    // a crash between the DONE removal and the data removal leaves data without DONE: not complete
    make_ckpt(70, true);
    unlink(checkpoint_done_path(d, 70).c_str());
    CHECK(checkpoint_find_latest(d) == 50, "files without DONE never count as complete");
}

// Pruning counts only proven checkpoints (written by this process, or resumed from after
// its files were checked): a DONE of the run that no one checked is never among the kept.
static void test_prune_proven() {
    const std::string d = mkdir_in_tmp("prune_proven");
    const auto make_ckpt = [&](int step) {
        touch(checkpoint_model_path(d, step));
        touch(checkpoint_state_path(d, step, 0));
        checkpoint_write_done(d, step, OWN);
    };
    // a resume fell back past a damaged 20 to 10, then wrote 11: -nk 1 keeps 11, and 20
    for (int s : {10, 20, 11}) make_ckpt(s);
    checkpoint_prune(d, 1, OWN.run_id, {10, 11});
    CHECK(!exists(checkpoint_done_path(d, 10)) && exists(checkpoint_done_path(d, 11)) &&
              exists(checkpoint_model_path(d, 11)) && exists(checkpoint_done_path(d, 20)),
          "-nk 1 after a fallback past 20: 11 (proven, newest) and 20 (unproven) kept, 10 pruned");
    // fewer trusted than keep_last (5 is older than the first proven, so trusted): none deleted
    make_ckpt(5);
    checkpoint_prune(d, 3, OWN.run_id, {11});
    CHECK(exists(checkpoint_done_path(d, 5)) && exists(checkpoint_done_path(d, 11)) &&
              exists(checkpoint_done_path(d, 20)),
          "fewer trusted checkpoints than -nk: nothing pruned");
    // the checkpoint resumed from is never deleted before keep_last newer proven ones exist
    make_ckpt(12);
    checkpoint_prune(d, 2, OWN.run_id, {11, 12});
    CHECK(!exists(checkpoint_done_path(d, 5)) && exists(checkpoint_done_path(d, 11)) &&
              exists(checkpoint_done_path(d, 12)),
          "-nk 2 with 11 and 12 proven: 5 (older) pruned, 11 and 12 kept");
    // a resume from 21 with the run's 15 and 18 before it, then 24 written: -nk 3 keeps 18, 21, 24
    const std::string e = mkdir_in_tmp("prune_resumed");
    for (int s : {15, 18, 21, 24}) {
        touch(checkpoint_model_path(e, s));
        checkpoint_write_done(e, s, OWN);
    }
    checkpoint_prune(e, 3, OWN.run_id, {21, 24});
    CHECK(!exists(checkpoint_done_path(e, 15)) && exists(checkpoint_done_path(e, 18)) &&
              exists(checkpoint_done_path(e, 24)),
          "the run's checkpoints older than the one resumed from count: -nk 3 keeps 18, 21, 24");
    // a proven step whose DONE is gone does not count
    unlink(checkpoint_done_path(d, 12).c_str());
    checkpoint_prune(d, 1, OWN.run_id, {11, 12});
    CHECK(exists(checkpoint_done_path(d, 11)), "a proven step without its DONE does not count: 11 kept");
}

// A DONE vouches for a checkpoint only when it lists exactly its model and every rank's state.
static void test_done_covers() {
    const auto rec = [](std::vector<std::string> names) {
        DoneRecord r{"0123456789abcdef", {}};
        for (const std::string& n : names) r.files.push_back(CheckpointFile{n, 1, 1});
        return r;
    };
    const std::string m = "model_00000007.bin", s0 = "state_00000007_00000.bin", s1 = "state_00000007_00001.bin";
    std::string why;
    CHECK(checkpoint_done_covers(rec({m, s0, s1}), 7, 2, {}, &why) && checkpoint_done_ranks(rec({m, s0, s1})) == 2,
          "model and both states of 2 ranks: covered");
    const struct {
        DoneRecord r;
        int step, ranks;
        const char* says;
    } bad[] = {
        {DoneRecord{}, 7, 1, "DONE_00000007 is empty (llm.c's marker)"},
        {rec({}), 7, 1, "DONE_00000007 lists no file"},
        {rec({s0}), 7, 1, "does not list model_00000007.bin"},
        {rec({m, s0}), 7, 2, "does not list state_00000007_00001.bin"},
        {rec({"model_00000005.bin", "state_00000005_00000.bin"}), 7, 1, "does not list model_00000007.bin"},
        {rec({m, s0, "notes.txt"}), 7, 1, "lists notes.txt, not a file of this checkpoint"},
        {rec({m, s0, s0}), 7, 1, "lists a file twice"},
    };
    for (const auto& b : bad) {
        why.clear();
        CHECK(!checkpoint_done_covers(b.r, b.step, b.ranks, {}, &why) && one_line(why) && contains(why, b.says),
              "not covered: %s", why.c_str());
    }
}

// A family whose model is a folder (Llama 3: config.json, model.safetensors): its DONE must list
// each file of model_%08d/, and nothing of the one-file layout.
static void test_done_covers_folder() {
    const auto rec = [](std::vector<std::string> names) {
        DoneRecord r{"0123456789abcdef", {}};
        for (const std::string& n : names) r.files.push_back(CheckpointFile{n, 1, 1});
        return r;
    };
    const std::vector<std::string> files = {"config.json", "model.safetensors"};
    const std::string c = "model_00000007/config.json", w = "model_00000007/model.safetensors",
                      s0 = "state_00000007_00000.bin";
    std::string why;
    CHECK(checkpoint_model_names(7, files) == std::vector<std::string>({c, w}) &&
              checkpoint_model_names(7, {}) == std::vector<std::string>({"model_00000007.bin"}) &&
              checkpoint_model_path("out", 7, true) == "out/model_00000007",
          "a model folder's names: model_%%08d/<file>; the one file: model_%%08d.bin");
    CHECK(checkpoint_done_covers(rec({c, w, s0}), 7, 1, files, &why),
          "both files of the folder and the state: covered %s", why.c_str());
    const struct {
        std::vector<std::string> names;
        const char* says;
    } bad[] = {
        {{c, s0}, "does not list model_00000007/model.safetensors"},
        {{"model_00000007.bin", s0}, "does not list model_00000007/config.json"},
        {{c, w, "model_00000007/notes.txt", s0}, "lists model_00000007/notes.txt"},
        {{"model_00000005/config.json", "model_00000005/model.safetensors", s0}, "does not list model_00000007/config"},
    };
    for (const auto& b : bad) {
        why.clear();
        CHECK(!checkpoint_done_covers(rec(b.names), 7, 1, files, &why) && one_line(why) && contains(why, b.says),
              "not covered: %s", why.c_str());
    }
}

// A model folder written whole through model_%08d.tmp; its files verified against a DONE
// without following a link (the folder's or a file's); pruned whole; a link in its place
// refused (kept, never followed); a folder already at its temporary's name refused.
static void test_model_folder() {
    const std::string d = mkdir_in_tmp("folder");
    const std::string m = checkpoint_model_path(d, 4, true);
    const auto write_two = [](const std::string& tmp) {
        std::vector<CheckpointFile> files;
        for (const char* name : {"config.json", "model.safetensors"})
            files.push_back(write_file_hashed(tmp + "/" + name, [&](HashingWriter& w) { return w.put(name, 1, 5); }));
        return files;
    };
    mkdir((m + ".tmp").c_str(), 0755);  // a killed write's temporary (or a user's folder): not replaced
    write_file(m + ".tmp/model.safetensors.tmp", "partial");
    std::string err = error_of([&] { write_folder_atomic(m, write_two); });
    CHECK(contains(err, "model_00000004.tmp: cannot create the folder (something is already there; not replaced)") &&
              read_file(m + ".tmp/model.safetensors.tmp") == "partial" && !exists(m),
          "write_folder_atomic refuses a folder already at path.tmp, kept: %s", err.c_str());
    remove_written_folder_(m + ".tmp");
    std::vector<CheckpointFile> files;
    err = error_of([&] { files = write_folder_atomic(m, write_two); });
    CHECK(err == NO_ERROR && files.size() == 2 && files[0].name == "model_00000004/config.json" &&
              files[1].name == "model_00000004/model.safetensors" && files[1].bytes == 5 &&
              read_file(m + "/model.safetensors") == "model" && !exists(m + ".tmp"),
          "write_folder_atomic: both files in model_00000004/, named with the folder %s", err.c_str());
    const std::string before = read_file(m + "/config.json");
    err = error_of([&] { write_folder_atomic(m, write_two); });
    CHECK(contains(err, "model_00000004: already exists; not replaced") && read_file(m + "/config.json") == before &&
              !exists(m + ".tmp"),
          "a folder already at path is refused, kept as it was: %s", err.c_str());
    const std::string five = checkpoint_model_path(d, 5, true);
    err = error_of([&] {
        write_folder_atomic(five, [](const std::string& tmp) -> std::vector<CheckpointFile> {
            write_file(tmp + "/config.json", "half");
            llmc::fail(tmp + ": disk full");
        });
    });
    CHECK(contains(err, "disk full") && !exists(five) && !exists(five + ".tmp"),
          "a write that fails leaves no folder and no .tmp: %s", err.c_str());

    const DoneRecord rec{"0123456789abcdef", files};
    err.clear();
    CHECK(checkpoint_verify_files(d, rec, &err), "the folder's files match their DONE %s", err.c_str());
    write_file(m + "/model.safetensors", "mode");
    err.clear();
    CHECK(!checkpoint_verify_files(d, rec, &err) && one_line(err) && contains(err, "model.safetensors: 4 bytes"),
          "a truncated model.safetensors inside the folder: %s", err.c_str());
    const std::string elsewhere = g_tmp + "/folder_elsewhere";
    rename(m.c_str(), elsewhere.c_str());
    write_file(elsewhere + "/model.safetensors", "model");
    if (symlink(elsewhere.c_str(), m.c_str()) != 0) perror("symlink");
    err.clear();
    CHECK(!checkpoint_verify_files(d, rec, &err) && one_line(err) && contains(err, "a symbolic link, not followed"),
          "the folder as a link to an intact copy: not followed %s", err.c_str());
    unlink(m.c_str());
    mkdir(m.c_str(), 0755);
    write_file(m + "/config.json", "confi");
    if (symlink((elsewhere + "/model.safetensors").c_str(), (m + "/model.safetensors").c_str()) != 0) perror("symlink");
    err.clear();
    CHECK(!checkpoint_verify_files(d, rec, &err) && contains(err, "model.safetensors: a symbolic link, not followed"),
          "a file of the folder as a link to an intact copy: not followed %s", err.c_str());

    // a link at the folder's name: refused, the link and its target kept
    remove_written_folder_(m);
    if (symlink(elsewhere.c_str(), m.c_str()) != 0) perror("symlink");
    err = error_of([&] { write_folder_atomic(m, write_two); });
    struct stat st;
    CHECK(contains(err, "model_00000004: already exists; not replaced") && lstat(m.c_str(), &st) == 0 &&
              S_ISLNK(st.st_mode) && read_file(elsewhere + "/config.json") == "confi" && !exists(m + ".tmp"),
          "a link at the folder's name is refused, the link and its target untouched: %s", err.c_str());
    unlink(m.c_str());
    err = error_of([&] { write_folder_atomic(m, write_two); });

    // pruned whole (a link named as an older step's folder without DONE kept, its target too)
    checkpoint_write_done(d, 4, rec);
    const std::string orphan = checkpoint_model_path(d, 3, true);
    if (symlink(elsewhere.c_str(), orphan.c_str()) != 0) perror("symlink");
    CHECK(checkpoint_steps_with_files(d) == std::vector<int>({3, 4}),
          "a model folder and a link named so count as files of their step");
    const std::string newer = checkpoint_model_path(d, 9, true);
    std::vector<CheckpointFile> nine;
    err = error_of([&] { nine = write_folder_atomic(newer, write_two); });
    checkpoint_write_done(d, 9, DoneRecord{rec.run_id, nine});
    checkpoint_prune(d, 1, rec.run_id, {4, 9});
    CHECK(err == NO_ERROR && !exists(m) && !exists(checkpoint_done_path(d, 4)) && lstat(orphan.c_str(), &st) == 0 &&
              read_file(elsewhere + "/config.json") == "confi" && exists(newer + "/model.safetensors"),
          "-nk 1: the older folder removed whole, the link at step 3 (no DONE) and its target kept, the newest kept %s",
          err.c_str());

    // a user's file in a folder its DONE lists: pruning it is one error naming the file, nothing deleted
    const std::string twelve = checkpoint_model_path(d, 12, true);
    err = error_of([&] {
        std::vector<CheckpointFile> f = write_folder_atomic(twelve, write_two);
        checkpoint_write_done(d, 12, DoneRecord{rec.run_id, f});
    });
    write_file(newer + "/notes.txt", "mine");
    err = error_of([&] { checkpoint_prune(d, 1, rec.run_id, {4, 9, 12}); });
    CHECK(contains(err,
                   "model_00000009/notes.txt is not a file this run wrote; remove or move it (nothing was deleted)") &&
              exists(checkpoint_done_path(d, 9)) && exists(newer + "/model.safetensors") &&
              read_file(newer + "/notes.txt") == "mine",
          "prune meets a user's file in a listed folder: %s", err.c_str());
}

static void test_done_and_verify() {
    const std::string d = mkdir_in_tmp("verify");
    State s = random_state(11, 500, 24);
    CheckpointFile written;
    const std::string p = checkpoint_state_path(d, 7, 3);
    std::string err =
        error_of([&] { written = state_write(p, s.h, s.m.data(), s.v.data(), s.master.data(), s.extra.data()); });
    const std::string raw = read_file(p);
    CHECK(err == NO_ERROR && written.name == "state_00000007_00003.bin" && written.bytes == raw.size() &&
              written.xxh64 == XXH64(raw.data(), raw.size(), 0),
          "state_write reports the file's name, size and XXH64");
    const DoneRecord rec{"0123456789abcdef", {written}};
    DoneRecord back;
    err.clear();
    const bool ok = error_of([&] { checkpoint_write_done(d, 7, rec); }) == NO_ERROR &&
                    checkpoint_read_done(d, 7, &back, &err);
    CHECK(ok && back.run_id == rec.run_id && back.files.size() == 1 && back.files[0].name == written.name &&
              back.files[0].bytes == written.bytes && back.files[0].xxh64 == written.xxh64,
          "DONE round trip: run id and the file line %s", err.c_str());
    CHECK(checkpoint_verify_files(d, back, &err), "the files match their DONE %s", err.c_str());
    std::string flipped = raw;
    flipped[2000] ^= 1;
    write_file(p, flipped);
    err.clear();
    CHECK(!checkpoint_verify_files(d, back, &err) && one_line(err) && contains(err, "checksum differs"),
          "one flipped bit: %s", err.c_str());
    write_file(p, raw.substr(0, raw.size() - 1));
    err.clear();
    CHECK(!checkpoint_verify_files(d, back, &err) && contains(err, "its DONE says"), "a truncated file: %s",
          err.c_str());
    unlink(p.c_str());
    mkfifo(p.c_str(), 0644);
    err.clear();
    CHECK(!checkpoint_verify_files(d, back, &err) && contains(err, "not a regular file"),
          "a FIFO in its place: refused, not waited on: %s", err.c_str());
    touch(checkpoint_done_path(d, 8));
    CHECK(checkpoint_read_done(d, 8, &back, &err) && back.run_id.empty() && back.files.empty(),
          "llm.c's empty DONE: complete, no owner, nothing to check");
    for (const char* bad : {"gpt-trainer checkpoint 1\nrun 12\n", "something else\nrun 0123456789abcdef\n",
                            "gpt-trainer checkpoint 1\nrun 0123456789abcdef\nfile a 12\n",
                            "gpt-trainer checkpoint 1\nrun 0123456789abcdef\nfile ../x 1 0000000000000001\n",
                            "gpt-trainer checkpoint 1\nrun 0123456789abcdef\nfile x 1 00000000000000"}) {
        write_file(checkpoint_done_path(d, 9), bad);
        err.clear();
        CHECK(!checkpoint_read_done(d, 9, &back, &err) && one_line(err), "a damaged DONE is refused: %s", err.c_str());
    }
}

static void test_lock() {
    const std::string d = mkdir_in_tmp("lock");
    FolderLock held;
    std::string err = error_of([&] { held = checkpoint_lock_dir(d); });
    CHECK(err == NO_ERROR && held.on_folder && read_file(d + "/train.lock") == std::to_string(getpid()) + "\n",
          "the lock is taken on the folder and train.lock names this pid %s", err == NO_ERROR ? "" : err.c_str());
    // flock is per open file: a second open, even in this process, is another writer
    err = error_of([&] { checkpoint_lock_dir(d); });
    CHECK(one_line(err) &&
              contains(err, "another trainer is writing into this folder (pid " + std::to_string(getpid())),
          "a second writer is refused, naming the holder: %s", err.c_str());
    unlink((d + "/train.lock").c_str());
    err = error_of([&] { checkpoint_lock_dir(d); });
    CHECK(one_line(err) && contains(err, "another trainer is writing into this folder (pid unknown"),
          "train.lock removed: the folder's lock still refuses a second writer: %s", err.c_str());
    err = error_of([&] { checkpoint_check_lock(&held); });
    CHECK(err == NO_ERROR && read_file(d + "/train.lock") == std::to_string(getpid()) + "\n",
          "the holder re-creates train.lock at its next check %s", err.c_str());
    err = error_of([] { checkpoint_lock_dir(g_tmp + "/nope"); });
    CHECK(err != NO_ERROR && one_line(err), "a missing folder: %s", err.c_str());

    // where a folder cannot be locked, only train.lock is: losing its name stops the holder
    const std::string f = mkdir_in_tmp("lock_file_only");
    FolderLock first, second;
    err = error_of([&] { first = checkpoint_lock_dir(f, false); });
    CHECK(err == NO_ERROR && !first.on_folder && error_of([&] { checkpoint_check_lock(&first); }) == NO_ERROR,
          "train.lock alone: taken, and the check passes while the name is that file %s", err.c_str());
    unlink((f + "/train.lock").c_str());
    err = error_of([&] { second = checkpoint_lock_dir(f, false); });
    const std::string stop = error_of([&] { checkpoint_check_lock(&first); });
    CHECK(err == NO_ERROR && one_line(stop) && contains(stop, "removed or replaced during the run"),
          "train.lock removed: a second writer gets in, so the first stops before its next checkpoint: %s",
          stop.c_str());

    const std::string l = mkdir_in_tmp("lock_link");
    write_file(g_tmp + "/victim", "precious");
    if (symlink((g_tmp + "/victim").c_str(), (l + "/train.lock").c_str()) != 0) perror("symlink");
    err = error_of([&] { checkpoint_lock_dir(l); });
    CHECK(one_line(err) && contains(err, "a symbolic link, not followed") && read_file(g_tmp + "/victim") == "precious",
          "a symbolic link as train.lock is refused, its target untouched: %s", err.c_str());
}

static void test_no_symlink_followed() {
    const std::string d = mkdir_in_tmp("links");
    const std::string victim = g_tmp + "/links_victim", p = d + "/model_00000001.bin";
    write_file(victim, "precious");
    if (symlink(victim.c_str(), (p + ".tmp").c_str()) != 0) perror("symlink");
    std::string err = error_of([&] { write_file_atomic(p, [](FILE* f) { return fputs("new", f) >= 0; }); });
    struct stat st;
    CHECK(err == NO_ERROR && read_file(victim) == "precious" && read_file(p) == "new" && lstat(p.c_str(), &st) == 0 &&
              S_ISREG(st.st_mode) && !exists(p + ".tmp"),
          "a symbolic link at the temporary's name is replaced, never written through %s", err.c_str());
    unlink(p.c_str());
    if (symlink(victim.c_str(), p.c_str()) != 0) perror("symlink");
    err = error_of([&] { write_file_atomic(p, [](FILE* f) { return fputs("new", f) >= 0; }); });
    CHECK(err == NO_ERROR && read_file(victim) == "precious" && lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode),
          "a symbolic link at the file's own name is replaced by the file, its target untouched %s", err.c_str());
}

static void test_llmc_state() {
    const std::string d = mkdir_in_tmp("llmc_state");
    int32_t h[CHECKPOINT_HEADER_INTS] = {CHECKPOINT_STATE_MAGIC, 1, 1, 0, 1, 0};
    h[10] = 20;  // llm.c: the step in slot 10, its rng and loader state in 20..33, 12..16 unused
    h[30] = 3;
    write_file(d + "/llmc.bin", std::string((const char*)h, sizeof h) + std::string(48, '\0'));
    State s = random_state(12, 8, 4);
    write_state(d + "/ours.bin", s);
    CHECK(state_file_is_llmc(d + "/llmc.bin") && !state_file_is_llmc(d + "/ours.bin") &&
              !state_file_is_llmc(d + "/missing.bin"),
          "llm.c's state file is told from this trainer's");
}

// What a crash leaves of the run's writes (a step with its WRITING) goes at a resume, and only
// that; checkpoint_clear_step refuses what is in the way and not the run's, deleting nothing.
static void test_unfinished() {
    const std::string d = mkdir_in_tmp("unfinished");
    const std::vector<std::string> folder = {"config.json", "model.safetensors"};
    const std::string own = OWN.run_id, other = "00000000000000bb";
    const auto writing = [&](int step, const std::string& id) {
        checkpoint_write_marker_(checkpoint_writing_path(d, step), DoneRecord{id, {}});
    };
    // step 10: killed inside the model folder's write; 11: at the WRITING's rename (its whole .tmp);
    // 12: before the WRITING's one write (an empty .tmp); 13: another run's
    writing(10, own);
    mkdir((d + "/model_00000010.tmp").c_str(), 0755);
    write_file(d + "/model_00000010.tmp/config.json", "partial");
    write_file(d + "/model_00000010.tmp/model.safetensors.tmp", "partial");
    write_file(d + "/state_00000010_00000.bin.tmp", "partial");
    writing(11, own);
    rename(checkpoint_writing_path(d, 11).c_str(), (checkpoint_writing_path(d, 11) + ".tmp").c_str());
    write_file(d + "/state_00000011_00000.bin", "partial");
    write_file(checkpoint_writing_path(d, 12) + ".tmp", "");
    writing(13, other);
    write_file(d + "/state_00000013_00000.bin.tmp", "theirs");
    const std::vector<std::string> keep = {"main.log.tmp", "notes.tmp", "model_00000010.bin", "model_00000014.tmp"};
    for (const auto& k : keep) write_file(d + "/" + k, "keep");
    CHECK(checkpoint_unfinished_run_id(d).empty(), "WRITING markers of two runs: no run to continue");
    std::string err = error_of([&] { checkpoint_remove_unfinished(d, own, folder); });
    bool kept = true;
    for (const auto& k : keep) kept = kept && read_file(d + "/" + k) == "keep";
    CHECK(err == NO_ERROR && !exists(d + "/model_00000010.tmp") && !exists(d + "/state_00000010_00000.bin.tmp") &&
              !exists(checkpoint_writing_path(d, 10)) && !exists(d + "/state_00000011_00000.bin") &&
              !exists(checkpoint_writing_path(d, 11) + ".tmp") && exists(checkpoint_writing_path(d, 12) + ".tmp") &&
              read_file(d + "/state_00000013_00000.bin.tmp") == "theirs" && exists(checkpoint_writing_path(d, 13)) &&
              kept,
          "remove_unfinished: the run's interrupted steps 10 and 11 go; step 12's empty marker, another run's step 13, "
          "a model file of a folder family, other *.tmp stay %s",
          err.c_str());
    CHECK(checkpoint_unfinished_run_id(d) == other, "the one run whose WRITING is left: %s",
          checkpoint_unfinished_run_id(d).c_str());
    // a user's file in a folder the run's WRITING covers: an error naming it, nothing deleted
    writing(15, own);
    mkdir((d + "/model_00000015").c_str(), 0755);
    write_file(d + "/model_00000015/config.json", "partial");
    write_file(d + "/model_00000015/notes.txt", "mine");
    write_file(d + "/state_00000015_00000.bin", "partial");
    err = error_of([&] { checkpoint_remove_unfinished(d, own, folder); });
    CHECK(contains(err, "model_00000015/notes.txt is not a file this run wrote") && one_line(err) &&
              exists(d + "/state_00000015_00000.bin") && exists(checkpoint_writing_path(d, 15)),
          "remove_unfinished meets a user's file in the folder: %s", err.c_str());
    // clear_step: the empty marker of 12 goes, the step is marked; a user's file or folder where
    // the run writes is an error naming it
    err = error_of([&] { checkpoint_clear_step(d, 12, own, folder); });
    CHECK(err == NO_ERROR && !exists(checkpoint_writing_path(d, 12) + ".tmp") &&
              read_file(checkpoint_writing_path(d, 12)) == "gpt-trainer checkpoint 1\nrun " + own + "\n",
          "clear_step: an empty WRITING temporary replaced by the run's WRITING %s", err.c_str());
    struct Case {
        int step;
        std::string name;
        bool dir;
    };
    for (const Case& c : std::vector<Case>{{14, "model_00000014.tmp", false},
                                           {16, "model_00000016", true},
                                           {17, "model_00000017", false},
                                           {13, "WRITING_00000013", false}}) {
        const std::string p = d + "/" + c.name;
        if (c.dir) mkdir(p.c_str(), 0755);
        write_file(c.dir ? p + "/notes.txt" : (c.step == 13 ? d + "/x" : p), "mine");
        err = error_of([&] { checkpoint_clear_step(d, c.step, own, folder); });
        CHECK(contains(err, p + " is not a file this run wrote") && one_line(err) && exists(p) &&
                  !exists(checkpoint_writing_path(d, c.step)) == (c.step != 13),
              "clear_step at step %d meets %s: %s", c.step, c.name.c_str(), err.c_str());
    }
    checkpoint_remove_unfinished(g_tmp + "/nope", own, folder);  // no crash on a missing folder
}

int main() {
    char tmpl[] = "/tmp/test_checkpoint.XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 2;
    }
    g_tmp = tmpl;
    // every path here is absolute except the bare-name case, which must land in g_tmp
    if (chdir(g_tmp.c_str()) != 0) {
        perror("chdir");
        return 2;
    }

    test_paths();
    test_round_trip();
    test_mismatch();
    test_damage();
    test_atomic();
    test_find_latest();
    test_prune();
    test_prune_proven();
    test_done_covers();
    test_done_covers_folder();
    test_done_and_verify();
    test_model_folder();
    test_lock();
    test_no_symlink_followed();
    test_llmc_state();
    test_unfinished();

    std::string cmd = "rm -rf '" + g_tmp + "'";
    if (system(cmd.c_str()) != 0) printf("note: could not remove %s\n", g_tmp.c_str());
    return test_summary("test_checkpoint");
}
