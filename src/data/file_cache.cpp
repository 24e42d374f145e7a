// cache(path): elements as TFRecord-framed records (each element's tensors serialized with the
// iterator-state writer), so the file is checksummed record by record.
#include <filesystem>
#include <map>
#include <sstream>
#include <string_view>

#include "hpm/data/dataset.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

namespace {

constexpr std::string_view kKeyMagic = "hpm-cache-key\n";

// "name=value" lines into a map.
std::map<std::string, std::string> key_lines(const std::string& key) {
  std::map<std::string, std::string> out;
  std::istringstream in(key);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    out[line.substr(0, eq)] = eq == std::string::npos ? "" : line.substr(eq + 1);
  }
  return out;
}

// Reads the key record of a cache file and refuses one written for other data.
void check_key(io::TfRecordReader& reader, const std::string& path, const std::string& key) {
  std::string first;
  bool got = false;
  try {
    got = reader.next(first);
  } catch (const io::IoError& e) {
    throw DataError("cache", e.what());
  }
  if (!got || first.compare(0, kKeyMagic.size(), kKeyMagic) != 0) {
    throw DataError("cache", path +
                                 ": not written for this pipeline (it holds no key of what "
                                 "produced it); remove it, or give [data] cache another path");
  }
  const std::string cached = first.substr(kKeyMagic.size());
  if (cached == key) return;
  const auto was = key_lines(cached), now = key_lines(key);
  std::string diff;
  for (const auto& [name, value] : now) {
    const auto it = was.find(name);
    const std::string old = it == was.end() ? "(none)" : it->second;
    if (old != value)
      diff += (diff.empty() ? "" : "; ") + name + " " + old + " in the cache, " + value + " now";
  }
  for (const auto& [name, value] : was)
    if (!now.count(name))
      diff += (diff.empty() ? "" : "; ") + name + " " + value + " in the cache, (none) now";
  throw DataError("cache", path + ": written for other data (" + diff +
                               "); remove it, or give [data] cache another path");
}

class FileCacheNode : public DatasetNode {
 public:
  FileCacheNode(Dataset input, std::string path, std::string key)
      : input_(std::move(input)), path_(std::move(path)), key_(std::move(key)) {}
  std::int64_t cardinality() const override { return input_.cardinality(); }
  std::string name() const override { return "cache"; }

  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const FileCacheNode> n, std::int64_t epoch)
          : n_(std::move(n)), epoch_(epoch) {
        if (std::filesystem::exists(n_->path_)) {
          reader_ = std::make_unique<io::TfRecordReader>(n_->path_);
          if (!n_->key_.empty()) check_key(*reader_, n_->path_, n_->key_);
        } else {
          input_ = n_->input_.make_iterator(epoch_);
          writer_ = std::make_unique<io::TfRecordWriter>(n_->path_);
          if (!n_->key_.empty()) writer_->write(std::string(kKeyMagic) + n_->key_);
        }
      }

      bool next(Element& out) override {
        if (reader_) {
          std::string record;
          try {
            if (!reader_->next(record)) return false;
          } catch (const io::IoError& e) {
            throw DataError("cache", e.what());
          }
          StateReader r(record);
          out = r.tensors();
          return true;
        }
        if (!input_->next(out)) {
          if (writer_) {
            try {
              writer_->close();  // the complete pass becomes the cache
            } catch (const io::IoError& e) {
              writer_.reset();
              throw DataError("cache", e.what());
            }
            writer_.reset();
          }
          return false;
        }
        if (writer_) {
          StateWriter w;
          w.tensors(out);
          try {
            writer_->write(w.bytes());
            ++written_;
          } catch (const io::IoError& e) {
            writer_.reset();  // drops the temporary file; the pass goes on uncached
            throw DataError("cache", e.what());
          }
        }
        return true;
      }

      // 1: reading the cache at an offset; 2: writing it, with the elements written so far;
      // 0: a pass that goes on uncached (its write failed; also, before 2 was saved, any writer).
      void save(StateWriter& w) override {
        w.tag("file_cache");
        w.u64(reader_ ? 1 : writer_ ? 2 : 0);
        if (reader_) {
          w.u64(reader_->offset());
          return;
        }
        if (writer_) w.u64(written_);
        input_->save(w);
      }

      void restore(StateReader& r) override {
        r.expect_tag("file_cache");
        const std::uint64_t mode = r.u64();
        if (mode == 1) {
          if (!std::filesystem::exists(n_->path_)) {
            throw DataError("cache",
                            n_->path_ + ": the saved iterator read this cache file, which is gone");
          }
          input_.reset();
          writer_.reset();
          reader_ = std::make_unique<io::TfRecordReader>(n_->path_);
          if (!n_->key_.empty()) check_key(*reader_, n_->path_, n_->key_);
          reader_->seek(r.u64());
          return;
        }
        reader_.reset();
        writer_.reset();
        if (mode == 2 && !std::filesystem::exists(n_->path_)) {
          // Mid-way through the writing pass, whose partial file died with its process: the cache
          // is written whole by this epoch's pass again, then read from where it was. Finished
          // uncached, the next pass wrote it in its own epoch's order, and every later epoch
          // replayed another order than an uninterrupted run's.
          const std::uint64_t done = r.u64();
          // The input's saved state follows; read past it (what comes after belongs to stages
          // beside this one, a zip's other inputs).
          n_->input_.make_iterator(epoch_)->restore(r);
          write_whole_pass();
          reader_ = std::make_unique<io::TfRecordReader>(n_->path_);
          if (!n_->key_.empty()) check_key(*reader_, n_->path_, n_->key_);
          std::string record;
          for (std::uint64_t i = 0; i < done && reader_->next(record); ++i) {
          }
          input_.reset();
          return;
        }
        if (mode == 2) r.u64();  // the file is there (written since): finish reading the input
        input_ = n_->input_.make_iterator(epoch_);
        input_->restore(r);
      }

      void stats(std::vector<StageStats>& out) const override {
        if (input_) input_->stats(out);
      }

     private:
      // The cache file from a whole pass of this epoch (published only when complete).
      void write_whole_pass() {
        auto pass = n_->input_.make_iterator(epoch_);
        io::TfRecordWriter writer(n_->path_);
        try {
          if (!n_->key_.empty()) writer.write(std::string(kKeyMagic) + n_->key_);
          for (;;) {
            Element e;
            try {
              if (!pass->next(e)) break;
            } catch (const DataError&) {
              continue;  // the pass that is replayed went on past it (ignore_errors after this)
            }
            StateWriter w;
            w.tensors(e);
            writer.write(w.bytes());
          }
          writer.close();
        } catch (const io::IoError& e) {
          throw DataError("cache", e.what());
        }
      }

      std::shared_ptr<const FileCacheNode> n_;
      std::int64_t epoch_;
      std::uint64_t written_ = 0;
      std::unique_ptr<Iterator> input_;
      std::unique_ptr<io::TfRecordWriter> writer_;
      std::unique_ptr<io::TfRecordReader> reader_;
    };
    return std::make_unique<It>(self<FileCacheNode>(), epoch);
  }

 private:
  Dataset input_;
  std::string path_;
  std::string key_;
};

}  // namespace

Dataset Dataset::cache(const std::string& path, const std::string& key) const {
  if (path.empty()) return cache();
  return Dataset(std::make_shared<FileCacheNode>(*this, path, key));
}

}  // namespace hpm::data
