#include "hpm/cli/data_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/data/tfrecord_files.h"

namespace hpm::cli {

namespace {

int run_data_bench(const Common& c, std::int64_t epochs) {
  Config cfg = configure(c);
  std::int64_t train_examples = 0;
  const data::Dataset pipeline = training_pipeline(cfg, &train_examples);
  const data::PipelineThroughput t = data::measure_throughput(pipeline, epochs);
  const std::int64_t elements = t.elements, batches = t.batches;
  const double seconds = t.seconds;
  const std::vector<data::StageStats>& stats = t.stages;
  const double rate = t.elements_per_s();
  std::printf("hpm data bench %s: %lld elements in %lld batches, %.0f elements/s\n",
              cfg.path.c_str(), static_cast<long long>(elements), static_cast<long long>(batches),
              rate);
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : stats) {
    std::printf(
        "  %-16s parallelism %2d  buffer %3lld  occupancy %4.0f%%  %8.1f us/output  consumer "
        "waited %4.1f%%%s\n",
        st.name.c_str(), st.parallelism, static_cast<long long>(st.buffer_size),
        100.0 * st.buffer_occupancy, 1e6 * st.seconds_per_element, 100.0 * st.wait_fraction,
        st.autotuned ? "  (autotuned)" : "");
    stages.push_back({{"name", st.name},
                      {"elements", st.elements},
                      {"parallelism", st.parallelism},
                      {"buffer_size", st.buffer_size},
                      {"buffer_occupancy", st.buffer_occupancy},
                      {"seconds_per_output", st.seconds_per_element},
                      {"errors_skipped", st.errors_skipped},
                      {"consumer_wait_fraction", st.wait_fraction},
                      {"autotuned", st.autotuned}});
  }
  write_report(c.report, {{"elements_per_s", rate},
                          {"elements", elements},
                          {"batches", batches},
                          {"epochs", epochs},
                          {"seconds", seconds},
                          {"stages", stages}});
  return 0;
}

int run_data_convert(const ConvertOptions& o) {
  for (const data::WrittenShard& s : data::write_idx_as_tfrecords(
           o.dir, o.out, o.shards, io::compression_from_name(o.compression),
           o.image_format == "png")) {
    std::printf("%s: %lld records\n", s.path.c_str(), static_cast<long long>(s.records));
  }
  return 0;
}

int run_data_inspect(const std::string& file, const std::string& compression) {
  const data::TfRecordSummary s =
      data::summarize_tfrecord_examples(file, io::compression_from_name(compression));
  std::printf("%s: %lld records\n", file.c_str(), static_cast<long long>(s.records));
  for (const auto& [key, f] : s.features) {
    std::printf("  %-12s %-10s values per record: %zu..%zu", key.c_str(),
                io::feature_kind_name(f.kind), f.min_values, f.max_values);
    if (f.max_bytes > 0) std::printf(", bytes per value: %zu..%zu", f.min_bytes, f.max_bytes);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

CLI::App* add_data_command(CLI::App& app, DataCommandOptions& o) {
  CLI::App* data_cmd = app.add_subcommand("data", "input pipeline tools");
  data_cmd->require_subcommand(1);
  o.bench_cmd =
      data_cmd->add_subcommand("bench", "run a config's input pipeline alone and time it");
  add_common(o.bench_cmd, o.bench);
  o.bench_cmd->add_option("--epochs", o.bench_epochs, "passes over the data")
      ->check(positive_number());
  ConvertOptions& convert = o.convert;
  o.convert_cmd = data_cmd->add_subcommand(
      "convert",
      "write Fashion-MNIST as sharded TFRecord files of tf.train.Example (image bytes, label)");
  o.convert_cmd->add_option("--dir", convert.dir, "IDX data set directory");
  o.convert_cmd->add_option("--out", convert.out, "output directory")->required();
  o.convert_cmd->add_option("--shards", convert.shards, "files per split")
      ->check(CLI::Range(1, 100000));
  o.convert_cmd->add_option("--compression", convert.compression, "none, zlib or gzip");
  o.convert_cmd->add_option("--image-format", convert.image_format, "raw (784 bytes) or png")
      ->check(CLI::IsMember({"raw", "png"}));
  o.inspect_cmd = data_cmd->add_subcommand(
      "inspect", "count the records of a TFRecord file and list its features");
  o.inspect_cmd->add_option("file", o.inspect_file, "TFRecord file")->required();
  o.inspect_cmd->add_option("--compression", o.inspect_compression, "none, zlib or gzip");
  o.tokenizer_cmd = add_tokenizer_command(*data_cmd, o.tokenizer);
  return data_cmd;
}

int run_data_command(const DataCommandOptions& o) {
  if (*o.bench_cmd) return run_data_bench(o.bench, o.bench_epochs);
  if (*o.convert_cmd) return run_data_convert(o.convert);
  if (*o.inspect_cmd) return run_data_inspect(o.inspect_file, o.inspect_compression);
  return run_tokenizer_command(o.tokenizer);
}

}  // namespace hpm::cli
