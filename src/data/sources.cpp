// Source datasets: tensor slices, ranges, generator functions, and zip.
#include <exception>
#include <stdexcept>

#include "hpm/data/dataset.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::data {

namespace {

// Row i of t as a view of shape t.shape()[1:].
Tensor row(const Tensor& t, std::int64_t i) {
  std::vector<std::int64_t> dims(t.shape().dims().begin() + 1, t.shape().dims().end());
  return t.narrow(i, 1).reshape(Shape(dims));
}

class SliceNode : public DatasetNode {
 public:
  explicit SliceNode(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
    if (tensors_.empty()) throw std::invalid_argument("from_tensor_slices: no tensors");
    for (const auto& t : tensors_) {
      if (t.dim() == 0 || t.size(0) != tensors_[0].size(0)) {
        throw std::invalid_argument(
            "from_tensor_slices: every tensor needs the same first dimension");
      }
    }
  }
  std::int64_t cardinality() const override { return tensors_[0].size(0); }
  std::string name() const override { return "from_tensor_slices"; }

  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      explicit It(std::shared_ptr<const SliceNode> n) : n_(std::move(n)) {}
      bool next(Element& out) override {
        if (i_ >= n_->cardinality()) return false;
        out.clear();
        for (const auto& t : n_->tensors_) out.push_back(row(t, i_));
        ++i_;
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("from_tensor_slices");
        w.i64(i_);
      }
      void restore(StateReader& r) override {
        r.expect_tag("from_tensor_slices");
        i_ = r.i64();
      }

     private:
      std::shared_ptr<const SliceNode> n_;
      std::int64_t i_ = 0;
    };
    (void)epoch;
    return std::make_unique<It>(self<std::remove_cvref_t<decltype(*this)>>());
  }

 private:
  std::vector<Tensor> tensors_;
};

class RangeNode : public DatasetNode {
 public:
  RangeNode(std::int64_t start, std::int64_t stop, std::int64_t step)
      : start_(start), stop_(stop), step_(step) {
    if (step == 0) throw std::invalid_argument("range: step must not be 0");
  }
  std::int64_t cardinality() const override {
    if (step_ > 0) return stop_ > start_ ? (stop_ - start_ + step_ - 1) / step_ : 0;
    return start_ > stop_ ? (start_ - stop_ - step_ - 1) / -step_ : 0;
  }
  std::string name() const override { return "range"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      explicit It(std::shared_ptr<const RangeNode> n) : n_(std::move(n)) {}
      bool next(Element& out) override {
        if (k_ >= n_->cardinality()) return false;
        const std::int64_t v = n_->start_ + k_ * n_->step_;
        out = {Tensor::from_i64(std::vector<std::int64_t>{v}, Shape{})};
        ++k_;
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("range");
        w.i64(k_);
      }
      void restore(StateReader& r) override {
        r.expect_tag("range");
        k_ = r.i64();
      }

     private:
      std::shared_ptr<const RangeNode> n_;
      std::int64_t k_ = 0;
    };
    (void)epoch;
    return std::make_unique<It>(self<std::remove_cvref_t<decltype(*this)>>());
  }

 private:
  std::int64_t start_, stop_, step_;
};

// (epoch, index, out): from_generator's functions ignore the epoch.
using GeneratorFn = std::function<bool(std::int64_t, std::int64_t, Element&)>;

class GeneratorNode : public DatasetNode {
 public:
  GeneratorNode(GeneratorFn fn, std::int64_t cardinality)
      : fn_(std::move(fn)), card_(cardinality) {}
  std::int64_t cardinality() const override { return card_; }
  std::string name() const override { return "from_generator"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const GeneratorNode> n, std::int64_t epoch)
          : n_(std::move(n)), epoch_(epoch) {}
      bool next(Element& out) override {
        if (done_) return false;
        out.clear();
        const std::int64_t i = i_++;  // advance first: a throwing call skips its index
        trace::Span span("read", "extract");
        bool more = false;
        try {
          more = n_->fn_(epoch_, i, out);
        } catch (const DataError&) {
          throw;
        } catch (const std::exception& e) {
          throw DataError("from_generator", "element " + std::to_string(i) + ": " + e.what());
        }
        if (!more) done_ = true;
        return more;
      }
      void save(StateWriter& w) override {
        w.tag("from_generator");
        w.i64(i_);
        w.u64(done_);
      }
      void restore(StateReader& r) override {
        r.expect_tag("from_generator");
        i_ = r.i64();
        done_ = r.u64() != 0;
      }

     private:
      std::shared_ptr<const GeneratorNode> n_;
      std::int64_t epoch_;
      std::int64_t i_ = 0;
      bool done_ = false;
    };
    return std::make_unique<It>(self<std::remove_cvref_t<decltype(*this)>>(), epoch);
  }

 private:
  GeneratorFn fn_;
  std::int64_t card_;
};

class ZipNode : public DatasetNode {
 public:
  explicit ZipNode(std::vector<Dataset> inputs) : inputs_(std::move(inputs)) {
    if (inputs_.empty()) throw std::invalid_argument("zip: no datasets");
  }
  std::int64_t cardinality() const override {
    std::int64_t c = kInfinite;
    for (const auto& d : inputs_) {
      const std::int64_t k = d.cardinality();
      if (k == kUnknown) return kUnknown;
      if (k != kInfinite) c = c == kInfinite ? k : std::min(c, k);
    }
    return c;
  }
  std::string name() const override { return "zip"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(const ZipNode* n, std::int64_t epoch) {
        for (const auto& d : n->inputs_) its_.push_back(d.make_iterator(epoch));
      }
      // Every input advances, even past one that fails: after an error that ignore_errors skips,
      // the next elements are partners again (they were one off from then on: every later image
      // with the previous one's label).
      bool next(Element& out) override {
        out.clear();
        Element part;
        std::exception_ptr failed;
        bool ended = false;
        for (auto& it : its_) {
          try {
            if (!it->next(part)) {
              ended = true;
              break;
            }
            out.insert(out.end(), part.begin(), part.end());
          } catch (...) {
            if (!failed) failed = std::current_exception();
          }
        }
        if (ended) return false;
        if (failed) std::rethrow_exception(failed);
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("zip");
        for (auto& it : its_) it->save(w);
      }
      void restore(StateReader& r) override {
        r.expect_tag("zip");
        for (auto& it : its_) it->restore(r);
      }
      void stats(std::vector<StageStats>& out) const override {
        for (const auto& it : its_) it->stats(out);
      }

     private:
      std::vector<std::unique_ptr<Iterator>> its_;
    };
    return std::make_unique<It>(this, epoch);
  }

 private:
  std::vector<Dataset> inputs_;
};

class RandomNode : public DatasetNode {
 public:
  explicit RandomNode(std::uint64_t seed) : seed_(seed) {}
  std::int64_t cardinality() const override { return kInfinite; }
  std::string name() const override { return "random"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      explicit It(std::uint64_t seed) : gen_(seed) {}
      bool next(Element& out) override {
        out = {Tensor::from_i64(
            std::vector<std::int64_t>{static_cast<std::int64_t>(gen_.next_u64() >> 1)}, Shape{})};
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("random");
        for (auto v : gen_.state().s) w.u64(v);
      }
      void restore(StateReader& r) override {
        r.expect_tag("random");
        Generator::State st;
        for (auto& v : st.s) v = r.u64();
        gen_.set_state(st);
      }

     private:
      Generator gen_;
    };
    return std::make_unique<It>(seed_ * 0x9e3779b97f4a7c15ULL +
                                static_cast<std::uint64_t>(epoch) * 0xbf58476d1ce4e5b9ULL + 1);
  }

 private:
  std::uint64_t seed_;
};

class BatchedSlicesNode : public DatasetNode {
 public:
  BatchedSlicesNode(std::vector<Tensor> tensors, std::int64_t batch, bool shuffle,
                    std::uint64_t seed, bool drop)
      : tensors_(std::move(tensors)), batch_(batch), shuffle_(shuffle), seed_(seed), drop_(drop) {
    if (batch <= 0) throw std::invalid_argument("batched_slices: batch_size must be positive");
    if (tensors_.empty()) throw std::invalid_argument("batched_slices: no tensors");
    for (const auto& t : tensors_) {
      if (t.dim() == 0 || t.size(0) != tensors_[0].size(0)) {
        throw std::invalid_argument("batched_slices: every tensor needs the same first dimension");
      }
    }
  }
  std::int64_t rows() const { return tensors_[0].size(0); }
  std::int64_t cardinality() const override {
    return drop_ ? rows() / batch_ : (rows() + batch_ - 1) / batch_;
  }
  std::string name() const override { return "batched_slices"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const BatchedSlicesNode> n, std::int64_t epoch) : n_(std::move(n)) {
        order_.resize(static_cast<std::size_t>(n_->rows()));
        for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::int64_t>(i);
        if (n_->shuffle_) {
          // Fisher-Yates from (seed, epoch): a pure function, so resuming needs only the position.
          Generator gen(n_->seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch) + 1);
          for (std::size_t i = order_.size(); i > 1; --i)
            std::swap(order_[i - 1], order_[gen.below(i)]);
        }
      }
      bool next(Element& out) override {
        if (pos_ >= n_->cardinality()) return false;
        const std::int64_t begin = pos_ * n_->batch_;
        const std::int64_t end = std::min(begin + n_->batch_, n_->rows());
        const std::vector<std::int64_t> idx(order_.begin() + begin, order_.begin() + end);
        out.clear();
        for (const auto& t : n_->tensors_) out.push_back(kernels::index_select0(t, idx));
        ++pos_;
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("batched_slices");
        w.i64(pos_);
      }
      void restore(StateReader& r) override {
        r.expect_tag("batched_slices");
        pos_ = r.i64();
      }

     private:
      std::shared_ptr<const BatchedSlicesNode> n_;
      std::vector<std::int64_t> order_;
      std::int64_t pos_ = 0;
    };
    return std::make_unique<It>(self<BatchedSlicesNode>(), epoch);
  }

 private:
  std::vector<Tensor> tensors_;
  std::int64_t batch_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_;
};

}  // namespace

Dataset Dataset::batched_slices(std::vector<Tensor> tensors, std::int64_t batch_size, bool shuffle,
                                std::uint64_t seed, bool drop_remainder) {
  return Dataset(std::make_shared<BatchedSlicesNode>(std::move(tensors), batch_size, shuffle, seed,
                                                     drop_remainder));
}

Dataset Dataset::random(std::uint64_t seed) { return Dataset(std::make_shared<RandomNode>(seed)); }

Dataset Dataset::from_tensor_slices(std::vector<Tensor> tensors) {
  return Dataset(std::make_shared<SliceNode>(std::move(tensors)));
}

Dataset Dataset::range(std::int64_t start, std::int64_t stop, std::int64_t step) {
  return Dataset(std::make_shared<RangeNode>(start, stop, step));
}

Dataset Dataset::from_generator(std::function<bool(std::int64_t index, Element& out)> fn,
                                std::int64_t cardinality) {
  return Dataset(std::make_shared<GeneratorNode>(
      [fn = std::move(fn)](std::int64_t, std::int64_t i, Element& out) { return fn(i, out); },
      cardinality));
}

Dataset Dataset::from_epoch_generator(
    std::function<bool(std::int64_t epoch, std::int64_t index, Element& out)> fn,
    std::int64_t cardinality) {
  return Dataset(std::make_shared<GeneratorNode>(std::move(fn), cardinality));
}

Dataset Dataset::zip(std::vector<Dataset> datasets) {
  return Dataset(std::make_shared<ZipNode>(std::move(datasets)));
}

}  // namespace hpm::data
