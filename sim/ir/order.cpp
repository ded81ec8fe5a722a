#include "sim/ir/order.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "sim/error.hpp"

namespace hpz {
namespace {

constexpr std::size_t kNpos = static_cast<std::size_t>(-1);
constexpr std::string_view kHeader = "# hpzlab golden order, format 1";

std::string stream_of(const RankSchedule& rs, StreamId id) {
  return id == kHostStream ? std::string("host") : rs.streams.at(id).name;
}

/** What an op is for, in words: its label, else its parameter unit, else "-". */
std::string base_of(const Schedule& s, const Op& op) {
  if (op.label != kNoLabel) return s.labels.at(op.label);
  if (op.unit != kNoUnit) return s.units.at(op.unit).name;
  return "-";
}

/** A buffer's name, "~" standing for the op's base when the name starts with it. */
std::string buffer_of(const RankSchedule& rs, BufferId id, const std::string& base) {
  const std::string& name = rs.buffers.at(id).name;
  if (name.size() > base.size() && name.compare(0, base.size(), base) == 0 &&
      name[base.size()] == '.') {
    std::string out = "~";
    out.append(name, base.size(), std::string::npos);
    return out;
  }
  return name;
}

std::string when_of(const Op& op) {
  if (op.step < 0) return std::string(to_string(op.phase));
  std::string out = fmt::format("s{}", op.step);
  if (op.micro_step != 0) out += fmt::format(".{}", op.micro_step);
  return out + " " + std::string(to_string(op.phase));
}

/** Names events by where they were recorded: "STREAM@BASE#K", the K-th record on STREAM of an
 *  op with that base, so a name does not change when an unrelated op is added. */
class EventNames {
 public:
  std::string on_record(const std::string& stream, const std::string& base, EventId event) {
    const int k = count_[{stream, base}]++;
    auto& name = names_[event];
    name = {stream, base, k};
    return spelled(name, base);
  }
  std::string of(EventId event, const std::string& base) const {
    const auto it = names_.find(event);
    return it == names_.end() ? fmt::format("unrecorded event {}", event)
                              : spelled(it->second, base);
  }

 private:
  using Name = std::tuple<std::string, std::string, int>;
  static std::string spelled(const Name& n, const std::string& base) {
    const auto& [stream, at, k] = n;
    return fmt::format("{}@{}#{}", stream, at == base ? "~" : at, k);
  }
  std::map<std::pair<std::string, std::string>, int> count_;
  std::map<EventId, Name> names_;
};

std::string op_line(const Schedule& s, Rank r, const Op& op, EventNames& events) {
  const RankSchedule& rs = s.ranks[r];
  const std::string base = base_of(s, op);
  const std::string stream = stream_of(rs, op.stream);
  std::string line = fmt::format("{} {} {} | {} @{}", stream, to_string(op.kind),
                                 to_string(op.purpose), when_of(op), base);
  if (op.group != kNoGroup) {
    line += fmt::format(" | group {} {} B", s.groups.at(op.group).name, op.comm_bytes);
  }
  if (op.kind == OpKind::kEventRecord) {
    line += " | as " + events.on_record(stream, base, op.event);
  } else if (op.event != kNoEvent) {
    line += " | for " + events.of(op.event, base);
  }
  if (op.spin_us > 0) line += fmt::format(" | spin {} us", op.spin_us);
  if (op.buffer != kNoBuffer) {
    line += " | " + buffer_of(rs, op.buffer, base);
    if (op.kind == OpKind::kAlloc)
      line += fmt::format(" fill {}", to_string(static_cast<Fill>(op.fill)));
  }
  for (const Access& a : s.accesses_of(r, op)) {
    // A strided access is written out slice by slice: an order does not depend on how the IR
    // stores the ranges (the golden orders predate strided accesses).
    a.for_each_slice([&](std::uint64_t lo, std::uint64_t hi) {
      line += fmt::format(" | {} {}[{}, {})", a.mode == AccessMode::kWrite ? "W" : "R",
                          buffer_of(rs, a.buffer, base), lo, hi);
    });
  }
  return line;
}

std::uint64_t fnv1a(std::uint64_t h, std::string_view text) {
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;

std::string hex(std::uint64_t h) {
  return fmt::format("{:016x}", h);
}

/** "0-3, 7, 9-10" */
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") +
           (i == j ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return out;
}

/** The hunks of an edit script: each change with `context` kept lines around it. */
std::string format_hunks(const std::vector<LineEdit>& edits, const std::vector<std::string>& a,
                         const std::vector<std::string>& b, std::size_t context,
                         std::size_t max_hunks, const std::string& unit) {
  std::vector<bool> show(edits.size(), false);
  std::vector<std::size_t> changes;
  for (std::size_t i = 0; i < edits.size(); ++i) {
    if (edits[i].a != kNpos && edits[i].b != kNpos) continue;
    changes.push_back(i);
    const std::size_t from = i > context ? i - context : 0;
    for (std::size_t j = from; j <= std::min(edits.size() - 1, i + context); ++j) show[j] = true;
  }
  std::string out;
  std::size_t hunks = 0;
  for (std::size_t i = 0; i < edits.size(); ++i) {
    if (!show[i]) continue;
    if (i == 0 || !show[i - 1]) {
      if (hunks == max_hunks) {
        const auto left = static_cast<std::size_t>(
            std::count_if(changes.begin(), changes.end(), [&](std::size_t c) { return c >= i; }));
        out += fmt::format("  ... {} more changed line(s) not shown\n", left);
        break;
      }
      ++hunks;
      const LineEdit& e = edits[i];
      out += fmt::format("  @@ golden {} {}, now {} {} @@\n", unit, e.a == kNpos ? e.b : e.a, unit,
                         e.b == kNpos ? e.a : e.b);
    }
    const LineEdit& e = edits[i];
    if (e.a != kNpos && e.b != kNpos) {
      out += fmt::format("    {:>6} {}\n", e.b, b[e.b]);
    } else if (e.a != kNpos) {
      out += fmt::format("  - {:>6} {}\n", e.a, a[e.a]);
    } else {
      out += fmt::format("  + {:>6} {}\n", e.b, b[e.b]);
    }
  }
  return out;
}

/** Rank 0's lines compared: a line diff, or the first divergence when too many lines differ. */
std::string diff_lines(const std::vector<std::string>& a, const std::vector<std::string>& b,
                       std::size_t context, std::size_t max_hunks, const std::string& unit) {
  bool too_far = false;
  const std::vector<LineEdit> edits = line_diff(a, b, 2000, too_far);
  if (!too_far) return format_hunks(edits, a, b, context, max_hunks, unit);
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  std::string out =
      fmt::format("  more than 2000 lines differ; the first difference, at {} {}:\n", unit, k);
  const std::size_t from = k > context ? k - context : 0;
  for (std::size_t i = from; i < k; ++i) out += fmt::format("    {:>6} {}\n", i, a[i]);
  for (std::size_t i = k; i < std::min(a.size(), k + context); ++i)
    out += fmt::format("  - {:>6} {}\n", i, a[i]);
  for (std::size_t i = k; i < std::min(b.size(), k + context); ++i)
    out += fmt::format("  + {:>6} {}\n", i, b[i]);
  return out;
}

}  // namespace

std::vector<std::string> canonical_order(const Schedule& s, Rank r) {
  const RankSchedule& rs = s.ranks.at(r);
  EventNames events;
  std::vector<std::string> lines;
  lines.reserve(rs.ops.size());
  for (const Op& op : rs.ops) lines.push_back(op_line(s, r, op, events));
  return lines;
}

std::string order_digest(const std::vector<std::string>& lines) {
  std::uint64_t h = kFnvOffset;
  for (const std::string& line : lines) h = fnv1a(fnv1a(h, line), "\n");
  return hex(h);
}

std::vector<std::string> order_sections(const Schedule& s, Rank r,
                                        const std::vector<std::string>& lines) {
  const RankSchedule& rs = s.ranks.at(r);
  std::vector<std::string> out;
  std::size_t begin = 0;
  auto name_of = [&](const Op& op) { return when_of(op) + " @" + base_of(s, op); };
  for (std::size_t i = 1; i <= rs.ops.size(); ++i) {
    if (i < rs.ops.size() && name_of(rs.ops[i]) == name_of(rs.ops[begin])) continue;
    const std::vector<std::string> part(lines.begin() + static_cast<std::ptrdiff_t>(begin),
                                        lines.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(
        fmt::format("{} | {} ops | {}", name_of(rs.ops[begin]), i - begin, order_digest(part)));
    begin = i;
  }
  return out;
}

GoldenOrder make_golden_order(const Schedule& s, const std::string& scenario,
                              const std::vector<std::string>& sets, const std::string& built_by,
                              std::size_t full_order_limit) {
  GoldenOrder g;
  g.scenario = scenario;
  g.sets = sets;
  g.built_by = built_by;
  for (Rank r = 0; r < s.world_size; ++r) {
    std::vector<std::string> lines = canonical_order(s, r);
    g.ranks.push_back({lines.size(), order_digest(lines)});
    if (r != 0) continue;
    if (lines.size() <= full_order_limit)
      g.order = std::move(lines);
    else
      g.sections = order_sections(s, r, lines);
  }
  return g;
}

std::string golden_order_text(const GoldenOrder& g) {
  std::string out = fmt::format(
      "{} (docs/orders.md). Check: hpzlab order --check FILE; rewrite: hpzlab order --update "
      "FILE\n",
      kHeader);
  out += "scenario " + g.scenario + "\n";
  for (const std::string& set : g.sets) out += "set " + set + "\n";
  out += "built-by " + g.built_by + "\n";
  for (std::size_t r = 0; r < g.ranks.size(); ++r)
    out += fmt::format("rank {} ops {} digest {}\n", r, g.ranks[r].ops, g.ranks[r].digest);
  const bool full = g.sections.empty();
  out += full ? "order of rank 0\n" : "sections of rank 0\n";
  for (const std::string& line : full ? g.order : g.sections) out += line + "\n";
  return out;
}

GoldenOrder parse_golden_order(const std::string& text, const std::string& file) {
  GoldenOrder g;
  std::istringstream in(text);
  std::string line;
  std::size_t n = 0;
  auto fail = [&](const std::string& what) {
    throw InputError(file, fmt::format("line {}", n), what);
  };
  std::vector<std::string>* body = nullptr;
  while (std::getline(in, line)) {
    ++n;
    if (body != nullptr) {
      body->push_back(line);
      continue;
    }
    if (n == 1) {
      if (line.rfind(kHeader, 0) != 0)
        fail(fmt::format("not an hpzlab golden order (it starts with '{}')", kHeader));
      continue;
    }
    const std::size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "scenario" && g.scenario.empty() && !value.empty()) {
      g.scenario = value;
    } else if (key == "set" && !value.empty()) {
      g.sets.push_back(value);
    } else if (key == "built-by") {
      g.built_by = value;
    } else if (key == "rank") {
      std::size_t r = 0;
      std::size_t ops = 0;
      char digest[17] = {};
      if (std::sscanf(value.c_str(), "%zu ops %zu digest %16[0-9a-f]", &r, &ops, digest) != 3 ||
          r != g.ranks.size() || std::string(digest).size() != 16) {
        fail(fmt::format("expected 'rank {} ops N digest HEX16'", g.ranks.size()));
      }
      g.ranks.push_back({ops, digest});
    } else if (line == "order of rank 0") {
      body = &g.order;
    } else if (line == "sections of rank 0") {
      body = &g.sections;
    } else {
      fail(
          fmt::format("'{}' is not a golden order line (allowed: scenario, set, built-by, rank, "
                      "'order of rank 0', 'sections of rank 0')",
                      line.substr(0, 60)));
    }
  }
  if (g.scenario.empty()) fail("no 'scenario' line");
  if (g.ranks.empty()) fail("no 'rank' lines");
  if (body == nullptr) fail("no 'order of rank 0' or 'sections of rank 0' line");
  if (body == &g.order && g.order.size() != g.ranks[0].ops) {
    fail(fmt::format("rank 0 has {} ops, but {} order lines follow", g.ranks[0].ops,
                     g.order.size()));
  }
  return g;
}

std::string golden_order_diff(const GoldenOrder& golden, const GoldenOrder& now,
                              std::size_t context, std::size_t max_hunks) {
  std::string out;
  if (golden.ranks.size() != now.ranks.size()) {
    out += fmt::format("  world size {} in the golden order, {} now\n", golden.ranks.size(),
                       now.ranks.size());
  }
  std::vector<int> differing;
  for (std::size_t r = 0; r < std::min(golden.ranks.size(), now.ranks.size()); ++r) {
    const auto& g = golden.ranks[r];
    const auto& c = now.ranks[r];
    if (g.ops != c.ops || g.digest != c.digest) differing.push_back(static_cast<int>(r));
  }
  if (differing.empty() && out.empty()) return {};
  if (!differing.empty()) {
    out += fmt::format("  ranks whose order differs: {}", rank_ranges(differing));
    const auto& g0 = golden.ranks[static_cast<std::size_t>(differing[0])];
    const auto& c0 = now.ranks[static_cast<std::size_t>(differing[0])];
    out += fmt::format(" (rank {}: {} ops in the golden order, {} now)\n", differing[0], g0.ops,
                       c0.ops);
  }
  const bool rank0_differs = !differing.empty() && differing[0] == 0;
  if (!rank0_differs) {
    out +=
        "  rank 0's order is the golden one; show a differing rank's with hpzlab order "
        "SCENARIO --rank N\n";
  } else if (!golden.order.empty() && !now.order.empty()) {
    out += "  rank 0, first differences (- golden, + now; the number is the op's index):\n";
    out += diff_lines(golden.order, now.order, context, max_hunks, "op");
  } else if (!golden.sections.empty() && !now.sections.empty()) {
    out +=
        "  rank 0, first differing sections (- golden, + now; a section is a run of ops with "
        "the same step, phase and label; see its ops with hpzlab order SCENARIO --rank 0):\n";
    out += diff_lines(golden.sections, now.sections, context, max_hunks, "section");
  } else {
    out += "  rank 0's order is stored in full on one side and as sections on the other\n";
  }
  return out;
}

std::vector<LineEdit> line_diff(const std::vector<std::string>& a,
                                const std::vector<std::string>& b, std::size_t max_edits,
                                bool& too_far) {
  too_far = false;
  // Common head and tail first: most changes to an order are local.
  std::size_t head = 0;
  while (head < a.size() && head < b.size() && a[head] == b[head]) ++head;
  std::size_t tail = 0;
  while (tail < a.size() - head && tail < b.size() - head &&
         a[a.size() - 1 - tail] == b[b.size() - 1 - tail]) {
    ++tail;
  }
  const auto n = static_cast<std::ptrdiff_t>(a.size() - head - tail);
  const auto m = static_cast<std::ptrdiff_t>(b.size() - head - tail);
  auto same = [&](std::ptrdiff_t x, std::ptrdiff_t y) {
    return a[head + static_cast<std::size_t>(x)] == b[head + static_cast<std::size_t>(y)];
  };
  const auto max = std::min<std::ptrdiff_t>(n + m, static_cast<std::ptrdiff_t>(max_edits));
  // trace[d] holds V[-d..d] as it was before round d (V[k]: the furthest x on diagonal k).
  std::vector<std::vector<std::ptrdiff_t>> trace;
  std::vector<std::ptrdiff_t> v(2 * static_cast<std::size_t>(max) + 3, 0);
  const std::ptrdiff_t off = max + 1;
  std::ptrdiff_t found = -1;
  for (std::ptrdiff_t d = 0; d <= max && found < 0; ++d) {
    trace.emplace_back(v.begin() + (off - d - 1), v.begin() + (off + d + 2));
    for (std::ptrdiff_t k = -d; k <= d; k += 2) {
      std::ptrdiff_t x = (k == -d || (k != d && v[off + k - 1] < v[off + k + 1]))
                             ? v[off + k + 1]
                             : v[off + k - 1] + 1;
      std::ptrdiff_t y = x - k;
      while (x < n && y < m && same(x, y)) ++x, ++y;
      v[off + k] = x;
      if (x >= n && y >= m) {
        found = d;
        break;
      }
    }
  }
  if (found < 0) {
    too_far = true;
    return {};
  }
  std::vector<LineEdit> edits;
  for (std::size_t i = 0; i < tail; ++i) edits.push_back({a.size() - 1 - i, b.size() - 1 - i});
  std::ptrdiff_t x = n;
  std::ptrdiff_t y = m;
  auto at = [&](std::ptrdiff_t d, std::ptrdiff_t k) {
    return trace[static_cast<std::size_t>(d)][static_cast<std::size_t>(k + d + 1)];
  };
  for (std::ptrdiff_t d = found; d >= 0; --d) {
    const std::ptrdiff_t k = x - y;
    const std::ptrdiff_t prev_k =
        (k == -d || (k != d && at(d, k - 1) < at(d, k + 1))) ? k + 1 : k - 1;
    const std::ptrdiff_t prev_x = d == 0 ? 0 : at(d, prev_k);
    const std::ptrdiff_t prev_y = d == 0 ? 0 : prev_x - prev_k;
    while (x > prev_x && y > prev_y) {
      --x, --y;
      edits.push_back({head + static_cast<std::size_t>(x), head + static_cast<std::size_t>(y)});
    }
    if (d == 0) break;
    if (x == prev_x) {
      edits.push_back({kNpos, head + static_cast<std::size_t>(prev_y)});
    } else {
      edits.push_back({head + static_cast<std::size_t>(prev_x), kNpos});
    }
    x = prev_x;
    y = prev_y;
  }
  for (std::size_t i = head; i-- > 0;) edits.push_back({i, i});
  std::reverse(edits.begin(), edits.end());
  return edits;
}

}  // namespace hpz
