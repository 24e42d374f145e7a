#include "hpm/data/file_sources.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "hpm/data/input_pipeline.h"

namespace hpm::data {
namespace {

using hpm::testing::TempDir;

// Writes `n` Examples {image: bytes of i repeated 4 times, label: i} to `path`.
void write_examples(const std::string& path, int first, int n,
                    io::Compression c = io::Compression::None) {
  io::TfRecordWriter w(path, c);
  for (int i = first; i < first + n; ++i) {
    io::Example ex;
    ex["image"] = io::Feature::of_bytes({std::string(4, static_cast<char>(i))});
    ex["label"] = io::Feature::of_ints({i});
    w.write(io::encode_example(ex));
  }
  w.close();
}

std::vector<io::FeatureSpec> specs() {
  return {io::FixedLenFeature{"image", io::Feature::Bytes, Shape{}, std::nullopt},
          io::FixedLenFeature{"label", io::Feature::Int64, Shape{}, std::nullopt}};
}

std::vector<std::int64_t> labels_of(Iterator& it) {
  std::vector<std::int64_t> out;
  Element e;
  while (it.next(e)) out.push_back(e[1].to_vector_i64()[0]);
  return out;
}

TEST(FileSources, TfRecordExamplesParseInOrder) {
  TempDir dir;
  write_examples(dir / "a.tfrecord", 0, 5);
  write_examples(dir / "b.tfrecord.gz", 5, 3, io::Compression::Gzip);
  auto it = tfrecord_dataset({dir / "a.tfrecord"}).map(parse_example_fn(specs())).make_iterator();
  Element e;
  ASSERT_TRUE(it->next(e));
  EXPECT_EQ(tensor_bytes(e[0]), std::string(4, '\0'));
  EXPECT_EQ(labels_of(*it), (std::vector<std::int64_t>{1, 2, 3, 4}));
  auto gz = tfrecord_dataset({dir / "b.tfrecord.gz"}, io::Compression::Gzip)
                .map(parse_example_fn(specs()))
                .make_iterator();
  EXPECT_EQ(labels_of(*gz), (std::vector<std::int64_t>{5, 6, 7}));
}

TEST(FileSources, ResumesMidFile) {
  TempDir dir;
  write_examples(dir / "a.tfrecord", 0, 4);
  write_examples(dir / "b.tfrecord", 4, 4);
  const Dataset d =
      tfrecord_dataset({dir / "a.tfrecord", dir / "b.tfrecord"}).map(parse_example_fn(specs()));
  for (int k : {0, 1, 3, 4, 6, 8}) {
    auto it = d.make_iterator();
    Element e;
    for (int i = 0; i < k; ++i) ASSERT_TRUE(it->next(e));
    StateWriter w;
    it->save(w);
    auto restored = d.make_iterator();
    StateReader r(w.bytes());
    restored->restore(r);
    std::vector<std::int64_t> expect;
    for (int i = k; i < 8; ++i) expect.push_back(i);
    EXPECT_EQ(labels_of(*restored), expect) << "breakpoint " << k;
  }
}

TEST(FileSources, CorruptRecordNamesFileAndOffsetAndIgnoreErrorsSkipsIt) {
  TempDir dir;
  const std::string path = dir / "c.tfrecord";
  write_examples(path, 0, 4);
  // Flip a byte inside the second record's data: its data CRC no longer matches.
  const auto size = std::filesystem::file_size(path);
  const std::uint64_t record = size / 4;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(record + 14));
    f.put('\x55');
  }
  auto it = tfrecord_dataset({path}).map(parse_example_fn(specs())).make_iterator();
  Element e;
  ASSERT_TRUE(it->next(e));
  try {
    it->next(e);
    FAIL() << "expected a DataError";
  } catch (const DataError& err) {
    EXPECT_EQ(err.origin(), "tfrecord");
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("byte " + std::to_string(record)), std::string::npos)
        << err.what();
  }
  auto skipping =
      tfrecord_dataset({path}).ignore_errors().map(parse_example_fn(specs())).make_iterator();
  EXPECT_EQ(labels_of(*skipping), (std::vector<std::int64_t>{0, 2, 3}));
  std::vector<StageStats> stats;
  skipping->stats(stats);
  std::int64_t skipped = 0;
  for (const auto& s : stats) skipped += s.errors_skipped;
  EXPECT_EQ(skipped, 1);
}

TEST(FileSources, ListFilesInterleave) {
  TempDir dir;
  write_examples(dir / "part-0.tfrecord", 0, 3);
  write_examples(dir / "part-1.tfrecord", 10, 3);
  const Dataset d = list_files(dir / "part-*.tfrecord")
                        .interleave([](const Element& p) { return tfrecord_from_path(p); }, 2, 1, 2)
                        .map(parse_example_fn(specs()));
  auto it = d.make_iterator();
  EXPECT_EQ(labels_of(*it), (std::vector<std::int64_t>{0, 10, 1, 11, 2, 12}));
  EXPECT_THROW(list_files(dir / "nothing-*"), std::invalid_argument);
}

TEST(FileSources, TextLinesAndCsv) {
  TempDir dir;
  std::ofstream(dir / "lines.txt") << "alpha\r\nbeta\ngamma";
  auto lines = text_line_dataset({dir / "lines.txt"}).make_iterator();
  Element e;
  std::vector<std::string> got;
  while (lines->next(e)) got.push_back(tensor_bytes(e[0]));
  EXPECT_EQ(got, (std::vector<std::string>{"alpha", "beta", "gamma"}));

  std::ofstream(dir / "t.csv") << "x,name,y\n1.5,\"a, b\",3\n2.5,c,4\n";
  io::CsvOptions o;
  o.types = {io::ColumnType::F32, io::ColumnType::String, io::ColumnType::I64};
  const Dataset csv = csv_dataset(dir / "t.csv", o);
  auto it = csv.make_iterator();
  ASSERT_TRUE(it->next(e));
  EXPECT_FLOAT_EQ(e[0].item(), 1.5f);
  EXPECT_EQ(tensor_bytes(e[1]), "a, b");
  EXPECT_EQ(e[2].to_vector_i64()[0], 3);
  StateWriter w;
  it->save(w);
  auto restored = csv.make_iterator();
  StateReader r(w.bytes());
  restored->restore(r);
  ASSERT_TRUE(restored->next(e));
  EXPECT_FLOAT_EQ(e[0].item(), 2.5f);
  EXPECT_FALSE(restored->next(e));
}

// A bad row that ignore_errors skipped counts as read: a restore continues after it. It was not
// counted, so the row after it came again; and a row of the wrong field count before the save
// made the restore itself fail.
TEST(FileSources, CsvResumesPastRowsIgnoreErrorsSkipped) {
  TempDir dir;
  std::ofstream(dir / "bad.csv") << "x\n1\nabc\n3\n2,2\n4\n5\n";
  io::CsvOptions o;
  o.types = {io::ColumnType::I64};
  const Dataset csv = csv_dataset(dir / "bad.csv", o).ignore_errors();
  auto it = csv.make_iterator();
  Element e;
  ASSERT_TRUE(it->next(e));
  EXPECT_EQ(e[0].to_vector_i64()[0], 1);
  ASSERT_TRUE(it->next(e));
  EXPECT_EQ(e[0].to_vector_i64()[0], 3);
  ASSERT_TRUE(it->next(e));  // past "2,2"
  EXPECT_EQ(e[0].to_vector_i64()[0], 4);
  StateWriter w;
  it->save(w);
  auto restored = csv.make_iterator();
  StateReader r(w.bytes());
  restored->restore(r);
  std::vector<std::int64_t> rest;
  while (restored->next(e)) rest.push_back(e[0].to_vector_i64()[0]);
  EXPECT_EQ(rest, (std::vector<std::int64_t>{5}));
}

// shuffle_buffer = -1 over TFRecord files: the files shuffled and the records through a buffer of
// kTfRecordShuffleBuffer (not the whole decoded set, which would sit in memory and in every
// mid-epoch backup). Every record once an epoch, and not in file order.
TEST(FileSources, TfRecordPipelineShufflesThroughABoundedBufferForMinusOne) {
  TempDir dir;
  constexpr int kRecords = 20000;
  write_examples(dir / "all.tfrecord", 0, kRecords);
  InputPipelineSpec spec;
  spec.shuffle_buffer = -1;
  spec.seed = 7;
  spec.batch_size = 100;
  spec.prefetch = 0;
  spec.parallel_calls = 1;
  auto it = build_tfrecord_input_pipeline(dir / "all.tfrecord", io::Compression::None, spec)
                .make_iterator();
  Element batch;
  ASSERT_TRUE(it->next(batch));
  const std::vector<std::int64_t> first = batch[1].to_vector_i64();
  EXPECT_LT(*std::max_element(first.begin(), first.end()), kTfRecordShuffleBuffer + 100);
  EXPECT_FALSE(std::is_sorted(first.begin(), first.end()));
  std::vector<bool> seen(kRecords);
  int records = 0;
  do {
    for (std::int64_t label : batch[1].to_vector_i64()) {
      ASSERT_FALSE(seen.at(static_cast<std::size_t>(label))) << label;
      seen[static_cast<std::size_t>(label)] = true;
      ++records;
    }
  } while (it->next(batch));
  EXPECT_EQ(records, kRecords);
}

}  // namespace
}  // namespace hpm::data
