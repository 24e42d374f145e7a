// The conformance suite every dataset op passes (tf.data's DatasetOpsTestBase, in spirit):
// get-next order, cardinality, end-of-sequence stickiness, and save/restore at breakpoints
// 0, 1, 5 and the last element giving exactly the remaining elements.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "hpm/data/dataset.h"

namespace hpm::data {
namespace {

// An element flattened for comparison: shapes and values of every component.
std::vector<double> flat(const Element& e) {
  std::vector<double> v;
  for (const auto& t : e) {
    v.push_back(static_cast<double>(t.dim()) + 1000.0);
    for (auto d : t.shape().dims()) v.push_back(static_cast<double>(d));
    if (t.dtype() == DType::F32) {
      for (float x : t.to_vector()) v.push_back(x);
    } else {
      for (auto x : t.to_vector_i64()) v.push_back(static_cast<double>(x));
    }
  }
  return v;
}

using Seq = std::vector<std::vector<double>>;

Seq drain(Iterator& it, std::int64_t limit = -1) {
  Seq out;
  Element e;
  while ((limit < 0 || static_cast<std::int64_t>(out.size()) < limit) && it.next(e))
    out.push_back(flat(e));
  return out;
}

Seq all(const Dataset& d) {
  auto it = d.make_iterator();
  return drain(*it);
}

Seq scalars(std::vector<double> v) {
  Seq s;
  for (double x : v) s.push_back({1000.0, x});
  return s;
}

std::vector<double> iota(double from, double to, double step = 1) {
  std::vector<double> v;
  for (double x = from; x < to; x += step) v.push_back(x);
  return v;
}

struct Case {
  std::string name;
  std::function<Dataset()> make;
  Seq expected;  // empty: compare with a second fresh run (determinism) only
  std::int64_t expected_cardinality = kUnknown;
};

Dataset slow_double() {
  return Dataset::range(0, 23).map(
      [](Element e) {
        const auto v = e[0].to_vector_i64()[0];
        return Element{Tensor::from_i64(std::vector<std::int64_t>{2 * v}, Shape{})};
      },
      MapOptions{3, true});
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"range", [] { return Dataset::range(0, 12); }, scalars(iota(0, 12)), 12});
  c.push_back({"range_step", [] { return Dataset::range(10, 0, -3); }, scalars({10, 7, 4, 1}), 4});
  c.push_back({"slices",
               [] {
                 return Dataset::from_tensor_slices({Tensor::from({1, 2, 3, 4, 5, 6}, {3, 2})});
               },
               {{1001, 2, 1, 2}, {1001, 2, 3, 4}, {1001, 2, 5, 6}},
               3});
  c.push_back({"generator",
               [] {
                 return Dataset::from_generator(
                     [](std::int64_t i, Element& out) {
                       if (i >= 9) return false;
                       out = {Tensor::scalar(static_cast<float>(i * i))};
                       return true;
                     },
                     9);
               },
               scalars({0, 1, 4, 9, 16, 25, 36, 49, 64}), 9});
  c.push_back({"map_sequential",
               [] {
                 return Dataset::range(0, 8).map(
                     [](Element e) { return Element{Tensor::scalar(e[0].item() + 0.5f)}; });
               },
               scalars(iota(0.5, 8.5)), 8});
  c.push_back({"map_parallel_deterministic", slow_double, scalars(iota(0, 46, 2)), 23});
  c.push_back({"filter",
               [] {
                 return Dataset::range(0, 15).filter(
                     [](const Element& e) { return e[0].to_vector_i64()[0] % 3 == 0; });
               },
               scalars({0, 3, 6, 9, 12})});
  c.push_back({"shuffle", [] { return Dataset::range(0, 30).shuffle(7, 3); }, {}, 30});
  c.push_back({"batch",
               [] { return Dataset::range(0, 10).batch(4); },
               {{1001, 4, 0, 1, 2, 3}, {1001, 4, 4, 5, 6, 7}, {1001, 2, 8, 9}},
               3});
  c.push_back({"batch_drop",
               [] { return Dataset::range(0, 10).batch(4, true); },
               {{1001, 4, 0, 1, 2, 3}, {1001, 4, 4, 5, 6, 7}},
               2});
  c.push_back({"padded_batch",
               [] {
                 return Dataset::range(1, 5)
                     .map([](Element e) {
                       const auto n = e[0].to_vector_i64()[0];
                       return Element{Tensor::full({n}, static_cast<float>(n))};
                     })
                     .padded_batch(2, -1.0f);
               },
               {{1002, 2, 2, 1, -1, 2, 2}, {1002, 2, 4, 3, 3, 3, -1, 4, 4, 4, 4}},
               2});
  c.push_back(
      {"unbatch", [] { return Dataset::range(0, 7).batch(3).unbatch(); }, scalars(iota(0, 7))});
  c.push_back({"repeat", [] { return Dataset::range(0, 3).repeat(3); },
               scalars({0, 1, 2, 0, 1, 2, 0, 1, 2}), 9});
  c.push_back({"repeat_infinite_take", [] { return Dataset::range(0, 4).repeat().take(10); },
               scalars({0, 1, 2, 3, 0, 1, 2, 3, 0, 1}), 10});
  c.push_back({"stretches", [] { return Dataset::range(0, 4).stretches(6); },
               scalars({0, 1, 2, 3, 0, 1}), 6});
  c.push_back({"stretches_of_unknown_length",
               [] {
                 return Dataset::range(0, 9)
                     .filter([](const Element& e) { return e[0].to_vector_i64()[0] % 4 == 0; })
                     .stretches(4);
               },
               scalars({0, 4, 8, 0}), 4});
  c.push_back({"take", [] { return Dataset::range(0, 10).take(4); }, scalars({0, 1, 2, 3}), 4});
  c.push_back({"skip", [] { return Dataset::range(0, 10).skip(7); }, scalars({7, 8, 9}), 3});
  c.push_back(
      {"shard", [] { return Dataset::range(0, 11).shard(3, 1); }, scalars({1, 4, 7, 10}), 4});
  c.push_back({"enumerate",
               [] { return Dataset::range(5, 8).enumerate(); },
               {{1000, 0, 1000, 5}, {1000, 1, 1000, 6}, {1000, 2, 1000, 7}},
               3});
  c.push_back({"zip",
               [] {
                 return Dataset::zip({Dataset::range(0, 5), Dataset::range(10, 13)});
               },
               {{1000, 0, 1000, 10}, {1000, 1, 1000, 11}, {1000, 2, 1000, 12}},
               3});
  c.push_back({"cache", [] { return Dataset::range(0, 6).cache(); }, scalars(iota(0, 6)), 6});
  c.push_back(
      {"prefetch", [] { return Dataset::range(0, 13).prefetch(3); }, scalars(iota(0, 13)), 13});
  c.push_back({"ignore_errors",
               [] {
                 return Dataset::from_generator([](std::int64_t i, Element& out) {
                          if (i >= 10) return false;
                          if (i % 4 == 1)
                            throw std::runtime_error("corrupt record " + std::to_string(i));
                          out = {Tensor::scalar(static_cast<float>(i))};
                          return true;
                        })
                     .ignore_errors();
               },
               scalars({0, 2, 3, 4, 6, 7, 8})});
  // An input that fails advances the others with it: after the skipped element, the partners are
  // those of one index again (they were one off from then on).
  c.push_back({"zip_ignore_errors",
               [] {
                 return Dataset::zip({Dataset::from_generator([](std::int64_t i, Element& out) {
                                        if (i >= 6) return false;
                                        if (i == 2) throw std::runtime_error("corrupt record 2");
                                        out = {Tensor::scalar(static_cast<float>(i))};
                                        return true;
                                      }),
                                      Dataset::range(100, 106)})
                     .ignore_errors();
               },
               {{1000, 0, 1000, 100},
                {1000, 1, 1000, 101},
                {1000, 3, 1000, 103},
                {1000, 4, 1000, 104},
                {1000, 5, 1000, 105}}});
  // An element unbatch refuses (components of unequal rows) is skipped whole.
  c.push_back(
      {"unbatch_ignore_errors",
       [] {
         return Dataset::range(0, 3)
             .map([](Element e) {
               const auto i = e[0].to_vector_i64()[0];
               const std::int64_t rows = i == 1 ? 3 : 2;
               std::vector<std::int64_t> a(2, 10 * i),
                   b(static_cast<std::size_t>(rows), 10 * i + 1);
               return Element{Tensor::from_i64(a, {2}), Tensor::from_i64(b, {rows})};
             })
             .unbatch()
             .ignore_errors();
       },
       {{1000, 0, 1000, 1}, {1000, 0, 1000, 1}, {1000, 20, 1000, 21}, {1000, 20, 1000, 21}}});
  c.push_back({"interleave",
               [] {
                 return Dataset::range(0, 4).interleave(
                     [](const Element& e) {
                       const auto k = e[0].to_vector_i64()[0];
                       return Dataset::range(10 * k, 10 * k + k + 1);
                     },
                     2, 2);
               },
               scalars({0, 10, 11, 20, 21, 22, 30, 31, 32, 33})});
  c.push_back({"interleave_parallel",
               [] {
                 return Dataset::range(0, 5).interleave(
                     [](const Element& e) {
                       const auto k = e[0].to_vector_i64()[0];
                       return Dataset::range(100 * k, 100 * k + 3);
                     },
                     3, 1, 3);
               },
               scalars({0, 100, 200, 1, 101, 201, 2, 102, 202, 300, 400, 301, 401, 302, 402})});
  c.push_back({"pipeline",
               [] {
                 return Dataset::range(0, 40)
                     .shuffle(8, 11)
                     .map(
                         [](Element e) {
                           return Element{
                               Tensor::scalar(static_cast<float>(e[0].to_vector_i64()[0]))};
                         },
                         MapOptions{2, true})
                     .batch(3)
                     .prefetch(2);
               },
               {},
               14});
  return c;
}

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, GetNextOrderAndCardinality) {
  const Case& c = GetParam();
  const Dataset d = c.make();
  const Seq got = all(d);
  if (!c.expected.empty()) {
    EXPECT_EQ(got, c.expected);
  } else {
    EXPECT_EQ(got, all(c.make())) << "not deterministic";
  }
  if (c.expected_cardinality != kUnknown) {
    EXPECT_EQ(d.cardinality(), c.expected_cardinality);
    EXPECT_EQ(static_cast<std::int64_t>(got.size()), c.expected_cardinality);
  }
}

TEST_P(Conformance, EndOfSequenceIsSticky) {
  auto it = GetParam().make().make_iterator();
  drain(*it);
  Element e;
  EXPECT_FALSE(it->next(e));
  EXPECT_FALSE(it->next(e));
}

TEST_P(Conformance, SaveRestoreAtBreakpoints) {
  const Case& c = GetParam();
  const Seq full = all(c.make());
  const auto n = static_cast<std::int64_t>(full.size());
  for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, n - 1, n}) {
    if (k < 0 || k > n) continue;
    SCOPED_TRACE("breakpoint " + std::to_string(k));
    auto it = c.make().make_iterator();
    const Seq head = drain(*it, k);
    ASSERT_EQ(static_cast<std::int64_t>(head.size()), k);
    StateWriter w;
    it->save(w);
    // The original continues unaffected by having been saved...
    const Seq rest_original = drain(*it);
    // ...and a fresh iterator of a freshly built pipeline, restored, yields the same remainder.
    auto restored = c.make().make_iterator();
    StateReader r(w.bytes());
    restored->restore(r);
    EXPECT_TRUE(r.at_end());
    const Seq rest = drain(*restored);
    EXPECT_EQ(rest, Seq(full.begin() + k, full.end()));
    EXPECT_EQ(rest_original, rest);
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, Conformance, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Stretch k of a dataset reshuffled each pass is elements k*n .. k*n+n-1 of its repetition,
// whether the stretches are made in order (continuing one iterator), out of order, or restored.
TEST(Dataset, StretchesCutTheRepeatedSequence) {
  const Dataset epochs = Dataset::range(0, 10).shuffle(10, 5);
  const Seq repeated = all(epochs.repeat(4));
  const Dataset stretches = epochs.stretches(7);
  EXPECT_EQ(stretches.cardinality(), 7);
  Seq in_order;
  for (std::int64_t k = 0; k < 5; ++k) {
    auto it = stretches.make_iterator(k);
    const Seq part = drain(*it);
    ASSERT_EQ(part.size(), 7u) << k;
    in_order.insert(in_order.end(), part.begin(), part.end());
  }
  EXPECT_EQ(in_order, Seq(repeated.begin(), repeated.begin() + 35));
  for (std::int64_t k : {3, 1, 4, 0}) {  // out of order: each starts its pass and skips
    auto it = Dataset::range(0, 10).shuffle(10, 5).stretches(7).make_iterator(k);
    EXPECT_EQ(drain(*it), Seq(repeated.begin() + 7 * k, repeated.begin() + 7 * k + 7)) << k;
  }
}

TEST(Dataset, StretchesOfNothingFailAtTheFirstElement) {
  auto it = Dataset::range(0, 0).stretches(3).make_iterator(2);
  Element e;
  EXPECT_THROW(it->next(e), DataError);
  EXPECT_THROW(Dataset::range(0, 3).stretches(0), std::invalid_argument);
}

TEST(Dataset, ShuffleIsAPermutationAndReshufflesPerEpoch) {
  const Dataset d = Dataset::range(0, 50).shuffle(10, 5);
  Seq e0 = all(d), e1;
  {
    auto it = d.make_iterator(1);
    e1 = drain(*it);
  }
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, scalars(iota(0, 50)));
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, scalars(iota(0, 50)));
  EXPECT_EQ(e1, e0);
  const Dataset fixed = Dataset::range(0, 50).shuffle(10, 5, false);
  auto a = fixed.make_iterator(0), b = fixed.make_iterator(1);
  EXPECT_EQ(drain(*a), drain(*b));
}

TEST(Dataset, ErrorsReachTheConsumerWithTheirOrigin) {
  const Dataset d = Dataset::range(0, 6).map(
      [](Element e) {
        if (e[0].to_vector_i64()[0] == 3) throw std::runtime_error("bad pixel");
        return e;
      },
      MapOptions{2, true});
  auto it = d.make_iterator();
  Element e;
  std::vector<std::int64_t> got;
  int errors = 0;
  for (;;) {
    try {
      if (!it->next(e)) break;
      got.push_back(e[0].to_vector_i64()[0]);
    } catch (const DataError& err) {
      ++errors;
      EXPECT_EQ(err.origin(), "map");
      EXPECT_NE(std::string(err.what()).find("bad pixel"), std::string::npos) << err.what();
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(got, (std::vector<std::int64_t>{0, 1, 2, 4, 5}));
}

TEST(Dataset, NonDeterministicMapYieldsEveryElement) {
  const Dataset d = Dataset::range(0, 100).map([](Element e) { return e; }, MapOptions{4, false});
  Seq s = all(d);
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, scalars(iota(0, 100)));
}

TEST(Dataset, CacheServesLaterPassesWithoutTheInput) {
  int calls = 0;
  const Dataset d = Dataset::from_generator([&](std::int64_t i, Element& out) {
                      if (i >= 5) return false;
                      ++calls;
                      out = {Tensor::scalar(static_cast<float>(i))};
                      return true;
                    }).cache();
  EXPECT_EQ(all(d), scalars(iota(0, 5)));
  EXPECT_EQ(all(d), scalars(iota(0, 5)));
  EXPECT_EQ(calls, 5);
}

// A position in a pass served from the cache restores in a new process (a restart from a backup of
// a later epoch), whose cache is not filled yet: it is filled again by the pass that filled it,
// here epoch 0's order of a shuffle that reshuffles each epoch. It was refused: such a backup
// could never be resumed.
TEST(Dataset, APositionInTheCacheRestoresInANewProcess) {
  const auto pipeline = [] { return Dataset::range(0, 8).shuffle(8, 3).cache(); };
  const Dataset d = pipeline();
  const Seq first = drain(*d.make_iterator(0));
  auto it = d.make_iterator(1);
  const Seq head = drain(*it, 3);
  StateWriter w;
  it->save(w);
  const Seq rest = drain(*it);
  ASSERT_EQ(head.size() + rest.size(), first.size());
  EXPECT_NE(drain(*Dataset::range(0, 8).shuffle(8, 3).make_iterator(1)), first)
      << "epoch 1's own order differs, so the refill must use epoch 0's";

  const Dataset fresh = pipeline();  // another process: nothing cached
  auto restored = fresh.make_iterator(1);
  StateReader r(w.bytes());
  restored->restore(r);
  EXPECT_EQ(drain(*restored), rest);
  EXPECT_EQ(drain(*fresh.make_iterator(2)), first);
}

// A restart mid-way through the pass that writes a cache file (the partial file died with its
// process) writes it whole from that epoch's pass: every later epoch replays the order an
// uninterrupted run's cache holds. The restored pass went on uncached, and the next pass wrote the
// file in its own epoch's order.
TEST(Dataset, AFileCacheRestoredMidWriteHoldsTheSameEpochsOrder) {
  const auto path = [](const char* name) {
    const std::string p = (std::filesystem::temp_directory_path() /
                           ("hpm-cache-" + std::to_string(::getpid()) + name))
                              .string();
    std::filesystem::remove(p);
    return p;
  };
  const std::string straight = path("-straight"), resumed = path("-resumed");
  // Inside a zip, whose other input's state follows the cache's in the saved bytes (the CLI's
  // TFRecord pipeline zips the cached elements with a random stream).
  const auto pipeline = [](const std::string& file) {
    return Dataset::zip(
        {Dataset::range(0, 8).shuffle(8, 3).cache(file, "k=1\n"), Dataset::range(100, 108)});
  };
  const Dataset reference = pipeline(straight);
  std::vector<Seq> epochs;
  for (std::int64_t e = 0; e < 3; ++e) epochs.push_back(drain(*reference.make_iterator(e)));

  StateWriter w;
  {
    auto it = pipeline(resumed).make_iterator(0);
    ASSERT_EQ(drain(*it, 3), Seq(epochs[0].begin(), epochs[0].begin() + 3));
    it->save(w);
  }  // the process dies: its partial file with it
  ASSERT_FALSE(std::filesystem::exists(resumed));
  const Dataset again = pipeline(resumed);
  auto it = again.make_iterator(0);
  StateReader r(w.bytes());
  it->restore(r);
  EXPECT_EQ(drain(*it), Seq(epochs[0].begin() + 3, epochs[0].end()));
  EXPECT_EQ(drain(*again.make_iterator(1)), epochs[1]);
  EXPECT_EQ(drain(*again.make_iterator(2)), epochs[2]);
  std::filesystem::remove(straight);
  std::filesystem::remove(resumed);
}

TEST(Dataset, FileCacheIsWrittenOnlyByACompletePass) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("hpm-cache-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(path);
  int calls = 0;
  const Dataset d = Dataset::from_generator([&](std::int64_t i, Element& out) {
                      if (i >= 6) return false;
                      ++calls;
                      out = {Tensor::scalar(static_cast<float>(i)),
                             Tensor::from_i64(std::vector<std::int64_t>{i}, {1})};
                      return true;
                    }).cache(path);
  {
    // An interrupted first pass leaves no cache file behind.
    auto it = d.make_iterator();
    Element e;
    ASSERT_TRUE(it->next(e));
    ASSERT_TRUE(it->next(e));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  const Seq first = all(d);
  EXPECT_TRUE(std::filesystem::exists(path));
  const int calls_after_first = calls;
  EXPECT_EQ(all(d), first);
  EXPECT_EQ(calls, calls_after_first) << "the second pass must come from the file";
  // Save and restore while reading the cache.
  auto it = d.make_iterator();
  Element e;
  ASSERT_TRUE(it->next(e));
  ASSERT_TRUE(it->next(e));
  StateWriter w;
  it->save(w);
  auto restored = d.make_iterator();
  StateReader r(w.bytes());
  restored->restore(r);
  EXPECT_EQ(drain(*restored), Seq(first.begin() + 2, first.end()));
  // A corrupted cache file is reported, not trusted.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  auto bad = d.make_iterator();
  EXPECT_THROW(drain(*bad), DataError);
  std::filesystem::remove(path);
}

TEST(Dataset, RestoringIntoADifferentPipelineFails) {
  auto it = Dataset::range(0, 5).batch(2).make_iterator();
  StateWriter w;
  it->save(w);
  auto other = Dataset::range(0, 5).shuffle(2, 1).make_iterator();
  StateReader r(w.bytes());
  EXPECT_THROW(other->restore(r), DataError);
  StateReader truncated(std::string_view(w.bytes()).substr(0, 5));
  auto same = Dataset::range(0, 5).batch(2).make_iterator();
  EXPECT_THROW(same->restore(truncated), DataError);
}

TEST(Dataset, InvalidArgumentsAreRejected) {
  EXPECT_THROW(Dataset::range(0, 5).batch(0), std::invalid_argument);
  EXPECT_THROW(Dataset::range(0, 5).shard(2, 2), std::invalid_argument);
  EXPECT_THROW(Dataset::range(0, 5).shuffle(0, 1), std::invalid_argument);
  EXPECT_THROW(Dataset::range(0, 5).map([](Element e) { return e; }, MapOptions{0, true}),
               std::invalid_argument);
  EXPECT_THROW(Dataset::range(0, 5, 0), std::invalid_argument);
}

}  // namespace
}  // namespace hpm::data
