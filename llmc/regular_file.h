// Opening input files for reading: only regular files. A FIFO, a socket or a device
// in place of an input would make a plain open() or read() block forever (a FIFO's
// open waits for a writer), so the file is opened with O_NONBLOCK, checked with
// fstat, and only then read normally. Header-only, no CUDA.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

constexpr const char* NOT_A_REGULAR_FILE = "not a regular file";

// A read-only fd of path if it is a regular file, else -1 and *why (NOT_A_REGULAR_FILE or
// the system's reason).
inline int open_regular_file(const char* path, std::string* why) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    struct stat st;
    const bool stated = fstat(fd, &st) == 0;
    if (!stated || !S_ISREG(st.st_mode)) {
        *why = stated ? NOT_A_REGULAR_FILE : strerror(errno);
        close(fd);
        return -1;
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    return fd;
}

// The same as a FILE* for binary reading; null and *why on failure.
inline FILE* fopen_regular_file(const char* path, std::string* why) {
    int fd = open_regular_file(path, why);
    if (fd < 0) return nullptr;
    FILE* f = fdopen(fd, "rb");
    if (!f) {
        *why = strerror(errno);
        close(fd);
    }
    return f;
}

// The whole of a regular file of at most max_bytes into *text; false and *why otherwise.
inline bool read_regular_file(const char* path, std::string* text, size_t max_bytes, std::string* why) {
    int fd = open_regular_file(path, why);
    if (fd < 0) return false;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size > max_bytes) {
        *why = "larger than " + std::to_string(max_bytes) + " bytes";
        close(fd);
        return false;
    }
    text->assign((size_t)st.st_size, '\0');
    size_t done = 0;
    while (done < text->size()) {
        const ssize_t got = read(fd, &(*text)[done], text->size() - done);
        if (got <= 0) {
            *why = got < 0 ? strerror(errno) : "shorter than its size";
            close(fd);
            return false;
        }
        done += (size_t)got;
    }
    close(fd);
    return true;
}
