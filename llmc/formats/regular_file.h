// Opening files: only regular files. A FIFO, a socket or a device in place of a file
// would make a plain open() or read() block forever (a FIFO's open waits for the other
// side), so every file is opened with O_NONBLOCK, checked with fstat, and only then read
// or written normally. Files written are, besides, never reached through a symbolic link
// (O_NOFOLLOW): the link's target is someone else's. Header-only, no CUDA.
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
constexpr const char* SYMBOLIC_LINK_NOT_FOLLOWED = "a symbolic link, not followed";

// fd (opened with O_NONBLOCK) if it is a regular file, made blocking again; else closed,
// -1 and *why.
inline int keep_if_regular_file_(int fd, std::string* why) {
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

// A read-only fd of path if it is a regular file, else -1 and *why (NOT_A_REGULAR_FILE or
// the system's reason).
inline int open_regular_file(const char* path, std::string* why) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    return keep_if_regular_file_(fd, why);
}

// Why an open of path for writing failed (errno e): a FIFO without a reader (ENXIO) or any
// other non-regular file is NOT_A_REGULAR_FILE, a link SYMBOLIC_LINK_NOT_FOLLOWED.
inline std::string write_open_failure_(const char* path, int e) {
    struct stat st;
    if (lstat(path, &st) != 0 || S_ISREG(st.st_mode)) return strerror(e);
    return S_ISLNK(st.st_mode) ? SYMBOLIC_LINK_NOT_FOLLOWED : NOT_A_REGULAR_FILE;
}

// A fd of path for writing, the file created (0644) where it is missing: access is O_WRONLY
// or O_RDWR, with O_APPEND, O_TRUNC or O_EXCL as the caller needs. Only a regular file is
// opened, never through a symbolic link, and nothing waits: else -1 and *why
// (NOT_A_REGULAR_FILE, SYMBOLIC_LINK_NOT_FOLLOWED or the system's reason). O_TRUNC is
// applied once the file is known to be regular.
inline int open_regular_file_for_writing(const char* path, int flags, std::string* why) {
    const int fd = open(path, (flags & ~O_TRUNC) | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int e = errno;  // (kept for the caller: O_EXCL's EEXIST)
        *why = write_open_failure_(path, e);
        errno = e;
        return -1;
    }
    if (keep_if_regular_file_(fd, why) < 0) return -1;
    if ((flags & O_TRUNC) && ftruncate(fd, 0) != 0) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    return fd;
}

// The same as a FILE* for binary writing; null and *why on failure.
inline FILE* fopen_regular_file_for_writing(const char* path, int flags, std::string* why) {
    const int fd = open_regular_file_for_writing(path, flags, why);
    if (fd < 0) return nullptr;
    FILE* f = fdopen(fd, "wb");
    if (!f) {
        *why = strerror(errno);
        close(fd);
    }
    return f;
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
