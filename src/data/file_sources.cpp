#include "hpm/data/file_sources.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::data {

Tensor bytes_tensor(std::string_view bytes) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::I8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

std::string tensor_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

namespace {

// Files read one after another; the position is (file index, the reader's own position).
template <typename Reader>
class FileSequenceIt : public Iterator {
 public:
  FileSequenceIt(std::vector<std::string> files, std::string stage)
      : files_(std::move(files)), stage_(std::move(stage)) {}

  bool next(Element& out) override {
    for (;;) {
      if (file_ >= files_.size()) return false;
      if (!reader_) open(0);
      bool got = false;
      try {
        trace::Span span("read record", "extract");
        got = read(out);
      } catch (const io::IoError& e) {
        throw DataError(stage_, e.what());
      }
      if (got) return true;
      reader_.reset();
      ++file_;
    }
  }

  void save(StateWriter& w) override {
    w.tag(stage_);
    w.u64(file_);
    w.u64(reader_ ? position() : 0);
  }

  void restore(StateReader& r) override {
    r.expect_tag(stage_);
    file_ = r.u64();
    const std::uint64_t pos = r.u64();
    reader_.reset();
    if (file_ < files_.size()) open(pos);
  }

 protected:
  virtual std::unique_ptr<Reader> make_reader(const std::string& path) = 0;
  virtual bool read(Element& out) = 0;
  virtual std::uint64_t position() const = 0;
  virtual void seek(std::uint64_t pos) = 0;

  void open(std::uint64_t pos) {
    try {
      reader_ = make_reader(files_[file_]);
      if (pos > 0) seek(pos);
    } catch (const io::IoError& e) {
      reader_.reset();
      ++file_;  // a file that cannot be opened is skipped by ignore_errors, not retried forever
      throw DataError(stage_, e.what());
    }
  }

  std::vector<std::string> files_;
  std::string stage_;
  std::size_t file_ = 0;
  std::unique_ptr<Reader> reader_;
};

class TfRecordIt : public FileSequenceIt<io::TfRecordReader> {
 public:
  TfRecordIt(std::vector<std::string> files, io::Compression c)
      : FileSequenceIt(std::move(files), "tfrecord"), compression_(c) {}

 protected:
  std::unique_ptr<io::TfRecordReader> make_reader(const std::string& path) override {
    return std::make_unique<io::TfRecordReader>(path, compression_);
  }
  bool read(Element& out) override {
    if (!reader_->next(record_)) return false;
    out = {bytes_tensor(record_)};
    return true;
  }
  std::uint64_t position() const override { return reader_->offset(); }
  void seek(std::uint64_t pos) override { reader_->seek(pos); }

 private:
  io::Compression compression_;
  std::string record_;
};

class TextLineIt : public FileSequenceIt<io::TextLineReader> {
 public:
  explicit TextLineIt(std::vector<std::string> files)
      : FileSequenceIt(std::move(files), "text_lines") {}

 protected:
  std::unique_ptr<io::TextLineReader> make_reader(const std::string& path) override {
    return std::make_unique<io::TextLineReader>(path);
  }
  bool read(Element& out) override {
    std::string line;
    if (!reader_->next(line)) return false;
    out = {bytes_tensor(line)};
    return true;
  }
  std::uint64_t position() const override { return reader_->line(); }
  void seek(std::uint64_t lines) override {
    std::string skip;
    for (std::uint64_t i = 0; i < lines && reader_->next(skip);) ++i;
  }
};

class CsvIt : public FileSequenceIt<io::CsvReader> {
 public:
  CsvIt(std::string file, io::CsvOptions o)
      : FileSequenceIt({std::move(file)}, "csv"), options_(std::move(o)) {}

 protected:
  std::unique_ptr<io::CsvReader> make_reader(const std::string& path) override {
    return std::make_unique<io::CsvReader>(path, options_);
  }
  bool read(Element& out) override {
    std::vector<io::CsvValue> row;
    if (!reader_->next(row)) return false;
    out.clear();
    for (const auto& v : row) {
      if (const float* f = std::get_if<float>(&v)) {
        out.push_back(Tensor::full(Shape{}, *f));
      } else if (const std::int64_t* i = std::get_if<std::int64_t>(&v)) {
        out.push_back(Tensor::from_i64(std::vector<std::int64_t>{*i}, Shape{}));
      } else {
        out.push_back(bytes_tensor(std::get<std::string>(v)));
      }
    }
    return true;
  }
  // Records read, bad ones included (ignore_errors skipped them): counted only when they
  // converted, a bad one before the save was read again after the restore, and a row of the wrong
  // field count made the restore itself fail.
  std::uint64_t position() const override { return reader_->records(); }
  void seek(std::uint64_t rows) override {
    while (reader_->records() < rows && reader_->skip_record()) {
    }
  }

 private:
  io::CsvOptions options_;
};

template <typename MakeIt>
class FileNode : public DatasetNode {
 public:
  FileNode(std::string name, MakeIt make) : name_(std::move(name)), make_(std::move(make)) {}
  std::string name() const override { return name_; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t) const override { return make_(); }

 private:
  std::string name_;
  MakeIt make_;
};

template <typename MakeIt>
Dataset file_node(std::string name, MakeIt make) {
  return Dataset(std::make_shared<FileNode<MakeIt>>(std::move(name), std::move(make)));
}

}  // namespace

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> paths;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::string first_shared_file(const std::vector<std::string>& a,
                              const std::vector<std::string>& b) {
  std::set<std::filesystem::path> in_a;
  for (const std::string& f : a) in_a.insert(std::filesystem::weakly_canonical(f));
  for (const std::string& f : b)
    if (in_a.count(std::filesystem::weakly_canonical(f))) return f;
  return "";
}

Dataset list_files(const std::string& pattern, bool shuffle, std::uint64_t seed) {
  const std::vector<std::string> files = glob_paths(pattern);
  if (files.empty()) throw std::invalid_argument("list_files: no file matches '" + pattern + "'");
  const auto n = static_cast<std::int64_t>(files.size());
  Dataset d = Dataset::from_generator(
      [files](std::int64_t i, Element& out) {
        if (i >= static_cast<std::int64_t>(files.size())) return false;
        out = {bytes_tensor(files[static_cast<std::size_t>(i)])};
        return true;
      },
      n);
  return shuffle ? d.shuffle(n, seed) : d;
}

Dataset tfrecord_dataset(std::vector<std::string> files, io::Compression compression) {
  return file_node("tfrecord", [files = std::move(files), compression] {
    return std::make_unique<TfRecordIt>(files, compression);
  });
}

Dataset tfrecord_from_path(const Element& path_element, io::Compression compression) {
  return tfrecord_dataset({tensor_bytes(path_element.at(0))}, compression);
}

Dataset text_line_dataset(std::vector<std::string> files) {
  return file_node("text_lines",
                   [files = std::move(files)] { return std::make_unique<TextLineIt>(files); });
}

Dataset csv_dataset(std::string file, io::CsvOptions options) {
  return file_node("csv", [file = std::move(file), options = std::move(options)] {
    return std::make_unique<CsvIt>(file, options);
  });
}

MapFn parse_example_fn(std::vector<io::FeatureSpec> specs) {
  return [specs = std::move(specs)](Element e) {
    const std::string bytes = tensor_bytes(e.at(0));
    Element out;
    try {
      for (auto& [name, t] :
           io::parse_example(io::decode_example(bytes, "record"), specs, "record")) {
        out.push_back(std::move(t));
      }
    } catch (const io::IoError& err) {
      throw DataError("parse_example", err.what());
    }
    return out;
  };
}

}  // namespace hpm::data
