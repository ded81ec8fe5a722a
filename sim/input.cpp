#include "sim/input.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "sim/error.hpp"

namespace hpz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/** Why `path` cannot be read as an input file, or nothing when it can (its size in `bytes`). */
std::optional<std::string> unreadable(const std::string& path, std::uintmax_t& bytes) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  if (ec || !fs::exists(st)) {
    return std::string(ec ? ec.message() : std::strerror(ENOENT));
  }
  if (fs::is_directory(st)) return std::string("is a directory, not a file");
  if (!fs::is_regular_file(st)) {
    return std::string("is not a regular file (a device, FIFO or socket is not read)");
  }
  bytes = fs::file_size(path, ec);
  if (ec) return ec.message();
  if (bytes > kMaxInputBytes) {
    return fmt::format("is {} bytes (allowed: at most {} MiB)", bytes, kMaxInputBytes >> 20);
  }
  return std::nullopt;
}

/** nlohmann's message without its "[json.exception.parse_error.101] " prefix. */
std::string without_prefix(std::string_view what) {
  const std::size_t cut = what.find("] ");
  return std::string(
      what.starts_with("[json.") && cut != std::string_view::npos ? what.substr(cut + 2) : what);
}

/** Refuses deep nesting and duplicate keys while nlohmann parses (its parser callback). */
class JsonGuard {
 public:
  JsonGuard(const std::string& file, const std::string& what) : file_(file), what_(what) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (open_.size() >= kMaxJsonDepth) {
          throw InputError(file_, "",
                           fmt::format("{}: nested more than {} levels deep (allowed: at most {})",
                                       what_, kMaxJsonDepth, kMaxJsonDepth));
        }
        open_.push_back(event == json::parse_event_t::object_start);
        keys_.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open_.pop_back();
        keys_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_.back().insert(parsed.get<std::string>()).second) {
          throw InputError(file_, shown(parsed.get<std::string>()),
                           fmt::format("{}: this key is given twice in one object (allowed: "
                                       "once)",
                                       what_));
        }
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  }

 private:
  const std::string& file_;
  const std::string& what_;
  std::vector<bool> open_;  ///< the arrays and objects open, innermost last (true: object)
  std::vector<std::set<std::string>> keys_;  ///< keys seen in each open object
};

void render(const json& value, int depth, std::string& out) {
  if (out.size() > kShownMax) return;
  if (!value.is_structured()) {
    out += value.dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  const bool object = value.is_object();
  if (value.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  if (depth >= 3) {
    out += object ? "{...}" : "[...]";
    return;
  }
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end() && out.size() <= kShownMax; ++it) {
    if (!first) out += ',';
    first = false;
    if (object) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
    render(*it, depth + 1, out);
  }
  out += object ? '}' : ']';
}

}  // namespace

std::string read_input_file(const std::string& path, const std::string& where,
                            const std::string& key, const std::string& what) {
  if (path.empty()) {
    throw InputError(where.empty() ? "''" : where, key, what + ": the file name is empty");
  }
  std::uintmax_t bytes = 0;
  if (const std::optional<std::string> why = unreadable(path, bytes)) {
    throw InputError(where, key, what + ": " + *why);
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(where, key,
                     what + ": " + (errno != 0 ? std::strerror(errno) : "cannot be opened"));
  }
  // Never more than the cap, even if the file grew since it was measured.
  std::string text(static_cast<std::size_t>(bytes), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (in.bad()) throw InputError(where, key, what + ": read error");
  return text;
}

std::string gunzipped_input(std::string bytes, const std::string& file, const std::string& what) {
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != 0x1f ||
      static_cast<unsigned char>(bytes[1]) != 0x8b) {
    return bytes;
  }
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {  // 16: a gzip header, not zlib's
    throw InputError(file, "", what + ": cannot start zlib");
  }
  z.next_in = reinterpret_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());  // at most kMaxInputBytes, read_input_file's cap
  std::string out;
  char chunk[1 << 16];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(chunk);
    z.avail_out = sizeof chunk;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      const std::string why = rc == Z_BUF_ERROR ? "truncated" : (z.msg ? z.msg : "corrupt");
      inflateEnd(&z);
      throw InputError(file, "", fmt::format("{}: gzip data {}", what, why));
    }
    out.append(chunk, sizeof chunk - z.avail_out);
    if (out.size() > kMaxInputBytes) {
      inflateEnd(&z);
      throw InputError(file, "",
                       fmt::format("{}: inflates to more than {} MiB (allowed: at most {} MiB)",
                                   what, kMaxInputBytes >> 20, kMaxInputBytes >> 20));
    }
  }
  inflateEnd(&z);
  return out;
}

json parse_json_input(const std::string& text, const std::string& file, const std::string& what) {
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    throw InputError(file, "",
                     fmt::format("{}: a NUL byte at offset {} (JSON text has none)", what, nul));
  }
  JsonGuard guard(file, what);
  try {
    return json::parse(text, std::ref(guard));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw InputError(file, "", what + " (" + without_prefix(e.what()) + ")");
  }
}

std::string shown_json(const json& value) {
  std::string out;
  render(value, 0, out);
  return shown(out);
}

std::string gzipped(const std::string& text) {
  z_stream z{};
  // 16 + MAX_WBITS: a gzip header and trailer, not zlib's (gunzipped_input reads them back).
  if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("zlib: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  const uLong written = z.total_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("zlib: deflate did not finish");
  out.resize(written);
  return out;
}

}  // namespace hpz
