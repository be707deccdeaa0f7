// flags.h: a program's command-line flags from one table (header-only host C++).
//
// Each row names the flag, the field of the program's options struct it sets
// (the field's type picks the parser), its metavar, its accepted range, its
// default and its help text; parsing, the defaults and --help all read it.
// Every value is the whole argument: no blanks, nothing trailing, not empty,
// inside the range (an int or long must fit without wrapping, a float must not
// overflow or underflow to a denormal), else llmc::Error naming the flag and
// what it accepts. A metavar of "<int|auto>" also takes "auto", stored as 0.
//
// An enumerated flag declares its choices in its row, and the metavar that
// --help prints (which docs/usage.md's flag table and dev/fuzz_cli.py read) is made
// from them: a row with `choices` (names, null-terminated, in the order of the
// enum its int field holds) takes one of the names and stores its index, as
// "<cosine|linear|...>"; an int row with a null metavar takes min..max, as
// "<0|1|2>".
#pragma once

#include <cctype>
#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include "llmc/error.h"

template <class Options>
struct Flag {
    using Field = std::variant<int Options::*, long Options::*, float Options::*, const char * Options::*>;
    const char* name;
    Field field;
    const char* metavar;  // "<int>", "<glob>", ...
    double min, max;      // the accepted range (inclusive)
    const char* default_value;  // null leaves a text field unset
    const char* help;
    const char* section;  // a heading printed before the first flag of each section
    const char* const* choices = nullptr;  // an enumerated flag's names, null-terminated
    const char* choice_noun = nullptr;     // what a choice is, for the error: "schedule"
};
constexpr double FLAG_INT_TOP = INT_MAX, FLAG_LONG_TOP = (double)LONG_MAX, FLAG_FLOAT_TOP = FLT_MAX;

template <class O>
[[noreturn]] void flag_bad_value(const Flag<O>& f, const char* text, const char* what) {
    llmc::failf("%s %s: expected %s", f.name, *text ? text : "\"\"", what);
}

template <class O>
long flag_parse_integer(const Flag<O>& f, const char* text) {
    char range[96];
    snprintf(range, sizeof range, "an integer from %.0f to %.0f", f.min, f.max);
    char* end = nullptr;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (!*text || isspace((unsigned char)*text) || *end || errno == ERANGE || v < f.min || v > f.max)
        flag_bad_value(f, text, range);
    return v;
}

template <class O>
float flag_parse_real(const Flag<O>& f, const char* text) {
    char range[96];
    snprintf(range, sizeof range, "a float from %g to %g (0 or at least %g in size)", f.min, f.max, FLT_MIN);
    char* end = nullptr;
    errno = 0;
    const float v = strtof(text, &end);
    // ERANGE: overflow, or an underflow to 0 or a denormal
    if (!*text || isspace((unsigned char)*text) || *end || errno == ERANGE || !std::isfinite(v) || v < f.min ||
        v > f.max)
        flag_bad_value(f, text, range);
    return v;
}

// "a, b or c" of a choice flag's names.
inline std::string flag_choice_list(const char* const* choices) {
    std::string list;
    for (int i = 0; choices[i]; i++) list += std::string(i == 0 ? "" : choices[i + 1] ? ", " : " or ") + choices[i];
    return list;
}

template <class O>
int flag_parse_choice(const Flag<O>& f, const char* text) {
    for (int i = 0; f.choices[i]; i++)
        if (strcmp(text, f.choices[i]) == 0) return i;
    llmc::failf("%s %s: %s (unknown %s)", f.name, *text ? text : "\"\"", flag_choice_list(f.choices).c_str(),
                f.choice_noun);
}

// The value form --help prints: the row's metavar, or one made from its choices or its int range.
template <class O>
std::string flag_metavar(const Flag<O>& f) {
    if (f.metavar) return f.metavar;
    std::string form = "<";
    if (f.choices)
        for (int i = 0; f.choices[i]; i++) form += std::string(i ? "|" : "") + f.choices[i];
    else if (f.max - f.min <= 8)
        for (long v = (long)f.min; v <= (long)f.max; v++) form += (v > (long)f.min ? "|" : "") + std::to_string(v);
    else form += "int";
    return form + ">";
}

template <class O>
void flag_set(O* o, const Flag<O>& f, const char* text) {
    std::visit(
        [&](auto field) {
            using T = std::remove_reference_t<decltype(o->*field)>;
            if constexpr (std::is_same_v<T, int>) {
                if (f.choices) {
                    o->*field = flag_parse_choice(f, text);
                    return;
                }
            }
            if constexpr (std::is_same_v<T, const char*>) {
                if (!*text) flag_bad_value(f, text, "a non-empty value");
                o->*field = text;
            } else if constexpr (std::is_same_v<T, float>) {
                o->*field = flag_parse_real(f, text);
            } else if (f.metavar && strcmp(f.metavar, "<int|auto>") == 0 && strcmp(text, "auto") == 0) {
                o->*field = 0;
            } else {
                o->*field = (T)flag_parse_integer(f, text);
            }
        },
        f.field);
}

// The table's defaults, then "-flag value" pairs from argv, each flag at most
// once; *given collects the flags on the command line. Returns false for
// --help (nothing else is parsed then).
template <class O, class Flags>  // Flags: an array or vector of Flag<O>
bool flags_parse(const Flags& flags, int argc, char** argv, O* o, std::set<std::string>* given) {
    for (const Flag<O>& f : flags)
        if (f.default_value) flag_set(o, f, f.default_value);
    for (int i = 1; i < argc; i += 2) {
        const char* name = argv[i];
        if (strcmp(name, "--help") == 0) return false;
        const Flag<O>* f = nullptr;
        for (const Flag<O>& x : flags)
            if (strcmp(x.name, name) == 0) f = &x;
        if (!f) llmc::failf("unknown flag %s (see --help)", name);
        // a second value would silently replace the first: which one was meant is unknown
        if (!given->insert(name).second) llmc::failf("flag %s given twice (give each flag once)", name);
        if (i + 1 >= argc) llmc::failf("flag %s needs a value (see --help)", name);
        flag_set(o, *f, argv[i + 1]);
    }
    return true;
}

// A flag's value as parsed, in one canonical text: a choice's name, an int or
// long in decimal, a float in the fewest digits that read back as it, a text
// quoted (llmc::quote_for_error) or "(not given)". So "-x 4" and "-x 04" read
// alike; the ranks of a job compare these (llmc/run/run_agreement.h).
template <class O>
std::string flag_value_text(const Flag<O>& f, const O& o) {
    return std::visit(
        [&](auto field) -> std::string {
            using T = std::remove_cv_t<std::remove_reference_t<decltype(o.*field)>>;
            if constexpr (std::is_same_v<T, const char*>) {
                return o.*field ? llmc::quote_for_error(o.*field) : "(not given)";
            } else if constexpr (std::is_same_v<T, float>) {
                char text[32];  // the fewest digits that read back as the same float (9 always do)
                for (int digits = 1; digits <= 9; digits++) {
                    snprintf(text, sizeof text, "%.*g", digits, (double)(o.*field));
                    if (strtof(text, nullptr) == o.*field) break;
                }
                return text;
            } else {
                if constexpr (std::is_same_v<T, int>)
                    if (f.choices) return f.choices[o.*field];
                return std::to_string(o.*field);
            }
        },
        f.field);
}

// One line per flag (and the section headings): "  -x <int>   help (default d)";
// a help text's continuation lines line up under its first line.
template <class Flags>
void flags_print_help(const Flags& flags) {
    int width = 25;  // the column the help texts start at, past the longest "  -x <form>"
    for (const auto& f : flags) width = std::max(width, (int)(strlen(f.name) + flag_metavar(f).size() + 3));
    for (const auto& f : flags) {
        if (f.section) printf("%s\n", f.section);
        std::string head = std::string("  ") + f.name + " " + flag_metavar(f), help = f.help;
        if (f.default_value) help += std::string(" (default ") + f.default_value + ")";
        for (size_t nl; (nl = help.find('\n')) != std::string::npos;) {
            printf("%-*s %s\n", width, head.c_str(), help.substr(0, nl).c_str());
            head.clear();
            help.erase(0, nl + 1);
        }
        printf("%-*s %s\n", width, head.c_str(), help.c_str());
    }
    printf("%-*s %s\n", width, "  --help", "this text");
}

namespace llmc {

// A model descriptor's "KEY=VALUE,KEY=VALUE" as its pairs, into *kv; "" when it is one, else why
// not (an item without '=', an empty item: a trailing or doubled comma; a key given twice). Both
// trainers' -e descriptors read through it, so they take and refuse the same forms.
inline std::string parse_key_values(const std::string& text, std::map<std::string, std::string>* kv) {
    kv->clear();
    for (size_t at = 0; at <= text.size();) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string item = text.substr(at, comma - at);
        const size_t eq = item.find('=');
        if (eq == std::string::npos) return quote_for_error(item) + " is not KEY=VALUE";
        const std::string key = item.substr(0, eq);
        if (!kv->emplace(key, item.substr(eq + 1)).second) return key + " is given twice";
        at = comma + 1;
    }
    return "";
}

}  // namespace llmc
