// The IR's JSON form round-trips (recorded schedules' labels, source and host event syncs too),
// and malformed documents give clear errors naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz {
namespace {

Schedule tiny_schedule() {
  Scenario sc;
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 2;
  sc.cluster.gpu = gpu_preset("a100-80g");
  sc.model = model_preset("tiny");
  // Hidden 32: qwZ's quantizer needs a multiple of 8 elements in every gathered shard (DeepSpeed
  // itself stops otherwise: sim/deepspeed/build.cpp).
  sc.model.hidden = 32;
  sc.model.heads = 2;
  sc.model.kv_heads = 2;
  sc.training.seq_len = 8;
  sc.zero.zero_hpz_partition_size = 2;
  sc.zero.zero_quantized_weights = true;
  sc.zero.zero_quantized_gradients = true;
  sc.zero.stage3_param_persistence_threshold = 0;
  sc.run.variant = Variant::kEventWait;
  sc.run.spin_before_copy_us = 12.5;  // a spin kernel before each secondary copy
  return build_schedule(sc);
}

/** tiny_schedule() with what only a recorded schedule has: labels, a source, a host event sync
 *  (after rank 0's first event record) and the recorder's purposes. */
Schedule recorded_schedule() {
  Schedule s = tiny_schedule();
  for (RankSchedule& rs : s.ranks) {  // the builder's module labels give way to these two
    for (Op& op : rs.ops.mut()) op.label = kNoLabel;
  }
  s.labels = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp"};
  s.source = {{"recorder", "hpzlab record"}, {"deepspeed", "0.13.4"}};
  auto& ops = s.ranks[0].ops.mut();
  const auto rec = std::find_if(ops.begin(), ops.end(),
                                [](const Op& op) { return op.kind == OpKind::kEventRecord; });
  Op sync;
  sync.kind = OpKind::kHostEventSync;
  sync.purpose = Purpose::kHostThrottle;
  sync.stream = kHostStream;
  sync.event = rec->event;
  sync.label = 0;
  ops.insert(rec + 1, sync);
  ops.back().purpose = Purpose::kOther;
  ops.back().label = 1;
  return s;
}

TEST(ScheduleJson, RoundTripIsLossless) {
  const Schedule s = recorded_schedule();
  const nlohmann::json j = schedule_to_json(s);
  const Schedule back = schedule_from_json(j);
  EXPECT_EQ(schedule_to_json(back), j);
  ASSERT_EQ(back.ranks.size(), s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    ASSERT_EQ(back.ranks[r].ops.size(), s.ranks[r].ops.size());
    ASSERT_EQ(back.ranks[r].accesses.size(), s.ranks[r].accesses.size());
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const Op& a = s.ranks[r].ops[i];
      const Op& b = back.ranks[r].ops[i];
      EXPECT_EQ(a.kind, b.kind);
      EXPECT_EQ(a.purpose, b.purpose);
      EXPECT_EQ(a.stream, b.stream);
      EXPECT_EQ(a.event, b.event);
      EXPECT_EQ(a.buffer, b.buffer);
      EXPECT_EQ(a.flops, b.flops);
      EXPECT_EQ(a.mem_bytes, b.mem_bytes);
      EXPECT_EQ(a.comm_bytes, b.comm_bytes);
      EXPECT_EQ(a.spin_us, b.spin_us);
      EXPECT_EQ(a.access_count, b.access_count);
      EXPECT_EQ(a.label, b.label);
    }
  }
  EXPECT_EQ(back.labels, s.labels);
  EXPECT_EQ(back.source, s.source);
  EXPECT_EQ(j["source"]["deepspeed"], "0.13.4");
  EXPECT_EQ(j["labels"][1], "model.layers.0.mlp");
}

// The builder names itself and its release (sim/deepspeed/build.cpp) and labels the modules.
TEST(ScheduleJson, ABuiltScheduleNamesItsReleaseAndModules) {
  const nlohmann::json j = schedule_to_json(tiny_schedule());
  EXPECT_EQ(j["source"]["builder"], "deepspeed");
  EXPECT_EQ(j["source"]["deepspeed"], "0.13.4");
  ASSERT_TRUE(j.contains("labels"));
  EXPECT_FALSE(j["labels"].empty());
}

TEST(ScheduleJson, HostEventSyncIsWrittenWithItsEventOnTheHost) {
  const nlohmann::json j = schedule_to_json(recorded_schedule());
  int syncs = 0;
  for (const auto& op : j["ranks"][0]["ops"]) {
    if (op["kind"] != "host_event_sync") continue;
    EXPECT_EQ(op["stream"], -1);
    EXPECT_TRUE(op.contains("event"));
    if (!op.contains("label")) continue;  // DeepSpeed's own host waits (the builder's)
    ++syncs;                              // the one recorded_schedule() added
    EXPECT_EQ(op["purpose"], "host_throttle");
    EXPECT_EQ(op["label"], 0);
  }
  EXPECT_EQ(syncs, 1);
}

/** The error schedule_from_json gives for `j` ("" when it accepts it). */
std::string error_of(const nlohmann::json& j) {
  try {
    schedule_from_json(j, "x.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

/** Where rank 0's host event sync is in the JSON of recorded_schedule(). */
std::size_t sync_index(const nlohmann::json& j) {
  const auto& ops = j["ranks"][0]["ops"];
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]["kind"] == "host_event_sync") return i;
  }
  return 0;
}

TEST(ScheduleJson, AWaitForAnEventNeverRecordedNamesTheOp) {
  nlohmann::json j = schedule_to_json(recorded_schedule());
  const std::size_t i = sync_index(j);
  j["ranks"][0]["ops"][i]["event"] = 9999;
  const std::string path = "x.json: ranks[0].ops[" + std::to_string(i) + "].event: event 9999";
  EXPECT_NE(error_of(j).find(path), std::string::npos) << error_of(j);
  // A sync before the record is as wrong as one on an event never recorded.
  nlohmann::json early = schedule_to_json(recorded_schedule());
  auto& ops = early["ranks"][0]["ops"];
  const nlohmann::json sync = ops[sync_index(early)];
  ops.erase(sync_index(early));
  ops.insert(ops.begin(), sync);
  EXPECT_NE(error_of(early).find("ranks[0].ops[0].event"), std::string::npos) << error_of(early);
  // The same rule for a stream's wait.
  nlohmann::json wait = schedule_to_json(tiny_schedule());
  for (auto& op : wait["ranks"][1]["ops"]) {
    if (op["kind"] == "stream_wait_event") op["event"] = 9999;
  }
  EXPECT_NE(error_of(wait).find("is not recorded"), std::string::npos) << error_of(wait);
}

TEST(ScheduleJson, AHostEventSyncOnAStreamIsRejected) {
  nlohmann::json j = schedule_to_json(recorded_schedule());
  j["ranks"][0]["ops"][sync_index(j)]["stream"] = 0;
  EXPECT_NE(error_of(j).find(".stream: must be -1"), std::string::npos) << error_of(j);
}

TEST(ScheduleJson, ALabelOutOfRangeIsRejected) {
  nlohmann::json j = schedule_to_json(recorded_schedule());
  j["ranks"][0]["ops"][sync_index(j)]["label"] = 2;
  EXPECT_NE(error_of(j).find(".label: out of range (allowed: an index into labels, 0 to 1)"),
            std::string::npos)
      << error_of(j);
  j["ranks"][0]["ops"][sync_index(j)]["label"] = -2;
  EXPECT_NE(error_of(j).find(".label: out of range"), std::string::npos) << error_of(j);
}

TEST(ScheduleJson, SourceHoldsStrings) {
  nlohmann::json j = schedule_to_json(recorded_schedule());
  j["source"]["steps"] = 2;
  EXPECT_NE(error_of(j).find("x.json: source.steps: expected a string"), std::string::npos)
      << error_of(j);
  j["source"] = "DeepSpeed";
  EXPECT_NE(error_of(j).find("x.json: source: expected an object"), std::string::npos)
      << error_of(j);
}

TEST(ScheduleJson, WhatTheEnginesIndexIsRangeChecked) {
  const auto broken = [](auto change) {
    nlohmann::json j = schedule_to_json(tiny_schedule());
    change(j);
    return error_of(j);
  };
  EXPECT_NE(broken([](auto& j) { j["world_size"] = 3; }).find("hpz_size: must divide"),
            std::string::npos);
  EXPECT_NE(
      broken([](auto& j) { j["ranks"].erase(3); }).find("ranks: 3 listed but world_size is 4"),
      std::string::npos);
  EXPECT_NE(broken([](auto& j) {
              j["groups"][0]["ranks"] = {1, 0};
            }).find("groups[0].ranks"),
            std::string::npos);
  const std::string unit = broken([](auto& j) {
    for (auto& op : j["ranks"][2]["ops"]) {
      if (op.contains("unit")) op["unit"] = 1000;
    }
  });
  EXPECT_NE(unit.find("ranks[2].ops["), std::string::npos) << unit;
  EXPECT_NE(unit.find(".unit: no such unit"), std::string::npos) << unit;
  const std::string group = broken([](auto& j) {
    for (auto& op : j["ranks"][1]["ops"]) {
      if (op.contains("group")) op["group"] = 1000;
    }
  });
  EXPECT_NE(group.find(".group: no such group"), std::string::npos) << group;
  const std::string past = broken([](auto& j) {
    for (auto& op : j["ranks"][0]["ops"]) {
      if (op.contains("accesses")) op["accesses"][0][3] = 1ull << 40;
    }
  });
  EXPECT_NE(past.find("past the end of buffer"), std::string::npos) << past;
}

TEST(ScheduleJson, ReadsAFileAndNamesItInErrors) {
  const std::string path = ::testing::TempDir() + "hpzlab-schedule-file.json";
  {
    std::ofstream out(path);
    out << schedule_to_json(recorded_schedule()).dump();
  }
  EXPECT_EQ(schedule_to_json(read_schedule_file(path)), schedule_to_json(recorded_schedule()));
  {
    std::ofstream out(path);
    out << "{\"format\": ";
  }
  try {
    read_schedule_file(path);
    FAIL() << "truncated JSON accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": not valid JSON"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  try {
    read_schedule_file(path);
    FAIL() << "a missing file was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": cannot read"), std::string::npos) << e.what();
  }
}

TEST(ScheduleJson, IntegersOutOfTheirTypesRangeAreRefused) {
  // nlohmann's get<int> casts 1e300 or 2^40 unchecked (undefined behaviour for the float).
  const auto error = [](const nlohmann::json& j) {
    try {
      schedule_from_json(j, "s.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = schedule_to_json(tiny_schedule());
  j["world_size"] = 1e300;
  EXPECT_EQ(error(j),
            "s.json: world_size: out of range (allowed: an integer from -2147483648 to "
            "2147483647)");
  j["world_size"] = std::uint64_t{1} << 40;
  EXPECT_EQ(error(j).rfind("s.json: world_size: out of range", 0), 0u) << error(j);
  j["world_size"] = 2.5;
  EXPECT_EQ(error(j).rfind("s.json: world_size: out of range", 0), 0u) << error(j);
  j = schedule_to_json(tiny_schedule());
  j["groups"][0]["ranks"][0] = -1e30;
  EXPECT_EQ(error(j).rfind("s.json: groups[0].ranks[0]: out of range", 0), 0u) << error(j);
  // A whole float in range reads as the integer it is.
  j = schedule_to_json(tiny_schedule());
  j["world_size"] = static_cast<double>(tiny_schedule().world_size);
  EXPECT_EQ(schedule_to_json(schedule_from_json(j, "s.json")), schedule_to_json(tiny_schedule()));
}

TEST(ScheduleJson, HostileFilesAreOneLine) {
  // Issue 20: nesting deep enough to overflow the stack, a number beyond a double, /dev/zero.
  const std::string path = ::testing::TempDir() + "hpzlab-hostile-schedule.json";
  std::ofstream(path) << "{\"format\": \"hpzlab-schedule\", \"ranks\": " + std::string(5000, '[') +
                             std::string(5000, ']') + "}";
  const auto error = [](const std::string& file) {
    try {
      read_schedule_file(file);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(path),
            path + ": not valid JSON: nested more than 64 levels deep (allowed: at most 64)");
  std::ofstream(path) << "{\"format\": \"hpzlab-schedule\", \"version\": 1e999}";
  EXPECT_EQ(error(path), path + ": not valid JSON (number overflow parsing '1e999')");
  EXPECT_EQ(
      error("/dev/zero").rfind("/dev/zero: cannot read this schedule file: is not a regular", 0),
      0u);
  std::filesystem::remove(path);
}

/** tiny_schedule()'s JSON with rank 2 written as a recorder writes the ranks it did not record:
 *  like rank 0, on the groups of rank 2's node (or, with `mapped` false, on rank 0's). */
nlohmann::json rank_2_like_0(bool mapped) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  nlohmann::json map = nlohmann::json::array();
  const auto& groups = j["groups"];
  const auto has = [](const nlohmann::json& g, int r) {
    const auto& ranks = g["ranks"];
    return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
  };
  for (std::size_t g = 0; g < groups.size() && mapped; ++g) {
    if (!has(groups[g], 0) || has(groups[g], 2)) continue;
    for (std::size_t h = 0; h < groups.size(); ++h) {
      if (groups[h]["kind"] == groups[g]["kind"] && has(groups[h], 2)) map.push_back({g, h});
    }
  }
  j["ranks"][2] = {{"rank", 2}, {"like", 0}, {"groups", map}};
  return j;
}

TEST(ScheduleJson, ARankWrittenLikeAnotherIsItsScheduleOnItsOwnGroups) {
  const Schedule s = schedule_from_json(rank_2_like_0(true));
  const RankSchedule& like = s.ranks[2];
  EXPECT_EQ(like.rank, 2);
  ASSERT_EQ(like.ops.size(), s.ranks[0].ops.size());
  EXPECT_EQ(like.buffers.size(), s.ranks[0].buffers.size());
  int moved = 0;
  for (std::size_t i = 0; i < like.ops.size(); ++i) {
    EXPECT_EQ(like.ops[i].kind, s.ranks[0].ops[i].kind);
    if (!is_collective(like.ops[i].kind)) continue;
    const auto& ranks = s.groups[like.ops[i].group].ranks;
    EXPECT_TRUE(std::binary_search(ranks.begin(), ranks.end(), 2)) << "op " << i;
    moved += like.ops[i].group != s.ranks[0].ops[i].group;
  }
  EXPECT_GT(moved, 0);  // the hpZ gathers moved to node 1's group
  // Written back, every rank is in full.
  EXPECT_TRUE(schedule_to_json(s)["ranks"][2].contains("ops"));
}

TEST(ScheduleJson, ARankWrittenLikeAnotherMustBeInItsGroups) {
  const std::string unmapped = error_of(rank_2_like_0(false));
  EXPECT_NE(unmapped.find("x.json: ranks[2].groups: rank 2 is not in group"), std::string::npos)
      << unmapped;
  nlohmann::json chained = rank_2_like_0(true);
  chained["ranks"][3] = {{"rank", 3}, {"like", 2}, {"groups", nlohmann::json::array()}};
  EXPECT_NE(error_of(chained).find("ranks[3].like: names no rank written in full"),
            std::string::npos)
      << error_of(chained);
}

// Every feature the builder has (qwZ, qgZ, offload, both fixes, the bug classes) reads back from
// its JSON: the reader's checks accept whatever the builder emits.
TEST(ScheduleJson, EveryShippedSmallScenarioReadsBack) {
  for (const char* name : {"tiny", "stale-after-step", "stale-after-load", "zero-element-slice",
                           "mismatched-collectives", "race-1gpu-deepspeed"}) {
    for (const char* variant : {"stock", "host-sync", "event-wait"}) {
      const Scenario sc = load_scenario(test::scenario_path(name), {{"run.variant", variant}});
      const nlohmann::json j = schedule_to_json(build_schedule(sc));
      EXPECT_EQ(schedule_to_json(schedule_from_json(j)), j) << name << " " << variant;
    }
  }
  const Scenario offload =
      load_scenario(test::scenario_path("tiny"), {{"zero.offload_param", "true"}});
  const nlohmann::json j = schedule_to_json(build_schedule(offload));
  EXPECT_EQ(schedule_to_json(schedule_from_json(j)), j);
}

TEST(ScheduleJson, TextRoundTripIsBitIdentical) {
  const std::string text = schedule_to_json(recorded_schedule()).dump();
  EXPECT_EQ(schedule_to_json(schedule_from_json(nlohmann::json::parse(text))).dump(), text);
}

TEST(ScheduleJson, RejectsAnotherFormat) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  j["format"] = "chrome-trace";
  try {
    schedule_from_json(j, "x.json");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: format"), std::string::npos) << e.what();
  }
}

TEST(ScheduleJson, NamesTheOffendingKey) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  j["ranks"][1]["ops"][3]["kind"] = "teleport";
  try {
    schedule_from_json(j, "x.json");
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks[1].ops[3].kind"), std::string::npos) << what;
    EXPECT_NE(what.find("allowed"), std::string::npos) << what;
  }
}

// A strided access is [buffer, mode, offset, bytes, count, stride]; a plain one keeps its four
// fields. Bad strides are refused with the access's path.
TEST(ScheduleJson, AStridedAccessRoundTripsAndBadOnesAreRefused) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  nlohmann::json* acc = nullptr;
  for (auto& op : j["ranks"][0]["ops"]) {
    if (op.contains("accesses") && op["accesses"][0][1] == "r") {
      acc = &op["accesses"][0];
      break;
    }
  }
  ASSERT_NE(acc, nullptr);
  const std::uint64_t bytes = (*acc)[3].get<std::uint64_t>();
  ASSERT_GE(bytes, 4u);
  const nlohmann::json plain = *acc;
  // The builder's own strided accesses (DeepSpeed's narrow() views) unfold as well.
  const std::size_t unfolded = unfold_strided(schedule_from_json(j)).ranks[0].accesses.size();
  *acc = {plain[0], "r", 0, 1, 2, bytes - 1};  // bytes [0, 1) and [bytes - 1, bytes)
  const Schedule s = schedule_from_json(j);
  EXPECT_TRUE(has_strided_accesses(s));
  EXPECT_EQ(schedule_to_json(s), j);
  const Schedule flat = unfold_strided(s);
  EXPECT_FALSE(has_strided_accesses(flat));
  EXPECT_EQ(flat.ranks[0].accesses.size(), unfolded + 1);
  for (std::size_t i = 0; i < s.ranks[0].ops.size(); ++i) {
    EXPECT_EQ(flat.ranks[0].ops[i].kind, s.ranks[0].ops[i].kind);  // ops keep their indices
  }
  const auto refused = [&](const nlohmann::json& bad) {
    *acc = bad;
    const std::string e = error_of(j);
    *acc = plain;
    return e;
  };
  EXPECT_NE(refused({plain[0], "r", 0, 1, 1, 4}).find("count of 2 or more"), std::string::npos);
  EXPECT_NE(refused({plain[0], "r", 0, 2, 2, 1}).find("0 < bytes <= stride"), std::string::npos);
  EXPECT_NE(refused({plain[0], "r", 0, 1, 2, 1ull << 31}).find("past the end of buffer"),
            std::string::npos);
  EXPECT_NE(refused({plain[0], "r", 0, 1, 65535, 4000000000u}).find("past the end"),
            std::string::npos);
  EXPECT_NE(refused({plain[0], "r", 0, 1, 70000, 4}).find("out of range"), std::string::npos);
  EXPECT_NE(refused({plain[0], "r", 0, 1, 2, 1ull << 33}).find("out of range"), std::string::npos);
  const std::string five = refused({plain[0], "r", 0, 1, 2});
  EXPECT_NE(five.find("accesses[0]: expected"), std::string::npos) << five;
}

// schedule_to_json(s, true) writes a rank that shares another's ops and buffers as {"like",
// "groups", "accesses"}: only the accesses that differ. It reads back as the full form.
TEST(ScheduleJson, CompactFormReadsBackAsTheFullOne) {
  const Scenario sc = load_scenario(test::scenario_path("tiny"));
  const Schedule s = build_schedule(sc);
  const nlohmann::json full = schedule_to_json(s);
  const nlohmann::json compact = schedule_to_json(s, true);
  int like = 0, overridden = 0;
  for (const auto& r : compact["ranks"]) {
    like += r.contains("like") ? 1 : 0;
    overridden += r.contains("accesses") ? 1 : 0;
  }
  EXPECT_EQ(like, s.world_size - 1);
  EXPECT_GT(overridden, 0);  // a flat buffer's offsets differ by rank
  EXPECT_LT(2 * compact.dump().size(), full.dump().size());
  const Schedule back = schedule_from_json(compact);
  EXPECT_EQ(schedule_to_json(back), full);
  EXPECT_EQ(schedule_to_json(back, true), compact);
  for (std::size_t r = 1; r < back.ranks.size(); ++r) {
    EXPECT_TRUE(back.ranks[r].ops.shares_with(back.ranks[0].ops)) << "rank " << r;
  }
}

TEST(ScheduleJson, ACompactRanksAccessesAreChecked) {
  const Scenario sc = load_scenario(test::scenario_path("tiny"), {{"run.builder", "deepspeed"}});
  const nlohmann::json good = schedule_to_json(build_schedule(sc), true);
  const auto broken = [&](auto change) {
    nlohmann::json j = good;
    change(j["ranks"][1]);
    return error_of(j);
  };
  ASSERT_TRUE(good["ranks"][1].contains("accesses"));
  const std::string order = broken([](auto& r) {
    r["accesses"].push_back(r["accesses"][0]);  // the first op again, after later ones
  });
  EXPECT_NE(order.find("ranks[1].accesses["), std::string::npos) << order;
  EXPECT_NE(order.find("ascending order"), std::string::npos) << order;
  const std::string count =
      broken([](auto& r) { r["accesses"][0][1].push_back(r["accesses"][0][1][0]); });
  EXPECT_NE(count.find("accesses, not"), std::string::npos) << count;
  const std::string past = broken([](auto& r) { r["accesses"][0][1][0][3] = 1ull << 40; });
  EXPECT_NE(past.find("ranks[1].accesses[0][1][0]: past the end of buffer"), std::string::npos)
      << past;
  const std::string shape = broken([](auto& r) { r["accesses"][0] = 7; });
  EXPECT_NE(shape.find("expected [op, [access, ...]]"), std::string::npos) << shape;
}

TEST(ScheduleJson, RejectsAccessToAMissingBuffer) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  for (auto& op : j["ranks"][0]["ops"]) {
    if (op.contains("accesses")) {
      op["accesses"][0][0] = 100000;
      break;
    }
  }
  EXPECT_THROW(schedule_from_json(j), InputError);
}

TEST(ScheduleJson, RejectsANegativeSpin) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  j["ranks"][0]["ops"][0]["spin_us"] = -1.0;
  try {
    schedule_from_json(j, "sched.json");
    FAIL() << "a negative spin was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks[0].ops[0].spin_us"), std::string::npos) << e.what();
  }
}

TEST(ScheduleJson, RejectsMissingSections) {
  nlohmann::json j = schedule_to_json(tiny_schedule());
  j.erase("units");
  EXPECT_THROW(schedule_from_json(j), InputError);
}

}  // namespace
}  // namespace hpz

namespace hpz {
namespace {

TEST(ScheduleNames, EveryEnumNameParsesBackToItself) {
  for (int i = 0; i <= static_cast<int>(Purpose::kOther); ++i) {
    EXPECT_EQ(parse_purpose(to_string(static_cast<Purpose>(i))), static_cast<Purpose>(i));
  }
  for (int i = 0; i <= static_cast<int>(OpKind::kHostEventSync); ++i) {
    EXPECT_EQ(parse_op_kind(to_string(static_cast<OpKind>(i))), static_cast<OpKind>(i));
  }
  for (int i = 0; i <= static_cast<int>(Phase::kOptimizer); ++i) {
    EXPECT_EQ(parse_phase(to_string(static_cast<Phase>(i))), static_cast<Phase>(i));
  }
  for (int i = 0; i <= static_cast<int>(BufferRole::kScratch); ++i) {
    EXPECT_EQ(parse_buffer_role(to_string(static_cast<BufferRole>(i))), static_cast<BufferRole>(i));
  }
  // The last names line up with the enums.
  EXPECT_EQ(to_string(Purpose::kOther), "other");
  EXPECT_EQ(to_string(Purpose::kHostThrottle), "host_throttle");
  EXPECT_EQ(to_string(OpKind::kHostEventSync), "host_event_sync");
}

// A recording as traces/deepspeed/ keeps it (gzip'd) reads as the JSON it holds; a truncated one
// is one line naming the file.
TEST(ScheduleJson, AGzippedScheduleReadsAsItsJson) {
  const std::string json = test::source_dir() + "/tests/fuzz/schedule_json/host-event-sync.json";
  const std::string gz = json + ".gz";
  EXPECT_EQ(schedule_to_json(read_schedule_file(gz)), schedule_to_json(read_schedule_file(json)));
  std::ifstream in(gz, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::filesystem::path cut = std::filesystem::temp_directory_path() / "hpzlab-cut.json.gz";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  try {
    read_schedule_file(cut.string());
    ADD_FAILURE() << "a truncated gzip stream was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("hpzlab-cut.json.gz: schedule file: gzip data truncated"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(cut);
}

}  // namespace
}  // namespace hpz
