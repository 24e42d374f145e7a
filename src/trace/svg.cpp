#include "hpm/trace/svg.h"

#include <cstdio>

namespace hpm::trace {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string SvgDocument::number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

SvgDocument::SvgDocument(double width, double height, std::string_view attributes)
    : width_(width), height_(height), root_attributes_(attributes) {
  rect(0, 0, width, height, "fill=\"white\"");
}

void SvgDocument::rect(double x, double y, double width, double height,
                       std::string_view attributes) {
  body_ << "<rect x=\"" << number(x) << "\" y=\"" << number(y) << "\" width=\"" << number(width)
        << "\" height=\"" << number(height) << "\" " << attributes << "/>\n";
}

void SvgDocument::rect_with_title(double x, double y, double width, double height,
                                  std::string_view attributes, std::string_view tooltip) {
  body_ << "<rect x=\"" << number(x) << "\" y=\"" << number(y) << "\" width=\"" << number(width)
        << "\" height=\"" << number(height) << "\" " << attributes << "><title>"
        << xml_escape(tooltip) << "</title></rect>\n";
}

void SvgDocument::line(double x1, double y1, double x2, double y2, std::string_view attributes) {
  body_ << "<line x1=\"" << number(x1) << "\" y1=\"" << number(y1) << "\" x2=\"" << number(x2)
        << "\" y2=\"" << number(y2) << "\" " << attributes << "/>\n";
}

void SvgDocument::circle(double cx, double cy, double r, std::string_view attributes) {
  body_ << "<circle cx=\"" << number(cx) << "\" cy=\"" << number(cy) << "\" r=\"" << number(r)
        << "\" " << attributes << "/>\n";
}

void SvgDocument::poly(std::string_view element,
                       const std::vector<std::pair<double, double>>& points,
                       std::string_view attributes) {
  body_ << '<' << element << ' ' << attributes << " points=\"";
  for (const auto& [x, y] : points) body_ << number(x) << ',' << number(y) << ' ';
  body_ << "\"/>\n";
}

void SvgDocument::text(double x, double y, std::string_view content, std::string_view attributes) {
  body_ << "<text x=\"" << number(x) << "\" y=\"" << number(y) << '"'
        << (attributes.empty() ? "" : " ") << attributes << '>' << xml_escape(content)
        << "</text>\n";
}

void SvgDocument::open_group(std::string_view attributes) { body_ << "<g " << attributes << ">\n"; }

void SvgDocument::close_group() { body_ << "</g>\n"; }

std::string SvgDocument::finish(bool declaration) const {
  std::ostringstream out;
  if (declaration) out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width_ << "\" height=\"" << height_
      << "\" viewBox=\"0 0 " << width_ << ' ' << height_ << "\" " << root_attributes_ << ">\n"
      << body_.str() << "</svg>\n";
  return out.str();
}

}  // namespace hpm::trace
