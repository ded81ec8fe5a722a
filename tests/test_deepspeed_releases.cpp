// The release table (sim/deepspeed_releases.hpp): every release from ZeRO++ to the newest, the
// rules that fold into the builder's behaviour for each, the refusals where a rule is not
// modelled, --deepspeed's ranges, and a finding followed across releases
// (sim/check/release_history.hpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "sim/check/release_history.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz {
namespace {

/** The builder's table before the release rules (sim/deepspeed_builder.cpp at e26f317), whose
 *  rows were each held equal to recordings of that release: the fold must give them back. */
VersionRules anchored(const char* name, bool only_backward, bool on_create, bool host_sync,
                      bool invalidate, bool loss_item, bool split, bool step_at_init,
                      bool reset_at_forward, CopyBounds bounds) {
  VersionRules v;
  v.name = name;
  v.secondary_only_backward = only_backward;
  v.copy_only_on_create = on_create;
  v.host_sync_after_copy = host_sync;
  v.invalidate_after_step = invalidate;
  v.loss_item_in_backward = loss_item;
  v.split_by_secondary = split;
  v.optimizer_step_at_init = step_at_init;
  v.reset_at_forward_start = reset_at_forward;
  v.length_broadcast_in_trace_check = reset_at_forward;  // one field then
  v.copy_bounds = bounds;
  // Added with the load (issue 7606), which those rows did not model: 0.13.1's _partition
  // passes has_been_updated to _partition_param_sec, 0.13.2 to 0.18.2 do not (PP:1473).
  v.secondary_sees_update = std::string(name) == "0.13.1";
  v.secondary_realloc_on_update = std::string(name) == "0.13.1";
  // And PR 5504's norm on the device (0.14.5), whose sync the rows issued and the comparison
  // folded.
  if (compare_versions(name, "0.14.5") >= 0) v.grad_norm_sync = NormSync::kNone;
  // (qgZ's missing reduce_scatter fallback before 0.13.2, PR 5056, is folded in only for a qgZ
  // run: these are the default run's.)
  return v;
}

TEST(DeepSpeedReleases, TheFoldGivesBackEveryRecordedRelease) {
  EXPECT_EQ(version_rules("0.13.1"), anchored("0.13.1", true, true, false, false, true, false, true,
                                              false, CopyBounds::kLegacy));
  EXPECT_EQ(version_rules("0.13.4"), anchored("0.13.4", false, false, false, true, false, true,
                                              false, false, CopyBounds::kLegacy));
  EXPECT_EQ(version_rules("0.13.5"), anchored("0.13.5", false, false, true, true, false, true,
                                              false, false, CopyBounds::kSecNumel));
  EXPECT_EQ(version_rules("0.14.4"), anchored("0.14.4", false, true, true, true, false, true, false,
                                              false, CopyBounds::kClamped));
  EXPECT_EQ(version_rules("0.17.6"), anchored("0.17.6", false, true, true, true, false, true, false,
                                              true, CopyBounds::kClamped));
}

TEST(DeepSpeedReleases, ReleasesBetweenRecordedOnesTakeTheirEpochsRules) {
  // 0.13.2 is 0.13.4 but for engine.backward's loss.item() (PR 5135 came in 0.13.3).
  VersionRules v0132 = version_rules("0.13.4");
  v0132.loss_item_in_backward = true;
  v0132.name = "0.13.2";
  EXPECT_EQ(version_rules("0.13.2"), v0132);
  // 0.14.3 is 0.14.4 with 0.13.5's copy bounds (PR 5652 came in 0.14.4).
  VersionRules v0143 = version_rules("0.14.4");
  v0143.copy_bounds = CopyBounds::kSecNumel;
  v0143.name = "0.14.3";
  EXPECT_EQ(version_rules("0.14.3"), v0143);
  // 0.15.4 to 0.17.5 reset at forward start without the length's broadcast (PR 7525, 0.17.6).
  const VersionRules v0169 = version_rules("0.16.9");
  EXPECT_TRUE(v0169.reset_at_forward_start);
  EXPECT_FALSE(v0169.length_broadcast_in_trace_check);
  EXPECT_FALSE(version_rules("0.15.3").reset_at_forward_start);
  // Past the last recording (0.17.6): the leftovers' release (0.19.3), the zero fill (0.19.5),
  // the norm's validity sync and every handle waited (0.19.8), each from its release on.
  const VersionRules v0194 = version_rules("0.19.4");
  EXPECT_TRUE(v0194.release_backward_leftovers);
  EXPECT_FALSE(version_rules("0.19.2").release_backward_leftovers);
  EXPECT_FALSE(v0194.zero_fill_secondary);
  EXPECT_EQ(v0194.copy_bounds, CopyBounds::kClamped);
  const VersionRules v0195 = version_rules("0.19.5");
  EXPECT_TRUE(v0195.zero_fill_secondary);
  EXPECT_EQ(v0195.copy_bounds, CopyBounds::kZeroFilled);
  EXPECT_FALSE(v0195.norm_validity_sync);
  const VersionRules v0198 = version_rules("latest");
  EXPECT_EQ(v0198.name, "0.19.8");
  EXPECT_TRUE(v0198.norm_validity_sync);
  EXPECT_TRUE(v0198.wait_every_blocking_handle);
  EXPECT_TRUE(v0198.copy_only_on_create);
  EXPECT_TRUE(v0198.host_sync_after_copy);
  // The gradient norm's host sync: after the norm up to 0.14.0, only with clipping in 0.14.1 and
  // 0.14.2 (PR 5256), after the norm again from 0.14.3 (PR 5461), none from 0.14.5 (PR 5504).
  EXPECT_EQ(version_rules("0.14.0").grad_norm_sync, NormSync::kAfterNorm);
  EXPECT_EQ(version_rules("0.14.1").grad_norm_sync, NormSync::kWhenClipping);
  EXPECT_EQ(version_rules("0.14.2").grad_norm_sync, NormSync::kWhenClipping);
  EXPECT_EQ(version_rules("0.14.4").grad_norm_sync, NormSync::kAfterNorm);
  EXPECT_EQ(version_rules("0.14.5").grad_norm_sync, NormSync::kNone);
  // 0.17.2 alone never resets the bucket's count (PR 6993, PR 7418).
  EXPECT_FALSE(version_rules("0.17.1").bucket_count_never_reset);
  EXPECT_TRUE(version_rules("0.17.2").bucket_count_never_reset);
  EXPECT_FALSE(version_rules("0.17.3").bucket_count_never_reset);
  // ZeRO++ as first shipped: 0.10.0's loss item, 0.10.0-0.10.1's forward flag, 0.10.x's strict
  // bucket bound, the overflow check in every dtype to 0.11.1.
  const VersionRules v0100 = version_rules("0.10.0");
  EXPECT_TRUE(v0100.loss_item_off_boundary_only);
  EXPECT_FALSE(v0100.forward_passes_grad_enabled);
  EXPECT_TRUE(v0100.bucket_strict_bound);
  EXPECT_TRUE(v0100.overflow_check_every_dtype);
  EXPECT_TRUE(v0100.invalidate_after_step);
  const VersionRules v0103 = version_rules("0.10.3");
  EXPECT_FALSE(v0103.loss_item_off_boundary_only);
  EXPECT_TRUE(v0103.forward_passes_grad_enabled);
  EXPECT_TRUE(v0103.bucket_strict_bound);
  EXPECT_FALSE(v0103.invalidate_after_step);
  EXPECT_FALSE(version_rules("0.11.0").bucket_strict_bound);
  EXPECT_TRUE(version_rules("0.11.1").overflow_check_every_dtype);
  EXPECT_FALSE(version_rules("0.11.2").overflow_check_every_dtype);
  for (const char* same : {"0.13.0", "0.13.3", "0.14.0"}) {
    VersionRules v = version_rules(same);
    v.name.clear();
    VersionRules w = version_rules(same == std::string("0.13.0")   ? "0.13.1"
                                   : same == std::string("0.13.3") ? "0.13.4"
                                                                   : "0.13.5");
    w.name.clear();
    EXPECT_EQ(v, w) << same;
  }
}

/** The id of the rule version_rules names when it refuses, "" when it does not. */
std::string refusal(const std::string& release, const RunTraits& traits = {}) {
  try {
    version_rules(release, traits);
  } catch (const ReleaseRefusal& e) {
    const std::string what = e.what();
    const auto open = what.find("rule '");
    return what.substr(open + 6, what.find('\'', open + 6) - open - 6);
  }
  return "";
}

TEST(DeepSpeedReleases, UnmodelledRulesRefuseTheirReleasesByName) {
  // Every release is modelled on the default run (one sub-group, no qgZ, torch 2.1.2).
  for (const DeepSpeedRelease& r : deepspeed_releases())
    EXPECT_EQ(refusal(r.version), "") << r.version;
  // Several sub-groups are modelled in every release (grad-norm-sync-per-sub-group up to 0.12.6,
  // held to tiny-0.12.6-sub-group-2000).
  EXPECT_TRUE(version_rules("0.12.6", {}).norm_sync_per_sub_group);
  EXPECT_FALSE(version_rules("0.13.0", {}).norm_sync_per_sub_group);
  // Conditional rules: the MoE families DeepSpeed makes leaf modules, qgZ before its
  // reduce_scatter fallback, torch 2.10. Gradient accumulation on 0.16.0-0.16.7 is modelled
  // (prefetch-budget-kept-across-resets, held to tiny-0.16.4-accum-2).
  RunTraits accum;
  accum.grad_accum = 2;
  EXPECT_EQ(refusal("0.16.0"), "");
  EXPECT_EQ(refusal("0.16.0", accum), "");
  EXPECT_TRUE(version_rules("0.16.4", accum).available_kept_across_reset);
  EXPECT_FALSE(version_rules("0.16.8", accum).available_kept_across_reset);
  RunTraits mixtral;
  mixtral.family = "mixtral";
  EXPECT_EQ(refusal("0.17.6", mixtral), "");
  // 0.18.0's default leaf modules are modelled (held to tiny-mixtral-tf4.51-0.18.2), and 0.19.3's
  // release of a leaf in set order (held to tiny-mixtral-0.19.8-torch2.10).
  EXPECT_EQ(refusal("0.18.2", mixtral), "");
  EXPECT_EQ(refusal("0.19.3", mixtral), "");
  EXPECT_EQ(refusal("0.19.8", mixtral), "");
  EXPECT_TRUE(version_rules("0.18.0", mixtral).default_moe_leaf);
  EXPECT_FALSE(version_rules("0.17.6", mixtral).default_moe_leaf);
  RunTraits qgz;
  qgz.qgz = true;
  EXPECT_EQ(refusal("0.10.0", qgz), "qgz-reduction-sized-for-16-gpus");
  EXPECT_EQ(refusal("0.10.1", qgz), "");  // the missing fallback is modelled: 0.10.3, 0.13.1
  EXPECT_EQ(refusal("0.13.1", qgz), "");
  EXPECT_TRUE(version_rules("0.13.1", qgz).qgz_no_fallback);
  EXPECT_FALSE(version_rules("0.13.2", qgz).qgz_no_fallback);
  EXPECT_EQ(refusal("0.13.4", qgz), "");
  // Issue 7898: the step issued from the default stream is modelled with every torch; from a
  // side stream only with torch 2.10 or later, where the hook's stream was measured.
  RunTraits torch210;
  torch210.torch = "2.10.0";
  EXPECT_EQ(refusal("0.17.6", torch210), "");
  RunTraits side;
  side.step_off_default_stream = true;
  EXPECT_EQ(refusal("0.17.6", side), "accumulate-grad-off-compute-stream");
  EXPECT_EQ(refusal("0.19.8", side), "accumulate-grad-off-compute-stream");
  side.torch = "2.9.1";
  EXPECT_EQ(refusal("0.18.8", side), "accumulate-grad-off-compute-stream");
  side.torch = "2.10.0";
  EXPECT_EQ(refusal("0.18.7", side), "");
  EXPECT_FALSE(version_rules("0.18.7", side).reduce_waits_current_stream);
  EXPECT_TRUE(version_rules("0.18.8", side).reduce_waits_current_stream);
  // A name that is no release is bad input, not a refusal.
  EXPECT_THROW(
      {
        try {
          version_rules("0.13.10");
        } catch (const ReleaseRefusal&) {
          ADD_FAILURE() << "an unknown name was refused as a release";
          throw;
        }
      },
      InputError);
}

// qwZ on parameters that are not fp16: DeepSpeed's quantize kernel reads them as fp16 in every
// release before 0.19.6 (csrc/quantization/pt_binding.cpp:96; issues 3992, 7775), a defect the
// verdict names; from 0.19.6 (PR 8215) they are cast first, which the builder models. An fp16
// run has neither.
TEST(DeepSpeedReleases, QwzOffFp16IsADefectUntil0196AndCastFrom0196) {
  const auto defects = [](const std::string& release, const RunTraits& t) {
    std::vector<std::string> ids;
    for (const ReleaseRule* r : known_defects(release, t)) ids.push_back(r->id);
    return ids;
  };
  RunTraits qwz;
  qwz.qwz_non_fp16 = true;
  const std::vector<std::string> reads_half = {"qwz-quantizer-reads-half"};
  EXPECT_EQ(defects("0.10.0", qwz), reads_half);
  EXPECT_EQ(defects("0.13.4", qwz), reads_half);
  EXPECT_EQ(defects("0.19.5", qwz), reads_half);
  EXPECT_TRUE(defects("0.19.6", qwz).empty());
  EXPECT_TRUE(defects("0.13.4", RunTraits{}).empty());
  EXPECT_EQ(refusal("0.19.6", qwz), "");
  EXPECT_EQ(refusal("latest", qwz), "");
  EXPECT_FALSE(version_rules("0.19.5", qwz).qwz_half_cast);
  EXPECT_TRUE(version_rules("0.19.6", qwz).qwz_half_cast);
  // A defect changes no schedule: the builder's rules are those of the same release without it.
  EXPECT_EQ(version_rules("0.13.4", qwz), version_rules("0.13.4"));
}

TEST(DeepSpeedReleases, TheTableRunsFromZeroPlusPlusToTheNewestOnPyPI) {
  const auto& r = deepspeed_releases();
  EXPECT_EQ(std::string(r.front().version), "0.10.0");  // PR 3784, ZeRO++
  EXPECT_EQ(std::string(r.back().version), "0.19.8");
  EXPECT_EQ(latest_deepspeed_release(), "0.19.8");
  for (std::size_t i = 1; i < r.size(); ++i) {
    EXPECT_LT(compare_versions(r[i - 1].version, r[i].version), 0) << r[i].version;
    EXPECT_LE(std::string(r[i - 1].date), std::string(r[i].date)) << r[i].version;
  }
  for (const ReleaseRule& rule : deepspeed_release_rules()) {
    EXPECT_TRUE(is_deepspeed_release(rule.first)) << rule.id;
    if (*rule.until != '\0') {
      EXPECT_LT(compare_versions(rule.first, rule.until), 0) << rule.id;
    }
    // A modelled rule changes the builder's rules, or ends an earlier one that did.
    EXPECT_EQ(rule.scope == RuleScope::kModelled, rule.apply != nullptr || *rule.ends != '\0')
        << rule.id;
    EXPECT_FALSE(rule.apply != nullptr && *rule.ends != '\0') << rule.id;
    EXPECT_EQ(rule.scope == RuleScope::kElsewhere, *rule.where != '\0') << rule.id;
  }
}

// A rule that ends another (`ends`) names an earlier modelled rule with no `until` of its own,
// and only one rule ends each; the ended rule holds up to the release before the ending one's
// first, and the builder's rules change back there (loss.item() every micro-step from 0.10.1,
// PR 4030; the fp16-only overflow check from 0.11.2, PR 4512).
TEST(DeepSpeedReleases, ARuleThatEndsAnotherClosesItsWindow) {
  const auto& rules = deepspeed_release_rules();
  int ending = 0;
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (*rules[i].ends == '\0') continue;
    ++ending;
    int named = 0;
    for (std::size_t j = 0; j < rules.size(); ++j) {
      if (rules[j].id != std::string(rules[i].ends)) continue;
      ++named;
      EXPECT_LT(j, i) << rules[i].id;
      EXPECT_TRUE(rules[j].apply != nullptr) << rules[j].id;
      EXPECT_STREQ(rules[j].until, "") << rules[j].id;
      EXPECT_EQ(until_of(rules[j]), rules[i].first) << rules[j].id;
    }
    EXPECT_EQ(named, 1) << rules[i].id;
    for (std::size_t k = 0; k < rules.size(); ++k) {
      if (k != i) {
        EXPECT_STRNE(rules[k].ends, rules[i].ends) << rules[k].id;
      }
    }
  }
  EXPECT_EQ(ending, 7);
  EXPECT_TRUE(version_rules("0.10.0").loss_item_off_boundary_only);
  EXPECT_FALSE(version_rules("0.10.1").loss_item_off_boundary_only);
  EXPECT_TRUE(version_rules("0.11.1").overflow_check_every_dtype);
  EXPECT_FALSE(version_rules("0.11.2").overflow_check_every_dtype);
  EXPECT_EQ(version_rules("0.14.2").grad_norm_sync, NormSync::kWhenClipping);
  EXPECT_EQ(version_rules("0.14.3").grad_norm_sync, NormSync::kAfterNorm);
}

TEST(DeepSpeedReleases, VersionSpecsExpandToReleases) {
  const auto all = expand_deepspeed_versions("all");
  EXPECT_EQ(all.size(), deepspeed_releases().size());
  EXPECT_EQ(expand_deepspeed_versions("0.13.2..0.13.5"),
            (std::vector<std::string>{"0.13.2", "0.13.3", "0.13.4", "0.13.5"}));
  EXPECT_EQ(expand_deepspeed_versions("latest"), (std::vector<std::string>{"0.19.8"}));
  // Sorted, without repeats, ranges and single releases mixed.
  EXPECT_EQ(expand_deepspeed_versions("0.14.4,0.13.4,0.13.3..0.13.4"),
            (std::vector<std::string>{"0.13.3", "0.13.4", "0.14.4"}));
  EXPECT_EQ(expand_deepspeed_versions("0.19.7..latest"),
            (std::vector<std::string>{"0.19.7", "0.19.8"}));
  for (const char* bad : {"", "0.13.4,", "0.9.0", "0.13.5..0.13.4", "0.13..0.14", "1.0.0"}) {
    EXPECT_THROW(expand_deepspeed_versions(bad), InputError) << bad;
  }
  try {
    expand_deepspeed_versions("0.13.5..0.13.4");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("runs backwards (write 0.13.4..0.13.5)"),
              std::string::npos)
        << e.what();
  }
}

TEST(DeepSpeedReleases, LabelsSayARunOfReleasesOrListThem) {
  EXPECT_EQ(releases_label({"0.13.4"}), "0.13.4");
  EXPECT_EQ(releases_label({"0.13.2", "0.13.3", "0.13.4"}), "0.13.2-0.13.4 (3 releases)");
  EXPECT_EQ(releases_label({"0.13.4", "0.14.4"}), "0.13.4, 0.14.4");
}

TEST(DeepSpeedReleases, EpochsCoverEveryReleaseOnceAndOpenAtEachRule) {
  const std::vector<ReleaseEpoch> epochs = deepspeed_epochs();
  std::vector<std::string> seen;
  std::set<std::string> firsts;
  for (const ReleaseEpoch& e : epochs) {
    seen.insert(seen.end(), e.releases.begin(), e.releases.end());
    firsts.insert(e.first());
  }
  ASSERT_EQ(seen.size(), deepspeed_releases().size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], deepspeed_releases()[i].version);
  }
  for (const ReleaseRule& rule : deepspeed_release_rules()) {
    EXPECT_TRUE(firsts.count(rule.first)) << rule.id;
  }
  // The hpZ race's releases are one epoch apart from 0.13.2's loss.item().
  for (const char* opens : {"0.13.2", "0.13.3", "0.13.5", "0.14.3", "0.15.4", "0.17.6"}) {
    EXPECT_TRUE(firsts.count(opens)) << opens;
  }
  EXPECT_FALSE(firsts.count("0.13.4"));
}

TEST(DeepSpeedReleases, TheBuilderRefusesAReleaseByItsMissingRule) {
  Scenario sc = load_scenario(test::scenario_path("tiny"), {{"run.builder", "deepspeed"},
                                                            {"zero.deepspeed_version", "0.17.6"},
                                                            {"run.step_stream", "side"}});
  try {
    build_deepspeed_schedule(sc, "0.17.6");
    ADD_FAILURE() << "0.17.6 was built from a side stream with torch 2.1.2";
  } catch (const ReleaseRefusal& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zero.deepspeed_version: DeepSpeed 0.17.6 is not modelled yet: the "
                        "builder lacks rule 'accumulate-grad-off-compute-stream' (issue 7898"),
              std::string::npos)
        << what;
  }
}

TEST(DeepSpeedReleases, AKeyOfAnotherReleaseIsThatReleasesRefusal) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hpzlab-releases";
  std::filesystem::create_directories(dir);
  const std::string ds = (dir / "ds.json").string();
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 3, "leaf_module": {}}})";
  const auto load_with = [&](const char* v) {
    return load_scenario(test::scenario_path("tiny"),
                         {{"zero.ds_config", ds}, {"zero.deepspeed_version", v}});
  };
  EXPECT_NO_THROW(load_with("0.18.0"));
  try {
    load_with("0.17.6");
    ADD_FAILURE() << "0.17.6 took leaf_module";
  } catch (const ReleaseRefusal& e) {
    EXPECT_NE(std::string(e.what()).find("DeepSpeed 0.17.6 refuses it"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("0.18.0-0.19.8 (19 releases) defines it"),
              std::string::npos)
        << e.what();
  }
  // A key no release defines is a typo: plain bad input, with a suggestion.
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 3, "overlap_com": true}})";
  try {
    load_with("0.13.4");
    ADD_FAILURE() << "a typo was taken";
  } catch (const ReleaseRefusal&) {
    ADD_FAILURE() << "a typo was refused as a release";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'overlap_comm'"), std::string::npos);
  }
  // leaf_module: DeepSpeed's default leaves are modelled (rule default-moe-leaf-modules), any
  // other choice of leaves is refused, as is a granularity threshold (leaves by size).
  std::ofstream(ds)
      << R"({"zero_optimization": {"stage": 3, "leaf_module": {"classes": [)"
         R"("transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",)"
         R"("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",)"
         R"("transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock"],)"
         R"("names": []}}})";
  EXPECT_NO_THROW(load_with("0.18.2"));
  for (const char* other : {R"({"classes": []})", R"({"name_suffixes": "mlp"})",
                            R"({"classes": ["LlamaMLP"]})", R"([])"}) {
    std::ofstream(ds) << R"({"zero_optimization": {"stage": 3, "leaf_module": )" << other << "}}";
    try {
      load_with("0.18.2");
      ADD_FAILURE() << "leaf_module " << other << " was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.leaf_module"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("only DeepSpeed's default leaf modules"),
                std::string::npos)
          << e.what();
    }
  }
  std::ofstream(ds)
      << R"({"zero_optimization": {"stage": 3, "stage3_module_granularity_threshold": 0}})";
  EXPECT_NO_THROW(load_with("0.18.2"));
  std::ofstream(ds)
      << R"({"zero_optimization": {"stage": 3, "stage3_module_granularity_threshold": 5000}})";
  try {
    load_with("0.18.2");
    ADD_FAILURE() << "a granularity threshold was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fast sharding"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

/** A result with one group of `kind` between the purposes given, `count` times. */
check::CheckResult with_group(check::FindingKind kind, Purpose first, Purpose second,
                              std::uint64_t count) {
  check::CheckResult r;
  check::FindingGroup g;
  g.example.kind = kind;
  g.example.first.purpose = first;
  g.example.second.purpose = second;
  g.example.role = BufferRole::kSecondary;
  g.count = count;
  r.groups.push_back(g);
  return r;
}

TEST(ReleaseHistory, AFindingsFirstReleaseAndTheReleaseThatFixedIt) {
  const check::CheckResult clean;
  const check::CheckResult stale =
      with_group(check::FindingKind::kStaleRead, Purpose::kOptimizerStep, Purpose::kPrefetch, 4);
  const check::CheckResult race = with_group(
      check::FindingKind::kRace, Purpose::kSecondaryPartitionCopy, Purpose::kPrefetch, 7);
  const std::vector<check::EpochVerdict> epochs = {
      {{"0.12.6"}, nullptr},  // refused
      {{"0.13.0", "0.13.1"}, &stale}, {{"0.13.2"}, &race},
      {{"0.13.3", "0.13.4"}, &race},  {{"0.13.5", "0.14.0"}, &clean},
  };
  const auto h = check::finding_history(epochs);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].kind, check::FindingKind::kStaleRead);
  EXPECT_EQ(h[0].spans, (std::vector<std::string>{"0.13.0-0.13.1"}));
  EXPECT_EQ(h[0].first, "0.13.0");
  EXPECT_EQ(h[0].fixed_in, "0.13.2");
  EXPECT_EQ(h[1].kind, check::FindingKind::kRace);
  EXPECT_EQ(h[1].spans, (std::vector<std::string>{"0.13.2-0.13.4"}));
  EXPECT_EQ(h[1].fixed_in, "0.13.5");
  EXPECT_EQ(h[1].count, 7u);
  EXPECT_EQ(h[1].signature, check::signature_of(race.groups[0]));
  // Unchecked releases between the last that has it and the next checked one are named: the
  // fix may lie in them. The newest checked release still having it means not fixed.
  const std::vector<check::EpochVerdict> gap = {
      {{"0.13.4"}, &race}, {{"0.14.1", "0.14.2"}, nullptr}, {{"0.14.3"}, &clean}};
  const auto g = check::finding_history(gap);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].fixed_in, "0.14.3");
  EXPECT_EQ(g[0].unchecked_before_fix, "0.14.1-0.14.2");
  const std::vector<check::EpochVerdict> open = {{{"0.13.4"}, &clean}, {{"0.19.8"}, &race}};
  EXPECT_EQ(check::finding_history(open)[0].fixed_in, "");
}

}  // namespace
}  // namespace hpz
