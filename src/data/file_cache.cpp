// cache(path): elements as TFRecord-framed records (each element's tensors serialized with the
// iterator-state writer), so the file is checksummed record by record.
#include <filesystem>

#include "hpm/data/dataset.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

namespace {

class FileCacheNode : public DatasetNode {
 public:
  FileCacheNode(Dataset input, std::string path)
      : input_(std::move(input)), path_(std::move(path)) {}
  std::int64_t cardinality() const override { return input_.cardinality(); }
  std::string name() const override { return "cache"; }

  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const FileCacheNode> n, std::int64_t epoch)
          : n_(std::move(n)), epoch_(epoch) {
        if (std::filesystem::exists(n_->path_)) {
          reader_ = std::make_unique<io::TfRecordReader>(n_->path_);
        } else {
          input_ = n_->input_.make_iterator(epoch_);
          writer_ = std::make_unique<io::TfRecordWriter>(n_->path_);
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
          } catch (const io::IoError& e) {
            writer_.reset();  // drops the temporary file; the pass goes on uncached
            throw DataError("cache", e.what());
          }
        }
        return true;
      }

      void save(StateWriter& w) override {
        w.tag("file_cache");
        w.u64(reader_ != nullptr);
        if (reader_) {
          w.u64(reader_->offset());
          return;
        }
        input_->save(w);
      }

      void restore(StateReader& r) override {
        r.expect_tag("file_cache");
        const bool reading = r.u64() != 0;
        if (reading) {
          if (!std::filesystem::exists(n_->path_)) {
            throw DataError("cache",
                            n_->path_ + ": the saved iterator read this cache file, which is gone");
          }
          input_.reset();
          writer_.reset();
          reader_ = std::make_unique<io::TfRecordReader>(n_->path_);
          reader_->seek(r.u64());
          return;
        }
        // Mid-way through the writing pass: the partial file died with its process, so finish the
        // pass uncached; a later pass writes the cache.
        reader_.reset();
        writer_.reset();
        input_ = n_->input_.make_iterator(epoch_);
        input_->restore(r);
      }

      void stats(std::vector<StageStats>& out) const override {
        if (input_) input_->stats(out);
      }

     private:
      std::shared_ptr<const FileCacheNode> n_;
      std::int64_t epoch_;
      std::unique_ptr<Iterator> input_;
      std::unique_ptr<io::TfRecordWriter> writer_;
      std::unique_ptr<io::TfRecordReader> reader_;
    };
    return std::make_unique<It>(self<FileCacheNode>(), epoch);
  }

 private:
  Dataset input_;
  std::string path_;
};

}  // namespace

Dataset Dataset::cache(const std::string& path) const {
  if (path.empty()) return cache();
  return Dataset(std::make_shared<FileCacheNode>(*this, path));
}

}  // namespace hpm::data
