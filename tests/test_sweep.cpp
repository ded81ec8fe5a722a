// `hpzlab sweep`'s plan (axes, ranges, variants, the cross product) and its results table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "sim/error.hpp"
#include "tools/hpzlab/sweep/fields.hpp"
#include "tools/hpzlab/sweep/plan.hpp"
#include "tools/hpzlab/sweep/plot.hpp"
#include "tools/hpzlab/sweep/report.hpp"
#include "tools/hpzlab/sweep/runner.hpp"
#include "tools/hpzlab/sweep/table.hpp"

namespace hpz::sweep {
namespace {

using Values = std::vector<std::string>;

std::string error_of(const std::string& text) {
  try {
    parse_axis(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SweepAxis, ListsAndRanges) {
  EXPECT_EQ(parse_axis("cluster.nic_gbps=12.5,25").values, (Values{"12.5", "25"}));
  EXPECT_EQ(parse_axis("training.micro_batch=1:4:1").values, (Values{"1", "2", "3", "4"}));
  EXPECT_EQ(parse_axis("x.y=0.1:0.3:0.1").values, (Values{"0.1", "0.2", "0.3"}));
  EXPECT_EQ(parse_axis("x.y=10:1:-4").values, (Values{"10", "6", "2"}));
  EXPECT_EQ(parse_axis("x.y=log:1:100:3").values, (Values{"1", "10", "100"}));
  EXPECT_EQ(parse_axis("x.y=log:1e7:1e9:5").values,
            (Values{"1e+07", "3.16e+07", "1e+08", "3.16e+08", "1e+09"}));
  EXPECT_EQ(parse_axis("x.y=1,5:7:1,stock").values, (Values{"1", "5", "6", "7", "stock"}));
}

TEST(SweepAxis, BadListsNameKeyAndValue) {
  EXPECT_EQ(error_of("x.y="),
            "--vary: x.y=: an empty list (allowed: v1,v2,..., start:stop:step, log:start:stop:n)");
  EXPECT_EQ(error_of("x.y=1,,2"),
            "--vary: x.y=1,,2: an empty value (allowed: v1,v2,..., start:stop:step, "
            "log:start:stop:n)");
  EXPECT_EQ(error_of("x.y=1:5:0"),
            "--vary: x.y=1:5:0: the step is zero (allowed: a step that reaches stop)");
  EXPECT_NE(error_of("x.y=1:5:-1").find("leads away from stop"), std::string::npos);
  EXPECT_NE(error_of("x.y=log:0:5:3").find("above zero"), std::string::npos);
  EXPECT_NE(error_of("x.y=log:1:5:2.5").find("n = 2.5"), std::string::npos);
  EXPECT_NE(error_of("x.y=1:1e9:1").find("more than 10000 values"), std::string::npos);
  EXPECT_NE(error_of("novalue").find("expected section.key=values"), std::string::npos);
}

TEST(SweepVariants, NoHpzTurnsHpzOff) {
  EXPECT_EQ(variant_spec("no-hpz").overrides,
            (std::vector<Override>{{"zero.zero_hpz_partition_size", "1"}}));
  EXPECT_EQ(variant_spec("event-wait").overrides,
            (std::vector<Override>{{"run.variant", "event-wait"}}));
  EXPECT_THROW(variant_spec("event_wait"), InputError);
}

Plan two_by_three() {
  Plan plan;
  plan.scenario = "scenarios/tiny.toml";
  plan.sets = {"run.steps=2"};
  plan.axes = {{"a.b", {"1", "2"}}, {"c.d", {"x", "y", "z"}}};
  plan.variants = {variant_spec("stock"), variant_spec("no-hpz")};
  return plan;
}

TEST(SweepPlan, CrossProductLastAxisFastest) {
  const Plan plan = two_by_three();
  ASSERT_EQ(plan.points(), 6u);
  EXPECT_EQ(plan.values_at(0), (Values{"1", "x"}));
  EXPECT_EQ(plan.values_at(2), (Values{"1", "z"}));
  EXPECT_EQ(plan.values_at(4), (Values{"2", "y"}));
  EXPECT_EQ(
      plan.overrides(4, 1),
      (std::vector<Override>{
          {"run.steps", "2"}, {"a.b", "2"}, {"c.d", "y"}, {"zero.zero_hpz_partition_size", "1"}}));
  EXPECT_EQ(plan.sim_args(0, 0, "f.json"),
            (Values{"sim", "scenarios/tiny.toml", "--set", "run.steps=2", "--set", "a.b=1", "--set",
                    "c.d=x", "--set", "run.variant=stock", "--runs", "1", "--json", "f.json"}));
}

std::string validate_error(Plan plan) {
  try {
    validate(plan);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SweepPlan, ValidatesEveryValueBeforeRunning) {
  Plan plan;
  plan.scenario = "scenarios/tiny.toml";
  plan.variants = {variant_spec("stock")};
  plan.axes = {parse_axis("cluster.nic_gbps=12.5,-1")};
  EXPECT_EQ(validate_error(plan),
            "--vary: cluster.nic_gbps=-1: must be a positive number of Gbit/s, got -1");
  plan.axes = {parse_axis("cluster.nic_gbs=12.5")};
  EXPECT_NE(validate_error(plan).find("--vary: cluster.nic_gbs=12.5: "), std::string::npos);
  EXPECT_NE(validate_error(plan).find("did you mean 'cluster.nic_gbps'"), std::string::npos);
  plan.axes = {parse_axis("training.micro_batch=1,two")};
  EXPECT_NE(validate_error(plan).find("--vary: training.micro_batch=two: expected an integer"),
            std::string::npos);
  plan.axes = {parse_axis("zero.stage3_max_live_parameters=log:1e7:1e9:5")};
  EXPECT_EQ(validate_error(plan), "");
  // hpZ 8 is more than tiny's 4 ranks, but fine once another --vary makes 8 or 16 ranks.
  plan.axes = {parse_axis("zero.zero_hpz_partition_size=2,8"),
               parse_axis("cluster.gpus_per_node=2,4,8")};
  EXPECT_EQ(validate_error(plan), "");
  plan.axes = {parse_axis("zero.zero_hpz_partition_size=2,32"),
               parse_axis("cluster.gpus_per_node=2,4,8")};
  EXPECT_EQ(validate_error(plan),
            "--vary: zero.zero_hpz_partition_size=32: 32 is larger than the world size 4 (nodes "
            "x gpus_per_node) (allowed: 1, 2, 4)");
  plan.axes = {parse_axis("run.variant=stock")};
  EXPECT_NE(validate_error(plan).find("--variants"), std::string::npos);
}

/** A fresh directory under the build's temporary space. */
std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("hpzlab_test_sweep_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

nlohmann::json sim_json(double step_time) {
  nlohmann::json run = {{"step_time_s", step_time},
                        {"tokens_per_s_per_node", 100.5},
                        {"exposed_comm_s", 0.25},
                        {"host_stall_s", 0.0},
                        {"host_sync_s", 0.0},
                        {"races_manifested", 3},
                        {"hung", false}};
  nlohmann::json race = {{"second", "rank 0 S_nccl #5 all_gather prefetch (step 1, l0, forward)"},
                         {"manifested_per_run", {3}},
                         {"margin_s", {{"min", -0.002}, {"min_per_run", {-0.002}}}}};
  return {{"runs", {run}}, {"races", {race}}};
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(SweepTable, RowsFromSimAndFailedRows) {
  const Plan plan = two_by_three();
  const std::vector<std::string> cols = columns(plan);
  const std::vector<Row> ok = rows_from_sim(plan, {4, 1}, sim_json(0.5));
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(csv_header(cols),
            "point,variant,run,a.b,c.d,status,step_time_s,tokens_per_s_per_node,exposed_comm_s,"
            "host_stall_s,host_sync_s,races_manifested,race_groups,first_race,race_margin_s,"
            "error\n");
  EXPECT_EQ(csv_line(cols, ok[0]),
            "4,no-hpz,0,2,y,ok,0.5,100.5,0.25,0,0,3,1,"
            "\"rank 0 S_nccl #5 all_gather prefetch (step 1, l0, forward)\",-0.002,\n");
  const std::vector<Row> failed =
      failed_rows(plan, {1, 0}, "exit code 2: a \"bad\", value\nsecond line");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(csv_line(cols, failed[0]),
            "1,stock,0,1,y,failed,,,,,,,,,,\"exit code 2: a \"\"bad\"\", value second line\"\n");
  EXPECT_EQ(failed[0]["a.b"], 1);
  EXPECT_EQ(failed[0]["c.d"], "y");
}

TEST(SweepTable, ReproColumnsFromReproJson) {
  Plan plan = two_by_three();
  plan.repro = true;
  plan.runs = 2;
  const std::vector<std::string> cols = columns(plan);
  EXPECT_EQ(std::vector<std::string>(cols.end() - 6, cols.end()),
            (std::vector<std::string>{"first_race", "race_margin_s", "first_bad_step", "final_loss",
                                      "repro_error", "error"}));
  nlohmann::json sim = sim_json(0.5);
  sim["runs"].push_back(sim["runs"][0]);
  sim["races"][0]["manifested_per_run"] = {3, 0};
  std::vector<Row> rows = rows_from_sim(plan, {4, 0}, sim);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0]["first_bad_step"].is_null());  // until fill_repro
  // `hpzlab repro --json`'s shape: per variant, per run, first_bad_step and the loss per step.
  const nlohmann::json repro = {
      {"variants",
       {{"stock",
         {{"runs",
           {{{"seed", 1}, {"loss", {6.0, "nan"}}, {"first_bad_step", 1}},
            {{"seed", 2}, {"loss", {6.0, 5.5}}, {"first_bad_step", nullptr}}}}}},
        {"no-hpz", {{"runs", {{{"seed", 1}, {"loss", {6.0, 5.5}}}}}}}}}};
  fill_repro(rows, repro, "");
  EXPECT_EQ(rows[0]["first_bad_step"], 1);
  EXPECT_EQ(rows[0]["final_loss"], "nan");
  EXPECT_TRUE(rows[1]["first_bad_step"].is_null());
  EXPECT_EQ(rows[1]["final_loss"], 5.5);
  const std::string line = csv_line(cols, rows[0]);
  EXPECT_TRUE(line.ends_with("\",-0.002,1,nan,,\n")) << line;
  // The columns stay before `error` in the JSON row too.
  EXPECT_EQ(std::prev(rows[0].end()).key(), "error");
  // A run repro does not have: said in repro_error.
  std::vector<Row> no_hpz = rows_from_sim(plan, {4, 1}, sim);
  fill_repro(no_hpz, repro, "");
  EXPECT_EQ(no_hpz[1]["repro_error"], "hpzlab repro's JSON has no run 1 of no-hpz");
  // repro failed or was not run: empty columns, the reason.
  fill_repro(no_hpz, nlohmann::json(), "hpzlab repro failed: exit code 2");
  EXPECT_TRUE(no_hpz[0]["final_loss"].is_null());
  EXPECT_EQ(no_hpz[0]["repro_error"], "hpzlab repro failed: exit code 2");
}

TEST(SweepPlan, ReproRunsOncePerPointAndIsPartOfThePlan) {
  Plan plan = two_by_three();
  plan.repro = true;
  EXPECT_EQ(plan.repro_args(5, "o.json"),
            (Values{"repro", "scenarios/tiny.toml", "--set", "run.steps=2", "--set", "a.b=2",
                    "--set", "c.d=z", "--runs", "1", "--json", "o.json"}));
  EXPECT_EQ(plan_from_json(plan.to_json()).repro, true);
  plan.repro = false;
  EXPECT_FALSE(plan.to_json().contains("repro"));  // sweep.json as before --repro existed
  EXPECT_EQ(plan_from_json(plan.to_json()).repro, false);
}

// The one-command form (issue 35): no scenario file, the user's files and cluster flags; every
// child gets the flags, the plan keeps them for --resume, and validation loads them.
TEST(SweepPlan, OneCommandFlagsReachEveryChildAndThePlan) {
  Plan plan;
  plan.flags = {{"--hf-config", "model.hf_config", "tools/recorder/tests/data/llama-tiny.json"},
                {"--ds-config", "zero.ds_config", "tools/recorder/tests/data/ds-hpz8.json"},
                {"--nic-gbps", "cluster.nic_gbps", "25"}};
  plan.flag_args = {"--hf-config", "tools/recorder/tests/data/llama-tiny.json",
                    "--ds-config", "tools/recorder/tests/data/ds-hpz8.json",
                    "--nic-gbps",  "25"};
  plan.axes = {parse_axis("cluster.nodes=1,2")};
  plan.variants = {variant_spec("stock")};
  EXPECT_EQ(
      plan.sim_args(1, 0, "f.json"),
      (Values{"sim", "--hf-config", "tools/recorder/tests/data/llama-tiny.json", "--ds-config",
              "tools/recorder/tests/data/ds-hpz8.json", "--nic-gbps", "25", "--set",
              "cluster.nodes=2", "--set", "run.variant=stock", "--runs", "1", "--json", "f.json"}));
  EXPECT_EQ(plan.repro_args(0, "o.json").at(1), "--hf-config");
  const Plan back = plan_from_json(plan.to_json());
  EXPECT_EQ(back.flag_args, plan.flag_args);
  ASSERT_EQ(back.flags.size(), 3u);
  EXPECT_EQ(back.flags[2].key, "cluster.nic_gbps");
  EXPECT_NO_THROW(validate(plan));
  plan.flags[2].value = "fast";  // a bad flag value is reported before anything runs
  EXPECT_THROW(validate(plan), InputError);
  plan.flags.clear();
  EXPECT_FALSE(plan.to_json().contains("flags"));  // sweep.json as before the flags existed
}

TEST(SweepTable, AppendResumeAndSortedFinish) {
  const Plan plan = two_by_three();
  const std::string dir = temp_dir("table");
  Table table(plan, dir);
  table.start();
  table.append(rows_from_sim(plan, {3, 0}, sim_json(3)));
  table.append(failed_rows(plan, {0, 1}, "boom"));
  table.append(rows_from_sim(plan, {0, 0}, sim_json(1)));
  // A torn last line (a crash mid-write) is not a row.
  std::ofstream(table.jsonl_path(), std::ios::app) << "{\"point\": 5, \"vari";
  Table again(plan, dir);
  EXPECT_EQ(again.resume(), (std::set<SimKey>{{0, 0}, {0, 1}, {3, 0}}));
  const std::vector<Row> rows = again.finish();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["variant"], "stock");
  EXPECT_EQ(rows[1]["status"], "failed");
  EXPECT_EQ(rows[2]["point"], 3);
  const std::string csv = read(table.csv_path());
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);
  EXPECT_EQ(csv.find("0,stock,0,"), csv.find('\n') + 1);
}

TEST(SweepTable, ResumeRerunsWhatIsMissingFromEitherFile) {
  const Plan plan = two_by_three();
  const std::string dir = temp_dir("resume");
  Table table(plan, dir);
  table.start();
  table.append(rows_from_sim(plan, {0, 0}, sim_json(1)));
  table.append(rows_from_sim(plan, {1, 0}, sim_json(1)));
  // Delete point 1's row from the CSV only.
  std::string csv = read(table.csv_path());
  csv.erase(csv.find("1,stock,0,"));
  std::ofstream(table.csv_path()) << csv;
  EXPECT_EQ(Table(plan, dir).resume(), (std::set<SimKey>{{0, 0}}));
  const std::string jsonl = read(table.jsonl_path());
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1);
}

}  // namespace
}  // namespace hpz::sweep

namespace hpz::sweep {
namespace {

TEST(SweepPlot, LogScaleFromTwoDecades) {
  EXPECT_TRUE(wants_log_scale({1, 2, 100}));
  EXPECT_FALSE(wants_log_scale({1, 2, 99}));
  EXPECT_FALSE(wants_log_scale({0, 1, 1000}));
  EXPECT_EQ(ticks(1, 400, true), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}));
  EXPECT_EQ(ticks(1e3, 1e9, true), (std::vector<double>{1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}));
  EXPECT_EQ(ticks(0, 200, false), (std::vector<double>{0, 50, 100, 150, 200}));
  const std::vector<double> small = ticks(0, 0.0031, false);
  ASSERT_EQ(small.size(), 5u);  // 0, 0.001, ..., 0.004: 1-2-5 steps, ends on a tick
  EXPECT_NEAR(small.back(), 0.004, 1e-15);
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(SweepPlot, LinePerSeriesRingWhereARaceBites) {
  Chart chart;
  chart.title = "step time vs cluster.nic_gbps";
  chart.series = {{"stock", {{1, 2, false}, {10, 1, true}, {100, 0.5, true}}},
                  {"event-wait <fix B>", {{1, 2, false}, {10, 1, false}, {100, 0.5, false}}}};
  chart.marked_meaning = "a race bites";
  const std::string svg = render_svg(chart);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "r=\"7\""), 2u);  // the two ringed points
  EXPECT_NE(svg.find("event-wait &lt;fix B&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">a race bites</text>"), std::string::npos);
  // 1 .. 100 is two decades: a log x axis, so 10 lies halfway between 1 and 100.
  EXPECT_NE(svg.find(">10</text>"), std::string::npos);
}

// The legend's lines fit in the picture: short names keep it 760 px wide, a long one widens it
// (a cluster-size sweep's "stock, cluster.nic_gbps=12.5" was cut off after "12").
TEST(SweepPlot, TheLegendFitsItsLongestName) {
  Chart chart;
  chart.series = {{"stock", {{1, 2, false}, {2, 1, false}}}};
  EXPECT_NE(render_svg(chart).find("width=\"760\" height=\"440\""), std::string::npos);
  chart.series.push_back({"stock, cluster.nic_gbps=12.5", {{1, 3, false}, {2, 2, false}}});
  const std::string svg = render_svg(chart);
  const std::size_t at = svg.find("width=\"");
  ASSERT_NE(at, std::string::npos);
  const double width = std::stod(svg.substr(at + 7));
  // The plot ends at 560 px, the legend's lines start 14 px right of it and their text 26 px
  // further, ~7 px a character for 28 characters.
  EXPECT_GE(width, 560 + 14 + 26 + 7 * 28);
  EXPECT_NE(svg.find("viewBox=\"0 0 " + svg.substr(at + 7, svg.find('"', at + 7) - at - 7)),
            std::string::npos);
}

TEST(SweepReport, ChartPerResultAndKeyRunsAveraged) {
  Plan plan;
  plan.scenario = "s.toml";
  plan.axes = {{"cluster.nic_gbps", {"1", "100"}}, {"cluster.gpu", {"a100-80g", "h100-sxm"}}};
  plan.variants = {variant_spec("stock")};
  plan.runs = 2;
  std::vector<Row> rows;
  for (std::size_t point = 0; point < 4; ++point) {
    for (int run = 0; run < 2; ++run) {
      nlohmann::json sim = {{"runs", nlohmann::json::array()}, {"races", nlohmann::json::array()}};
      for (int r = 0; r < 2; ++r) {
        sim["runs"].push_back({{"step_time_s", 1.0 + r},
                               {"tokens_per_s_per_node", 1.0},
                               {"exposed_comm_s", 0.0},
                               {"host_stall_s", 0.0},
                               {"host_sync_s", 0.0},
                               {"races_manifested", point == 3 ? 1 : 0},
                               {"hung", false}});
      }
      if (run == 0) {
        for (Row& row : rows_from_sim(plan, {point, 0}, sim)) rows.push_back(std::move(row));
      }
    }
  }
  const auto all = charts(plan, rows);
  ASSERT_EQ(all.size(), 2 * plotted_results().size());
  EXPECT_EQ(all[0].first, "step_time_s-vs-cluster.nic_gbps.svg");
  const Chart& by_gpu = all[plotted_results().size()].second;
  EXPECT_EQ(by_gpu.x_labels, (std::vector<std::string>{"a100-80g", "h100-sxm"}));
  ASSERT_EQ(by_gpu.series.size(), 2u);  // stock at each bandwidth
  EXPECT_EQ(by_gpu.series[1].name, "stock, cluster.nic_gbps=100");
  EXPECT_DOUBLE_EQ(by_gpu.series[1].points[0].y, 1.5);  // runs averaged
  EXPECT_TRUE(by_gpu.series[1].points[1].marked);
  EXPECT_FALSE(by_gpu.series[0].points[1].marked);
}

/** A one-axis, one-variant plan with one ok row: two points, 6 charts. */
std::pair<Plan, std::vector<Row>> small_table() {
  Plan plan;
  plan.scenario = "s.toml";
  plan.axes = {{"cluster.nic_gbps", {"1", "100"}}};
  plan.variants = {variant_spec("stock")};
  std::vector<Row> rows;
  for (std::size_t point = 0; point < 2; ++point) {
    for (Row& row : rows_from_sim(plan, {point, 0}, sim_json(point == 0 ? 1.0 : 2.0))) {
      rows.push_back(std::move(row));
    }
  }
  return {plan, rows};
}

TEST(SweepReport, PngNextToEachSvgOrOneNote) {
  const auto [plan, rows] = small_table();
  const std::string dir = temp_dir("report");
  // No converter: SVG only, a note, and no PNG left from an earlier drawing.
  std::filesystem::create_directories(dir + "/plots");
  std::ofstream(dir + "/plots/step_time_s-vs-cluster.nic_gbps.png") << "stale";
  ReportFiles files = write_report(plan, rows, dir, "");
  EXPECT_EQ(files.svg.size(), plotted_results().size());
  EXPECT_TRUE(files.png.empty());
  EXPECT_NE(files.png_note.find("rsvg-convert is not on the PATH"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir + "/plots/step_time_s-vs-cluster.nic_gbps.png"));
  EXPECT_EQ(files.html, dir + "/report.html");
  // A converter that fails: a note naming the first failure, not an exception.
  const std::string failing = dir + "/failing-convert";
  std::ofstream(failing) << "#!/bin/sh\necho 'cannot render' >&2\nexit 3\n";
  std::filesystem::permissions(failing, std::filesystem::perms::owner_all);
  files = write_report(plan, rows, dir, failing);
  EXPECT_TRUE(files.png.empty());
  EXPECT_NE(files.png_note.find("6 of 6 SVG files not converted"), std::string::npos);
  EXPECT_NE(files.png_note.find("cannot render"), std::string::npos);
  // rsvg-convert itself, where installed (tools/install-deps installs it).
  const std::string rsvg = find_on_path("rsvg-convert");
  if (rsvg.empty()) GTEST_SKIP() << "rsvg-convert is not installed";
  files = write_report(plan, rows, dir, rsvg);
  EXPECT_EQ(files.png_note, "");
  ASSERT_EQ(files.png.size(), files.svg.size());
  EXPECT_EQ(files.png[0], dir + "/plots/step_time_s-vs-cluster.nic_gbps.png");
  EXPECT_EQ(read(files.png[0]).substr(0, 8), "\x89PNG\r\n\x1a\n");
}

TEST(SweepReport, FindsProgramsOnThePath) {
  EXPECT_EQ(find_on_path("sh").empty(), false);
  EXPECT_EQ(find_on_path("no-such-program-hpzlab"), "");
}

}  // namespace
}  // namespace hpz::sweep

namespace hpz::sweep {
namespace {

TEST(SweepRunner, ErrorLineOfAChild) {
  const std::string path = temp_dir("runner") + "/child.err";
  std::ofstream(path) << "\r[###   ] 1/3 runs\r[######] 2/3 runs\n"
                         "hpzlab: error: --set: cluster.nodes: must be at least 1, got 0\n\n";
  EXPECT_EQ(last_error_line(path), "--set: cluster.nodes: must be at least 1, got 0");
  std::ofstream(path) << "AddressSanitizer: SEGV on unknown address\n";
  EXPECT_EQ(last_error_line(path), "AddressSanitizer: SEGV on unknown address");
  std::ofstream(path) << "";
  EXPECT_EQ(last_error_line(path), "");
}

TEST(SweepRunner, RunsJobsAtMostJAtATime) {
  const std::string dir = temp_dir("jobs");
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < 5; ++i) {
    // Each job fails if another holds the lock file: with 1 at a time none does.
    const std::string script = "set -o noclobber; : > " + dir +
                               "/lock || exit 9; sleep 0.05; "
                               "rm " +
                               dir + "/lock; exit " + std::to_string(i);
    jobs.push_back({i, {"-c", script}, dir + "/err" + std::to_string(i)});
  }
  std::vector<int> codes(5, -1);
  run_jobs("/bin/sh", jobs, 1,
           [&](const Job& job, const Outcome& outcome) { codes[job.id] = outcome.exit_code; });
  EXPECT_EQ(codes, (std::vector<int>{0, 1, 2, 3, 4}));
  std::vector<Job> killed = {{0, {"-c", "kill -TERM $$"}, dir + "/killed"}};
  Outcome seen;
  run_jobs("/bin/sh", killed, 2, [&](const Job&, const Outcome& o) { seen = o; });
  EXPECT_EQ(seen.signal, 15);
}

// Issue 34, item 8: every field read back names the file, the key and what was expected.
std::string read_error(const std::function<void()>& read) {
  try {
    read();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SweepFields, WrongTypesAreOneLineNamingFileAndKey) {
  Plan plan = two_by_three();
  nlohmann::json sim = sim_json(0.5);
  sim["runs"][0]["hung"] = 1;
  EXPECT_EQ(read_error([&] {
              rows_from_sim(plan, {0, 0}, sim, "p0-v0.json");
            }),
            "p0-v0.json: runs[0].hung: expected true or false, got 1");
  sim = sim_json(0.5);
  sim["runs"][0]["races_manifested"] = nullptr;
  EXPECT_EQ(read_error([&] {
              rows_from_sim(plan, {0, 0}, sim, "p0-v0.json");
            }),
            "p0-v0.json: runs[0].races_manifested: expected a whole number, 0 or more, got null");
  sim = sim_json(0.5);
  sim["runs"][0].erase("step_time_s");
  EXPECT_EQ(read_error([&] {
              rows_from_sim(plan, {0, 0}, sim, "p0-v0.json");
            }),
            "p0-v0.json: runs[0].step_time_s: missing (expected a number or null)");
  plan.runs = 2;
  const std::string runs_error = read_error([&] {
    rows_from_sim(plan, {0, 0}, sim_json(0.5), "p0-v0.json");
  });
  EXPECT_TRUE(runs_error.starts_with(
      "p0-v0.json: runs: expected an array of 2 runs (the sweep's runs), got [{"))
      << runs_error;
}

TEST(SweepFields, ResultsRowsCheckedColumnByColumn) {
  const Plan plan = two_by_three();
  const Row good = rows_from_sim(plan, {4, 1}, sim_json(0.5)).front();
  EXPECT_EQ(checked_row(plan, good, "r.jsonl:1").dump(), good.dump());
  nlohmann::json bad = good;
  bad["status"] = 5;
  EXPECT_EQ(read_error([&] { checked_row(plan, bad, "r.jsonl:1"); }),
            "r.jsonl:1: status: expected ok, hung or failed, got 5");
  bad = good;
  bad["c.d"] = "x";
  EXPECT_EQ(read_error([&] { checked_row(plan, bad, "r.jsonl:1"); }),
            "r.jsonl:1: c.d: expected \"y\" (point 4's value), got \"x\"");
  bad = good;
  bad["point"] = 6;
  EXPECT_EQ(read_error([&] { checked_row(plan, bad, "r.jsonl:1"); }),
            "r.jsonl:1: point: expected a whole number from 0 to 5, got 6");
  bad = good;
  bad["extra"] = 1;
  EXPECT_NE(read_error([&] {
              checked_row(plan, bad, "r.jsonl:1");
            }).find("r.jsonl:1: extra: not a column of this sweep's table"),
            std::string::npos);
  // A line cut by a kill is skipped; the others are rows.
  const std::string text = good.dump() + "\n" + good.dump().substr(0, 20);
  EXPECT_EQ(rows_from_jsonl(plan, text, "r.jsonl").size(), 1u);
}

TEST(SweepFields, PlanFromSweepJsonHasTheCommandLinesLimits) {
  const Plan plan = two_by_three();
  nlohmann::json j = plan.to_json();
  j["runs"] = 2000000000;
  EXPECT_EQ(read_error([&] { plan_from_json(j, "d/sweep.json"); }),
            "d/sweep.json: runs: expected a whole number from 1 to 10000, got 2000000000");
  j = plan.to_json();
  j["vary"] = nlohmann::json::array();
  for (int i = 0; i < 6; ++i) {
    nlohmann::json values = nlohmann::json::array();
    for (int v = 0; v < 100; ++v) values.push_back(std::to_string(v));
    j["vary"].push_back({{"key", "a.k" + std::to_string(i)}, {"values", values}});
  }
  EXPECT_EQ(read_error([&] { plan_from_json(j, "d/sweep.json"); }),
            "d/sweep.json: vary: 2000000000000 simulations (allowed: at most 10000000)");
  j = plan.to_json();
  j["vary"][1]["key"] = "a.b";
  EXPECT_NE(read_error([&] {
              plan_from_json(j, "d/sweep.json");
            }).find("d/sweep.json: vary[1].key: given twice"),
            std::string::npos);
  j = plan.to_json();
  j["variants"] = {"stock", "stock"};
  EXPECT_EQ(read_error([&] { plan_from_json(j, "d/sweep.json"); }),
            "d/sweep.json: variants[1]: given twice");
  Plan many = plan;
  many.runs = 10000;
  many.axes = {{"a.b", Values(1000, "1")}};
  EXPECT_NE(read_error([&] { check_limits(many, ""); }).find("--runs: 20000000 rows"),
            std::string::npos);
}

TEST(SweepFields, TextThatIsNotUtf8GetsReplacementCharacters) {
  EXPECT_EQ(valid_utf8("ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(valid_utf8("a\xff\xfe b"), "a\xef\xbf\xbd\xef\xbf\xbd b");
  EXPECT_EQ(valid_utf8("cut \xe2\x82"), "cut \xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(valid_utf8("\xc0\xaf\xed\xa0\x80"),  // overlong '/', a surrogate
            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  // Into a failed row: the row dumps as JSON.
  const std::vector<Row> rows =
      failed_rows(two_by_three(), {0, 0}, error_line_of("hpzlab: error: bad \xff byte\n"));
  EXPECT_EQ(rows[0]["error"], "bad \xef\xbf\xbd byte");
  EXPECT_NO_THROW((void)rows[0].dump());
}

}  // namespace
}  // namespace hpz::sweep
