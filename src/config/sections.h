// The sections of the run configuration, each read by its own function next to the builders
// that turn it into objects (model_section.cpp: [model] and build_model; data_section.cpp: [data]
// and pipeline_spec; optimizer_section.cpp: [optimizer], [schedule] and their builders;
// train_section.cpp: [train], [memory], [early_stopping], fit_options and with_memory_options;
// strategy_section.cpp: [strategy] and [pipeline]; distill_sections.cpp: [distill],
// [noisy_student], [codistill]; ps_section.cpp: [cluster] and [ps]). config.cpp reads the file,
// applies the overrides and calls them in order.
#pragma once
#include <toml++/toml.h>

#include <string>

#include "hpm/config/config.h"

namespace hpm::config::detail {

// The parsed file (overrides applied) and its path, for errors.
struct Source {
  const std::string& path;
  const toml::table& root;
};

void read_model(const Source& s, Config& c);
void read_data(const Source& s, Config& c);
void read_optimizer(const Source& s, Config& c);
void read_schedule(const Source& s, Config& c);
void read_train(const Source& s, Config& c);
void read_memory(const Source& s, Config& c);
void read_strategy(const Source& s, Config& c);  // after [data] and [memory]: checks against them
void read_pipeline(const Source& s, Config& c);  // after [strategy]
void read_early_stopping(const Source& s, Config& c);  // after [train]
void read_distill(const Source& s, Config& c);
void read_noisy_student(const Source& s, Config& c);
void read_codistill(const Source& s, Config& c);
void read_ps(const Source& s, Config& c);

}  // namespace hpm::config::detail
