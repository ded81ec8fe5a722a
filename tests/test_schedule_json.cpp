// The IR's JSON form round-trips, and malformed documents give clear errors.
#include <gtest/gtest.h>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/schedule_json.hpp"

namespace hpz {
namespace {

Schedule tiny_schedule() {
  Scenario sc;
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 2;
  sc.cluster.gpu = gpu_preset("a100-80g");
  sc.model = model_preset("tiny");
  sc.model.hidden = 6;  // padding in every small unit
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

TEST(ScheduleJson, RoundTripIsLossless) {
  const Schedule s = tiny_schedule();
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
    }
  }
}

TEST(ScheduleJson, TextRoundTripIsBitIdentical) {
  const std::string text = schedule_to_json(tiny_schedule()).dump();
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
  for (int i = 0; i <= static_cast<int>(Purpose::kReproSpin); ++i) {
    EXPECT_EQ(parse_purpose(to_string(static_cast<Purpose>(i))), static_cast<Purpose>(i));
  }
  for (int i = 0; i <= static_cast<int>(OpKind::kFree); ++i) {
    EXPECT_EQ(parse_op_kind(to_string(static_cast<OpKind>(i))), static_cast<OpKind>(i));
  }
  for (int i = 0; i <= static_cast<int>(Phase::kOptimizer); ++i) {
    EXPECT_EQ(parse_phase(to_string(static_cast<Phase>(i))), static_cast<Phase>(i));
  }
  for (int i = 0; i <= static_cast<int>(BufferRole::kScratch); ++i) {
    EXPECT_EQ(parse_buffer_role(to_string(static_cast<BufferRole>(i))), static_cast<BufferRole>(i));
  }
  EXPECT_EQ(to_string(Purpose::kReproSpin), "repro_spin");  // the last name lines up with the enum
}

}  // namespace
}  // namespace hpz
