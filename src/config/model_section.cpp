// [model]: a stack of layers (layers = [...]), or a model of the library by kind: "gpt"
// (nn::GPT, torch_gpt.py's model) or "resnet" (nn::ResNet of BasicBlocks).
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "config/reader.h"
#include "config/sections.h"
#include "hpm/io/safetensors.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/resnet.h"

namespace hpm::config::detail {

namespace {

// Which keys each layer type takes.
const std::map<std::string, std::set<std::string>>& layer_keys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"flatten", {}},
      {"relu", {}},
      {"tanh", {}},
      {"sigmoid", {}},
      {"global_avgpool", {}},
      {"gelu", {"approximate"}},
      {"linear", {"in", "out", "bias"}},
      {"conv2d", {"in", "out", "kernel", "stride", "padding", "bias"}},
      {"maxpool2d", {"kernel", "stride", "padding"}},
      {"avgpool2d", {"kernel", "stride", "padding", "count_include_pad"}},
      {"dropout", {"p"}},
      {"batchnorm1d", {"features", "eps", "momentum"}},
      {"batchnorm2d", {"features", "eps", "momentum"}},
      {"layernorm", {"shape", "eps"}},
      {"embedding", {"num", "dim"}},
  };
  return keys;
}

LayerSpec parse_layer(const std::string& path, const toml::node& node) {
  const std::string at = where(path, node);
  if (!node.is_table()) throw ConfigError(at + ": each entry of [model] layers must be a table");
  const toml::table& t = *node.as_table();
  LayerSpec spec;
  spec.where = at;
  auto type = t["type"].value<std::string>();
  if (!type) throw ConfigError(at + ": layer has no string 'type'");
  spec.type = *type;
  auto it = layer_keys().find(spec.type);
  if (it == layer_keys().end()) {
    std::ostringstream known;
    for (const auto& [k, v] : layer_keys()) known << (known.tellp() > 0 ? ", " : "") << k;
    throw ConfigError(where(path, t["type"].node()->source()) + ": unknown layer type '" +
                      spec.type + "' (known: " + known.str() + ")");
  }
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (key == "type") continue;
    const std::string vat = where(path, v);
    if (!it->second.count(key)) {
      const std::string kat = where(path, k.source());
      std::ostringstream known;
      for (const auto& kk : it->second) known << (known.tellp() > 0 ? ", " : "") << kk;
      throw ConfigError(kat + ": unknown key '" + key + "' for layer " + spec.type +
                        " (known keys: " + (known.str().empty() ? "none" : known.str()) + ")");
    }
    if (key == "shape") {
      if (auto n = v.value_exact<std::int64_t>()) {
        spec.shape = {*n};
      } else if (const toml::array* arr = v.as_array()) {
        for (const auto& e : *arr) {
          auto d = e.value_exact<std::int64_t>();
          if (!d) throw ConfigError(vat + ": layernorm shape must be integers");
          spec.shape.push_back(*d);
        }
      } else {
        throw ConfigError(vat + ": layernorm shape must be an integer or an array of integers");
      }
    } else if (v.is_boolean()) {
      spec.flags.emplace_back(key, *v.value<bool>());
    } else if (v.is_string()) {
      spec.strings.emplace_back(key, *v.value<std::string>());
    } else if (v.is_number()) {
      spec.numbers.emplace_back(key, *v.value<double>());
    } else {
      throw ConfigError(vat + ": layer key '" + key + "' has an unsupported type");
    }
  }
  return spec;
}

void read_gpt(TableReader& r, nn::GPTConfig& g) {
  r.get_positive("n_layer", g.n_layer);
  r.get_positive("n_head", g.n_head);
  r.get_positive("n_embd", g.n_embd);
  r.get_positive("block_size", g.block_size);
  r.get_positive("vocab_size", g.vocab_size);
  r.get("dropout", g.dropout);
  r.get("bias", g.bias);
  r.get("tie_weights", g.tie_weights);
  if (!(g.dropout >= 0.0f && g.dropout < 1.0f))
    r.out_of_range(*r.find("dropout"), "dropout", "in [0, 1)");
  if (g.n_embd % g.n_head != 0) {
    r.invalid("n_embd", "must be a multiple of n_head (" + std::to_string(g.n_head) + "), got " +
                            std::to_string(g.n_embd));
  }
}

void read_resnet(TableReader& r, nn::ResNetConfig& n) {
  r.get_positive("in_channels", n.in_channels);
  r.get_positive("num_classes", n.num_classes);
  r.get_integers("widths", n.widths);
  r.get_integers("blocks", n.blocks);
  if (n.widths.empty() || n.widths.size() != n.blocks.size()) {
    r.invalid("blocks", "must name as many stages as widths (" + std::to_string(n.widths.size()) +
                            "), got " + std::to_string(n.blocks.size()));
  }
  for (std::size_t i = 0; i < n.widths.size(); ++i) {
    if (n.widths[i] <= 0) r.out_of_range(*r.find("widths"), "widths", "positive integers");
    if (n.blocks[i] <= 0) r.out_of_range(*r.find("blocks"), "blocks", "positive integers");
  }
}

}  // namespace

void read_model(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table* model = section(path, s.root, "model");
  if (!model) {
    throw ConfigError(path +
                      ": missing [model] section (a 'layers' array, or kind = \"gpt\" or "
                      "\"resnet\")");
  }
  TableReader r(path, "[model]", model);
  c.model_kind = model->get("layers") ? "layers" : c.model_kind;
  r.get("kind", c.model_kind);
  if (c.model_kind == "layers") {
    const toml::node* layers = model->get("layers");
    if (!layers || !layers->is_array() || layers->as_array()->empty()) {
      throw ConfigError(where(path, *model) + ": [model] needs a non-empty 'layers' array");
    }
    for (const auto& l : *layers->as_array()) c.layers.push_back(parse_layer(path, l));
    r.allow("layers");  // checked above
  } else if (c.model_kind == "gpt") {
    read_gpt(r, c.gpt);
  } else if (c.model_kind == "resnet") {
    read_resnet(r, c.resnet);
  } else {
    r.invalid("kind", "must be \"layers\", \"gpt\" or \"resnet\", got \"" + c.model_kind + "\"");
  }
  r.get("init_from", c.init_from);
  r.get("init_strict", c.init_strict);
  if (!c.init_from.empty() && !std::filesystem::is_regular_file(c.init_from)) {
    r.invalid("init_from", std::filesystem::is_directory(c.init_from)
                               ? c.init_from + " is a directory, not a .safetensors file"
                               : "no such file: " + c.init_from);
  }
  r.finish();
}

}  // namespace hpm::config::detail

namespace hpm::config {

namespace {
class LayerArgs {
 public:
  explicit LayerArgs(const LayerSpec& s) : s_(s) {}
  double number(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    for (const auto& [k, v] : s_.numbers)
      if (k == key) return v;
    if (fallback) return *fallback;
    throw ConfigError(s_.where + ": layer " + s_.type + " needs '" + key + "'");
  }
  std::int64_t integer(const std::string& key,
                       std::optional<std::int64_t> fallback = std::nullopt) const {
    const double v = number(
        key, fallback ? std::optional<double>(static_cast<double>(*fallback)) : std::nullopt);
    if (v != static_cast<double>(static_cast<std::int64_t>(v)) || v < 0) {
      throw ConfigError(s_.where + ": layer " + s_.type + " '" + key +
                        "' must be a non-negative integer");
    }
    return static_cast<std::int64_t>(v);
  }
  bool flag(const std::string& key, bool fallback) const {
    for (const auto& [k, v] : s_.flags)
      if (k == key) return v;
    for (const auto& [k, v] : s_.numbers)
      if (k == key)
        throw ConfigError(s_.where + ": layer " + s_.type + " '" + key + "' must be a boolean");
    return fallback;
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    for (const auto& [k, v] : s_.strings)
      if (k == key) return v;
    return fallback;
  }

 private:
  const LayerSpec& s_;
};

std::shared_ptr<nn::Module> make_layer(const LayerSpec& s) {
  LayerArgs a(s);
  const std::string& t = s.type;
  try {
    if (t == "flatten") return std::make_shared<nn::Flatten>();
    if (t == "relu") return std::make_shared<nn::ReLU>();
    if (t == "tanh") return std::make_shared<nn::Tanh>();
    if (t == "sigmoid") return std::make_shared<nn::Sigmoid>();
    if (t == "global_avgpool") return std::make_shared<nn::GlobalAvgPool2d>();
    if (t == "gelu") {
      const std::string approx = a.string("approximate", "none");
      if (approx != "none" && approx != "tanh") {
        throw ConfigError(s.where + ": gelu approximate must be \"none\" or \"tanh\"");
      }
      return std::make_shared<nn::GELU>(approx == "tanh");
    }
    if (t == "linear")
      return std::make_shared<nn::Linear>(a.integer("in"), a.integer("out"), a.flag("bias", true));
    if (t == "conv2d") {
      nn::Conv2dOptions o;
      o.in_channels = a.integer("in");
      o.out_channels = a.integer("out");
      o.kernel_size = static_cast<int>(a.integer("kernel"));
      o.stride = static_cast<int>(a.integer("stride", 1));
      o.padding = static_cast<int>(a.integer("padding", 0));
      o.bias = a.flag("bias", true);
      return std::make_shared<nn::Conv2d>(o);
    }
    if (t == "maxpool2d") {
      return std::make_shared<nn::MaxPool2d>(static_cast<int>(a.integer("kernel")),
                                             static_cast<int>(a.integer("stride", 0)),
                                             static_cast<int>(a.integer("padding", 0)));
    }
    if (t == "avgpool2d") {
      return std::make_shared<nn::AvgPool2d>(
          static_cast<int>(a.integer("kernel")), static_cast<int>(a.integer("stride", 0)),
          static_cast<int>(a.integer("padding", 0)), a.flag("count_include_pad", true));
    }
    if (t == "dropout")
      return std::make_shared<nn::Dropout>(static_cast<float>(a.number("p", 0.5)));
    if (t == "batchnorm1d" || t == "batchnorm2d") {
      nn::BatchNormOptions o;
      o.num_features = a.integer("features");
      o.eps = static_cast<float>(a.number("eps", 1e-5));
      o.momentum = static_cast<float>(a.number("momentum", 0.1));
      if (t == "batchnorm1d") return std::make_shared<nn::BatchNorm1d>(o);
      return std::make_shared<nn::BatchNorm2d>(o);
    }
    if (t == "layernorm") {
      if (s.shape.empty()) throw ConfigError(s.where + ": layernorm needs 'shape'");
      return std::make_shared<nn::LayerNorm>(Shape(s.shape),
                                             static_cast<float>(a.number("eps", 1e-5)));
    }
    if (t == "embedding")
      return std::make_shared<nn::Embedding>(a.integer("num"), a.integer("dim"));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(s.where + ": " + e.what());
  }
  throw ConfigError(s.where + ": unknown layer type '" + t + "'");
}
}  // namespace

namespace {

std::shared_ptr<nn::Module> build_architecture(const Config& config) {
  try {
    if (config.model_kind == "gpt") return std::make_shared<nn::GPT>(config.gpt);
    if (config.model_kind == "resnet") return std::make_shared<nn::ResNet>(config.resnet);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.path + ": [model] " + e.what());
  }
  auto model = std::make_shared<nn::Sequential>();
  for (const auto& spec : config.layers) model->push_back(make_layer(spec));
  return model;
}

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 8) s += ", ... (" + std::to_string(names.size()) + ")";
  return s;
}

}  // namespace

std::shared_ptr<nn::Module> build_model(const Config& config) {
  auto model = build_architecture(config);
  if (config.init_from.empty()) return model;
  const io::SafetensorsFile file = io::load_safetensors(config.init_from);
  // Weights exported from a language model's checkpoint record its tokenizer (hpm_tokenizer):
  // checked as the checkpoint's own record is.
  if (const auto it = file.metadata.find("hpm_tokenizer"); it != file.metadata.end()) {
    train::TrainerState recorded;
    recorded.metadata["tokenizer"] = it->second;
    check_checkpoint_tokenizer(recorded, config, "the weights " + config.init_from);
  }
  nn::Module::LoadReport r;
  try {
    r = model->load_weights(file.tensors, config.init_strict);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.path + ": [model] init_from = \"" + config.init_from +
                      "\": " + e.what() +
                      (config.init_strict ? " (init_strict = false loads what matches)" : ""));
  }
  // Replicas and teachers build the model again: say it once per process and file.
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(config.init_from).second) {
    std::fprintf(stderr, "init_from %s: %zu tensors loaded%s\n", config.init_from.c_str(), r.loaded,
                 r.cast ? (", " + std::to_string(r.cast) + " cast to f32").c_str() : "");
    if (!r.missing.empty()) {
      std::fprintf(stderr, "init_from %s: missing (left as initialized): %s\n",
                   config.init_from.c_str(), name_list(r.missing).c_str());
    }
    if (!r.unexpected.empty()) {
      std::fprintf(stderr, "init_from %s: unexpected (ignored): %s\n", config.init_from.c_str(),
                   name_list(r.unexpected).c_str());
    }
  }
  return model;
}

}  // namespace hpm::config
