// Sequential transformations: filter, shuffle, batch, padded_batch, unbatch, repeat, take, skip,
// shard, enumerate, cache (memory) and ignore_errors. Each iterator owns its input's iterator and
// saves its own state followed by its input's.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "fusion.h"
#include "hpm/data/dataset.h"
#include "hpm/tensor/random.h"
#include "stack.h"

namespace hpm::data {

namespace {

// A transformation of one input dataset; the iterator class does the work.
template <typename ItT, typename... Args>
class UnaryNode : public DatasetNode {
 public:
  UnaryNode(Dataset input, std::string name, std::int64_t (*card)(std::int64_t, const UnaryNode&),
            Args... args)
      : input_(std::move(input)), name_(std::move(name)), card_(card), args_(args...) {}
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    return std::apply(
        [&](const Args&... a) {
          return std::make_unique<ItT>(input_.make_iterator(epoch), epoch, a...);
        },
        args_);
  }
  std::int64_t cardinality() const override { return card_(input_.cardinality(), *this); }
  std::string name() const override { return name_; }
  const std::tuple<Args...>& args() const { return args_; }

 private:
  Dataset input_;
  std::string name_;
  std::int64_t (*card_)(std::int64_t, const UnaryNode&);
  std::tuple<Args...> args_;
};

std::int64_t same(std::int64_t c, const auto&) { return c; }
std::int64_t unknown_unless_infinite(std::int64_t c, const auto&) {
  return c == kInfinite ? kInfinite : kUnknown;
}

// Base for iterators that wrap one input iterator.
class WrappingIterator : public Iterator {
 public:
  explicit WrappingIterator(std::unique_ptr<Iterator> input) : input_(std::move(input)) {}
  void stats(std::vector<StageStats>& out) const override { input_->stats(out); }

 protected:
  std::unique_ptr<Iterator> input_;
};

// ---- filter --------------------------------------------------------------------------------

class FilterIt : public WrappingIterator {
 public:
  FilterIt(std::unique_ptr<Iterator> in, std::int64_t, PredicateFn p)
      : WrappingIterator(std::move(in)), pred_(std::move(p)) {}
  bool next(Element& out) override {
    while (input_->next(out)) {
      bool keep = false;
      try {
        keep = pred_(out);
      } catch (const std::exception& e) {
        throw DataError("filter", e.what());
      }
      if (keep) return true;
    }
    return false;
  }
  void save(StateWriter& w) override {
    w.tag("filter");
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("filter");
    input_->restore(r);
  }

 private:
  PredicateFn pred_;
};

// ---- shuffle -------------------------------------------------------------------------------

class ShuffleIt : public WrappingIterator {
 public:
  ShuffleIt(std::unique_ptr<Iterator> in, std::int64_t epoch, std::int64_t buffer,
            std::uint64_t seed, bool reshuffle)
      : WrappingIterator(std::move(in)),
        buffer_size_(buffer),
        gen_(seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(reshuffle ? epoch : 0) +
             0x5eed) {}
  bool next(Element& out) override {
    // Keep the buffer full: each output is drawn uniformly from the buffer and replaced by the
    // next input element.
    while (!input_done_ && static_cast<std::int64_t>(buffer_.size()) < buffer_size_) {
      Element e;
      if (!input_->next(e)) {
        input_done_ = true;
        break;
      }
      buffer_.push_back(std::move(e));
    }
    if (buffer_.empty()) return false;
    const std::size_t k = gen_.below(buffer_.size());
    out = std::move(buffer_[k]);
    buffer_[k] = std::move(buffer_.back());
    buffer_.pop_back();
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("shuffle");
    const Generator::State st = gen_.state();
    for (auto v : st.s) w.u64(v);
    w.u64(input_done_);
    w.u64(buffer_.size());
    for (const auto& e : buffer_) w.tensors(e);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("shuffle");
    Generator::State st;
    for (auto& v : st.s) v = r.u64();
    gen_.set_state(st);
    input_done_ = r.u64() != 0;
    buffer_.resize(r.u64());
    for (auto& e : buffer_) e = r.tensors();
    input_->restore(r);
  }

 private:
  std::int64_t buffer_size_;
  Generator gen_;
  bool input_done_ = false;
  std::vector<Element> buffer_;
};

// ---- batch ---------------------------------------------------------------------------------

class BatchIt : public WrappingIterator {
 public:
  BatchIt(std::unique_ptr<Iterator> in, std::int64_t, std::int64_t n, bool drop, bool pad,
          float pad_value)
      : WrappingIterator(std::move(in)), n_(n), drop_(drop), pad_(pad), pad_value_(pad_value) {}
  bool next(Element& out) override {
    std::vector<Element> items;
    Element e;
    while (static_cast<std::int64_t>(items.size()) < n_ && input_->next(e)) items.push_back(e);
    if (items.empty() || (drop_ && static_cast<std::int64_t>(items.size()) < n_)) return false;
    out.clear();
    const char* stage = pad_ ? "padded_batch" : "batch";
    for (std::size_t c = 0; c < items[0].size(); ++c) {
      for (const auto& it : items)
        if (it.size() != items[0].size()) throw DataError(stage, "elements have different arity");
      out.push_back(stack_component(items, c, pad_, pad_value_, stage));
    }
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("batch");
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("batch");
    input_->restore(r);
  }

 private:
  std::int64_t n_;
  bool drop_, pad_;
  float pad_value_;
};

class UnbatchIt : public WrappingIterator {
 public:
  UnbatchIt(std::unique_ptr<Iterator> in, std::int64_t) : WrappingIterator(std::move(in)) {}
  bool next(Element& out) override {
    while (current_.empty() || pos_ >= current_[0].size(0)) {
      // Checked before it is taken: a rejected element that ignore_errors skips must not be
      // unbatched after all (its rows came out, then an error ignore_errors did not catch).
      Element next;
      current_.clear();
      pos_ = 0;
      if (!input_->next(next)) return false;
      for (const auto& t : next) {
        if (t.dim() == 0 || t.size(0) != next[0].size(0)) {
          throw DataError("unbatch", "components need a common first dimension");
        }
      }
      current_ = std::move(next);
    }
    out.clear();
    for (const auto& t : current_) {
      std::vector<std::int64_t> dims(t.shape().dims().begin() + 1, t.shape().dims().end());
      out.push_back(t.narrow(pos_, 1).reshape(Shape(dims)));
    }
    ++pos_;
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("unbatch");
    w.tensors(current_);
    w.i64(pos_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("unbatch");
    current_ = r.tensors();
    pos_ = r.i64();
    input_->restore(r);
  }

 private:
  Element current_;
  std::int64_t pos_ = 0;
};

// ---- repeat, take, skip, shard, enumerate --------------------------------------------------

class RepeatNode : public DatasetNode {
 public:
  RepeatNode(Dataset input, std::int64_t count) : input_(std::move(input)), count_(count) {}
  std::int64_t cardinality() const override {
    const std::int64_t c = input_.cardinality();
    if (count_ == kInfinite) return c == 0 ? 0 : kInfinite;
    return c < 0 ? c : c * count_;
  }
  std::string name() const override { return "repeat"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const RepeatNode> n, std::int64_t base) : n_(std::move(n)), base_(base) {
        if (n_->count_ != 0) input_ = n_->input_.make_iterator(base_);
      }
      bool next(Element& out) override {
        while (input_) {
          if (input_->next(out)) {
            produced_in_pass_ = true;
            return true;
          }
          ++pass_;
          // An empty input would loop forever under an infinite repeat.
          if ((n_->count_ != kInfinite && pass_ >= n_->count_) || !produced_in_pass_) {
            input_.reset();
            return false;
          }
          produced_in_pass_ = false;
          input_ = n_->input_.make_iterator(base_ + pass_);
        }
        return false;
      }
      void save(StateWriter& w) override {
        w.tag("repeat");
        w.i64(pass_);
        w.u64(input_ != nullptr);
        w.u64(produced_in_pass_);
        if (input_) input_->save(w);
      }
      void restore(StateReader& r) override {
        r.expect_tag("repeat");
        pass_ = r.i64();
        const bool live = r.u64() != 0;
        produced_in_pass_ = r.u64() != 0;
        input_.reset();
        if (live) {
          input_ = n_->input_.make_iterator(base_ + pass_);
          input_->restore(r);
        }
      }
      void stats(std::vector<StageStats>& out) const override {
        if (input_) input_->stats(out);
      }

     private:
      std::shared_ptr<const RepeatNode> n_;
      std::int64_t base_, pass_ = 0;
      bool produced_in_pass_ = false;
      std::unique_ptr<Iterator> input_;
    };
    return std::make_unique<It>(self<std::remove_cvref_t<decltype(*this)>>(), epoch);
  }

 private:
  Dataset input_;
  std::int64_t count_;
};

class TakeIt : public WrappingIterator {
 public:
  TakeIt(std::unique_ptr<Iterator> in, std::int64_t, std::int64_t count)
      : WrappingIterator(std::move(in)), left_(count) {}
  bool next(Element& out) override {
    if (left_ == 0) return false;
    if (!input_->next(out)) return false;
    if (left_ > 0) --left_;
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("take");
    w.i64(left_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("take");
    left_ = r.i64();
    input_->restore(r);
  }

 private:
  std::int64_t left_;  // negative: unlimited
};

class SkipIt : public WrappingIterator {
 public:
  SkipIt(std::unique_ptr<Iterator> in, std::int64_t, std::int64_t count)
      : WrappingIterator(std::move(in)), to_skip_(count) {}
  bool next(Element& out) override {
    while (to_skip_ > 0) {
      if (!input_->next(out)) return false;
      --to_skip_;
    }
    return input_->next(out);
  }
  void save(StateWriter& w) override {
    w.tag("skip");
    w.i64(to_skip_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("skip");
    to_skip_ = r.i64();
    input_->restore(r);
  }

 private:
  std::int64_t to_skip_;
};

class ShardIt : public WrappingIterator {
 public:
  ShardIt(std::unique_ptr<Iterator> in, std::int64_t, std::int64_t num, std::int64_t index)
      : WrappingIterator(std::move(in)), num_(num), index_(index) {}
  bool next(Element& out) override {
    Element e;
    while (input_->next(e)) {
      const std::int64_t k = seen_++;
      if (k % num_ == index_) {
        out = std::move(e);
        return true;
      }
    }
    return false;
  }
  void save(StateWriter& w) override {
    w.tag("shard");
    w.i64(seen_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("shard");
    seen_ = r.i64();
    input_->restore(r);
  }

 private:
  std::int64_t num_, index_, seen_ = 0;
};

class EnumerateIt : public WrappingIterator {
 public:
  EnumerateIt(std::unique_ptr<Iterator> in, std::int64_t, std::int64_t start)
      : WrappingIterator(std::move(in)), next_index_(start) {}
  bool next(Element& out) override {
    Element e;
    if (!input_->next(e)) return false;
    out.clear();
    out.push_back(Tensor::from_i64(std::vector<std::int64_t>{next_index_++}, Shape{}));
    out.insert(out.end(), e.begin(), e.end());
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("enumerate");
    w.i64(next_index_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("enumerate");
    next_index_ = r.i64();
    input_->restore(r);
  }

 private:
  std::int64_t next_index_;
};

class IgnoreErrorsIt : public WrappingIterator {
 public:
  IgnoreErrorsIt(std::unique_ptr<Iterator> in, std::int64_t) : WrappingIterator(std::move(in)) {}
  bool next(Element& out) override {
    for (;;) {
      try {
        return input_->next(out);
      } catch (const DataError&) {
        ++skipped_;
      }
    }
  }
  void save(StateWriter& w) override {
    w.tag("ignore_errors");
    w.i64(skipped_);
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("ignore_errors");
    skipped_ = r.i64();
    input_->restore(r);
  }
  void stats(std::vector<StageStats>& out) const override {
    input_->stats(out);
    StageStats s;
    s.name = "ignore_errors";
    s.errors_skipped = skipped_;
    out.push_back(s);
  }

 private:
  std::int64_t skipped_ = 0;
};

// ---- cache (memory) ------------------------------------------------------------------------

// The first pass that runs to the end publishes its elements; later iterators replay them without
// touching the input. A pass that stops early publishes nothing.
class CacheNode : public DatasetNode {
 public:
  explicit CacheNode(Dataset input) : input_(std::move(input)) {}
  std::int64_t cardinality() const override { return input_.cardinality(); }
  std::string name() const override { return "cache"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const CacheNode> n, std::int64_t epoch) : n_(std::move(n)), epoch_(epoch) {
        std::lock_guard lock(n_->mu_);
        cached_ = n_->filled_ ? n_->store_ : nullptr;
        if (!cached_) input_ = n_->input_.make_iterator(epoch_);
      }
      bool next(Element& out) override {
        if (cached_) {
          if (pos_ >= static_cast<std::int64_t>(cached_->size())) return false;
          out = (*cached_)[static_cast<std::size_t>(pos_++)];
          return true;
        }
        if (!input_->next(out)) {
          std::lock_guard lock(n_->mu_);
          if (!n_->filled_) {
            n_->store_ = std::make_shared<const std::vector<Element>>(std::move(pending_));
            n_->filled_ = true;
            n_->fill_epoch_ = epoch_;
          }
          return false;
        }
        pending_.push_back(out);
        return true;
      }
      void save(StateWriter& w) override {
        w.tag("cache");
        // 2: from the cache, with the epoch whose pass filled it (1, from before that was saved:
        // the position alone); 0: still filling.
        w.u64(cached_ != nullptr ? 2 : 0);
        if (cached_) {
          std::lock_guard lock(n_->mu_);
          w.i64(n_->fill_epoch_);
          w.i64(pos_);
          return;
        }
        w.u64(pending_.size());
        for (const auto& e : pending_) w.tensors(e);
        input_->save(w);
      }
      void restore(StateReader& r) override {
        r.expect_tag("cache");
        const std::uint64_t from_cache = r.u64();
        if (from_cache != 0) {
          const std::int64_t fill_epoch = from_cache == 2 ? r.i64() : -1;
          std::lock_guard lock(n_->mu_);
          if (!n_->filled_ && fill_epoch >= 0) {
            // A new process (a restart from a backup of a later epoch): the cache is filled again
            // by the pass that filled it, so the restored position means the same elements. It
            // was refused, and such a backup could never be resumed.
            auto refill = n_->input_.make_iterator(fill_epoch);
            std::vector<Element> all;
            for (;;) {
              Element e;
              try {
                if (!refill->next(e)) break;
              } catch (const DataError&) {
                continue;  // the filling pass went on past it (ignore_errors after this stage)
              }
              all.push_back(std::move(e));
            }
            n_->store_ = std::make_shared<const std::vector<Element>>(std::move(all));
            n_->filled_ = true;
            n_->fill_epoch_ = fill_epoch;
          }
          if (!n_->filled_) {
            throw DataError(
                "cache",
                "the saved iterator read from a filled cache, which this process does not have");
          }
          cached_ = n_->store_;
          input_.reset();
          pos_ = r.i64();
          return;
        }
        cached_ = nullptr;
        pending_.resize(r.u64());
        for (auto& e : pending_) e = r.tensors();
        input_ = n_->input_.make_iterator(epoch_);
        input_->restore(r);
      }
      void stats(std::vector<StageStats>& out) const override {
        if (input_) input_->stats(out);
      }

     private:
      std::shared_ptr<const CacheNode> n_;
      std::int64_t epoch_;
      std::shared_ptr<const std::vector<Element>> cached_;
      std::unique_ptr<Iterator> input_;
      std::vector<Element> pending_;
      std::int64_t pos_ = 0;
    };
    return std::make_unique<It>(self<std::remove_cvref_t<decltype(*this)>>(), epoch);
  }

 private:
  Dataset input_;
  mutable std::mutex mu_;
  mutable bool filled_ = false;
  mutable std::int64_t fill_epoch_ = 0;  // the epoch of the pass that filled store_
  mutable std::shared_ptr<const std::vector<Element>> store_;
};

template <typename ItT, typename... Args>
Dataset unary(const Dataset& in, const char* name,
              std::int64_t (*card)(std::int64_t, const UnaryNode<ItT, Args...>&), Args... args) {
  return Dataset(std::make_shared<UnaryNode<ItT, Args...>>(in, name, card, args...));
}

}  // namespace

Dataset Dataset::filter(PredicateFn predicate) const {
  return unary<FilterIt, PredicateFn>(*this, "filter", unknown_unless_infinite,
                                      std::move(predicate));
}

Dataset Dataset::shuffle(std::int64_t buffer_size, std::uint64_t seed, bool reshuffle) const {
  if (buffer_size <= 0) throw std::invalid_argument("shuffle: buffer_size must be positive");
  return unary<ShuffleIt, std::int64_t, std::uint64_t, bool>(*this, "shuffle", same, buffer_size,
                                                             seed, reshuffle);
}

Dataset Dataset::batch(std::int64_t n, bool drop_remainder) const {
  if (n <= 0) throw std::invalid_argument("batch: batch_size must be positive");
  if (auto fused = fuse_map_and_batch(*node_, n, drop_remainder)) return *fused;
  using N = UnaryNode<BatchIt, std::int64_t, bool, bool, float>;
  return unary<BatchIt, std::int64_t, bool, bool, float>(
      *this, "batch",
      +[](std::int64_t c, const N& node) -> std::int64_t {
        if (c < 0) return c;
        const auto& [bn, drop, pad, value] = node.args();
        return drop ? c / bn : (c + bn - 1) / bn;
      },
      n, drop_remainder, false, 0.0f);
}

Dataset Dataset::padded_batch(std::int64_t n, float padding_value, bool drop_remainder) const {
  if (n <= 0) throw std::invalid_argument("padded_batch: batch_size must be positive");
  using N = UnaryNode<BatchIt, std::int64_t, bool, bool, float>;
  return unary<BatchIt, std::int64_t, bool, bool, float>(
      *this, "padded_batch",
      +[](std::int64_t c, const N& node) -> std::int64_t {
        if (c < 0) return c;
        const auto& [bn, drop, pad, value] = node.args();
        return drop ? c / bn : (c + bn - 1) / bn;
      },
      n, drop_remainder, true, padding_value);
}

Dataset Dataset::unbatch() const {
  return unary<UnbatchIt>(*this, "unbatch", unknown_unless_infinite);
}

Dataset Dataset::repeat(std::int64_t count) const {
  if (count < kInfinite) throw std::invalid_argument("repeat: count must be >= 0 or kInfinite");
  return Dataset(std::make_shared<RepeatNode>(*this, count));
}

Dataset Dataset::take(std::int64_t count) const {
  using N = UnaryNode<TakeIt, std::int64_t>;
  return unary<TakeIt, std::int64_t>(
      *this, "take",
      +[](std::int64_t c, const N& node) -> std::int64_t {
        const std::int64_t k = std::get<0>(node.args());
        if (k < 0) return c;
        if (c == kInfinite) return k;
        return c < 0 ? c : std::min(c, k);
      },
      count);
}

Dataset Dataset::skip(std::int64_t count) const {
  using N = UnaryNode<SkipIt, std::int64_t>;
  return unary<SkipIt, std::int64_t>(
      *this, "skip",
      +[](std::int64_t c, const N& node) -> std::int64_t {
        return c < 0 ? c : std::max<std::int64_t>(0, c - std::get<0>(node.args()));
      },
      count);
}

Dataset Dataset::shard(std::int64_t num_shards, std::int64_t index) const {
  if (num_shards <= 0 || index < 0 || index >= num_shards) {
    throw std::invalid_argument("shard: need 0 <= index < num_shards");
  }
  using N = UnaryNode<ShardIt, std::int64_t, std::int64_t>;
  return unary<ShardIt, std::int64_t, std::int64_t>(
      *this, "shard",
      +[](std::int64_t c, const N& node) -> std::int64_t {
        if (c < 0) return c;
        const auto& [num, idx] = node.args();
        return c / num + (idx < c % num ? 1 : 0);
      },
      num_shards, index);
}

Dataset Dataset::enumerate(std::int64_t start) const {
  return unary<EnumerateIt, std::int64_t>(*this, "enumerate", same, start);
}

Dataset Dataset::ignore_errors() const {
  return unary<IgnoreErrorsIt>(*this, "ignore_errors", unknown_unless_infinite);
}

Dataset Dataset::cache() const { return Dataset(std::make_shared<CacheNode>(*this)); }

}  // namespace hpm::data
