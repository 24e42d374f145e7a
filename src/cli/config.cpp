#include "hpm/cli/config.h"

#include <toml++/toml.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "hpm/comm/communicator.h"
#include "hpm/io/tfrecord.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/schedule.h"
#include "hpm/train/callbacks.h"

namespace hpm::cli {

namespace {

std::string where(const std::string& path, const toml::source_region& src) {
  std::ostringstream os;
  os << path;
  if (src.begin.line > 0) os << ':' << src.begin.line << ':' << src.begin.column;
  return os.str();
}

// Reads the keys of one table, remembering which were used so leftovers can be reported.
class TableReader {
 public:
  TableReader(const std::string& path, std::string section, const toml::table* table)
      : path_(path), section_(std::move(section)), table_(table) {}

  template <typename T>
  void get(const std::string& key, T& out) {
    used_.insert(key);
    if (!table_) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node->value_exact<bool>()) {
        out = *v;
        return;
      }
      fail(*node, key, "a boolean (true or false)");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = node->value_exact<std::string>()) {
        out = *v;
        return;
      }
      fail(*node, key, "a string");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node->value<double>(); v && (node->is_number())) {
        out = static_cast<T>(*v);
        return;
      }
      fail(*node, key, "a number");
    } else {
      if (auto v = node->value_exact<std::int64_t>()) {
        out = static_cast<T>(*v);
        return;
      }
      fail(*node, key, "an integer");
    }
  }

  void allow(const std::string& key) { used_.insert(key); }

  // A non-negative integer, or the string "autotune" (stored as data::kAutotune).
  template <typename T>
  void get_count_or_autotune(const std::string& key, T& out) {
    used_.insert(key);
    if (!table_) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    if (auto s = node->value_exact<std::string>(); s && *s == "autotune") {
      out = static_cast<T>(data::kAutotune);
      return;
    }
    if (auto v = node->value_exact<std::int64_t>(); v && *v >= 0) {
      out = static_cast<T>(*v);
      return;
    }
    fail(*node, key, "a non-negative integer or \"autotune\"");
  }

  template <typename T>
  void get_positive(const std::string& key, T& out) {
    get(key, out);
    if (table_ && table_->get(key) && !(out > 0)) fail(*table_->get(key), key, "a positive value");
  }

  void finish() const {
    if (!table_) return;
    for (const auto& [k, v] : *table_) {
      const std::string key(k.str());
      if (!used_.count(key)) {
        std::ostringstream known;
        for (const auto& u : used_) known << (known.tellp() > 0 ? ", " : "") << u;
        throw ConfigError(where(path_, k.source()) + ": unknown key '" + key + "' in " + section_ +
                          " (known keys: " + known.str() + ")");
      }
    }
  }

  // A value of the right type that the section cannot take: "<file:line>: [section] key what".
  [[noreturn]] void invalid(const char* key, const std::string& what) const {
    const toml::node* node = table_ ? table_->get(key) : nullptr;
    throw ConfigError((node ? where(path_, node->source()) : path_) + ": " + section_ + " " + key +
                      " " + what);
  }

  [[noreturn]] void fail(const toml::node& node, const std::string& key,
                         const std::string& expected) const {
    std::ostringstream os;
    os << where(path_, node.source()) << ": " << section_ << " " << key << " must be " << expected
       << ", got " << node.type();
    throw ConfigError(os.str());
  }

 private:
  const std::string& path_;
  std::string section_;
  const toml::table* table_;
  std::set<std::string> used_;
};

const toml::table* section(const std::string& path, const toml::table& root, const char* name) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  if (!n->is_table()) {
    throw ConfigError(where(path, n->source()) + ": [" + name + "] must be a table");
  }
  return n->as_table();
}

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
  const std::string at = where(path, node.source());
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
    const std::string vat = where(path, v.source());
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

std::vector<data::AugmentOp> parse_augment(const std::string& path, const toml::node& node) {
  const std::string at = where(path, node.source());
  if (!node.is_array()) throw ConfigError(at + ": [data] augment must be an array of tables");
  std::vector<data::AugmentOp> ops;
  for (const auto& entry : *node.as_array()) {
    const std::string eat = where(path, entry.source());
    if (!entry.is_table()) throw ConfigError(eat + ": each augment entry must be a table");
    const toml::table& t = *entry.as_table();
    data::AugmentOp op;
    auto name = t["op"].value<std::string>();
    if (!name) throw ConfigError(eat + ": augment entry has no string 'op'");
    op.op = *name;
    static const std::map<std::string, std::set<std::string>> keys = {
        {"random_crop", {"op", "padding", "size"}},
        {"random_flip", {"op"}},
        {"normalize", {"op", "mean", "std"}},
        {"resize", {"op", "size"}}};
    auto it = keys.find(op.op);
    if (it == keys.end()) {
      throw ConfigError(eat + ": unknown augment op '" + op.op +
                        "' (known: normalize, random_crop, random_flip, resize)");
    }
    for (const auto& [k, v] : t) {
      const std::string key(k.str());
      if (!it->second.count(key)) {
        throw ConfigError(where(path, k.source()) + ": unknown key '" + key + "' for augment op " +
                          op.op);
      }
    }
    auto floats = [&](const char* key) {
      std::vector<float> out;
      const toml::node* n = t.get(key);
      if (!n) throw ConfigError(eat + ": " + op.op + " needs '" + key + "'");
      if (n->is_number()) return std::vector<float>{static_cast<float>(*n->value<double>())};
      if (!n->is_array())
        throw ConfigError(where(path, n->source()) + ": '" + key +
                          "' must be a number or an array");
      for (const auto& e : *n->as_array()) {
        if (!e.is_number())
          throw ConfigError(where(path, e.source()) + ": '" + key + "' must hold numbers");
        out.push_back(static_cast<float>(*e.value<double>()));
      }
      return out;
    };
    if (const toml::node* size = t.get("size")) {
      if (auto n = size->value_exact<std::int64_t>(); n && *n > 0) {
        op.height = op.width = *n;
      } else if (const toml::array* a = size->as_array(); a && a->size() == 2 &&
                                                          a->get(0)->value_exact<std::int64_t>() &&
                                                          a->get(1)->value_exact<std::int64_t>()) {
        op.height = *a->get(0)->value_exact<std::int64_t>();
        op.width = *a->get(1)->value_exact<std::int64_t>();
      } else {
        throw ConfigError(where(path, size->source()) +
                          ": size must be a positive integer or [height, width]");
      }
    } else if (op.op == "random_crop" || op.op == "resize") {
      throw ConfigError(eat + ": " + op.op + " needs 'size'");
    }
    if (auto p = t["padding"].value_exact<std::int64_t>()) op.padding = static_cast<int>(*p);
    if (op.op == "normalize") {
      op.mean = floats("mean");
      op.std = floats("std");
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw ConfigError("--set " + assignment + ": expected section.key=value");
  }
  const std::string sec = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, "--set " + assignment);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: take it as a string
  }
  toml::node* target = root.get(sec);
  if (!target) {
    root.insert(sec, toml::table{});
    target = root.get(sec);
  }
  if (!target->is_table())
    throw ConfigError("--set " + assignment + ": [" + sec + "] is not a table");
  target->as_table()->insert_or_assign(key, *parsed.get("v"));
}

// [distill]: one teacher (teacher_config, teacher_checkpoint) or several (teachers = [{config,
// checkpoint, weight}, ...]); alpha, temperature, baseline, cache_teacher, m_on_m.
// [cluster] and [ps] (parameter-server jobs).
void parse_ps(const std::string& path, const toml::table& root, PsSection& p) {
  const toml::table* cluster = section(path, root, "cluster");
  TableReader cr(path, "[cluster]", cluster);
  cr.get("coordinator", p.coordinator);
  cr.allow("ps");
  if (const toml::node* n = cluster ? cluster->get("ps") : nullptr) {
    const toml::array* a = n->as_array();
    std::vector<std::string> ps;
    for (std::size_t i = 0; a && i < a->size(); ++i) {
      const auto v = (*a)[i].value_exact<std::string>();
      if (!v) {
        a = nullptr;
        break;
      }
      ps.push_back(*v);
    }
    if (!a || ps.empty()) {
      throw ConfigError(where(path, n->source()) +
                        ": [cluster] ps must be a non-empty array of \"HOST:PORT\" strings");
    }
    p.ps = ps;
  }
  cr.get_positive("workers", p.workers);
  cr.get("bind", p.bind);
  cr.get("token_file", p.token_file);
  cr.get("tls_cert", p.tls_cert);
  cr.get("tls_key", p.tls_key);
  cr.get("tls_ca", p.tls_ca);
  cr.get_positive("max_message_mb", p.max_message_mb);
  cr.get_positive("rpc_timeout_s", p.rpc_timeout_s);
  cr.finish();
  if (p.tls_cert.empty() != p.tls_key.empty())
    throw ConfigError(path + ": [cluster] tls_cert and tls_key go together");
  TableReader pr(path, "[ps]", section(path, root, "ps"));
  pr.get("mode", p.mode);
  pr.get("staleness", p.staleness);
  pr.get("checkpoint_dir", p.checkpoint_dir);
  pr.get("checkpoint_every_tasks", p.checkpoint_every_tasks);
  pr.get_positive("heartbeat_timeout_s", p.heartbeat_timeout_s);
  pr.get_positive("ps_wait_s", p.ps_wait_s);
  pr.get("slow_worker", p.slow_worker);
  pr.get_positive("slow_factor", p.slow_factor);
  pr.finish();
  if (p.mode != "async" && p.mode != "ssp" && p.mode != "sync") {
    throw ConfigError(path + ": [ps] mode must be \"async\", \"ssp\" or \"sync\", got \"" + p.mode +
                      "\"");
  }
  if (p.staleness < 0) throw ConfigError(path + ": [ps] staleness must be >= 0");
  if (p.checkpoint_every_tasks < 0)
    throw ConfigError(path + ": [ps] checkpoint_every_tasks must be >= 0");
}

void parse_distill(const std::string& path, const toml::table& root, DistillSection& d) {
  const toml::table* t = section(path, root, "distill");
  if (!t) return;
  d.present = true;
  const std::string at = where(path, t->source());
  const auto from_config_dir = [&](const std::string& p) {
    const std::filesystem::path fp(p);
    return fp.is_absolute() || p.empty()
               ? p
               : (std::filesystem::path(path).parent_path() / fp).string();
  };
  TableReader r(path, "[distill]", t);
  TeacherSpec one;
  one.where = at;
  r.get("teacher_config", one.config);
  r.get("teacher_checkpoint", one.checkpoint);
  r.get("alpha", d.alpha);
  r.get("temperature", d.temperature);
  r.get("baseline", d.baseline);
  r.get("cache_teacher", d.cache_teacher);
  r.get("m_on_m", d.m_on_m);
  r.allow("teachers");
  r.finish();
  if (const toml::node* n = t->get("alpha"); n && !(d.alpha >= 0.0f && d.alpha <= 1.0f)) {
    throw ConfigError(where(path, n->source()) + ": [distill] alpha must be in [0, 1]");
  }
  if (const toml::node* n = t->get("temperature"); n && !(d.temperature > 0.0f)) {
    throw ConfigError(where(path, n->source()) + ": [distill] temperature must be positive");
  }
  if (const toml::node* n = t->get("teachers")) {
    if (t->get("teacher_config") || t->get("teacher_checkpoint")) {
      throw ConfigError(
          where(path, n->source()) +
          ": [distill] takes teachers or teacher_config/teacher_checkpoint, not both");
    }
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty()) {
      throw ConfigError(where(path, n->source()) +
                        ": [distill] teachers must be a non-empty array of tables {config, "
                        "checkpoint, weight}");
    }
    for (const auto& e : *arr) {
      if (!e.is_table()) {
        throw ConfigError(
            where(path, e.source()) +
            ": [distill] teachers: each must be a table {config, checkpoint, weight}");
      }
      TeacherSpec spec;
      spec.where = where(path, e.source());
      TableReader tr(path, "[distill] teachers", e.as_table());
      tr.get("config", spec.config);
      tr.get("checkpoint", spec.checkpoint);
      tr.get("weight", spec.weight);
      tr.finish();
      if (spec.config.empty()) {
        throw ConfigError(spec.where + ": [distill] teachers: each needs 'config'");
      }
      if (!(spec.weight >= 0.0f)) {
        throw ConfigError(spec.where + ": [distill] teachers: weight must be non-negative");
      }
      spec.config = from_config_dir(spec.config);
      d.teachers.push_back(std::move(spec));
    }
  } else if (!one.config.empty()) {
    one.config = from_config_dir(one.config);
    d.teachers.push_back(std::move(one));
  } else if (!one.checkpoint.empty()) {
    throw ConfigError(at + ": [distill] teacher_checkpoint needs teacher_config (its model)");
  }
}

// [noisy_student]: rounds, pseudo_labels, confidence_threshold, balance_classes, per_class,
// labelled or labelled_fraction, teacher_config, teacher_epochs, crop_padding, flip.
void parse_noisy_student(const std::string& path, const toml::table& root, NoisyStudentSection& n) {
  const toml::table* t = section(path, root, "noisy_student");
  if (!t) return;
  n.present = true;
  TableReader r(path, "[noisy_student]", t);
  r.get("teacher_config", n.teacher_config);
  r.get("teacher_epochs", n.teacher_epochs);
  r.get_positive("rounds", n.rounds);
  r.get("pseudo_labels", n.pseudo_labels);
  r.get("confidence_threshold", n.confidence_threshold);
  r.get("balance_classes", n.balance_classes);
  r.get("per_class", n.per_class);
  r.get("labelled", n.labelled);
  r.get("labelled_fraction", n.labelled_fraction);
  r.get("crop_padding", n.crop_padding);
  r.get("flip", n.flip);
  r.finish();
  if (n.pseudo_labels != "soft" && n.pseudo_labels != "hard") {
    r.invalid("pseudo_labels", "must be \"soft\" or \"hard\", got \"" + n.pseudo_labels + "\"");
  }
  if (!(n.confidence_threshold >= 0.0f && n.confidence_threshold <= 1.0f))
    r.invalid("confidence_threshold", "must be in [0, 1]");
  if (n.per_class < 0) r.invalid("per_class", "must be >= 0");
  if (n.labelled < 0) r.invalid("labelled", "must be >= 0");
  if (n.teacher_epochs < 0) r.invalid("teacher_epochs", "must be >= 0");
  if (t->get("labelled_fraction") && !(n.labelled_fraction > 0.0f && n.labelled_fraction < 1.0f))
    r.invalid("labelled_fraction", "must be in (0, 1)");
  if (n.crop_padding < 0) r.invalid("crop_padding", "must be >= 0");
  if (!n.teacher_config.empty() && !std::filesystem::path(n.teacher_config).is_absolute()) {
    n.teacher_config = (std::filesystem::path(path).parent_path() / n.teacher_config).string();
  }
}

// [codistill]: copies, exchange_every, burn_in, alpha, temperature, shards.
void parse_codistill(const std::string& path, const toml::table& root, CodistillSection& c) {
  const toml::table* t = section(path, root, "codistill");
  if (!t) return;
  c.present = true;
  TableReader r(path, "[codistill]", t);
  r.get_positive("copies", c.copies);
  r.get_positive("exchange_every", c.exchange_every);
  r.get("burn_in", c.burn_in);
  r.get("alpha", c.alpha);
  r.get_positive("temperature", c.temperature);
  r.get("shards", c.shards);
  r.finish();
  if (c.burn_in < 0) r.invalid("burn_in", "must be >= 0");
  if (!(c.alpha >= 0.0f && c.alpha <= 1.0f)) r.invalid("alpha", "must be in [0, 1]");
  if (c.shards != "identical" && c.shards != "disjoint") {
    r.invalid("shards", "must be \"identical\" or \"disjoint\", got \"" + c.shards + "\"");
  }
}

}  // namespace

namespace {
void read_pipeline(const std::string& path, const toml::table& root, Config& c) {
  const toml::table* t = section(path, root, "pipeline");
  PipelineSection& p = c.pipeline;
  p.present = t != nullptr;
  TableReader r(path, "[pipeline]", t);
  r.get_positive("stages", p.stages);
  r.get_positive("micro_batches", p.micro_batches);
  r.get("schedule", p.schedule);
  r.get_positive("chunks_per_stage", p.chunks_per_stage);
  r.get("partition", p.partition);
  r.get_positive("profile_repeats", p.profile_repeats);
  r.finish();
  if (!p.present) return;
  auto at = [&](const char* key) {
    const toml::node* n = t->get(key);
    return n ? where(path, n->source()) : path;
  };
  try {
    pipeline::partition_from_name(p.partition);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(at("partition") + ": [pipeline] " + e.what());
  }
  try {
    pipeline::make_schedule(pipeline::schedule_from_name(p.schedule), p.stages, p.micro_batches,
                            p.chunks_per_stage);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(at("schedule") + ": [pipeline] " + e.what());
  }
  if (c.accumulation_steps != 1) {
    throw ConfigError(path + ": [pipeline] splits every batch into micro_batches already; " +
                      "[train] accumulation_steps must stay 1");
  }
  if (c.offload) {
    throw ConfigError(path + ": [memory] offload is for one device; a [pipeline] lowers each " +
                      "stage's memory with recompute instead");
  }
  if (c.strategy != "one_device") {
    throw ConfigError(path + ": [pipeline] runs on its own stages; it does not combine with " +
                      "[strategy] kind = \"" + c.strategy + "\"");
  }
  if (c.batch_size < p.micro_batches) {
    throw ConfigError(at("micro_batches") + ": [pipeline] micro_batches (" +
                      std::to_string(p.micro_batches) + ") exceeds [data] batch_size (" +
                      std::to_string(c.batch_size) + ")");
  }
}
}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << where(path, e.source()) << ": " << e.description();
    throw ConfigError(os.str());
  }
  for (const auto& o : overrides) apply_override(root, o);

  Config c;
  c.path = path;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    static const std::set<std::string> sections = {
        "model",   "data",          "optimizer", "schedule", "train",  "strategy", "early_stopping",
        "distill", "noisy_student", "codistill", "pipeline", "memory", "cluster",  "ps"};
    if (!sections.count(key)) {
      throw ConfigError(where(path, k.source()) + ": unknown section [" + key +
                        "] (known: cluster, codistill, data, distill, early_stopping, memory, "
                        "model, noisy_student, optimizer, pipeline, ps, schedule, strategy, "
                        "train)");
    }
  }

  const toml::table* model = section(path, root, "model");
  if (!model) throw ConfigError(path + ": missing [model] section with a 'layers' array");
  {
    const toml::node* layers = model->get("layers");
    if (!layers || !layers->is_array() || layers->as_array()->empty()) {
      throw ConfigError(where(path, model->source()) +
                        ": [model] needs a non-empty 'layers' array");
    }
    for (const auto& l : *layers->as_array()) c.layers.push_back(parse_layer(path, l));
    TableReader r(path, "[model]", model);
    r.allow("layers");  // checked above
    r.finish();
  }

  TableReader data(path, "[data]", section(path, root, "data"));
  data.get("dir", c.data_dir);
  data.get("dataset", c.dataset);
  data.get("source", c.source);
  data.get("files", c.files);
  data.get("test_files", c.test_files);
  data.get("compression", c.compression);
  data.get_positive("batch_size", c.batch_size);
  data.get("shuffle", c.shuffle);
  data.get("train_limit", c.train_limit);
  data.get("test_limit", c.test_limit);
  data.get("shuffle_buffer", c.shuffle_buffer);
  data.get("deterministic", c.deterministic);
  if (const toml::table* t = section(path, root, "data");
      t && t->get("cache") && t->get("cache")->is_string()) {
    data.get("cache", c.cache_path);
    c.cache = true;
  } else {
    data.get("cache", c.cache);
  }
  data.get("drop_remainder", c.drop_remainder);
  data.get_count_or_autotune("parallel_calls", c.parallel_calls);
  data.get_count_or_autotune("prefetch", c.prefetch);
  if (const toml::table* t = section(path, root, "data"); t && t->get("augment")) {
    data.allow("augment");
    c.augment = parse_augment(path, *t->get("augment"));
  }
  data.finish();
  if (c.source != "idx" && c.source != "tfrecord") {
    throw ConfigError(path + ": [data] source must be \"idx\" or \"tfrecord\", got \"" + c.source +
                      "\"");
  }
  if (c.source == "tfrecord" && (c.files.empty() || c.test_files.empty())) {
    throw ConfigError(path +
                      ": [data] source = \"tfrecord\" needs files and test_files (glob patterns)");
  }
  try {
    io::compression_from_name(c.compression);
  } catch (const std::exception& e) {
    throw ConfigError(path + ": [data] compression: " + e.what());
  }
  if (c.dataset != "fashion-mnist" && c.dataset != "mnist") {
    throw ConfigError(path + ": [data] dataset '" + c.dataset +
                      "' is not supported (fashion-mnist or mnist, IDX files in dir)");
  }

  TableReader opt(path, "[optimizer]", section(path, root, "optimizer"));
  opt.get("kind", c.optimizer);
  opt.get("lr", c.lr);
  opt.get("momentum", c.momentum);
  opt.get("dampening", c.dampening);
  opt.get("nesterov", c.nesterov);
  opt.get("weight_decay", c.weight_decay);
  opt.get("beta1", c.beta1);
  opt.get("beta2", c.beta2);
  opt.get("eps", c.eps);
  opt.get("amsgrad", c.amsgrad);
  opt.finish();

  TableReader sch(path, "[schedule]", section(path, root, "schedule"));
  sch.get("kind", c.schedule);
  sch.get("unit", c.schedule_unit);
  sch.get_positive("step_size", c.step_size);
  sch.get("gamma", c.gamma);
  sch.get_positive("t_max", c.t_max);
  sch.get("eta_min", c.eta_min);
  sch.get("warmup", c.warmup);
  sch.get("warmup_start_factor", c.warmup_start_factor);
  sch.finish();
  if (c.schedule_unit != "epoch" && c.schedule_unit != "step") {
    throw ConfigError(path + ": [schedule] unit must be \"epoch\" or \"step\", got \"" +
                      c.schedule_unit + "\"");
  }

  TableReader tr(path, "[train]", section(path, root, "train"));
  tr.get_positive("epochs", c.epochs);
  std::int64_t seed = 0;
  tr.get("seed", seed);
  c.seed = static_cast<std::uint64_t>(seed);
  tr.get_positive("threads", c.threads);
  tr.get("label_smoothing", c.label_smoothing);
  tr.get("clip_grad_norm", c.clip_grad_norm);
  tr.get("checkpoint_dir", c.checkpoint_dir);
  tr.get_positive("checkpoint_every", c.checkpoint_every);
  tr.get("metrics_csv", c.metrics_csv);
  tr.get("backup_dir", c.backup_dir);
  tr.get("backup_every_steps", c.backup_every_steps);
  tr.get("keep_backup", c.keep_backup);
  if (c.backup_every_steps < 0) {
    throw ConfigError(path + ": [train] backup_every_steps must be 0 (each epoch) or positive");
  }
  tr.get("best_checkpoint_dir", c.best_checkpoint_dir);
  tr.get("best_checkpoint_monitor", c.best_checkpoint_monitor);  // checked with [early_stopping]
  tr.get_positive("accumulation_steps", c.accumulation_steps);
  tr.finish();

  TableReader mem(path, "[memory]", section(path, root, "memory"));
  mem.get("recompute", c.recompute);
  mem.get_positive("recompute_every", c.recompute_every);
  mem.get("offload", c.offload);
  mem.get("offload_threshold_kb", c.offload_threshold_kb);
  mem.get_positive("device_budget_mb", c.device_budget_mb);
  mem.finish();
  try {
    nn::parse_recompute_mode(c.recompute);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": [memory] " + e.what());
  }
  if (c.offload_threshold_kb < 0) {
    throw ConfigError(path + ": [memory] offload_threshold_kb must be 0 or more");
  }
  if (c.offload && c.recompute != "never") {
    throw ConfigError(path + ": [memory] recompute = \"" + c.recompute +
                      "\" and offload = true: choose one (a recomputed segment keeps only its "
                      "input, so there is little left to offload)");
  }

  TableReader st(path, "[strategy]", section(path, root, "strategy"));
  st.get("kind", c.strategy);
  st.get_positive("replicas", c.replicas);
  st.get("bucket_mb", c.bucket_mb);
  st.get("overlap", c.overlap);
  st.get("algorithm", c.algorithm);
  st.get_positive("timeout_s", c.timeout_s);
  st.get("timeline", c.timeline);
  st.get("shard", c.shard);
  st.finish();
  if (c.shard != "batch" && c.shard != "elements" && c.shard != "files") {
    throw ConfigError(path +
                      ": [strategy] shard must be \"batch\", \"elements\" or \"files\", got \"" +
                      c.shard + "\"");
  }
  if (c.shard == "files" && c.source != "tfrecord") {
    throw ConfigError(path + ": [strategy] shard = \"files\" needs [data] source = \"tfrecord\"");
  }
  static const std::set<std::string> kinds = {"one_device", "mirrored", "multi_worker_mirrored",
                                              "central_storage"};
  if (!kinds.count(c.strategy)) {
    throw ConfigError(path +
                      ": [strategy] kind must be one_device, mirrored, multi_worker_mirrored or "
                      "central_storage, got \"" +
                      c.strategy + "\"");
  }
  if (c.bucket_mb <= 0) throw ConfigError(path + ": [strategy] bucket_mb must be positive");
  try {
    comm::algorithm_from_name(c.algorithm);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": [strategy] algorithm: " + e.what());
  }
  read_pipeline(path, root, c);
  if (c.strategy == "one_device" && c.replicas != 1) {
    throw ConfigError(path + ": [strategy] one_device has exactly one replica, got replicas = " +
                      std::to_string(c.replicas));
  }

  // [early_stopping] (present = on), and [train]'s best-epoch checkpoint, which watches a metric
  // the same way.
  {
    const toml::table* es_table = section(path, root, "early_stopping");
    c.early_stopping = es_table != nullptr;
    TableReader es(path, "[early_stopping]", es_table);
    es.get("monitor", c.early_stopping_monitor);
    es.get("mode", c.early_stopping_mode);
    es.get("min_delta", c.early_stopping_min_delta);
    es.get("patience", c.early_stopping_patience);
    es.get("restore_best_weights", c.early_stopping_restore_best_weights);
    es.finish();
    // An error names the key, at its line when the file (not --set) gave it.
    auto at = [&](const toml::table* t, const char* key) {
      const toml::node* n = t ? t->get(key) : nullptr;
      return n ? where(path, n->source()) : path;
    };
    auto check_monitor = [&](const toml::table* t, const std::string& sec, const char* key,
                             const std::string& monitor, const std::string& mode) {
      if (!train::is_monitor(monitor)) {
        std::string known;
        for (const char* m : train::kMonitors)
          known += (known.empty() ? "" : ", ") + std::string(m);
        throw ConfigError(at(t, key) + ": " + sec + " " + key + " must be one of " + known +
                          ", got \"" + monitor + "\"");
      }
      try {
        train::resolve_mode(monitor, mode);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(at(t, "mode") + ": " + sec + " " + e.what());
      }
    };
    const toml::table* tr_table = section(path, root, "train");
    check_monitor(tr_table, "[train]", "best_checkpoint_monitor", c.best_checkpoint_monitor,
                  "auto");
    if (c.early_stopping) {
      check_monitor(es_table, "[early_stopping]", "monitor", c.early_stopping_monitor,
                    c.early_stopping_mode);
      if (c.early_stopping_patience < 0) {
        throw ConfigError(at(es_table, "patience") +
                          ": [early_stopping] patience must be a non-negative integer");
      }
      if (!(c.early_stopping_min_delta >= 0)) {
        throw ConfigError(at(es_table, "min_delta") +
                          ": [early_stopping] min_delta must be non-negative");
      }
    }
    // Both save with keep-the-newest pruning and one `latest`: sharing a directory would delete
    // each other's checkpoints.
    if (!c.best_checkpoint_dir.empty() && c.best_checkpoint_dir == c.checkpoint_dir) {
      throw ConfigError(at(tr_table, "best_checkpoint_dir") +
                        ": [train] best_checkpoint_dir must differ from checkpoint_dir");
    }
    if (!c.backup_dir.empty() &&
        (c.backup_dir == c.checkpoint_dir || c.backup_dir == c.best_checkpoint_dir)) {
      throw ConfigError(
          at(tr_table, "backup_dir") +
          ": [train] backup_dir must differ from checkpoint_dir and best_checkpoint_dir");
    }
  }
  parse_distill(path, root, c.distill);
  parse_noisy_student(path, root, c.noisy_student);
  parse_codistill(path, root, c.codistill);
  parse_ps(path, root, c.ps);
  return c;
}

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

std::shared_ptr<nn::Sequential> build_model(const Config& config) {
  auto model = std::make_shared<nn::Sequential>();
  for (const auto& spec : config.layers) model->push_back(make_layer(spec));
  return model;
}

data::PipelineSpec pipeline_spec(const Config& c) {
  data::PipelineSpec spec;
  spec.shuffle_buffer = c.shuffle ? c.shuffle_buffer : 0;
  spec.seed = c.seed;
  spec.augment = c.augment;
  spec.parallel_calls = c.parallel_calls;
  spec.deterministic = c.deterministic;
  spec.batch_size = c.batch_size;
  spec.drop_remainder = c.drop_remainder;
  spec.prefetch = c.prefetch;
  spec.cache = c.cache;
  spec.cache_path = c.cache_path;
  return spec;
}

train::FitOptions fit_options(const Config& c) {
  train::FitOptions fo;
  fo.epochs = c.epochs;
  fo.seed = c.seed;
  fo.label_smoothing = c.label_smoothing;
  fo.clip_grad_norm = c.clip_grad_norm;
  fo.schedule_per_step = c.schedule_unit == "step";
  fo.checkpoint_dir = c.checkpoint_dir;
  fo.checkpoint_every = c.checkpoint_every;
  fo.accumulation_steps = c.accumulation_steps;
  return fo;
}

std::shared_ptr<nn::Module> with_memory_options(const Config& c,
                                                std::shared_ptr<nn::Sequential> model) {
  if (c.offload) {
    nn::OffloadOptions o;
    o.threshold_bytes = static_cast<std::size_t>(c.offload_threshold_kb * 1024.0);
    return nn::with_offload(std::move(model), o);
  }
  const nn::RecomputeMode mode = nn::parse_recompute_mode(c.recompute);
  if (mode == nn::RecomputeMode::Never) return model;
  return nn::with_recomputation(std::move(model), c.recompute_every, mode);
}

std::shared_ptr<optim::Optimizer> build_optimizer(const Config& c, const nn::Module& model) {
  try {
    if (c.optimizer == "sgd") {
      return std::make_shared<optim::SGD>(
          model.named_parameters(),
          optim::SgdOptions{c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov});
    }
    if (c.optimizer == "adam" || c.optimizer == "adamw") {
      optim::AdamOptions o{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.amsgrad, false};
      if (c.optimizer == "adamw")
        return std::make_shared<optim::AdamW>(model.named_parameters(), o);
      return std::make_shared<optim::Adam>(model.named_parameters(), o);
    }
  } catch (const std::invalid_argument& e) {
    throw ConfigError(c.path + ": [optimizer] " + e.what());
  }
  throw ConfigError(c.path + ": [optimizer] kind '" + c.optimizer +
                    "' is not one of sgd, adam, adamw");
}

std::shared_ptr<optim::LrSchedule> build_schedule(const Config& c) {
  try {
    if (c.schedule == "constant") return std::make_shared<optim::ConstantLr>();
    if (c.schedule == "step") return std::make_shared<optim::StepLr>(c.step_size, c.gamma);
    if (c.schedule == "cosine") return std::make_shared<optim::CosineLr>(c.t_max, c.eta_min);
    if (c.schedule == "warmup")
      return std::make_shared<optim::WarmupLr>(c.warmup_start_factor, c.warmup);
    if (c.schedule == "warmup_cosine") {
      return std::make_shared<optim::WarmupLr>(
          c.warmup_start_factor, c.warmup, std::make_shared<optim::CosineLr>(c.t_max, c.eta_min));
    }
  } catch (const std::invalid_argument& e) {
    throw ConfigError(c.path + ": [schedule] " + e.what());
  }
  throw ConfigError(c.path + ": [schedule] kind '" + c.schedule +
                    "' is not one of constant, step, cosine, warmup, warmup_cosine");
}

}  // namespace hpm::cli
