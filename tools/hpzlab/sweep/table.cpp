#include "tools/hpzlab/sweep/table.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "tools/hpzlab/sweep/fields.hpp"

namespace hpz::sweep {
namespace {

/** A varied value as JSON: a number or boolean when it reads as one, else the text. */
nlohmann::json typed_value(const std::string& text) {
  if (text == "true" || text == "false") return text == "true";
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc() && ptr == end && !text.empty() && std::isfinite(value)) {
    if (std::trunc(value) == value && std::fabs(value) < 9e15) {
      return static_cast<std::int64_t>(value);
    }
    return value;
  }
  return text;
}

Row row_head(const Plan& plan, SimKey key, int run) {
  Row row;
  row["point"] = key.first;
  row["variant"] = plan.variants.at(key.second).name;
  row["run"] = run;
  const std::vector<std::string> values = plan.values_at(key.first);
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    row[plan.axes[i].key] = typed_value(values[i]);
  }
  return row;
}

/** What the row of run k takes from one race group of sim --json: read through Field once. */
struct RaceRuns {
  std::string second;                         ///< the op that read too early, "" if not given
  std::vector<std::int64_t> manifested;       ///< instances that bit, per run
  std::vector<std::optional<double>> margin;  ///< the smallest margin per run, null where none
};

constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

std::vector<RaceRuns> races_of(const Field& sim) {
  std::vector<RaceRuns> out;
  const Field races = sim.at("races");
  if (!races.present()) return out;
  for (std::size_t i = 0; i < races.size(); ++i) {
    const Field race = races.item(i);
    RaceRuns r;
    if (race.at("second").present()) r.second = race.at("second").string();
    const Field per_run = race.at("manifested_per_run");
    for (std::size_t k = 0; k < per_run.size(); ++k) {
      r.manifested.push_back(per_run.item(k).integer(0, kMaxCount));
    }
    const Field margin = race.at("margin_s");
    if (margin.present() && margin.at("min_per_run").present()) {
      const Field min_per_run = margin.at("min_per_run");
      for (std::size_t k = 0; k < min_per_run.size(); ++k) {
        r.margin.push_back(min_per_run.item(k).number_or_null());
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

/** The first race sim --json lists that manifested in run `run` ("" if none), and how many
 *  race groups did. */
std::pair<std::string, int> races_in_run(const std::vector<RaceRuns>& races, std::size_t run) {
  std::string first;
  int groups = 0;
  for (const RaceRuns& race : races) {
    if (run >= race.manifested.size() || race.manifested[run] <= 0) continue;
    if (groups++ == 0) first = race.second;
  }
  return {first, groups};
}

/** The smallest race margin sim --json gives for run `run` over every race group (second
 *  start - first end: negative where a race bit), null without races. */
nlohmann::json margin_in_run(const std::vector<RaceRuns>& races, std::size_t run) {
  std::optional<double> least;
  for (const RaceRuns& race : races) {
    if (run >= race.margin.size() || !race.margin[run]) continue;
    if (!least || *race.margin[run] < *least) least = race.margin[run];
  }
  return least ? nlohmann::json(*least) : nlohmann::json(nullptr);
}

/** The --repro columns in their place (before `error`), empty until fill_repro(). */
void fill_repro_placeholders(Row& row) {
  row["first_bad_step"] = nullptr;
  row["final_loss"] = nullptr;
  row["repro_error"] = "";
}

/** Text for a cell: one line, and UTF-8 (a child's error output is any bytes; nlohmann::json
 *  refuses to dump a string that is not UTF-8). */
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return valid_utf8(text);
}

/** A row as a results.jsonl line: bytes that are not UTF-8 replaced, should any reach a cell. */
std::string jsonl_line(const Row& row) {
  return row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string csv_field(const nlohmann::ordered_json& value) {
  std::string text;
  if (value.is_null()) return "";
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_float()) {
    text = fmt::format("{}", value.get<double>());
  } else {
    text = value.dump();
  }
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// The temporary file is created exclusively (O_EXCL: a link planted or left at PATH.tmp is not
// followed, its target not truncated; issue 34), then renamed over PATH.
void write_all(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(tmp, ec))) {
    std::filesystem::remove(tmp, ec);  // the link itself, never what it points to
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InputError(tmp, "--out", std::string("cannot create this file: ") + std::strerror(errno));
  }
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const int saved = errno;
  if (::close(fd) != 0 || done != text.size()) {
    std::filesystem::remove(tmp, ec);
    throw InputError(path, "--out", std::string("cannot write this file: ") + std::strerror(saved));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError(path, "--out", "cannot write this file: " + ec.message());
}

/** Appends text with one write() on an O_APPEND descriptor: whole lines or nothing. */
void append_once(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(path, "--out", std::string("cannot open: ") + std::strerror(errno));
  const ssize_t written = ::write(fd, text.data(), text.size());
  const int saved = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(text.size())) {
    throw InputError(path, "--out", std::string("cannot append: ") + std::strerror(saved));
  }
}

/** (point, variant, run) of the CSV lines after the header: the first three fields. */
std::set<std::tuple<std::size_t, std::string, int>> csv_keys(const std::string& path) {
  std::set<std::tuple<std::size_t, std::string, int>> keys;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return keys;
  std::istringstream in(read_input_file(path, path, "--resume", "cannot read the sweep's table"));
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string point, variant, run;
    if (!std::getline(fields, point, ',') || !std::getline(fields, variant, ',') ||
        !std::getline(fields, run, ',')) {
      continue;
    }
    try {
      keys.emplace(std::stoul(point), variant, std::stoi(run));
    } catch (const std::exception&) {
      // not a row (a torn line): the simulation runs again
    }
  }
  return keys;
}

std::size_t variant_index(const Plan& plan, const std::string& name) {
  for (std::size_t i = 0; i < plan.variants.size(); ++i) {
    if (plan.variants[i].name == name) return i;
  }
  return plan.variants.size();
}

/** A row's place in the final table, or nullopt for a row that is not of this plan. */
std::optional<std::tuple<std::size_t, std::size_t, int>> place(const Plan& plan, const Row& row) {
  if (!row.contains("point") || !row["point"].is_number_unsigned() || !row.contains("variant") ||
      !row["variant"].is_string() || !row.contains("run") || !row["run"].is_number_integer()) {
    return {};
  }
  const auto point = row["point"].get<std::size_t>();
  const std::size_t variant = variant_index(plan, row["variant"].get<std::string>());
  const int run = row["run"].get<int>();
  if (point >= plan.points() || variant >= plan.variants.size() || run < 0 || run >= plan.runs) {
    return {};
  }
  return std::make_tuple(point, variant, run);
}

}  // namespace

std::vector<std::string> columns(const Plan& plan) {
  std::vector<std::string> c = {"point", "variant", "run"};
  for (const Axis& a : plan.axes) c.push_back(a.key);
  for (const char* name :
       {"status", "step_time_s", "tokens_per_s_per_node", "exposed_comm_s", "host_stall_s",
        "host_sync_s", "races_manifested", "race_groups", "first_race", "race_margin_s"}) {
    c.emplace_back(name);
  }
  if (plan.repro) {
    for (const char* name : {"first_bad_step", "final_loss", "repro_error"}) c.emplace_back(name);
  }
  c.emplace_back("error");
  return c;
}

void fill_repro(std::vector<Row>& rows, const nlohmann::json& repro, const std::string& error,
                const std::string& file) {
  const Field root(repro, file);
  for (Row& row : rows) {
    row["first_bad_step"] = nullptr;
    row["final_loss"] = nullptr;
    row["repro_error"] = one_line(error);
    if (!error.empty()) continue;
    const std::string variant = row.value("variant", "");
    const auto run = row.value("run", 0);
    const Field of_variant = root.at("variants").at(variant);
    const Field runs = of_variant.present() ? of_variant.at("runs") : of_variant;
    if (!runs.present() || run < 0 || static_cast<std::size_t>(run) >= runs.size()) {
      row["repro_error"] = fmt::format("hpzlab repro's JSON has no run {} of {}", run, variant);
      continue;
    }
    const Field r = runs.item(static_cast<std::size_t>(run));
    if (r.at("first_bad_step").present()) {
      r.at("first_bad_step").integer_or_null(0, kMaxCount);
      row["first_bad_step"] = r.at("first_bad_step").json();
    }
    const Field loss = r.at("loss");
    if (loss.present() && loss.size() > 0) {
      const Field last = loss.item(loss.size() - 1);
      if (!last.json().is_number() && !last.json().is_string() && !last.is_null()) {
        last.fail("a number, a string (nan, inf or a taint tag) or null");
      }
      row["final_loss"] = last.json();
    }
    if (r.at("hang").present()) {
      row["repro_error"] = one_line("the replay hangs: " + r.at("hang").string());
    }
  }
}

std::vector<Row> rows_from_sim(const Plan& plan, SimKey key, const nlohmann::json& sim,
                               const std::string& file) {
  const Field root(sim, file);
  const Field runs = root.at("runs");
  if (runs.size() != static_cast<std::size_t>(plan.runs)) {
    runs.fail(fmt::format("an array of {} runs (the sweep's runs)", plan.runs));
  }
  const std::vector<RaceRuns> races = races_of(root);
  std::vector<Row> rows;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Field m = runs.item(i);
    Row row = row_head(plan, key, static_cast<int>(i));
    row["status"] = m.at("hung").present() && m.at("hung").boolean() ? "hung" : "ok";
    for (const char* name : {"step_time_s", "tokens_per_s_per_node", "exposed_comm_s",
                             "host_stall_s", "host_sync_s"}) {
      const Field value = m.at(name);
      value.number_or_null();  // JSON has no NaN: nlohmann writes a non-finite number as null
      row[name] = value.json();
    }
    row["races_manifested"] = m.at("races_manifested").integer(0, kMaxCount);
    const auto [first, groups] = races_in_run(races, i);
    row["race_groups"] = groups;
    row["first_race"] = first;
    row["race_margin_s"] = margin_in_run(races, i);
    if (plan.repro) fill_repro_placeholders(row);
    row["error"] = "";
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Row> failed_rows(const Plan& plan, SimKey key, const std::string& error) {
  std::vector<Row> rows;
  for (int run = 0; run < plan.runs; ++run) {
    Row row = row_head(plan, key, run);
    row["status"] = "failed";
    for (const char* name : {"step_time_s", "tokens_per_s_per_node", "exposed_comm_s",
                             "host_stall_s", "host_sync_s", "races_manifested", "race_groups"}) {
      row[name] = nullptr;
    }
    row["first_race"] = "";
    row["race_margin_s"] = nullptr;
    if (plan.repro) fill_repro_placeholders(row);
    row["error"] = one_line(error);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string csv_header(const std::vector<std::string>& columns) {
  std::string line;
  for (const std::string& c : columns) {
    if (!line.empty()) line += ',';
    line += csv_field(c);
  }
  return line + "\n";
}

std::string csv_line(const std::vector<std::string>& columns, const Row& row) {
  std::string line;
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (i > 0) line += ',';
    const auto it = row.find(columns[i]);
    if (it != row.end()) line += csv_field(*it);
  }
  return line + "\n";
}

Row checked_row(const Plan& plan, const nlohmann::json& j, const std::string& where) {
  const Field f(j, where);
  f.object();
  Row row;
  const auto point = static_cast<std::size_t>(
      f.at("point").integer(0, static_cast<std::int64_t>(plan.points()) - 1));
  row["point"] = point;
  std::vector<std::string> names;
  for (const VariantSpec& v : plan.variants) names.push_back(v.name);
  row["variant"] = f.at("variant").one_of(names);
  row["run"] = f.at("run").integer(0, plan.runs - 1);
  const std::vector<std::string> values = plan.values_at(point);
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    const nlohmann::json expected = typed_value(values[i]);
    const Field value = f.at(plan.axes[i].key);
    if (!value.present() || value.json() != expected) {
      value.fail(fmt::format("{} (point {}'s value)", expected.dump(), point));
    }
    row[plan.axes[i].key] = expected;
  }
  row["status"] = f.at("status").one_of({"ok", "hung", "failed"});
  for (const char* name :
       {"step_time_s", "tokens_per_s_per_node", "exposed_comm_s", "host_stall_s", "host_sync_s"}) {
    f.at(name).number_or_null();
    row[name] = f.at(name).json();
  }
  for (const char* name : {"races_manifested", "race_groups"}) {
    f.at(name).integer_or_null(0, kMaxCount);
    row[name] = f.at(name).json();
  }
  row["first_race"] = f.at("first_race").string();
  f.at("race_margin_s").number_or_null();
  row["race_margin_s"] = f.at("race_margin_s").json();
  if (plan.repro) {
    f.at("first_bad_step").integer_or_null(0, kMaxCount);
    row["first_bad_step"] = f.at("first_bad_step").json();
    const Field loss = f.at("final_loss");
    if (!loss.present() ||
        !(loss.json().is_number() || loss.json().is_string() || loss.json().is_null())) {
      loss.fail("a number, a string (nan, inf or a taint tag) or null");
    }
    row["final_loss"] = loss.json();
    row["repro_error"] = f.at("repro_error").string();
  }
  row["error"] = f.at("error").string();
  for (const auto& item : j.items()) {
    if (!row.contains(item.key())) {
      throw InputError(where, item.key(),
                       "not a column of this sweep's table (allowed: the columns of "
                       "results.csv's header)");
    }
  }
  return row;
}

std::vector<Row> rows_from_jsonl(const Plan& plan, const std::string& text,
                                 const std::string& path) {
  std::vector<Row> rows;
  std::istringstream in(text);
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    nlohmann::json j;
    try {
      j = parse_json_input(line, path, "not JSON");
    } catch (const InputError&) {
      continue;  // a line cut by a kill (or a full disk): its simulation runs again
    }
    rows.push_back(checked_row(plan, j, fmt::format("{}:{}", path, number)));
  }
  return rows;
}

std::vector<Row> read_rows(const Plan& plan, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return {};
  // The guarded reader (issue 34): a regular file of at most kMaxInputBytes (a link to
  // /dev/zero took 17 GB), each line at most kMaxJsonDepth deep (a deep one overflowed the
  // stack when the row was written back), each row's fields checked.
  return rows_from_jsonl(
      plan, read_input_file(path, path, "--resume", "cannot read the sweep's rows"), path);
}

Table::Table(const Plan& plan, std::string dir)
    : plan_(plan), dir_(std::move(dir)), columns_(columns(plan)) {}

void Table::start() {
  write_all(csv_path(), csv_header(columns_));
  write_all(jsonl_path(), "");
}

std::set<SimKey> Table::resume() {
  const auto in_csv = csv_keys(csv_path());
  std::map<SimKey, std::set<int>> runs;
  std::vector<Row> kept;
  for (Row& row : read_rows(plan_, jsonl_path())) {
    const auto at = place(plan_, row);
    if (!at ||
        !in_csv.count({std::get<0>(*at), row["variant"].get<std::string>(), std::get<2>(*at)})) {
      continue;
    }
    runs[{std::get<0>(*at), std::get<1>(*at)}].insert(std::get<2>(*at));
    kept.push_back(std::move(row));
  }
  std::set<SimKey> done;
  for (const auto& [key, seen] : runs) {
    if (static_cast<int>(seen.size()) == plan_.runs) done.insert(key);
  }
  std::erase_if(kept, [&](const Row& row) {
    const auto at = place(plan_, row);
    return !done.count({std::get<0>(*at), std::get<1>(*at)});
  });
  rewrite(std::move(kept));
  return done;
}

void Table::append(const std::vector<Row>& rows) {
  std::string csv, jsonl;
  for (const Row& row : rows) {
    csv += csv_line(columns_, row);
    jsonl += jsonl_line(row);
  }
  append_once(jsonl_path(), jsonl);
  append_once(csv_path(), csv);
}

std::vector<Row> Table::finish() {
  std::vector<Row> rows = read_rows(plan_, jsonl_path());
  rewrite(rows);
  return read_rows(plan_, jsonl_path());
}

void Table::rewrite(std::vector<Row> rows) const {
  // Stable: of two rows for one (point, variant, run), the later one written is kept.
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const Row& a, const Row& b) { return *place(plan_, a) < *place(plan_, b); });
  std::string csv = csv_header(columns_), jsonl;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i + 1 < rows.size() && *place(plan_, rows[i]) == *place(plan_, rows[i + 1])) continue;
    csv += csv_line(columns_, rows[i]);
    jsonl += jsonl_line(rows[i]);
  }
  write_all(csv_path(), csv);
  write_all(jsonl_path(), jsonl);
}

}  // namespace hpz::sweep
