// DESIGN.md's map of layers, checked: every `#include "hpm/<layer>/..."` in src/<X>/ and
// include/hpm/<X>/ must name X itself, io, trace, or a layer that X depends on (directly or
// through the layers it depends on) in the table of ../shared/DESIGN.md, with the rows of
// docs/layers.md (the layers this repository added since) over it. A new include across the map
// fails here until the code or the map changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Graph = std::map<std::string, std::set<std::string>>;

const fs::path kSource = HPM_SOURCE_DIR;

// The "| layer | owns | depends on |" table: layer folder -> the layer folders in its last column.
Graph read_design_table(const fs::path& design) {
  std::ifstream in(design);
  Graph g;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| layer |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|---", 0) == 0) continue;
    if (line.empty() || line[0] != '|') break;
    const auto first = line.find('|', 1), last = line.rfind('|', line.size() - 2);
    const std::string layer = std::regex_replace(line.substr(1, first - 1), std::regex("\\s"), "");
    std::string deps = line.substr(last + 1);
    deps = deps.substr(0, deps.find('|'));
    auto& out = g[layer];
    if (deps.find("everything") != std::string::npos) {
      out.insert("*");
      continue;
    }
    static const std::regex word("[a-z]+");
    for (auto it = std::sregex_iterator(deps.begin(), deps.end(), word);
         it != std::sregex_iterator(); ++it)
      out.insert(it->str());
  }
  return g;
}

// X itself, io, trace, and the layers reachable through the table from X.
std::set<std::string> allowed(const Graph& g, const std::string& layer) {
  std::set<std::string> seen = {layer, "io", "trace"};
  std::vector<std::string> todo = {layer};
  while (!todo.empty()) {
    const std::string at = todo.back();
    todo.pop_back();
    const auto it = g.find(at);
    if (it == g.end()) continue;
    for (const auto& d : it->second) {
      if (d == "*") {
        for (const auto& [name, _] : g) seen.insert(name);
        continue;
      }
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  return seen;
}

// The shared map with this repository's rows (docs/layers.md) over it.
Graph design_map(const fs::path& design) {
  Graph g = read_design_table(design);
  for (auto& [layer, deps] : read_design_table(kSource / "docs" / "layers.md")) g[layer] = deps;
  return g;
}

TEST(Layering, EveryIncludeIsAllowedByTheDesignMap) {
  const fs::path design = kSource / ".." / "shared" / "DESIGN.md";
  if (!fs::exists(design)) GTEST_SKIP() << "no " << design << " beside the repository";
  const Graph g = design_map(design);
  ASSERT_GE(g.size(), 10u) << "could not read the layer table of " << design;
  static const std::regex include("#include \"hpm/([a-z_]+)/");
  int files = 0;
  for (const fs::path& root : {kSource / "src", kSource / "include" / "hpm"}) {
    for (const auto& layer_dir : fs::directory_iterator(root)) {
      if (!layer_dir.is_directory()) continue;
      const std::string layer = layer_dir.path().filename().string();
      ASSERT_TRUE(g.count(layer)) << layer_dir.path() << " is no layer of DESIGN.md's table";
      const std::set<std::string> ok = allowed(g, layer);
      for (const auto& f : fs::recursive_directory_iterator(layer_dir.path())) {
        if (!f.is_regular_file()) continue;
        ++files;
        std::ifstream in(f.path());
        std::string line;
        for (int n = 1; std::getline(in, line); ++n) {
          std::smatch m;
          if (std::regex_search(line, m, include) && !ok.count(m[1].str())) {
            ADD_FAILURE() << f.path().lexically_relative(kSource).string() << ":" << n << ": layer "
                          << layer << " includes " << m[1] << ", which DESIGN.md does not let it";
          }
        }
      }
    }
  }
  EXPECT_GT(files, 100);
}

TEST(Layering, TheCheckCatchesAnIncludeAgainstTheMap) {
  // The check itself must be able to fail: tensor may use nothing but io and trace.
  const fs::path design = kSource / ".." / "shared" / "DESIGN.md";
  if (!fs::exists(design)) GTEST_SKIP() << "no " << design << " beside the repository";
  const Graph g = design_map(design);
  const auto tensor = allowed(g, "tensor");
  EXPECT_FALSE(tensor.count("autograd"));
  EXPECT_FALSE(tensor.count("nn"));
  const auto pipeline = allowed(g, "pipeline");
  EXPECT_TRUE(pipeline.count("autograd")) << "through nn";
  EXPECT_FALSE(pipeline.count("train")) << "the pipeline knows no Trainer";
  EXPECT_TRUE(allowed(g, "cli").count("distill"));
  EXPECT_TRUE(allowed(g, "config").count("nn")) << "through train";
  EXPECT_FALSE(allowed(g, "config").count("cli")) << "the config layer works without the CLI";
}

// The backend seam, checked: outside the tensor layer only the layers whose business is host
// bytes read a tensor's memory (data<T>(), raw_data()) or call the CPU backend's kernels by name:
// io (files), data (the input pipeline, on the host), comm (gloo's byte buffers). Everything
// else goes through the ops of hpm/tensor/kernels.h, so it runs on any device.
const std::set<std::string> kHostViewLayers = {"tensor", "io", "data", "comm"};

std::vector<std::string> host_views_outside(const fs::path& root) {
  static const std::regex view(R"((\.|->)data<|raw_data\(|"hpm/tensor/backend/cpu\.h")");
  std::vector<std::string> found;
  for (const auto& layer_dir : fs::directory_iterator(root)) {
    if (!layer_dir.is_directory()) continue;
    if (kHostViewLayers.count(layer_dir.path().filename().string())) continue;
    for (const auto& f : fs::recursive_directory_iterator(layer_dir.path())) {
      if (!f.is_regular_file()) continue;
      std::ifstream in(f.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (std::regex_search(line, view)) {
          found.push_back(f.path().lexically_relative(root).string() + ":" + std::to_string(n) +
                          ": " + line);
        }
      }
    }
  }
  return found;
}

TEST(BackendSeam, OnlyHostByteLayersReadTensorMemory) {
  int checked = 0;
  for (const fs::path& root : {kSource / "src", kSource / "include" / "hpm"}) {
    for (const std::string& hit : host_views_outside(root)) {
      ADD_FAILURE() << hit << "\n  (a host pointer above the tensor layer: use a kernels.h op, or "
                    << "to_vector()/to_bytes()/assign_bytes() where a value must reach the host)";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(BackendSeam, TheCheckCatchesAHostPointer) {
  const fs::path dir = fs::temp_directory_path() / ("hpm-seam-" + std::to_string(::getpid()));
  fs::create_directories(dir / "nn");
  std::ofstream(dir / "nn" / "bad.cpp") << "float* p = x.data<float>();\n";
  fs::create_directories(dir / "io");  // io may
  std::ofstream(dir / "io" / "ok.cpp") << "float* p = x.data<float>();\n";
  const auto found = host_views_outside(dir);
  fs::remove_all(dir);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find("nn/bad.cpp:1"), std::string::npos) << found[0];
}

}  // namespace
