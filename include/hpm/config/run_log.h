// How a library entry point that runs a whole job (a distillation, a parameter-server role) tells
// what it does as it goes: one line at a time, without its newline. The command line prints them;
// a program may collect them, or pass none and hear nothing.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

namespace hpm::config {

using RunLog = std::function<void(const std::string& line)>;

// Each line on stdout, flushed (a launcher relays a worker's output as it comes).
inline RunLog stdout_log() {
  return [](const std::string& line) {
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  };
}

// printf-style formatting of a log line, checked by the compiler as printf's.
[[gnu::format(printf, 1, 2)]] std::string format_line(const char* format, ...);

}  // namespace hpm::config
