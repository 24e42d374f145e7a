// interleave: block_length elements from each of cycle_length datasets in turn, each dataset made
// by a function of one input element. The parallel form reads every open dataset ahead on its own
// thread (prefetch), which is how slow sources (a 10 ms open, 1 ms per record) overlap.
#include <stdexcept>

#include "hpm/data/dataset.h"

namespace hpm::data {

namespace {

using InterleaveFn = std::function<Dataset(const Element&)>;

class InterleaveNode : public DatasetNode {
 public:
  InterleaveNode(Dataset input, InterleaveFn fn, std::int64_t cycle, std::int64_t block,
                 int parallel)
      : input_(std::move(input)),
        fn_(std::move(fn)),
        cycle_(cycle),
        block_(block),
        parallel_(parallel) {}
  std::string name() const override { return "interleave"; }
  std::int64_t cardinality() const override {
    return input_.cardinality() == kInfinite ? kInfinite : kUnknown;
  }

  Dataset open(const Element& e) const {
    Dataset d;
    try {
      d = fn_(e);
    } catch (const std::exception& ex) {
      throw DataError("interleave", std::string("opening a dataset: ") + ex.what());
    }
    // Two blocks of read-ahead per open dataset keep the round-robin from waiting on any one.
    if (parallel_ == kAutotune || parallel_ > 1) d = d.prefetch(2 * block_);
    return d;
  }

  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    class It : public Iterator {
     public:
      It(std::shared_ptr<const InterleaveNode> n, std::int64_t epoch)
          : n_(std::move(n)), epoch_(epoch), input_(n_->input_.make_iterator(epoch)) {}

      bool next(Element& out) override {
        for (;;) {
          fill_cycle();
          if (slots_.empty()) return false;
          Slot& s = slots_[static_cast<std::size_t>(current_)];
          bool got = false;
          try {
            got = s.it->next(out);
          } catch (const DataError&) {
            advance_block(true);
            throw;
          }
          if (got) {
            advance_block(false);
            return true;
          }
          // This dataset is done: drop it; fill_cycle opens the next one in its place.
          slots_.erase(slots_.begin() + current_);
          block_pos_ = 0;
          if (current_ >= static_cast<std::int64_t>(slots_.size())) current_ = 0;
        }
      }

      void save(StateWriter& w) override {
        w.tag("interleave");
        w.i64(current_);
        w.i64(block_pos_);
        w.u64(input_done_);
        w.u64(slots_.size());
        for (auto& s : slots_) {
          w.tensors(s.source);
          s.it->save(w);
        }
        input_->save(w);
      }

      void restore(StateReader& r) override {
        r.expect_tag("interleave");
        current_ = r.i64();
        block_pos_ = r.i64();
        input_done_ = r.u64() != 0;
        slots_.clear();
        const std::uint64_t n = r.u64();
        for (std::uint64_t i = 0; i < n; ++i) {
          Slot s;
          s.source = r.tensors();
          s.it = n_->open(s.source).make_iterator(epoch_);
          s.it->restore(r);
          slots_.push_back(std::move(s));
        }
        input_->restore(r);
      }

      void stats(std::vector<StageStats>& out) const override {
        input_->stats(out);
        StageStats st;
        st.name = "interleave";
        st.parallelism = static_cast<int>(slots_.size());
        out.push_back(st);
      }

     private:
      struct Slot {
        Element source;  // the input element the dataset was made from (for save/restore)
        std::unique_ptr<Iterator> it;
      };

      void fill_cycle() {
        while (!input_done_ && static_cast<std::int64_t>(slots_.size()) < n_->cycle_) {
          Element e;
          if (!input_->next(e)) {
            input_done_ = true;
            break;
          }
          Slot s;
          s.source = e;
          s.it = n_->open(e).make_iterator(epoch_);
          s.it->warm_up();
          slots_.push_back(std::move(s));
        }
      }

      void advance_block(bool) {
        if (++block_pos_ >= n_->block_) {
          block_pos_ = 0;
          current_ = (current_ + 1) % static_cast<std::int64_t>(slots_.size());
        }
      }

      std::shared_ptr<const InterleaveNode> n_;
      std::int64_t epoch_;
      std::unique_ptr<Iterator> input_;
      std::vector<Slot> slots_;
      std::int64_t current_ = 0, block_pos_ = 0;
      bool input_done_ = false;
    };
    return std::make_unique<It>(self<InterleaveNode>(), epoch);
  }

 private:
  Dataset input_;
  InterleaveFn fn_;
  std::int64_t cycle_, block_;
  int parallel_;
};

}  // namespace

Dataset Dataset::interleave(InterleaveFn fn, std::int64_t cycle_length, std::int64_t block_length,
                            int num_parallel_calls) const {
  if (cycle_length <= 0 || block_length <= 0) {
    throw std::invalid_argument("interleave: cycle_length and block_length must be positive");
  }
  if (num_parallel_calls == 0 || num_parallel_calls < kAutotune) {
    throw std::invalid_argument("interleave: num_parallel_calls must be positive or kAutotune");
  }
  return Dataset(std::make_shared<InterleaveNode>(*this, std::move(fn), cycle_length, block_length,
                                                  num_parallel_calls));
}

}  // namespace hpm::data
