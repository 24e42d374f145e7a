// SVG drawn element by element: coordinates with two decimals, every text and attribute value
// escaped. The one SVG writer of hpm: timelines (trace::svg) and metric curves (hpm plot).
#pragma once
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hpm::trace {

// `text` with <, >, & and " escaped, for SVG (XML) text and attribute values.
std::string xml_escape(std::string_view text);

class SvgDocument {
 public:
  // The root element, white background. `attributes`: more of the root's (font-family, ...).
  SvgDocument(double width, double height,
              std::string_view attributes = "font-family=\"sans-serif\"");

  // `attributes` are written as given (name="value" ...): values from data go through xml_escape.
  void rect(double x, double y, double width, double height, std::string_view attributes);
  void line(double x1, double y1, double x2, double y2, std::string_view attributes);
  void circle(double cx, double cy, double r, std::string_view attributes);
  // <polyline> or <polygon> through `points`.
  void poly(std::string_view element, const std::vector<std::pair<double, double>>& points,
            std::string_view attributes);
  // `content` is escaped; `inner` (a <title> tooltip, say) is markup the caller escaped.
  void text(double x, double y, std::string_view content, std::string_view attributes = "");
  void open_group(std::string_view attributes);
  void close_group();
  // A rectangle with a tooltip (<title>): `tooltip` is escaped.
  void rect_with_title(double x, double y, double width, double height, std::string_view attributes,
                       std::string_view tooltip);

  // The document, closed (with the XML declaration when `declaration`).
  std::string finish(bool declaration = false) const;

  static std::string number(double v);  // "12.50"

 private:
  std::ostringstream body_;
  double width_, height_;
  std::string root_attributes_;
};

}  // namespace hpm::trace
