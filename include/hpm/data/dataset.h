// The input pipeline, after tf.data: a Dataset is an immutable description of a pipeline (a tree
// of DatasetNodes); an Iterator runs it, holds all mutable state, and can save that state as bytes
// and restore it, so a resumed run sees exactly the elements it would have seen.
//
// Elements are tuples of tensors. An element that fails (a corrupt record, a throwing map
// function) surfaces at the consumer as a DataError naming the stage it came from; the iterator
// stays usable, which is what ignore_errors() builds on.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpm/data/iterator_state.h"
#include "hpm/tensor/tensor.h"

namespace hpm::data {

using Element = std::vector<Tensor>;

class DataError : public std::runtime_error {
 public:
  DataError(const std::string& origin, const std::string& message)
      : std::runtime_error(origin + ": " + message), origin_(origin) {}
  // Re-raises an error whose message already names its origin (crossing a thread boundary).
  DataError(const std::string& origin, const std::string& full_message, bool)
      : std::runtime_error(full_message), origin_(origin) {}
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

constexpr std::int64_t kInfinite = -1;
constexpr std::int64_t kUnknown = -2;
constexpr int kAutotune = -1;

// What AUTOTUNE may spend: threads for parallel stages (the consumer's own thread not counted)
// and bytes of buffered elements across all autotuned stages of the process.
struct AutotuneBudget {
  int cpu = 0;                 // 0: the machine's hardware threads
  std::int64_t ram_bytes = 0;  // 0: half of the memory available when first asked
};
void set_autotune_budget(const AutotuneBudget& budget);
AutotuneBudget autotune_budget();    // with the defaults resolved
std::int64_t autotune_ram_in_use();  // bytes currently reserved by autotuned buffers

// Per-stage measurements, filled by Iterator::stats().
struct StageStats {
  std::string name;
  std::int64_t elements = 0;
  double seconds_per_element = 0;  // wall time inside this stage's work, per element produced
  int parallelism = 1;             // current (AUTOTUNE may change it)
  std::int64_t buffer_size = 0;    // current, for buffering stages
  double buffer_occupancy = 0;     // mean fraction of the buffer full when the consumer asked
  std::int64_t errors_skipped = 0;
  double wait_fraction = 0;  // share of the consumer's time spent waiting on this stage
  bool autotuned = false;
};

class Iterator {
 public:
  virtual ~Iterator() = default;
  // The next element into `out`; false at the end of the sequence. Throws DataError for a bad
  // element, after which the next call continues with the following one.
  virtual bool next(Element& out) = 0;
  // State as bytes; parallel stages finish their in-flight work first.
  virtual void save(StateWriter& w) = 0;
  virtual void restore(StateReader& r) = 0;
  virtual void stats(std::vector<StageStats>& out) const { (void)out; }
  // Starts background work now rather than at the first next() (parallel stages start their
  // threads): interleave warms every dataset it opens, so their slow opens overlap.
  virtual void warm_up() {}
};

// Iterators keep their node alive (shared_from_this), so an iterator may outlive its Dataset.
class DatasetNode : public std::enable_shared_from_this<DatasetNode> {
 public:
  virtual ~DatasetNode() = default;
  // `epoch` counts the passes made so far (repeat() passes its count), so shuffle can draw a new
  // order each pass while staying a pure function of (seed, epoch) for exact resume.
  virtual std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const = 0;
  virtual std::int64_t cardinality() const { return kUnknown; }
  virtual std::string name() const = 0;

 protected:
  template <typename T>
  std::shared_ptr<const T> self() const {
    return std::static_pointer_cast<const T>(shared_from_this());
  }
};

using MapFn = std::function<Element(Element)>;
using PredicateFn = std::function<bool(const Element&)>;

struct MapOptions {
  int num_parallel_calls = 1;  // kAutotune to let the runtime choose
  bool deterministic = true;   // false: elements leave in completion order
};

// A handle on an immutable pipeline; every method returns a new Dataset.
class Dataset;

// A pipeline run alone, as fast as it goes (tf.data's benchmark): what it delivers and where its
// time goes, per stage of the last pass.
struct PipelineThroughput {
  std::int64_t elements = 0;  // rows of the first component of every batch
  std::int64_t batches = 0;
  double seconds = 0;
  std::vector<StageStats> stages;
  double elements_per_s() const {
    return seconds > 0 ? static_cast<double>(elements) / seconds : 0;
  }
};
PipelineThroughput measure_throughput(const Dataset& pipeline, std::int64_t epochs = 1);

class Dataset {
 public:
  Dataset() = default;
  explicit Dataset(std::shared_ptr<const DatasetNode> node) : node_(std::move(node)) {}

  // ---- sources ----
  // Slices of the given tensors along their first dimension (all the same length).
  static Dataset from_tensor_slices(std::vector<Tensor> tensors);
  static Dataset range(std::int64_t start, std::int64_t stop, std::int64_t step = 1);
  // Elements from a function of the index; returns false at the end. Must be deterministic in the
  // index for exact resume.
  static Dataset from_generator(std::function<bool(std::int64_t index, Element& out)> fn,
                                std::int64_t cardinality = kUnknown);
  // The same with the pass (epoch) too: a new sequence each pass, each a pure function of
  // (epoch, index).
  static Dataset from_epoch_generator(
      std::function<bool(std::int64_t epoch, std::int64_t index, Element& out)> fn,
      std::int64_t cardinality = kUnknown);
  static Dataset zip(std::vector<Dataset> datasets);
  // Batches of rows of `tensors` (same first dimension), in a uniformly random order drawn from
  // (seed, epoch) when `shuffle`: what from_tensor_slices(...).shuffle(all).batch(n) means, done
  // as one gather per batch instead of per-element work.
  static Dataset batched_slices(std::vector<Tensor> tensors, std::int64_t batch_size, bool shuffle,
                                std::uint64_t seed, bool drop_remainder);
  // An endless stream of I64 scalars drawn from a generator seeded by (seed, epoch): zip it with
  // a dataset to give every element its own seed for random augmentation (tf.data's
  // Dataset.random), so augmentation in a parallel map is deterministic and resumable.
  static Dataset random(std::uint64_t seed);

  // ---- transformations ----
  Dataset map(MapFn fn, MapOptions options = {}) const;
  // Maps each element to a dataset and mixes their elements: block_length from each of
  // cycle_length open datasets in turn (tf.data's interleave). With num_parallel_calls > 1 or
  // kAutotune, each open dataset is read ahead by its own thread (parallel extraction), the
  // output order staying the deterministic round-robin.
  Dataset interleave(std::function<Dataset(const Element&)> fn, std::int64_t cycle_length,
                     std::int64_t block_length = 1, int num_parallel_calls = 1) const;
  Dataset filter(PredicateFn predicate) const;
  Dataset shuffle(std::int64_t buffer_size, std::uint64_t seed,
                  bool reshuffle_each_iteration = true) const;
  Dataset batch(std::int64_t batch_size, bool drop_remainder = false) const;
  // Pads every component to the largest shape in the batch with `padding_value`.
  Dataset padded_batch(std::int64_t batch_size, float padding_value = 0.0f,
                       bool drop_remainder = false) const;
  Dataset unbatch() const;
  Dataset repeat(std::int64_t count = kInfinite) const;
  Dataset take(std::int64_t count) const;
  // The endless repetition of this dataset (pass p is make_iterator(p), as repeat() makes them)
  // cut into stretches of `steps` elements: make_iterator(k) yields elements k * steps to
  // (k + 1) * steps - 1 of that sequence, and cardinality() is `steps`. Training by steps reads
  // this (Keras' steps_per_epoch over a repeated dataset): the Trainer's epochs are the stretches
  // between evaluations, each a function of its index alone, so a run resumed at any step sees
  // what it would have. Stretches made in order continue one iterator; any other starts its pass
  // and skips to its place. An input of unknown length is counted once, by reading its first pass,
  // and every pass is taken to be that long (a pass that ends sooner is a DataError when skipped
  // through). An input that yields nothing is a DataError at the first next().
  Dataset stretches(std::int64_t steps) const;
  Dataset skip(std::int64_t count) const;
  Dataset shard(std::int64_t num_shards, std::int64_t index) const;
  Dataset enumerate(std::int64_t start = 0) const;  // prepends an I64 scalar index
  Dataset cache() const;                            // in memory, filled by the first pass
  // On disk at `path`: the first complete pass writes `path.tmp.<pid>` and renames it into place
  // only at its end, so a crash leaves nothing a later run trusts; later passes (and later runs)
  // read the file, every record CRC-checked. A pass restored mid-way passes through uncached.
  // A non-empty `key` describes what produced the elements ("name=value" lines: the source, its
  // size and checksum, the settings before the cache); it is the file's first record, and a file
  // written for another key (or without one) is refused, naming the lines that differ.
  Dataset cache(const std::string& path, const std::string& key = "") const;
  Dataset prefetch(std::int64_t buffer_size = kAutotune) const;
  Dataset ignore_errors() const;

  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch = 0) const {
    return node_->make_iterator(epoch);
  }
  std::int64_t cardinality() const { return node_->cardinality(); }
  const std::shared_ptr<const DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const DatasetNode> node_;
};

}  // namespace hpm::data
