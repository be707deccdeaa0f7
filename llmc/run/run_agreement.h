// llmc/run/run_agreement.h: the ranks of one job agree on what they run (header-only host C++).
//
// Ranks started with different flags (mpirun's MPMD form, a wrapper that sets
// them per rank), or reading different files under one path, would hang in a
// collective whose sizes differ or train on to the end with weights that differ
// from rank to rank. At start-up every rank lists what must be the same on
// every rank as named values (the flags, the data, the model); the ranks gather
// a hash of each and, where one differs, rank 0 names the first such value with
// its own and a differing rank's text in one error line. Every rank decides from
// the same gathered hashes, so all take the same branch. One rank compares nothing.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llmc/formats/checkpoint.h"  // XXH64 (header-only)
#include "llmc/data/dataloader.h"
#include "llmc/run/distributed.h"
#include "llmc/error.h"
#include "llmc/step/params.h"
#include "llmc/formats/regular_file.h"

// A setting that every rank must hold alike: its name in the error ("-x", "the -i data") and its value's text.
using AgreedValue = std::pair<std::string, std::string>;

// The first value that some rank holds differently from rank 0: its index and
// that rank, from every rank's hashes (count per rank); false when all agree.
inline bool first_disagreement(const std::vector<uint64_t>& hashes, size_t count, size_t* item, int* rank) {
    const size_t ranks = hashes.size() / count;
    for (size_t i = 0; i < count; i++)
        for (size_t r = 1; r < ranks; r++)
            if (hashes[r * count + i] != hashes[i]) {
                *item = i;
                *rank = (int)r;
                return true;
            }
    return false;
}

// Every rank holds the same values (the same names in the same order on every
// rank), else the job is refused: rank 0 throws the one line naming the value,
// the other ranks wait for its exit to end the job (llmc/run/distributed.h:
// distributed_abort_at_exit), so the line is the job's only output.
inline void require_ranks_agree(const std::vector<AgreedValue>& values, const Distributed* d) {
    if (d->num_processes == 1) return;
    std::vector<uint64_t> mine;
    for (const AgreedValue& v : values) mine.push_back(XXH64(v.second.data(), v.second.size(), 0));
    const std::vector<uint64_t> all = host_all_gather(mine.data(), (int)mine.size(), d);
    size_t item = 0;
    int rank = 0;
    if (!first_disagreement(all, mine.size(), &item, &rank)) return;
    const std::vector<std::string> texts = host_all_gather_text(values[item].second, d);
    if (d->rank != 0) {
        host_barrier(d);  // rank 0 never comes: its exit ends the job
        llmc::fail("the ranks disagree; rank 0 says on what");  // (not reached)
    }
    llmc::fail("ranks disagree on " + values[item].first + ": rank 0 has " + texts[0] + ", rank " +
               std::to_string(rank) + " has " + texts[rank] +
               " (every rank of a job must be started with the same flags, model and data)");
}

// The identity of a data pattern's shards: how many, their bytes, and a hash of
// their names, sizes and headers (the token counts; a built-in corpus shard's
// seed). Each rank reads its own part of the data, but from the same shards.
inline std::string shards_identity(const char* pattern) {
    const std::vector<std::string> paths = dataloader_find_shards(pattern);
    XXH64_state_t h;
    XXH64_reset(&h, 0);
    uint64_t bytes = 0;
    for (const std::string& path : paths) {
        std::string why;
        const int fd = open_regular_file(path.c_str(), &why);
        if (fd < 0) llmc::fail(path + ": cannot open: " + why);
        struct stat st;
        char header[DATALOADER_HEADER_BYTES] = {};
        const bool ok = fstat(fd, &st) == 0 && pread(fd, header, sizeof header, 0) >= 0;
        close(fd);
        if (!ok) llmc::fail(path + ": cannot read: " + strerror(errno));
        const uint64_t size = (uint64_t)st.st_size;
        bytes += size;
        XXH64_update(&h, path.c_str(), path.size() + 1);
        XXH64_update(&h, &size, sizeof size);
        XXH64_update(&h, header, sizeof header);
    }
    char text[160];
    snprintf(text, sizeof text, "%zu shard%s of %llu bytes (names, sizes and headers: xxh64 %016llx)", paths.size(),
             paths.size() == 1 ? "" : "s", (unsigned long long)bytes, (unsigned long long)XXH64_digest(&h));
    return text;
}

// A hash of the weights this rank starts from: the floatX weights (ZeRO-3:
// gathered layer by layer, every rank calls it), and the fp32 master weights
// where this rank holds them all (ZeRO-0; under ZeRO-1 each rank owns its
// share alone). Read in slices, so the host holds little.
inline std::string weights_identity(Parameters* p) {
    XXH64_state_t h;
    XXH64_reset(&h, 0);
    std::vector<char> slice((size_t)64 << 20);
    cudaCheck(cudaDeviceSynchronize());  // the weights the load or the init wrote
    auto hash_device = [&](const void* device, size_t bytes) {
        for (size_t at = 0; at < bytes; at += slice.size()) {
            const size_t n = std::min(slice.size(), bytes - at);
            cudaCheck(cudaMemcpy(slice.data(), (const char*)device + at, n, cudaMemcpyDeviceToHost));
            XXH64_update(&h, slice.data(), n);
        }
    };
    visit_weights(p, [&](const GradientSlice& s, const floatX* w) { hash_device(w, s.size * sizeof(floatX)); });
    if (p->zero_stage == 0) hash_device(p->master_weights, p->num_parameters * sizeof(float));
    char text[64];
    snprintf(text, sizeof text, "xxh64 %016llx", (unsigned long long)XXH64_digest(&h));
    return text;
}
