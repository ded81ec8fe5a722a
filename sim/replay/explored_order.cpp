#include "sim/replay/explored_order.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "sim/error.hpp"
#include "sim/input.hpp"

namespace hpz::replay {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "hpzlab explored order 1";

json time_json(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

double time_of(const json& v, const std::string& file, const std::string& key) {
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) throw InputError(file, key, "expected a number or null");
  return v.get<double>();
}

}  // namespace

std::string explored_order_text(const Schedule& s, const std::string& scenario,
                                const std::vector<std::string>& sets, const Timeline& order) {
  json ranks = json::array();
  for (const auto& ops : order.ranks) {
    json r = json::array();
    for (const OpTime& o : ops)
      r.push_back({time_json(o.issue_s), time_json(o.start_s), time_json(o.end_s)});
    ranks.push_back(std::move(r));
  }
  return json{{"format", kFormat},
              {"scenario", scenario},
              {"sets", sets},
              {"variant", s.variant},
              {"ranks", std::move(ranks)}}
             .dump() +
         "\n";
}

Timeline read_explored_order(const std::string& text, const std::string& file, const Schedule& s) {
  const json doc = parse_json_input(text, file, "not valid JSON");
  if (!doc.is_object())
    throw InputError(file, "", "not an order file from hpzlab explore --order-out");
  if (doc.value("format", "") != kFormat) {
    throw InputError(file, "format",
                     fmt::format("not an explored order (allowed: \"{}\")", kFormat));
  }
  if (doc.value("variant", "") != s.variant) {
    throw InputError(file, "variant",
                     fmt::format("the order is of variant '{}', the scenario builds '{}'",
                                 doc.value("variant", ""), s.variant));
  }
  const json& ranks = doc.contains("ranks") ? doc["ranks"] : json();
  if (!ranks.is_array() || ranks.size() != s.ranks.size()) {
    throw InputError(file, "ranks",
                     fmt::format("expected {} ranks, as the scenario has", s.ranks.size()));
  }
  Timeline t;
  t.ranks.resize(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const json& ops = ranks[r];
    const std::string key = fmt::format("ranks[{}]", r);
    if (!ops.is_array() || ops.size() != s.ranks[r].ops.size()) {
      throw InputError(file, key,
                       fmt::format("expected {} ops, as the scenario's rank {} has (the order was "
                                   "written for another schedule)",
                                   s.ranks[r].ops.size(), r));
    }
    t.ranks[r].reserve(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const json& o = ops[i];
      const std::string op_key = fmt::format("{}[{}]", key, i);
      if (!o.is_array() || o.size() != 3)
        throw InputError(file, op_key, "expected [issue, start, end]");
      t.ranks[r].push_back(
          {time_of(o[0], file, op_key), time_of(o[1], file, op_key), time_of(o[2], file, op_key)});
    }
  }
  return t;
}

}  // namespace hpz::replay
