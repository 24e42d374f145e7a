#include "hpm/trace/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace hpm::trace {
namespace {

TEST(Trace, RecordsSpansOnlyWhileEnabled) {
  { Span s("before", "load"); }
  start();
  name_thread("main");
  {
    Span outer("step", "train");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::thread([] {
    name_thread("worker");
    Span s("map", "transform");
  }).join();
  stop();
  { Span s("after", "load"); }
  const auto evs = events();
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs[0].name, "step");
  EXPECT_GE(evs[0].duration_us, 2000.0);
  EXPECT_NE(evs[0].thread, evs[1].thread);

  const auto j = nlohmann::json::parse(chrome_json(evs));
  int complete = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    complete += e["ph"] == "X";
    names += e["ph"] == "M";
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(names, 2);
  const std::string picture = svg(evs, "test");
  EXPECT_NE(picture.find("<svg"), std::string::npos);
  EXPECT_NE(picture.find(">worker<"), std::string::npos);
  EXPECT_NE(picture.find("step"), std::string::npos);
}

}  // namespace
}  // namespace hpm::trace
