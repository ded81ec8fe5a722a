// `hpzlab sweep --plot`: every numeric result against each varied key as SVG in DIR/plots/, a
// line per variant (and per value of the other varied keys), points where a race bites ringed,
// and DIR/report.html showing the plots and the table (static: opens from disk, no server).
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

/** Writes the SVG files in DIR/plots and DIR/report.html; returns the paths written. Throws
 * InputError naming a file it cannot write. */
std::vector<std::string> write_report(const Plan& plan, const std::vector<Row>& rows,
                                      const std::string& dir);

}  // namespace hpz::sweep
