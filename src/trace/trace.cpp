#include "hpm/trace/trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "hpm/trace/svg.h"

namespace hpm::trace {

namespace detail {
std::atomic<bool> on{false};
}

namespace {
std::mutex mu;
std::vector<Event> recorded;
std::map<std::thread::id, std::uint64_t> thread_ids;
std::map<std::uint64_t, std::string> thread_names;
std::chrono::steady_clock::time_point origin;

std::uint64_t thread_index_locked() {
  auto [it, fresh] = thread_ids.try_emplace(std::this_thread::get_id(), thread_ids.size());
  return it->second;
}
}  // namespace

void start() {
  std::lock_guard lock(mu);
  recorded.clear();
  thread_ids.clear();
  thread_names.clear();
  origin = std::chrono::steady_clock::now();
  detail::on = true;
}

void stop() { detail::on = false; }
bool enabled() { return detail::on.load(); }

void name_thread(const std::string& name) {
  std::lock_guard lock(mu);
  thread_names[thread_index_locked()] = name;
}

void detail::record(const char* name, const char* category,
                    std::chrono::steady_clock::time_point begin,
                    std::chrono::steady_clock::time_point end) {
  std::lock_guard lock(mu);
  const double s = std::chrono::duration<double, std::micro>(begin - origin).count();
  const double d = std::chrono::duration<double, std::micro>(end - begin).count();
  recorded.push_back({name, category, thread_index_locked(), s, d});
}

void record_span(const std::string& name, const std::string& category,
                 std::chrono::steady_clock::time_point begin,
                 std::chrono::steady_clock::time_point end) {
  if (!detail::on.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mu);
  const double s = std::chrono::duration<double, std::micro>(begin - origin).count();
  const double d = std::chrono::duration<double, std::micro>(end - begin).count();
  recorded.push_back({name, category, thread_index_locked(), s, d});
}

std::vector<Event> events() {
  std::lock_guard lock(mu);
  std::vector<Event> out = recorded;
  std::sort(out.begin(), out.end(),
            [](const Event& a, const Event& b) { return a.start_us < b.start_us; });
  return out;
}

std::string chrome_json(const std::vector<Event>& evs) {
  nlohmann::json list = nlohmann::json::array();
  std::map<std::uint64_t, std::string> names;
  {
    std::lock_guard lock(mu);
    names = thread_names;
  }
  for (const auto& [tid, name] : names) {
    list.push_back({{"ph", "M"},
                    {"name", "thread_name"},
                    {"pid", 1},
                    {"tid", tid},
                    {"args", {{"name", name}}}});
  }
  for (const auto& e : evs) {
    list.push_back({{"ph", "X"},
                    {"name", e.name},
                    {"cat", e.category},
                    {"pid", 1},
                    {"tid", e.thread},
                    {"ts", e.start_us},
                    {"dur", e.duration_us}});
  }
  return nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump();
}

std::string svg(const std::vector<Event>& evs, const std::string& title, double width_px) {
  std::map<std::uint64_t, std::string> names;
  {
    std::lock_guard lock(mu);
    names = thread_names;
  }
  std::vector<std::uint64_t> lanes;
  double end_us = 1;
  for (const auto& e : evs) {
    if (std::find(lanes.begin(), lanes.end(), e.thread) == lanes.end()) lanes.push_back(e.thread);
    end_us = std::max(end_us, e.start_us + e.duration_us);
  }
  std::sort(lanes.begin(), lanes.end());
  const double left = 150, lane_h = 28, top = 40;
  const double plot_w = width_px - left - 20;
  const double height = top + lane_h * static_cast<double>(lanes.size()) + 60;
  static const std::map<std::string, std::string> colours = {
      {"extract", "#4e79a7"}, {"transform", "#f28e2b"}, {"load", "#59a14f"},  {"train", "#e15759"},
      {"forward", "#76b7b2"}, {"backward", "#edc948"},  {"weight", "#b07aa1"}};
  std::vector<std::string> present;
  for (const auto& e : evs) {
    if (std::find(present.begin(), present.end(), e.category) == present.end())
      present.push_back(e.category);
  }
  SvgDocument doc(width_px, height, "font-family=\"sans-serif\" font-size=\"12\"");
  doc.text(10, 22, title, "font-size=\"15\"");
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const double y = top + lane_h * static_cast<double>(i);
    const auto it = names.find(lanes[i]);
    doc.text(10, y + 18, it != names.end() ? it->second : "thread " + std::to_string(lanes[i]));
    doc.line(left, y + lane_h - 2, left + plot_w, y + lane_h - 2, "stroke=\"#ddd\"");
  }
  const auto colour_of = [&](const std::string& category) {
    const auto c = colours.find(category);
    return "fill=\"" + (c != colours.end() ? c->second : std::string("#999")) + "\"";
  };
  for (const auto& e : evs) {
    const auto lane =
        static_cast<double>(std::find(lanes.begin(), lanes.end(), e.thread) - lanes.begin());
    const double x = left + plot_w * e.start_us / end_us;
    const double w = std::max(0.5, plot_w * e.duration_us / end_us);
    char ms[32];
    std::snprintf(ms, sizeof ms, " %.3f ms", e.duration_us / 1000.0);
    doc.rect_with_title(x, top + lane_h * lane + 3, w, lane_h - 8, colour_of(e.category),
                        e.name + ms);
    // Short names (a pipeline's "F3") fit inside their bar, as in the GPipe paper's figures.
    if (w >= 8.0 * static_cast<double>(e.name.size()) && e.name.size() <= 8) {
      doc.text(x + w / 2, top + lane_h * lane + 18, e.name,
               "text-anchor=\"middle\" font-size=\"11\"");
    }
  }
  const double axis_y = top + lane_h * static_cast<double>(lanes.size()) + 15;
  for (int k = 0; k <= 10; ++k) {
    char label[32];
    std::snprintf(label, sizeof label, "%.1f%s", end_us / 1000.0 * k / 10.0, k == 10 ? " ms" : "");
    doc.text(left + plot_w * k / 10.0, axis_y, label, "text-anchor=\"middle\"");
  }
  double lx = left;
  for (const std::string& cat : present) {
    doc.rect(lx, axis_y + 15, 12, 12, colour_of(cat));
    doc.text(lx + 16, axis_y + 26, cat);
    lx += 110;
  }
  return doc.finish();
}

}  // namespace hpm::trace
