// [distill], [noisy_student] and [codistill]: the settings of hpm distill and hpm codistill.
#include <filesystem>

#include "config/reader.h"
#include "config/sections.h"

namespace hpm::config::detail {

// [distill]: one teacher (teacher_config, teacher_checkpoint) or several (teachers = [{config,
// checkpoint, weight}, ...]); alpha, temperature, baseline, cache_teacher, m_on_m.
void read_distill(const Source& s, Config& c) {
  const std::string& path = s.path;
  DistillSection& d = c.distill;
  const toml::table* t = section(path, s.root, "distill");
  if (!t) return;
  d.present = true;
  const std::string at = where(path, *t);
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
    throw ConfigError(where(path, *n) + ": [distill] alpha must be in [0, 1]");
  }
  if (const toml::node* n = t->get("temperature"); n && !(d.temperature > 0.0f)) {
    throw ConfigError(where(path, *n) + ": [distill] temperature must be positive");
  }
  if (const toml::node* n = t->get("teachers")) {
    if (t->get("teacher_config") || t->get("teacher_checkpoint")) {
      throw ConfigError(
          where(path, *n) +
          ": [distill] takes teachers or teacher_config/teacher_checkpoint, not both");
    }
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty()) {
      throw ConfigError(where(path, *n) +
                        ": [distill] teachers must be a non-empty array of tables {config, "
                        "checkpoint, weight}");
    }
    for (const auto& e : *arr) {
      if (!e.is_table()) {
        throw ConfigError(
            where(path, e) +
            ": [distill] teachers: each must be a table {config, checkpoint, weight}");
      }
      TeacherSpec spec;
      spec.where = where(path, e);
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
void read_noisy_student(const Source& s, Config& c) {
  const std::string& path = s.path;
  NoisyStudentSection& n = c.noisy_student;
  const toml::table* t = section(path, s.root, "noisy_student");
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
void read_codistill(const Source& s, Config& cfg) {
  const std::string& path = s.path;
  CodistillSection& c = cfg.codistill;
  const toml::table* t = section(path, s.root, "codistill");
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

}  // namespace hpm::config::detail
