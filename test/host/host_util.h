// What the host (data tool) tests share: small file helpers, the message of the
// llmc::Error a call throws, and running a command to check its exit status and
// its one-line error (inline, so a test takes only what it uses without warnings).
#pragma once
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "llmc/error.h"

static inline std::string g_tmp;  // the test's temporary folder (set by main)

static inline bool exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}
static inline std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
static inline void write_file(const std::string& p, const std::string& data) {
    std::ofstream f(p, std::ios::binary);
    f.write(data.data(), (std::streamsize)data.size());
}

struct Run {
    int code;         // exit status, or 128 + signal
    std::string err;  // stderr
    std::string out;  // stdout
};
static inline Run run_cmd(const std::string& cmd) {
    const std::string o = g_tmp + "/cmd.out", e = g_tmp + "/cmd.err";
    const int st = system((cmd + " >" + o + " 2>" + e).c_str());
    Run r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    r.out = read_file(o);
    r.err = read_file(e);
    return r;
}
static inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
// exit 1 with exactly one line "error: ..." that contains every needle
static inline bool is_clean_error(const Run& r, std::initializer_list<const char*> needles) {
    if (r.code != 1 || r.err.rfind("error: ", 0) != 0) return false;
    if (std::count(r.err.begin(), r.err.end(), '\n') != 1) return false;
    for (const char* n : needles)
        if (r.err.find(n) == std::string::npos) return false;
    return true;
}

// The message of the llmc::Error that f() throws; "NO ERROR" when it returns, and
// another exception is named as such (no needle of a test matches these).
template <class F>
static inline std::string error_of(F&& f) {
    try {
        f();
    } catch (const llmc::Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string("UNEXPECTED EXCEPTION TYPE: ") + e.what();
    }
    return "NO ERROR";
}
// one line that contains every needle
static inline bool contains_all(const std::string& message, std::initializer_list<std::string> needles) {
    for (const auto& n : needles)
        if (message.find(n) == std::string::npos) return false;
    return message.find('\n') == std::string::npos;
}
