// The one error rule of this code base (header-only host C++).
//
// Code in llmc/ never prints an error and never exits: it throws llmc::Error,
// whose message is one line "WHERE: what is wrong" (WHERE: the file, pattern or
// flag at fault). Only a program's main prints it, as `error: <message>`, and
// exits non-zero; llmc::run_main is that main for the tools and test helpers.
// Outcomes a caller branches on (a file that is not a Markov shard, a failed
// try-allocation) are not errors: they stay return values, said so where they are.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

namespace llmc {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

// fail with a printf-style message (checked like printf's).
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void failf(const char* format, ...) {
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(nullptr, 0, format, args);
    va_end(args);
    std::string message(n > 0 ? n : 0, '\0');
    va_start(args, format);
    vsnprintf(&message[0], message.size() + 1, format, args);
    va_end(args);
    throw Error(message);
}

// text with every control byte as \xNN (and '"' and '\\' too where quoting):
// a name from a file printed inside a message cannot break the one-line rule.
inline std::string escape_for_error(const std::string& text, bool quoting = false) {
    std::string out;
    for (const char ch : text) {
        const unsigned char c = (unsigned char)ch;
        if (c < 0x20 || c == 0x7f || (quoting && (c == '"' || c == '\\'))) {
            char hex[8];
            snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        } else {
            out += ch;
        }
    }
    return out;
}

// A string from a file (a name, a value), quoted for an error message: control
// bytes, '"' and '\\' as \xNN, at most 200 bytes, so that a hostile string
// cannot break the one-line rule.
inline std::string quote_for_error(const std::string& text) {
    return "\"" + escape_for_error(text.substr(0, 200), true) + (text.size() > 200 ? "...\"" : "\"");
}

// run(argc, argv), with whatever it throws turned into one line on stderr and
// exit status 1 (EXIT_FAILURE), never an abort and a core.
inline int run_main(int (*run)(int, char**), int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of host memory\n");
    } catch (const std::exception& e) {  // one line, whatever a message took in unescaped
        fprintf(stderr, "error: %s\n", escape_for_error(e.what()).c_str());
    } catch (...) {
        fprintf(stderr, "error: an unknown exception\n");
    }
    return EXIT_FAILURE;
}

}  // namespace llmc
