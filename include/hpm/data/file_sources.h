// Datasets over files: TFRecord records, text lines, CSV rows, file lists; and parsing of
// tf.train.Example records. Byte strings travel as 1-D I8 tensors (bytes_tensor / tensor_bytes).
// Every source saves its position (file and record), so resuming mid-file skips nothing and
// repeats nothing; a corrupt record is a DataError naming the file and byte offset.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hpm/data/dataset.h"
#include "hpm/io/csv.h"
#include "hpm/io/example.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

Tensor bytes_tensor(std::string_view bytes);
std::string tensor_bytes(const Tensor& t);

// Paths matching a glob pattern, sorted (none: empty).
std::vector<std::string> glob_paths(const std::string& pattern);
// The first of `b` that is also one of `a` (compared as files: "d/x" and "d/./x" are one), or ""
// when they share none: a test set must be held out of training.
std::string first_shared_file(const std::vector<std::string>& a, const std::vector<std::string>& b);

// Paths matching a glob pattern, sorted; shuffled from (seed, epoch) when `shuffle`.
// Throws std::invalid_argument when nothing matches.
Dataset list_files(const std::string& pattern, bool shuffle = false, std::uint64_t seed = 0);
// One element per record: (record bytes).
Dataset tfrecord_dataset(std::vector<std::string> files,
                         io::Compression compression = io::Compression::None);
// Each element's first component is a path (bytes): one element per record of that file. For
// interleave: list_files(...).interleave(tfrecord_from_path, ...).
Dataset tfrecord_from_path(const Element& path_element,
                           io::Compression compression = io::Compression::None);
// One element per line: (line bytes).
Dataset text_line_dataset(std::vector<std::string> files);
// One element per row, a scalar per column (F32, I64, or bytes for String columns).
Dataset csv_dataset(std::string file, io::CsvOptions options);

// A map function turning (record bytes, ...) into the spec's tensors, in spec order.
MapFn parse_example_fn(std::vector<io::FeatureSpec> specs);

}  // namespace hpm::data
