#include "hpm/pipeline/partition.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include "hpm/autograd/deferred.h"
#include "hpm/autograd/grad_mode.h"

namespace hpm::pipeline {

namespace {
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// What a layer's cost depends on, as far as it can be told without running it: its type, its
// parameters' and buffers' names and shapes, its input's shape, and whether its input's gradient
// is computed. Layers that agree on it and produce the same output shape (a GPT's blocks, a
// ResNet's repeated units) are taken to cost the same.
std::string signature(nn::Module& layer, const Tensor& x, bool gradient_flows_back) {
  std::ostringstream s;
  s << layer.type_name() << ' ' << x.shape().str() << ' ' << static_cast<int>(x.dtype()) << ' '
    << gradient_flows_back;
  for (const auto& [name, t] : layer.state_dict())
    s << ' ' << name << t.shape().str() << static_cast<int>(t.dtype());
  return s.str();
}

}  // namespace

std::vector<LayerCost> profile_layers(const nn::Sequential& model, const Tensor& sample,
                                      int repeats) {
  // Before every tensor of this function: they are freed to it, so it must outlive them.
  Device scratch("profile");
  std::vector<LayerCost> out;
  Tensor x = sample;
  // A layer computes its input's gradient only when something before it learns: the first
  // layers with parameters skip it, in training as here, so their backward is cheaper.
  bool gradient_flows_back = false;
  // Measured layers by signature, with their output's shape. A layer equal to one of them is run
  // forward once, without a graph, for the next layer's input, and takes its cost: profiling a
  // 48-block GPT then measures one block, not 48, before training can start (and each process of
  // a pipeline profiles the whole model on its one core).
  std::map<std::string, std::pair<LayerCost, Shape>> measured;
  for (std::size_t i = 0; i < model.size(); ++i) {
    nn::Module& layer = *model[i];
    const std::string name = std::to_string(i) + ": " + layer.type_name();
    const std::string key = signature(layer, x, gradient_flows_back);
    if (const auto it = measured.find(key); it != measured.end()) {
      DeviceGuard on_scratch(scratch);
      NoGradGuard no_graph;
      Tensor y = layer.forward(x.to(scratch).detach());
      if (y.shape() == it->second.second) {
        out.push_back(it->second.first);
        out.back().name = name;
        if (!layer.parameters().empty()) gradient_flows_back = true;
        x = y;
        continue;
      }
    }
    LayerCost cost;
    cost.name = name;
    for (const auto& [n, t] : layer.state_dict()) cost.parameter_bytes += t.nbytes();
    std::vector<double> fwd, bwd, wgt;
    Tensor next;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      DeviceGuard on_scratch(scratch);
      Tensor in = x.to(scratch).detach();
      if (gradient_flows_back) in.set_requires_grad(true);
      const std::size_t before = scratch.stats().current_bytes;
      const Clock::time_point t0 = Clock::now();
      Tensor y = layer.forward(in);
      const Clock::time_point t1 = Clock::now();
      cost.activation_bytes = scratch.stats().current_bytes - before;
      Tensor g = Tensor::ones(y.shape());
      // Backward as B then W (zero-bubble schedules run them apart; the sum is the backward).
      autograd::DeferredWeightGradients deferred;
      const Clock::time_point t2 = Clock::now();
      if (y.requires_grad()) {
        autograd::DeferWeightGradients later(deferred);
        y.backward(g);
      }
      const Clock::time_point t3 = Clock::now();
      deferred.run();
      const Clock::time_point t4 = Clock::now();
      fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double>(t4 - t2).count());
      wgt.push_back(std::chrono::duration<double>(t4 - t3).count());
      next = y.detach();
    }
    layer.zero_grad();
    if (!layer.parameters().empty()) gradient_flows_back = true;
    cost.forward_s = median(fwd);
    cost.backward_s = median(bwd);
    cost.weight_s = median(wgt);
    out.push_back(cost);
    measured.emplace(key, std::make_pair(cost, next.shape()));
    x = next;
  }
  return out;
}

PartitionMethod partition_from_name(const std::string& name) {
  if (name == "uniform") return PartitionMethod::kUniform;
  if (name == "parameters") return PartitionMethod::kParameters;
  if (name == "balanced" || name == "time") return PartitionMethod::kBalanced;
  throw std::invalid_argument("unknown partition '" + name +
                              "' (choices: uniform, parameters, balanced)");
}

const char* partition_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::kUniform:
      return "uniform";
    case PartitionMethod::kParameters:
      return "parameters";
    case PartitionMethod::kBalanced:
      return "balanced";
  }
  return "?";
}

namespace {

// Contiguous blocks minimizing the largest block's weight (a linear-partition dynamic program),
// among those where every block satisfies `fits`.
template <typename Weight, typename Fits>
std::vector<int> min_max_blocks(int n, int parts, Weight weight, Fits fits) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[p][i]: the smallest possible max over the first i layers cut into p blocks.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(parts) + 1,
                                        std::vector<double>(static_cast<std::size_t>(n) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(best[0].size(), -1));
  best[0][0] = 0;
  for (int p = 1; p <= parts; ++p) {
    for (int i = p; i <= n; ++i) {
      for (int j = p - 1; j < i; ++j) {
        if (best[p - 1][j] == inf || !fits(j, i)) continue;
        const double v = std::max(best[p - 1][j], weight(j, i));
        if (v < best[p][i]) best[p][i] = v, from[p][i] = j;
      }
    }
  }
  if (best[parts][n] == inf) return {};
  std::vector<int> b(static_cast<std::size_t>(parts) + 1);
  b[parts] = n;
  for (int p = parts, i = n; p > 0; --p) i = b[p - 1] = from[p][i];
  return b;
}

}  // namespace

Partition partition(const std::vector<LayerCost>& layers, int parts, PartitionMethod method,
                    std::size_t memory_limit, int in_flight) {
  const int n = static_cast<int>(layers.size());
  if (parts < 1 || parts > n) {
    throw std::invalid_argument("cannot cut " + std::to_string(n) + " layers into " +
                                std::to_string(parts) + " pipeline chunks");
  }
  auto sum = [&](int j, int i, auto field) {
    double s = 0;
    for (int l = j; l < i; ++l) s += field(layers[static_cast<std::size_t>(l)]);
    return s;
  };
  auto time = [&](int j, int i) {
    return sum(j, i, [](const LayerCost& c) { return c.forward_s + c.backward_s; });
  };
  auto memory = [&](int j, int i) {
    return sum(j, i, [&](const LayerCost& c) {
      return 2.0 * static_cast<double>(c.parameter_bytes) +
             static_cast<double>(c.activation_bytes) * in_flight;
    });
  };
  Partition p;
  switch (method) {
    case PartitionMethod::kUniform:
      for (int k = 0; k <= parts; ++k) p.boundaries.push_back(k * n / parts);
      break;
    case PartitionMethod::kParameters:
      p.boundaries = min_max_blocks(
          n, parts,
          [&](int j, int i) {
            return sum(j, i, [](const LayerCost& c) { return double(c.parameter_bytes); });
          },
          [](int, int) { return true; });
      break;
    case PartitionMethod::kBalanced: {
      auto fits = [&](int j, int i) {
        return memory_limit == 0 || memory(j, i) <= static_cast<double>(memory_limit);
      };
      p.boundaries = min_max_blocks(n, parts, time, fits);
      if (p.boundaries.empty()) {
        // The cut that needs the least memory tells the user what limit would do.
        const std::vector<int> b = min_max_blocks(n, parts, memory, [](int, int) { return true; });
        double need = 0;
        for (int k = 0; k < parts; ++k) need = std::max(need, memory(b[k], b[k + 1]));
        throw std::invalid_argument("no cut of " + std::to_string(n) + " layers into " +
                                    std::to_string(parts) + " chunks fits a memory limit of " +
                                    mib(memory_limit) + " MiB per stage; the best needs " +
                                    mib(static_cast<std::size_t>(need)) + " MiB");
      }
      break;
    }
  }
  double total = 0, slowest = 0;
  for (int k = 0; k < parts; ++k) {
    const int j = p.boundaries[k], i = p.boundaries[k + 1];
    p.time_s.push_back(time(j, i));
    std::size_t params = 0, acts = 0;
    for (int l = j; l < i; ++l) {
      params += layers[static_cast<std::size_t>(l)].parameter_bytes;
      acts += layers[static_cast<std::size_t>(l)].activation_bytes;
    }
    p.parameter_bytes.push_back(params);
    p.activation_bytes.push_back(acts);
    total += p.time_s.back();
    slowest = std::max(slowest, p.time_s.back());
  }
  p.imbalance = total > 0 ? slowest / (total / parts) : 1.0;
  return p;
}

std::vector<ChunkCost> chunk_costs(const std::vector<LayerCost>& layers,
                                   const std::vector<int>& boundaries) {
  std::vector<ChunkCost> out;
  for (std::size_t k = 0; k + 1 < boundaries.size(); ++k) {
    ChunkCost c;
    for (int l = boundaries[k]; l < boundaries[k + 1]; ++l) {
      const LayerCost& layer = layers[static_cast<std::size_t>(l)];
      c.forward_s += layer.forward_s;
      c.backward_s += layer.backward_s;
      c.weight_s += layer.weight_s;
      c.activation_bytes += layer.activation_bytes;
      c.resident_bytes += 2 * layer.parameter_bytes;
    }
    out.push_back(c);
  }
  return out;
}

std::string describe(const Partition& p, const std::vector<LayerCost>& layers) {
  std::ostringstream os;
  double total = 0;
  for (double t : p.time_s) total += t;
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %-9s %10s %7s %12s %14s\n", "chunk", "layers", "F+B ms",
                "share", "params MiB", "activ. MiB/mb");
  os << line;
  for (std::size_t k = 0; k + 1 < p.boundaries.size(); ++k) {
    const std::string range =
        std::to_string(p.boundaries[k]) + "-" + std::to_string(p.boundaries[k + 1] - 1);
    std::snprintf(line, sizeof line, "%-6zu %-9s %10.3f %6.1f%% %12s %14s\n", k, range.c_str(),
                  p.time_s[k] * 1e3, total > 0 ? 100.0 * p.time_s[k] / total : 0.0,
                  mib(p.parameter_bytes[k]).c_str(), mib(p.activation_bytes[k]).c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "imbalance (slowest / mean): %.3f over %zu layers\n",
                p.imbalance, layers.size());
  os << line;
  return os.str();
}

}  // namespace hpm::pipeline
