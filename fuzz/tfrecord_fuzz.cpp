// TFRecord framing over plain, zlib and gzip streams: every record is read (a data CRC mismatch
// skips one, other errors end the stream), then the reader seeks back to a record boundary it
// reported, as resuming from a checkpoint does.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "hpm/io/tfrecord.h"

using namespace hpm;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static fuzz::InputFile file(".tfrecord");
  // The first byte chooses the compression, so one corpus reaches all three stream readers.
  const io::Compression compression =
      data[0] % 3 == 0 ? io::Compression::None
                       : (data[0] % 3 == 1 ? io::Compression::Zlib : io::Compression::Gzip);
  const std::string& path = file.write(data + 1, size - 1);
  try {
    io::TfRecordReader reader(path, compression);
    std::string record;
    std::vector<std::uint64_t> boundaries;
    for (int i = 0; i < 256; ++i) {
      boundaries.push_back(reader.offset());
      try {
        if (!reader.next(record)) break;
      } catch (const std::exception&) {
      }
    }
    if (boundaries.size() > 1) {
      reader.seek(boundaries[boundaries.size() / 2]);
      reader.next(record);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
