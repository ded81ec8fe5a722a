// `hpzlab sweep --plot`: every numeric result against each varied key as SVG in DIR/plots/, a
// line per variant (and per value of the other varied keys), points where a race bites ringed,
// and DIR/report.html showing the plots and the table (static: opens from disk, no server). Each
// SVG gets a PNG next to it when rsvg-convert (Debian: librsvg2-bin) is on the PATH.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tools/hpzlab/sweep/plan.hpp"
#include "tools/hpzlab/sweep/plot.hpp"
#include "tools/hpzlab/sweep/table.hpp"

namespace hpz::sweep {

/** The results plotted, in order: column name and axis label. */
const std::vector<std::pair<std::string, std::string>>& plotted_results();

/** The charts of a table: (file name, chart) for each varied key x plotted result, from the
 *  rows whose status is "ok", runs averaged. */
std::vector<std::pair<std::string, Chart>> charts(const Plan& plan, const std::vector<Row>& rows);

/** What write_report() wrote. */
struct ReportFiles {
  std::vector<std::string> svg;  ///< DIR/plots/*.svg
  std::vector<std::string> png;  ///< DIR/plots/*.png, one per SVG that rsvg-convert converted
  std::string html;              ///< DIR/report.html
  std::string png_note;          ///< why some or all SVGs have no PNG ("" when all have one)
};

/** The path of `program` found on the PATH, "" when it is not there. */
std::string find_on_path(const std::string& program);

/** Writes the SVG files in DIR/plots and DIR/report.html, then converts each SVG to a PNG next
 *  to it with `converter` (rsvg-convert's path; "" = none: SVG only, and png_note says so). A
 *  conversion that fails is a note, not an error. Throws InputError naming a file it cannot
 *  write. */
ReportFiles write_report(const Plan& plan, const std::vector<Row>& rows, const std::string& dir,
                         const std::string& converter);

}  // namespace hpz::sweep
