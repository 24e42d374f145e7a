// [data]: where the examples come from and the input pipeline that feeds them.
#include <filesystem>
#include <map>
#include <set>

#include "config/reader.h"
#include "config/sections.h"
#include "hpm/data/tokenizer.h"
#include "hpm/io/tfrecord.h"

namespace hpm::config::detail {

namespace {

std::vector<data::AugmentOp> parse_augment(const std::string& path, const toml::node& node) {
  const std::string at = where(path, node);
  if (!node.is_array()) throw ConfigError(at + ": [data] augment must be an array of tables");
  std::vector<data::AugmentOp> ops;
  for (const auto& entry : *node.as_array()) {
    const std::string eat = where(path, entry);
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
        throw ConfigError(where(path, *n) + ": '" + key + "' must be a number or an array");
      for (const auto& e : *n->as_array()) {
        if (!e.is_number()) throw ConfigError(where(path, e) + ": '" + key + "' must hold numbers");
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
        throw ConfigError(where(path, *size) +
                          ": size must be a positive integer or [height, width]");
      }
    } else if (op.op == "random_crop" || op.op == "resize") {
      throw ConfigError(eat + ": " + op.op + " needs 'size'");
    }
    if (const toml::node* padding = t.get("padding")) {
      const auto p = padding->value_exact<std::int64_t>();
      if (!p || *p < 0 || *p > 4096) {
        throw ConfigError(where(path, *padding) +
                          ": random_crop padding must be an integer from 0 to 4096 (pixels added "
                          "on each side)");
      }
      op.padding = static_cast<int>(*p);
    }
    if (op.op == "normalize") {
      op.mean = floats("mean");
      op.std = floats("std");
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

// [data] tokenizer: the SentencePiece model, whose vocabulary must be the GPT's.
void read_tokenizer(const TableReader& data, Config& c) {
  if (!c.token_source()) {
    data.invalid("tokenizer",
                 "is for [data] source = \"text\" or \"tokens\", got source \"" + c.source + "\"");
  }
  if (std::filesystem::is_directory(c.tokenizer)) {
    data.invalid("tokenizer", c.tokenizer + " is a directory, not a SentencePiece .model file");
  }
  try {
    c.text_tokenizer = data::load_sentencepiece(c.tokenizer);
  } catch (const data::DataError& e) {
    throw ConfigError(data.at("tokenizer") + ": [data] tokenizer: " + e.what());
  }
  if (c.text_tokenizer->vocab_size() != c.gpt.vocab_size) {
    throw ConfigError(data.at("tokenizer") + ": [data] tokenizer " + c.tokenizer + " has " +
                      std::to_string(c.text_tokenizer->vocab_size()) +
                      " tokens, but [model] vocab_size is " + std::to_string(c.gpt.vocab_size) +
                      ": the model's vocabulary must be the tokenizer's");
  }
}

}  // namespace

void read_data(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader data(path, "[data]", section(path, root, "data"));
  data.get("dir", c.data_dir);
  data.get("dataset", c.dataset);
  data.get("source", c.source);
  data.get("files", c.files);
  data.get("test_files", c.test_files);
  data.get("tokenizer", c.tokenizer);
  data.get("compression", c.compression);
  data.get_positive("batch_size", c.batch_size);
  data.get("shuffle", c.shuffle);
  data.get_non_negative("train_limit", c.train_limit);
  data.get_non_negative("test_limit", c.test_limit);
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
  // 0 with shuffle = true did not shuffle at all, and -5 meant the whole set: neither says what
  // it does.
  if (c.shuffle_buffer == 0 || c.shuffle_buffer < -1) {
    throw ConfigError(data.at("shuffle_buffer") +
                      ": [data] shuffle_buffer must be -1 (the whole training set) or a positive "
                      "count, got " +
                      std::to_string(c.shuffle_buffer) + " (not to shuffle: shuffle = false)");
  }
  if (c.source != "idx" && c.source != "tfrecord" && !c.token_source()) {
    throw ConfigError(data.at("source") + ": [data] source must be \"idx\", \"tfrecord\", " +
                      "\"text\", \"tokens\" or \"random_tokens\", got \"" + c.source + "\"");
  }
  // Text and tokens are for language models, and language models learn from them.
  if (c.token_source() != (c.model_kind == "gpt")) {
    throw ConfigError(
        data.at("source") + ": [data] source = \"" + c.source + "\" with [model] kind = \"" +
        c.model_kind +
        "\": a GPT trains on [data] source = \"text\", \"tokens\" or \"random_tokens\", and only a "
        "GPT does");
  }
  if (c.source == "text" && c.files.empty()) c.files = "/usr/share/games/fortunes/*";
  if (c.source == "tokens" && (c.files.empty() || c.test_files.empty())) {
    throw ConfigError(data.at("source") +
                      ": [data] source = \"tokens\" needs files and test_files (globs of token "
                      "shards, as `hpm data tokenizer encode --files GLOB -o DIR` writes them: "
                      "DIR/train-*.tokens and DIR/val-*.tokens)");
  }
  // Keys that change what the run reads or how, which the chosen source would ignore without a
  // word (files given to the default idx source trained on Fashion-MNIST instead). Another
  // source's location (dir for tfrecord, files for random_tokens: a config switched by --set)
  // changes nothing and passes.
  if (const toml::table* t = section(path, root, "data")) {
    std::vector<std::string> unused;
    if (c.source == "idx") {
      unused = {"files", "test_files", "compression"};
    } else if (c.token_source()) {  // a language model's windows, drawn from the run's seed
      unused = {"compression",    "shuffle",     "shuffle_buffer", "cache",
                "drop_remainder", "augment",     "parallel_calls", "prefetch",
                "deterministic",  "train_limit", "test_limit"};
    }
    for (const std::string& key : unused) {
      if (t->contains(key)) {
        throw ConfigError(data.at(key) + ": [data] " + key + " does not apply to source = \"" +
                          c.source + "\", which would ignore it; remove it");
      }
    }
  }
  if (!c.tokenizer.empty()) read_tokenizer(data, c);
  if (c.source == "tfrecord" && (c.files.empty() || c.test_files.empty())) {
    throw ConfigError(data.at("source") +
                      ": [data] source = \"tfrecord\" needs files and test_files (glob patterns)");
  }
  try {
    io::compression_from_name(c.compression);
  } catch (const std::exception& e) {
    throw ConfigError(data.at("compression") + ": [data] compression: " + e.what());
  }
  if (c.dataset != "fashion-mnist" && c.dataset != "mnist") {
    throw ConfigError(data.at("dataset") + ": [data] dataset '" + c.dataset +
                      "' is not supported (fashion-mnist or mnist, IDX files in dir)");
  }
}

}  // namespace hpm::config::detail

namespace hpm::config {

data::InputPipelineSpec pipeline_spec(const Config& c) {
  data::InputPipelineSpec spec;
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

}  // namespace hpm::config
