// Text for XML and HTML documents (JUnit, SVG plots, the sweep report): the five characters
// that markup gives a meaning, as entities.
#pragma once

#include <string>
#include <string_view>

namespace hpz {

/** `text` with & < > " ' as &amp; &lt; &gt; &quot; &apos;: safe in element text and in
 *  attribute values of XML and HTML. */
inline std::string xml_escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace hpz
