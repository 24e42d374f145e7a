// What one parameter-server task sustains: the median time of a pull and a push of one variable
// of each size, through a server on loopback in this process (`hpm ps bench`).
#pragma once
#include <cstdint>
#include <vector>

namespace hpm::distribute::ps {

struct PushPullTiming {
  std::int64_t bytes = 0;
  double pull_s_median = 0, push_s_median = 0;
  int repeats = 0;
};

// `repeats` timed pulls and pushes per size (after one untimed warm-up of each).
std::vector<PushPullTiming> time_push_pull(const std::vector<std::int64_t>& sizes, int repeats);

}  // namespace hpm::distribute::ps
