#include "data/sentencepiece_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "data/sentencepiece_library/library.h"

#ifndef HPM_SENTENCEPIECE_LIBRARY
#define HPM_SENTENCEPIECE_LIBRARY "libhpm_sentencepiece.so"
#endif

namespace hpm::data::spm {

namespace {

// The library's functions, resolved once.
struct Library {
  decltype(&hpm_spm_load) load;
  decltype(&hpm_spm_free) free;
  decltype(&hpm_spm_piece_size) piece_size;
  decltype(&hpm_spm_unk_id) unk_id;
  decltype(&hpm_spm_id_to_piece) id_to_piece;
  decltype(&hpm_spm_score) score;
  decltype(&hpm_spm_encode) encode;
  decltype(&hpm_spm_unknown_spans) unknown_spans;
  decltype(&hpm_spm_decode) decode;
  decltype(&hpm_spm_train) train;
};

std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("HPM_SENTENCEPIECE_LIBRARY"); env && *env)
    paths.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / "libhpm_sentencepiece.so").string());
  paths.emplace_back(HPM_SENTENCEPIECE_LIBRARY);
  return paths;
}

const Library& library() {
  static Library lib;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    std::string tried;
    for (const std::string& path : candidates()) {
      if (!std::filesystem::exists(path)) {
        tried += (tried.empty() ? "" : ", ") + path + " (missing)";
        continue;
      }
      h = ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
      tried += (tried.empty() ? "" : ", ") + path + " (" + ::dlerror() + ")";
    }
    if (h == nullptr) {
      failure = "cannot load SentencePiece: tried " + tried;
      return;
    }
    const auto sym = [&](const char* name) {
      void* f = ::dlsym(h, name);
      if (f == nullptr) failure = std::string("libhpm_sentencepiece.so lacks ") + name;
      return f;
    };
    lib.load = reinterpret_cast<decltype(lib.load)>(sym("hpm_spm_load"));
    lib.free = reinterpret_cast<decltype(lib.free)>(sym("hpm_spm_free"));
    lib.piece_size = reinterpret_cast<decltype(lib.piece_size)>(sym("hpm_spm_piece_size"));
    lib.unk_id = reinterpret_cast<decltype(lib.unk_id)>(sym("hpm_spm_unk_id"));
    lib.id_to_piece = reinterpret_cast<decltype(lib.id_to_piece)>(sym("hpm_spm_id_to_piece"));
    lib.score = reinterpret_cast<decltype(lib.score)>(sym("hpm_spm_score"));
    lib.encode = reinterpret_cast<decltype(lib.encode)>(sym("hpm_spm_encode"));
    lib.unknown_spans = reinterpret_cast<decltype(lib.unknown_spans)>(sym("hpm_spm_unknown_spans"));
    lib.decode = reinterpret_cast<decltype(lib.decode)>(sym("hpm_spm_decode"));
    lib.train = reinterpret_cast<decltype(lib.train)>(sym("hpm_spm_train"));
  });
  if (!failure.empty()) throw std::runtime_error(failure);
  return lib;
}

// What the callbacks fill.
struct Out {
  std::string bytes, error;
  std::vector<int> ids;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
};

void to_bytes(void* ctx, const char* data, std::size_t n) {
  static_cast<Out*>(ctx)->bytes.assign(data, n);
}
void to_error(void* ctx, const char* data, std::size_t n) {
  static_cast<Out*>(ctx)->error.assign(data, n);
}
void to_ids(void* ctx, const int* ids, std::size_t n) {
  static_cast<Out*>(ctx)->ids.assign(ids, ids + n);
}
void to_span(void* ctx, std::size_t begin, std::size_t end) {
  static_cast<Out*>(ctx)->spans.emplace_back(begin, end);
}

void check(int rc, const Out& out) {
  if (rc != 0) throw std::runtime_error(out.error);
}

}  // namespace

Model::Model(const std::string& bytes) {
  Out out;
  check(library().load(bytes.data(), bytes.size(), &handle_, to_error, &out), out);
}

Model::~Model() {
  if (handle_ != nullptr) library().free(handle_);
}

int Model::piece_size() const { return library().piece_size(handle_); }
int Model::unk_id() const { return library().unk_id(handle_); }
std::string Model::piece(int id) const { return library().id_to_piece(handle_, id); }
float Model::score(int id) const { return library().score(handle_, id); }

std::vector<int> Model::encode(std::string_view text) const {
  Out out;
  check(library().encode(handle_, text.data(), text.size(), to_ids, to_error, &out), out);
  return std::move(out.ids);
}

std::vector<std::pair<std::size_t, std::size_t>> Model::unknown_spans(std::string_view text) const {
  Out out;
  check(library().unknown_spans(handle_, text.data(), text.size(), to_span, to_error, &out), out);
  return std::move(out.spans);
}

std::string Model::decode(const std::vector<int>& ids) const {
  Out out;
  check(library().decode(handle_, ids.data(), ids.size(), to_bytes, to_error, &out), out);
  return std::move(out.bytes);
}

std::string train(const std::vector<std::pair<std::string, std::string>>& options,
                  const std::vector<std::string>& lines) {
  std::vector<const char*> keys, values, data;
  std::vector<std::size_t> lengths;
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  for (const std::string& line : lines) {
    data.push_back(line.data());
    lengths.push_back(line.size());
  }
  Out out;
  check(library().train(keys.data(), values.data(), keys.size(), data.data(), lengths.data(),
                        data.size(), to_bytes, to_error, &out),
        out);
  return std::move(out.bytes);
}

}  // namespace hpm::data::spm
