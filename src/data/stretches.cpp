// Dataset::stretches: a repeated dataset cut into fixed-length stretches (training by steps).
#include <mutex>
#include <stdexcept>

#include "hpm/data/dataset.h"

namespace hpm::data {

namespace {

// Where the repeated sequence stands: pass `pass` of the input, `index` elements into it.
struct Position {
  std::int64_t pass = 0, index = 0;
};

class StretchNode : public DatasetNode {
 public:
  StretchNode(Dataset input, std::int64_t steps) : input_(std::move(input)), steps_(steps) {}
  std::int64_t cardinality() const override { return steps_; }
  std::string name() const override { return "stretches"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t stretch) const override;

  // The iterator of the stretch that ended last, kept for the one after it: reading stretches in
  // order never repeats a pass's work.
  struct Parked {
    std::int64_t stretch = -1;
    Position at;
    std::unique_ptr<Iterator> it;
  };
  void park(Parked p) const {
    std::lock_guard<std::mutex> lock(mu_);
    parked_ = std::move(p);
  }
  Parked take_parked(std::int64_t stretch) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (parked_.stretch != stretch) return {};
    return std::exchange(parked_, Parked{});
  }
  // Elements per pass: the input's cardinality, or counted once by reading a pass.
  std::int64_t pass_length() const {
    const std::int64_t known = input_.cardinality();
    if (known >= 0) return known;
    std::lock_guard<std::mutex> lock(mu_);
    if (counted_ < 0) {
      if (known == kInfinite) {
        throw DataError("stretches", "the input is infinite: its passes have no end to repeat");
      }
      auto it = input_.make_iterator(0);
      Element e;
      std::int64_t n = 0;
      while (it->next(e)) ++n;
      counted_ = n;
    }
    return counted_;
  }
  const Dataset& input() const { return input_; }
  std::int64_t steps() const { return steps_; }

 private:
  Dataset input_;
  std::int64_t steps_;
  mutable std::mutex mu_;
  mutable Parked parked_;
  mutable std::int64_t counted_ = -1;
};

class StretchIt : public Iterator {
 public:
  StretchIt(std::shared_ptr<const StretchNode> node, std::int64_t stretch)
      : node_(std::move(node)), stretch_(stretch), left_(node_->steps()) {
    StretchNode::Parked p = node_->take_parked(stretch);
    if (p.it) {
      at_ = p.at;
      it_ = std::move(p.it);
    }
  }
  ~StretchIt() override {
    if (left_ == 0 && it_) node_->park({stretch_ + 1, at_, std::move(it_)});
  }

  bool next(Element& out) override {
    if (left_ == 0) return false;
    if (!it_) seek();
    while (true) {
      if (it_->next(out)) {
        ++at_.index;
        --left_;
        return true;
      }
      if (at_.index == 0) {
        throw DataError("stretches", "the input yields no element: there is nothing to repeat");
      }
      ++at_.pass;
      at_.index = 0;
      it_ = node_->input().make_iterator(at_.pass);
    }
  }
  void save(StateWriter& w) override {
    if (!it_) seek();  // a state names a pass and its iterator's place in it
    w.tag("stretches");
    w.i64(at_.pass);
    w.i64(at_.index);
    w.i64(left_);
    it_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("stretches");
    at_.pass = r.i64();
    at_.index = r.i64();
    left_ = r.i64();
    if (at_.pass < 0 || at_.index < 0 || left_ < 0 || left_ > node_->steps()) {
      throw DataError("stretches", "the saved position is not one of this dataset");
    }
    it_ = node_->input().make_iterator(at_.pass);
    it_->restore(r);
  }
  void stats(std::vector<StageStats>& out) const override {
    if (it_) it_->stats(out);
  }

 private:
  // Starts the stretch's pass and skips to its first element (a stretch made out of order).
  void seek() {
    const std::int64_t length = node_->pass_length();
    if (length == 0) {
      throw DataError("stretches", "the input yields no element: there is nothing to repeat");
    }
    const std::int64_t first = stretch_ * node_->steps();
    at_ = {first / length, 0};
    it_ = node_->input().make_iterator(at_.pass);
    Element skipped;
    for (const std::int64_t skip = first % length; at_.index < skip; ++at_.index) {
      if (!it_->next(skipped)) {
        throw DataError("stretches", "a pass of the input ended after " +
                                         std::to_string(at_.index) + " elements, not the " +
                                         std::to_string(length) + " it counts");
      }
    }
  }

  std::shared_ptr<const StretchNode> node_;
  std::int64_t stretch_, left_;
  Position at_;
  std::unique_ptr<Iterator> it_;
};

std::unique_ptr<Iterator> StretchNode::make_iterator(std::int64_t stretch) const {
  return std::make_unique<StretchIt>(self<StretchNode>(), stretch);
}

}  // namespace

Dataset Dataset::stretches(std::int64_t steps) const {
  if (steps <= 0) {
    throw std::invalid_argument("Dataset::stretches: steps must be positive, got " +
                                std::to_string(steps));
  }
  return Dataset(std::make_shared<StretchNode>(*this, steps));
}

}  // namespace hpm::data
