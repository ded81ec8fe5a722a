// Sim-vs-real comparison: the per-op times `hpzlab sim --op-times` writes (op_times, op_labels,
// source) and what `hpzlab compare` computes from two such files.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/time/compare.hpp"
#include "sim/time/report.hpp"
#include "sim/time/simulate.hpp"
#include "tests/input_error.hpp"
#include "tests/paths.hpp"

namespace hpz::time {
namespace {

using nlohmann::json;

const std::string kSource = test::source_dir();

Scenario scenario(const std::string& name, const std::vector<Override>& sets = {}) {
  return load_scenario(test::scenario_path(name), sets);
}

/** A simulated run and the schedule it timed. */
struct Simulated {
  Schedule schedule;
  SimResult result;
};

Simulated simulated(const Scenario& sc) {
  Simulated s{build_schedule(sc), {}};
  s.result = simulate(timing_inputs_of(sc), s.schedule, SimOptions{});
  return s;
}

/** tiny.toml cut to 2 steps: the JSON of `hpzlab sim --op-times`, built once. */
const json& tiny_sim() {
  static const json j = [] {
    const Simulated s = simulated(scenario("tiny.toml", {{"run.steps", "2"}}));
    return to_json(s.schedule, s.result, true);
  }();
  return j;
}

/** The same run as if measured `factor` times slower: every time and the step time scaled. */
json slower(json j, double factor) {
  for (json& rank : j["op_times"]) {
    for (json& t : rank) {
      if (!t.is_array()) continue;
      for (json& v : t) {
        if (v.is_number()) v = v.get<double>() * factor;
      }
    }
  }
  j["step_time_s"] = j["step_time_s"].get<double>() * factor;
  j["source"] = "real";
  return j;
}

/** Index of the first op of `rank` whose label starts with `prefix` and that lasts >= min_s. */
std::size_t find_op(const json& j, std::size_t rank, const std::string& prefix, double min_s) {
  const json& labels = j["op_labels"][rank];
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const json& t = j["op_times"][rank][i];
    if (labels[i].get<std::string>().rfind(prefix, 0) == 0 && t.is_array() &&
        t[2].get<double>() - t[1].get<double>() >= min_s) {
      return i;
    }
  }
  ADD_FAILURE() << "no " << prefix << " op of rank " << rank << " lasting " << min_s << " s";
  return 0;
}

TEST(OpTimes, EveryOpOfEveryRankInIrOrderWithItsLabel) {
  const Simulated s = simulated(scenario("tiny.toml", {{"run.steps", "2"}}));
  const json j = to_json(s.schedule, s.result, true);
  EXPECT_EQ(j["source"], "sim");
  ASSERT_EQ(j["op_times"].size(), s.schedule.ranks.size());
  ASSERT_EQ(j["op_labels"].size(), s.schedule.ranks.size());
  bool saw_unit = false;
  bool saw_no_unit = false;
  for (std::size_t r = 0; r < s.schedule.ranks.size(); ++r) {
    const auto& ops = s.schedule.ranks[r].ops;
    ASSERT_EQ(j["op_times"][r].size(), ops.size());
    ASSERT_EQ(j["op_labels"][r].size(), ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const OpTime& t = s.result.timeline.ranks[r][i];
      EXPECT_EQ(j["op_times"][r][i], json({t.issue_s, t.start_s, t.end_s}));
      const std::string unit = ops[i].unit == kNoUnit ? "-" : s.schedule.units[ops[i].unit].name;
      saw_unit = saw_unit || ops[i].unit != kNoUnit;
      saw_no_unit = saw_no_unit || ops[i].unit == kNoUnit;
      EXPECT_EQ(j["op_labels"][r][i], std::string(to_string(ops[i].kind)) + "/" +
                                          std::string(to_string(ops[i].purpose)) + "/" + unit);
    }
  }
  EXPECT_TRUE(saw_unit && saw_no_unit);
  const json plain = to_json(s.schedule, s.result, false);
  EXPECT_FALSE(plain.contains("op_times") || plain.contains("op_labels"));
  EXPECT_EQ(plain["source"], "sim");
}

TEST(OpTimes, SameInputSameBytes) {
  const Scenario sc = scenario("tiny.toml", {{"run.steps", "2"}});
  const Simulated a = simulated(sc);
  const Simulated b = simulated(sc);
  EXPECT_EQ(JsonReporter(true).render(a.schedule, a.result),
            JsonReporter(true).render(b.schedule, b.result));
}

TEST(OpTimes, OpsThatNeverRanAreNullAndNonFiniteNumbersStayValidJson) {
  Simulated s = simulated(scenario("mismatched-collectives.toml"));
  ASSERT_TRUE(s.result.mean.hung);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  s.result.timeline.ranks[0][0].issue_s = kInf;
  s.result.mean.step_time_s = std::numeric_limits<double>::quiet_NaN();
  const json back = json::parse(JsonReporter(true).render(s.schedule, s.result));
  EXPECT_TRUE(back["step_time_s"].is_null());
  EXPECT_TRUE(back["op_times"][0][0][0].is_null());
  EXPECT_TRUE(back["op_times"][0][0][2].is_number());
  std::size_t nulls = 0;
  std::size_t never_ran = 0;
  for (std::size_t r = 0; r < s.schedule.ranks.size(); ++r) {
    for (std::size_t i = 0; i < s.schedule.ranks[r].ops.size(); ++i) {
      nulls += back["op_times"][r][i].is_null() ? 1 : 0;
      never_ran += s.result.timeline.ranks[r][i].end_s < 0 ? 1 : 0;
    }
  }
  EXPECT_GT(never_ran, 0u);
  EXPECT_EQ(nulls, never_ran);
}

TEST(Quantile, InterpolatesBetweenSortedValues) {
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 0.9), 3.7);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.9), 7);
  EXPECT_TRUE(std::isnan(quantile({}, 0.5)));
}

TEST(Compare, ASimulationAgainstItselfHasNoError) {
  const Comparison c = compare(tiny_sim(), "sim.json", tiny_sim(), "sim.json", {.top = 5});
  EXPECT_EQ(c.step_error, 0);
  EXPECT_GT(c.ops_compared, 100u);
  EXPECT_GT(c.ops_over_floor, 0u);
  EXPECT_EQ(c.median_abs_relative, 0);
  EXPECT_EQ(c.p90_abs_relative, 0);
  ASSERT_EQ(c.worst.size(), 5u);
  for (const OpError& e : c.worst) EXPECT_EQ(e.error_s, 0);
}

TEST(Compare, ARealRunTenPercentSlowerIsMinusOneEleventh) {
  const json real = slower(tiny_sim(), 1.1);
  const Comparison c = compare(tiny_sim(), "sim.json", real, "real.json", {.top = 1000000});
  EXPECT_EQ(c.real_source, "real");
  EXPECT_NEAR(c.step_error, -1.0 / 11, 1e-12);
  EXPECT_NEAR(c.median_relative, -1.0 / 11, 1e-9);
  EXPECT_NEAR(c.median_abs_relative, 1.0 / 11, 1e-9);
  EXPECT_NEAR(c.p90_abs_relative, 1.0 / 11, 1e-9);
  ASSERT_EQ(c.worst.size(), c.ops_compared);
  for (const OpError& e : c.worst) EXPECT_NEAR(e.relative, -1.0 / 11, 1e-6) << e.label;
}

TEST(Compare, TheWorstOpIsTheOnePerturbed) {
  json real = tiny_sim();
  const std::size_t i = find_op(real, 2, "kernel/", 1e-6);
  real["op_times"][2][i][2] = real["op_times"][2][i][2].get<double>() + 1e-3;
  const Comparison c = compare(tiny_sim(), "sim.json", real, "real.json", {.top = 3});
  ASSERT_EQ(c.worst.size(), 3u);
  EXPECT_EQ(c.worst[0].rank, 2);
  EXPECT_EQ(c.worst[0].op, i);
  EXPECT_EQ(c.worst[0].label, tiny_sim()["op_labels"][2][i]);
  EXPECT_NEAR(c.worst[0].error_s, -1e-3, 1e-12);
  EXPECT_EQ(c.worst[1].error_s, 0);
  EXPECT_EQ(c.step_error, 0);  // the top-level step time is what the files say, untouched here
}

TEST(Compare, HostSyncsAndEventsAreNotCompared) {
  const Comparison same = compare(tiny_sim(), "sim.json", tiny_sim(), "sim.json");
  json real = tiny_sim();
  for (const char* prefix : {"host_stream_sync/", "host_device_sync/"}) {
    const std::size_t i = find_op(real, 0, prefix, 0);
    real["op_times"][0][i][2] = real["op_times"][0][i][2].get<double>() + 1;
  }
  const std::size_t e = find_op(real, 1, "event_record/", 0);
  real["op_times"][1][e][2] = real["op_times"][1][e][2].get<double>() + 1;
  const Comparison c = compare(tiny_sim(), "sim.json", real, "real.json");
  EXPECT_EQ(c.ops_compared, same.ops_compared);
  ASSERT_FALSE(c.worst.empty());
  EXPECT_EQ(c.worst[0].error_s, 0);
}

TEST(Compare, ShortOpsStayOutOfThePercentilesNotOutOfTheCount) {
  const Comparison all = compare(tiny_sim(), "a", tiny_sim(), "b", {.floor_s = 0});
  const Comparison none = compare(tiny_sim(), "a", tiny_sim(), "b", {.floor_s = 1});
  EXPECT_EQ(all.ops_over_floor, all.ops_compared);
  EXPECT_EQ(none.ops_compared, all.ops_compared);
  EXPECT_EQ(none.ops_over_floor, 0u);
  EXPECT_TRUE(std::isnan(none.median_abs_relative));
  EXPECT_TRUE(comparison_json(none)["op_error"]["median_abs"].is_null());
}

TEST(Compare, ADifferentScheduleIsRejectedNamingFileAndKey) {
  json other = tiny_sim();
  other["variant"] = "event-wait";
  EXPECT_EQ(test::error_of([&] { compare(tiny_sim(), "SIM.json", other, "REAL.json"); }),
            "variant: 'event-wait' in REAL.json but 'stock' in SIM.json: the files time "
            "different schedules");

  json fewer = tiny_sim();
  const std::size_t n = fewer["op_times"][3].size();
  fewer["op_times"][3].erase(n - 1);
  fewer["op_labels"][3].erase(n - 1);
  EXPECT_EQ(test::error_of([&] { compare(tiny_sim(), "SIM.json", fewer, "REAL.json"); }),
            "op_times: rank 3 has " + std::to_string(n - 1) + " ops in REAL.json but " +
                std::to_string(n) + " in SIM.json");

  json relabelled = tiny_sim();
  relabelled["op_labels"][1][7] = "kernel/optimizer_step/-";
  EXPECT_NE(test::error_of([&] {
              compare(tiny_sim(), "SIM.json", relabelled, "REAL.json");
            }).find("op_labels: rank 1 op 7"),
            std::string::npos);

  // Run from another directory (the GPU machine): the same scenario file.
  json moved = tiny_sim();
  moved["scenario"] = "/elsewhere/scenarios/tiny.toml";
  EXPECT_NO_THROW(compare(tiny_sim(), "SIM.json", moved, "REAL.json"));
}

TEST(Compare, AFileWithoutOpTimesOrNotJsonIsOneLineNamingIt) {
  json plain = tiny_sim();
  plain.erase("op_times");
  EXPECT_EQ(test::error_of([&] { compare(tiny_sim(), "SIM.json", plain, "REAL.json"); }),
            "REAL.json: no op_times; run `hpzlab sim --op-times` / `hpzlab real`");
  const std::string malformed = kSource + "/tests/data/malformed.json";
  const std::string bad = test::error_of([&] { read_timed_json(malformed); });
  EXPECT_EQ(bad.rfind(malformed + ": not valid JSON (", 0), 0u) << bad;
  EXPECT_EQ(bad.find('\n'), std::string::npos);
  EXPECT_EQ(test::error_of([&] { read_timed_json("no/such/file.json"); }),
            "no/such/file.json: cannot read this file: No such file or directory");
  json broken = tiny_sim();
  broken["op_times"][0][3] = "soon";
  EXPECT_NE(test::error_of([&] {
              compare(broken, "SIM.json", tiny_sim(), "REAL.json");
            }).find("SIM.json: op_times: rank 0 op 3"),
            std::string::npos);
}

TEST(Compare, HostileFilesAreOneLine) {
  // Issue 20: a 5,000-deep value where an op time is expected overflowed the stack in the
  // message's dump; 1e999 was "internal error"; a duplicate key was silently dropped.
  const std::string dir = ::testing::TempDir();
  const auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "hpzlab-hostile-" + name) << text;
    return dir + "hpzlab-hostile-" + name;
  };
  const std::string deep =
      file("deep.json", "{\"op_times\": [[" + std::string(5000, '[') + std::string(5000, ']') +
                            "]], \"op_labels\": [[\"kernel/forward/0\"]]}");
  EXPECT_EQ(test::error_of([&] { read_timed_json(deep); }),
            deep + ": not valid JSON: nested more than 64 levels deep (allowed: at most 64)");
  const std::string shallow =
      file("shallow.json", "{\"op_times\": [[" + std::string(20, '[') + std::string(20, ']') +
                               "]], \"op_labels\": [[\"kernel/forward/0\"]], \"step_time_s\": 1}");
  EXPECT_EQ(test::error_of([&] { read_timed_json(shallow); }),
            shallow +
                ": op_times: rank 0 op 0: expected [issue_s, start_s, end_s] or null, got "
                "[[[[...]]]]");
  const std::string huge = file("huge.json", "{\"op_times\": [], \"step_time_s\": 1e999}");
  EXPECT_EQ(test::error_of([&] { read_timed_json(huge); }),
            huge + ": not valid JSON (number overflow parsing '1e999')");
  const std::string twice = file("twice.json", "{\"op_times\": [], \"op_times\": []}");
  EXPECT_EQ(test::error_of([&] { read_timed_json(twice); }),
            twice +
                ": op_times: not valid JSON: this key is given twice in one object (allowed: "
                "once)");
  EXPECT_EQ(test::error_of([&] { read_timed_json(""); }),
            "'': cannot read this file: the file name is empty");
  EXPECT_EQ(test::error_of([&] { read_timed_json("/dev/zero"); }),
            "/dev/zero: cannot read this file: is not a regular file (a device, FIFO or socket "
            "is not read)");
}

TEST(Compare, TheShippedFixturesDifferByTenPercentAndOneOp) {
  const std::string dir = kSource + "/tests/data/compare/";
  const Comparison c = compare_files(dir + "tiny-sim.json", dir + "tiny-real.json", {.top = 2});
  EXPECT_EQ(c.sim_source, "sim");
  EXPECT_EQ(c.real_source, "real");
  EXPECT_NEAR(c.step_error, -1.0 / 11, 1e-12);
  EXPECT_NEAR(c.median_relative, -1.0 / 11, 1e-9);
  ASSERT_EQ(c.worst.size(), 2u);
  EXPECT_EQ(c.worst[0].rank, 1);
  EXPECT_NEAR(c.worst[0].error_s, -(c.worst[0].sim_s * 0.1 + 1e-3), 1e-12);
  const std::string text = render_text(c);
  EXPECT_NE(text.find("error -9.09%"), std::string::npos) << text;
}

}  // namespace
}  // namespace hpz::time
