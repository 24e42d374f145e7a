#include "hpm/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hpm/io/atomic_file.h"

namespace hpm::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts need byte swapping here");

using json = nlohmann::json;

constexpr std::uint64_t kMaxHeaderSize = 100'000'000;  // the limit of the reference reader

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw IoError(path + ": " + msg);
}

std::string shape_str(const std::vector<std::int64_t>& dims) { return Shape(dims).str(); }

const char* json_type(const json& j) {
  if (j.is_number_integer()) return "integer";
  return j.type_name();
}

void put_u64_le(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

std::uint64_t get_u64_le(std::string_view bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]))
         << (8 * i);
  }
  return v;
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> dims;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The header's size from the first 8 bytes (at least 8 given), checked against the limit and
// against the `remaining` bytes that follow them.
std::uint64_t checked_header_size(std::string_view bytes, std::uint64_t remaining,
                                  const std::string& path) {
  if (bytes.size() < 8) {
    fail(path, "file is too short for a safetensors file: expected at least 8 bytes (the header " +
                   std::string("size), found ") + std::to_string(bytes.size()));
  }
  const std::uint64_t header_size = get_u64_le(bytes);
  if (header_size > kMaxHeaderSize) {
    fail(path, "header size " + std::to_string(header_size) + " (u64 at offset 0) exceeds the " +
                   std::to_string(kMaxHeaderSize) + "-byte limit");
  }
  if (header_size > remaining) {
    fail(path, "header size " + std::to_string(header_size) +
                   " (u64 at offset 0) is larger than the file: only " + std::to_string(remaining) +
                   " bytes follow it");
  }
  return header_size;
}

// The header's JSON object, its keys checked for duplicates (the JSON parser would silently keep
// the last one).
json parse_header(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;    // the top-level key (tensor name) being parsed
  std::string duplicate;  // the message for the first duplicate found
  const json::parser_callback_t track = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
    if (ev == json::parse_event_t::object_end) open_objects.pop_back();
    if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (depth == 1) top_key = key;
      if (duplicate.empty() && !open_objects.back().insert(key).second) {
        if (depth == 1) {
          duplicate = "duplicate tensor name '" + key + "' in header";
        } else if (top_key == "__metadata__") {
          duplicate = "duplicate key '" + key + "' in __metadata__";
        } else {
          duplicate = "tensor '" + top_key + "': duplicate key '" + key + "' in its header entry";
        }
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), track);
  } catch (const json::parse_error& ex) {
    std::string what = ex.what();
    if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    const std::uint64_t at = ex.byte > 0 ? ex.byte - 1 : 0;
    fail(path, "header is not valid JSON (error at header byte " + std::to_string(at) +
                   ", file offset " + std::to_string(8 + at) + "): " + what);
  }
  if (!header.is_object()) {
    fail(path, std::string("header is not a JSON object (found ") + json_type(header) + ")");
  }
  if (text.empty() || text.front() != '{') {
    fail(path, "header does not start with '{' at file offset 8");
  }
  if (!duplicate.empty()) fail(path, duplicate);
  return header;
}

// The "__metadata__" object's strings.
std::map<std::string, std::string> metadata_of(const json& value, const std::string& path) {
  if (!value.is_object()) {
    fail(path, std::string("__metadata__ must be an object of strings, found ") + json_type(value));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) {
      fail(path, "__metadata__ value of key '" + k + "' must be a string, found " + json_type(v) +
                     " " + v.dump());
    }
    metadata[k] = v.get<std::string>();
  }
  return metadata;
}

// Parses one tensor's header entry; `where` is "<path>: tensor '<name>'".
Entry parse_entry(const std::string& where, const std::string& name, const json& j) {
  const auto bad = [&](const std::string& msg) { throw IoError(where + ": " + msg); };
  if (!j.is_object()) bad(std::string("entry is not an object (found ") + json_type(j) + ")");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field)) bad(std::string("missing field '") + field + "'");
  }
  Entry e;
  e.name = name;

  const json& dt = j.at("dtype");
  if (!dt.is_string()) {
    bad(std::string("field 'dtype' must be a string, found ") + json_type(dt) + " " + dt.dump());
  }
  try {
    e.dtype = dtype_from_name(dt.get<std::string>());
  } catch (const std::invalid_argument& ex) {
    bad(ex.what());
  }

  const json& sh = j.at("shape");
  if (!sh.is_array()) {
    bad(std::string("field 'shape' must be an array of integers, found ") + json_type(sh) + " " +
        sh.dump());
  }
  for (const json& d : sh) {
    if (!d.is_number_integer()) {
      bad("field 'shape' must be an array of integers, found " + sh.dump());
    }
    if (d.is_number_unsigned() &&
        d.get<std::uint64_t>() >
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      bad("dimension " + d.dump() + " in shape " + sh.dump() + " is too large");
    }
    e.dims.push_back(d.get<std::int64_t>());
  }
  std::uint64_t numel = 1;
  for (std::int64_t d : e.dims) {
    if (d < 0) bad("negative dimension " + std::to_string(d) + " in shape " + sh.dump());
  }
  for (std::int64_t d : e.dims) {
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 8 / ud) {
      bad("shape " + sh.dump() + " is too large (its byte size overflows 64 bits)");
    }
    numel *= ud;
  }
  const std::uint64_t need = numel * dtype_size(e.dtype);

  const json& off = j.at("data_offsets");
  const bool offsets_ok =
      off.is_array() && off.size() == 2 && std::all_of(off.begin(), off.end(), [](const json& o) {
        return o.is_number_unsigned() || (o.is_number_integer() && o.get<std::int64_t>() >= 0);
      });
  if (!offsets_ok) {
    bad("field 'data_offsets' must be an array of two non-negative integers [begin, end], found " +
        off.dump());
  }
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.end < e.begin) {
    bad("data_offsets " + off.dump() + " end before they begin");
  }
  if (e.end - e.begin != need) {
    bad("data_offsets " + off.dump() + " span " + std::to_string(e.end - e.begin) +
        " bytes but dtype " + dt.get<std::string>() + " and shape " + shape_str(e.dims) + " need " +
        std::to_string(need) + " bytes (" + std::to_string(numel) + " elements of " +
        std::to_string(dtype_size(e.dtype)) + ")");
  }
  return e;
}

}  // namespace

std::string encode_safetensors(const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw IoError("encode_safetensors: a tensor cannot be named '__metadata__'");
    }
    if (!names.insert(name).second) {
      throw IoError("encode_safetensors: duplicate tensor name '" + name + "'");
    }
    if (!t.defined()) throw IoError("encode_safetensors: tensor '" + name + "' is undefined");
    const std::uint64_t n = t.nbytes();
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape().dims()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw IoError(std::string("encode_safetensors: cannot encode the header: ") + ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  put_u64_le(out, text.size());
  out += text;
  for (const auto& entry : tensors) {
    const Tensor& t = entry.second;
    // A GPU's tensor comes to the host first: a file saved on any device reads on any other.
    if (t.device().is_host()) {
      out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      out += t.to_bytes();
    }
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string bytes;
  try {
    bytes = encode_safetensors(tensors, metadata);
  } catch (const IoError& ex) {
    throw IoError(path + ": " + ex.what());
  }
  write_file_atomic(path, bytes);
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw IoError("no tensor '" + name + "' in " + path);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

SafetensorsFile decode_safetensors(std::string_view bytes, const std::string& path) {
  const std::uint64_t header_size =
      checked_header_size(bytes, bytes.size() - std::min<std::size_t>(bytes.size(), 8), path);
  const std::string_view text = bytes.substr(8, header_size);
  const std::uint64_t data_start = 8 + header_size;
  const std::uint64_t data_size = bytes.size() - data_start;
  const json header = parse_header(text, path);

  SafetensorsFile file;
  file.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      file.metadata = metadata_of(value, path);
      continue;
    }
    entries.push_back(parse_entry(path + ": tensor '" + name + "'", name, value));
  }

  // The spec requires the tensors to tile the data section exactly: sorted by offset, each one
  // starts where the previous ended, the first at 0 and the last at the end of the file.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const auto range = [&](const Entry& e) {
    return "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
           "] (file offsets " + std::to_string(data_start + e.begin) + " to " +
           std::to_string(data_start + e.end) + ")";
  };
  std::uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_size) {
      fail(path, "tensor '" + e.name + "': " + range(e) + " extend past the end of the data " +
                     "section, which has " + std::to_string(data_size) + " bytes");
    }
    if (e.begin < covered) {
      fail(path, "tensor '" + e.name + "': " + range(e) + " overlap tensor '" + prev->name + "' " +
                     range(*prev));
    }
    if (e.begin > covered) {
      fail(path, "tensor '" + e.name + "': " + range(e) + " leave a gap: data section bytes [" +
                     std::to_string(covered) + ", " + std::to_string(e.begin) +
                     ") belong to no tensor" +
                     (prev ? " (after tensor '" + prev->name + "')" : ""));
    }
    covered = e.end;
    prev = &e;
  }
  if (covered != data_size) {
    fail(path,
         "data section bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
             ") (file offsets " + std::to_string(data_start + covered) + " to " +
             std::to_string(bytes.size()) + ") belong to no tensor: trailing bytes " +
             (prev ? "after the last tensor '" + prev->name + "'" : "(the file has no tensors)"));
  }

  file.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(Shape(e.dims), e.dtype);
    std::memcpy(t.raw_data(), bytes.data() + data_start + e.begin, e.end - e.begin);
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

SafetensorsFile load_safetensors(const std::string& path) {
  return decode_safetensors(read_file(path), path);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  std::string size_bytes(std::min<std::uint64_t>(file_size, 8), '\0');
  in.read(size_bytes.data(), static_cast<std::streamsize>(size_bytes.size()));
  const std::uint64_t header_size =
      checked_header_size(size_bytes, file_size - size_bytes.size(), path);
  std::string text(header_size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_size))) {
    throw IoError("cannot read " + path + ": " + std::strerror(errno));
  }
  const json header = parse_header(text, path);
  const auto it = header.find("__metadata__");
  return it == header.end() ? std::map<std::string, std::string>{} : metadata_of(*it, path);
}

}  // namespace hpm::io
