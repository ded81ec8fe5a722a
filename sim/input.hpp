// Reading the user's input files safely: regular files only, with a size cap, and JSON parsed
// with bounded nesting, duplicate keys refused and every parser error turned into one line
// (InputError). Every reader of a scenario, ds_config, HF config, schedule or compare file goes
// through here, so a hostile file (/dev/zero, 5,000 nested arrays, 1e999) gets one line, exit 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace hpz {

/** Largest input file read (64 MiB): hpzlab's own schedule files of 1,024 ranks stay far below. */
inline constexpr std::uintmax_t kMaxInputBytes = std::uintmax_t{64} << 20;

/** Deepest nesting of arrays and objects a JSON input may have (ours need fewer than 10). */
inline constexpr std::size_t kMaxJsonDepth = 64;

/** The whole of the regular file at `path` (symlinks followed). For a missing file, a
 *  directory, a device or FIFO, a file larger than kMaxInputBytes or a read error, throws
 *  InputError(where, key, what + ": " + the reason), e.g. ("s.toml", "", "cannot read the
 *  scenario file"). */
std::string read_input_file(const std::string& path, const std::string& where,
                            const std::string& key, const std::string& what);

/** `bytes` as read, or, where they start with gzip's magic (1f 8b: a `.json.gz` recording, as
 *  traces/deepspeed/ keeps them), decompressed. Throws InputError naming `file` for a corrupt or
 *  truncated stream and for one that inflates past kMaxInputBytes. */
std::string gunzipped_input(std::string bytes, const std::string& file, const std::string& what);

/** `text` as a gzip stream (zlib, level 6), e.g. for `--trace FILE.gz`; gunzipped_input reads
 *  it back. */
std::string gzipped(const std::string& text);

/** `text` (the content of `file`) parsed as JSON. Throws InputError naming `file` for malformed
 *  JSON (nlohmann's position, prefixed by `what`, e.g. "malformed JSON"), a NUL byte, nesting
 *  deeper than kMaxJsonDepth, a number beyond a double's range and a key given twice in one
 *  object. */
nlohmann::json parse_json_input(const std::string& text, const std::string& file,
                                const std::string& what);

/** `value` for a message: short, one line, control characters escaped (shown()), never more
 *  than a few levels deep (a dump of a deep value would recurse once per level). */
std::string shown_json(const nlohmann::json& value);

}  // namespace hpz
