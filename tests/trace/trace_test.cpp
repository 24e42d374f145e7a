#include "hpm/trace/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "hpm/trace/svg.h"

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

// Names come from configs and code (a config's path in the title, a span named "a<b"): the
// timeline stays well-formed XML, every text escaped, as hpm plot's curves are by the same writer.
TEST(Trace, TheTimelineEscapesItsTexts) {
  const std::vector<Event> evs = {{"x<y & z", "train", 1, 0.0, 50.0}};
  const std::string picture = svg(evs, "hpm train \"a&b.toml\" <one_device>");
  EXPECT_NE(picture.find("hpm train &quot;a&amp;b.toml&quot; &lt;one_device&gt;"),
            std::string::npos)
      << picture;
  EXPECT_NE(picture.find("<title>x&lt;y &amp; z 0.050 ms</title>"), std::string::npos) << picture;
  EXPECT_EQ(picture.find("x<y"), std::string::npos);
}

TEST(Svg, NumbersHaveTwoDecimalsAndTextsAreEscaped) {
  SvgDocument doc(100, 50);
  doc.text(1.234, 5, "1 < 2", "font-size=\"9\"");
  doc.poly("polyline", {{0, 1}, {2.5, 3}}, "class=\"mean\"");
  const std::string out = doc.finish(true);
  EXPECT_EQ(out.rfind("<?xml", 0), 0u);
  EXPECT_NE(out.find("<text x=\"1.23\" y=\"5.00\" font-size=\"9\">1 &lt; 2</text>"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("points=\"0.00,1.00 2.50,3.00 \""), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 7), "</svg>\n");
}

}  // namespace
}  // namespace hpm::trace
