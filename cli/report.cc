#include "cli/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "controller/progress/goodput.h"
#include "loom/v1/job.pb.h"

namespace loom::cli {
namespace {

using Point = std::pair<double, double>;

struct Series {
  std::string name;
  std::string color;
  std::vector<Point> points;
  bool dots = false;  // markers only (validation loss), no line
};

struct Marker {
  double x;
  std::string label;
  std::string color;
};

struct Band {
  double x0, x1;
  std::string label;
};

constexpr int kWidth = 860, kHeight = 250;
constexpr int kLeft = 70, kRight = 20, kTop = 28, kBottom = 36;
constexpr size_t kMaxPoints = 1200;  // per series; more are thinned evenly

// At most kMaxPoints, the first and last kept.
std::vector<Point> Thin(const std::vector<Point>& points) {
  if (points.size() <= kMaxPoints) return points;
  std::vector<Point> out;
  const double stride = static_cast<double>(points.size() - 1) / (kMaxPoints - 1);
  for (size_t i = 0; i < kMaxPoints; ++i) {
    out.push_back(points[static_cast<size_t>(std::llround(i * stride))]);
  }
  return out;
}

// Round tick values covering [lo, hi].
std::vector<double> Ticks(double lo, double hi) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

std::string Num(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) return absl::StrFormat("%.2g", v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.3g", v);
}

// An SVG line chart (or, `stacked`, filled areas each drawn on top of the
// previous series, which the caller has already summed).
std::string Chart(const std::string& id, const std::string& title, const std::string& y_unit,
                  const std::vector<Series>& series, const std::vector<Marker>& markers = {},
                  const std::vector<Band>& bands = {}, bool stacked = false) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  size_t total = 0;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
      ++total;
    }
  }
  if (total > 0) {
    if (stacked || y0 > 0) y0 = std::min(0.0, y0);
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1;
    y1 += (y1 - y0) * 0.05;  // headroom above the highest point
  }
  std::string svg = absl::StrFormat(
      "<figure><figcaption>%s</figcaption>\n<svg class=\"chart\" id=\"%s\" viewBox=\"0 0 %d %d\" "
      "width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"%s\" data-series=\"%d\" "
      "data-x0=\"%g\" data-x1=\"%g\" data-y0=\"%g\" data-y1=\"%g\" data-unit=\"%s\">\n",
      HtmlEscape(title), id, kWidth, kHeight, kWidth, kHeight, HtmlEscape(title), series.size(),
      total ? x0 : 0, total ? x1 : 0, total ? y0 : 0, total ? y1 : 0, HtmlEscape(y_unit));
  if (total == 0) {
    absl::StrAppend(&svg, "<text x=\"", kWidth / 2, "\" y=\"", kHeight / 2,
                    "\" text-anchor=\"middle\" class=\"empty\">no data</text></svg></figure>\n");
    return svg;
  }
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - y0) / (y1 - y0) * ph; };
  // Bands and grid first, data on top.
  for (const Band& b : bands) {
    const double a = std::clamp(sx(b.x0), double(kLeft), double(kLeft + pw));
    const double z = std::clamp(sx(b.x1), double(kLeft), double(kLeft + pw));
    absl::StrAppendFormat(&svg,
                          "<rect class=\"band\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.0f\">"
                          "<title>%s</title></rect>\n",
                          a, kTop, std::max(1.0, z - a), ph, HtmlEscape(b.label));
  }
  for (double t : Ticks(y0, y1)) {
    absl::StrAppendFormat(&svg,
                          "<line class=\"grid\" x1=\"%d\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                          "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          kLeft, kLeft + pw, sy(t), sy(t), kLeft - 6, sy(t) + 4, Num(t));
  }
  for (double t : Ticks(x0, x1)) {
    absl::StrAppendFormat(&svg,
                          "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                          sx(t), kHeight - kBottom + 16, Num(t));
  }
  absl::StrAppendFormat(&svg,
                        "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>"
                        "<text class=\"axis\" x=\"14\" y=\"%d\" transform=\"rotate(-90 14 %d)\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        kLeft + static_cast<int>(pw) / 2, kHeight - 4, kTop + static_cast<int>(ph) / 2,
                        kTop + static_cast<int>(ph) / 2, HtmlEscape(y_unit));
  // Stacked areas are drawn top series first so lower ones stay visible.
  std::vector<size_t> order(series.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = stacked ? order.size() - 1 - i : i;
  for (size_t i : order) {
    const Series& s = series[i];
    std::vector<Point> pts;
    for (const Point& p : Thin(s.points)) {
      if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
    }
    std::string coords;
    for (const auto& [x, y] : pts) absl::StrAppendFormat(&coords, "%.1f,%.1f ", sx(x), sy(y));
    if (s.dots) {
      absl::StrAppendFormat(&svg, "<g class=\"dots\" data-name=\"%s\" data-points=\"%d\" fill=\"%s\">",
                            HtmlEscape(s.name), pts.size(), s.color);
      for (const auto& [x, y] : pts) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"><title>step %s: %s</title></circle>",
                              sx(x), sy(y), Num(x), Num(y));
      }
      svg += "</g>\n";
    } else if (stacked && !pts.empty()) {
      absl::StrAppendFormat(
          &svg,
          "<polygon class=\"area\" data-name=\"%s\" data-points=\"%d\" fill=\"%s\" "
          "points=\"%.1f,%.1f %s%.1f,%.1f\"/>\n",
          HtmlEscape(s.name), pts.size(), s.color, sx(pts.front().first), sy(0), coords,
          sx(pts.back().first), sy(0));
    } else {
      absl::StrAppendFormat(&svg,
                            "<polyline class=\"line\" data-name=\"%s\" data-points=\"%d\" "
                            "stroke=\"%s\" points=\"%s\"/>\n",
                            HtmlEscape(s.name), pts.size(), s.color, coords);
    }
  }
  for (const Marker& m : markers) {
    if (m.x < x0 || m.x > x1) continue;
    absl::StrAppendFormat(&svg,
                          "<line class=\"marker\" stroke=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" "
                          "y2=\"%.0f\"><title>%s</title></line>\n",
                          m.color, sx(m.x), sx(m.x), kTop, kTop + ph, HtmlEscape(m.label));
  }
  // Legend.
  double lx = kLeft;
  for (const Series& s : series) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"8\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text class=\"legend\" x=\"%.0f\" y=\"17\">%s</text>\n",
                          lx, s.color, lx + 14, HtmlEscape(s.name));
    lx += 24 + 7.0 * static_cast<double>(s.name.size());
  }
  svg += "</svg></figure>\n";
  return svg;
}

std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::string html = "<table>\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    html += "<tr>";
    for (const std::string& cell : rows[r]) {
      absl::StrAppend(&html, r == 0 ? "<th>" : "<td>", HtmlEscape(cell), r == 0 ? "</th>" : "</td>");
    }
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  return absl::StrFormat("%.0f kB", b / 1e3);
}

std::string Time(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

const char* EventColor(loom::v1::RecoveryEvent::Kind kind) {
  switch (kind) {
    case loom::v1::RecoveryEvent::SPIKE:
      return "#d62728";
    case loom::v1::RecoveryEvent::ROLLBACK:
      return "#9467bd";
    case loom::v1::RecoveryEvent::RESTART:
      return "#ff7f0e";
    default:
      return "#7f7f7f";
  }
}

constexpr char kStyle[] = R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       max-width: 920px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px;
     border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.meta { color: #57606a; } figure { margin: 12px 0; } figcaption { font-weight: 600; }
svg.chart { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; max-width: 100%;
            height: auto; }
.grid { stroke: #eaeef2; } .tick, .legend, .axis { font-size: 11px; fill: #57606a; }
.line { fill: none; stroke-width: 1.6; } .area { opacity: 0.85; stroke: none; }
.band { fill: #9467bd; opacity: 0.12; } .marker { stroke-width: 1.5; stroke-dasharray: 4 3; }
.empty { fill: #8c959f; } table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } #readout { position: fixed; pointer-events: none; background: #1f2328;
     color: #fff; font-size: 12px; padding: 2px 6px; border-radius: 4px; display: none; }
#self-check { color: #57606a; font-size: 12px; }
)CSS";

// Hover read-out (step and value under the pointer, from the chart's data
// ranges) and the self-check the browser test reads. No network, no eval.
constexpr char kScript[] = R"JS(
(function () {
  var charts = document.querySelectorAll('svg.chart');
  var points = 0, empty = 0;
  charts.forEach(function (svg) {
    var n = 0;
    svg.querySelectorAll('[data-points]').forEach(function (s) { n += Number(s.dataset.points); });
    if (n === 0) empty += 1;
    points += n;
  });
  var check = document.getElementById('self-check');
  check.textContent = charts.length + ' charts, ' + points + ' points, ' + empty + ' empty';
  check.dataset.charts = charts.length;
  check.dataset.points = points;
  check.dataset.empty = empty;
  var readout = document.getElementById('readout');
  charts.forEach(function (svg) {
    svg.addEventListener('mousemove', function (e) {
      var box = svg.getBoundingClientRect();
      var fx = (e.clientX - box.left) / box.width * 860, fy = (e.clientY - box.top) / box.height * 250;
      if (fx < 70 || fx > 840 || fy < 28 || fy > 214) { readout.style.display = 'none'; return; }
      var d = svg.dataset;
      var x = Number(d.x0) + (fx - 70) / 770 * (Number(d.x1) - Number(d.x0));
      var y0 = Math.min(0, Number(d.y0)), y1 = Number(d.y1);
      var y = y0 + (214 - fy) / 186 * (y1 - y0);
      readout.textContent = 'step ' + Math.round(x) + ': ' + y.toPrecision(4) + ' ' + d.unit;
      readout.style.left = (e.clientX + 12) + 'px';
      readout.style.top = (e.clientY + 12) + 'px';
      readout.style.display = 'block';
    });
    svg.addEventListener('mouseleave', function () { readout.style.display = 'none'; });
  });
})();
)JS";

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string RenderJobReport(const loom::v1::Job& job,
                            const std::vector<loom::v1::StepMetrics>& steps_in,
                            const std::vector<loom::v1::CheckpointInfo>& checkpoints,
                            absl::Time now) {
  // The latest report of each step (a replayed step after a restart or
  // rollback replaces the earlier one), in step order.
  std::map<int64_t, loom::v1::StepMetrics> by_step;
  for (const auto& m : steps_in) {
    if (m.step() <= 0) continue;
    auto it = by_step.find(m.step());
    if (it == by_step.end() || m.time_unix_ms() >= it->second.time_unix_ms()) by_step[m.step()] = m;
  }
  Series loss{"train loss", "#1f77b4", {}}, val{"validation loss", "#2ca02c", {}, true};
  Series tps{"tokens/s", "#1f77b4", {}}, mfu{"MFU %", "#ff7f0e", {}};
  Series rss{"RSS", "#1f77b4", {}}, peak{"peak RSS", "#d62728", {}};
  Series power{"power W", "#ff7f0e", {}}, energy{"energy kJ", "#2ca02c", {}};
  // Step-time split, cumulative (stacked).
  const std::vector<std::pair<std::string, std::string>> parts = {
      {"data wait", "#8c564b"}, {"forward", "#1f77b4"},  {"backward", "#aec7e8"},
      {"pipeline wait", "#c5b0d5"}, {"exposed comm", "#ff7f0e"}, {"optimizer", "#2ca02c"},
      {"checkpoint stall", "#d62728"}};
  std::vector<Series> split;
  for (const auto& [name, color] : parts) split.push_back({name, color, {}});
  for (const auto& [step, m] : by_step) {
    const double x = static_cast<double>(step);
    loss.points.push_back({x, m.loss()});
    if (m.has_val_loss()) val.points.push_back({x, m.val_loss()});
    tps.points.push_back({x, m.tokens_per_second()});
    mfu.points.push_back({x, 100 * m.mfu()});
    rss.points.push_back({x, m.rss_bytes() / 1e6});
    peak.points.push_back({x, m.peak_rss_bytes() / 1e6});
    power.points.push_back({x, m.power_watts()});
    energy.points.push_back({x, m.energy_joules() / 1e3});
    // Forward and backward when reported, else compute whole as forward.
    const bool fb = m.forward_seconds() > 0 || m.backward_seconds() > 0;
    const double values[] = {m.data_wait_seconds(),
                             fb ? m.forward_seconds() : m.compute_seconds(),
                             fb ? m.backward_seconds() : 0.0,
                             m.pipeline_wait_seconds(),
                             m.comm_seconds(),
                             m.optimizer_seconds(),
                             m.checkpoint_stall_seconds()};
    double sum = 0;
    for (size_t i = 0; i < split.size(); ++i) {
      sum += 1000 * values[i];
      split[i].points.push_back({x, sum});
    }
  }
  std::vector<Marker> markers;
  std::vector<Band> bands;
  // Skipped data batches as steps: batch b was trained at the step whose
  // data_batch is b (the nearest reported).
  auto step_of_batch = [&](int64_t batch) -> double {
    for (const auto& [step, m] : by_step) {
      if (m.data_batch() >= batch) return static_cast<double>(step);
    }
    return by_step.empty() ? 0 : static_cast<double>(by_step.rbegin()->first);
  };
  for (const auto& e : job.events()) {
    const double x = static_cast<double>(e.step() > 0 ? e.step() : e.checkpoint_step());
    markers.push_back({x,
                       absl::StrCat(loom::v1::RecoveryEvent::Kind_Name(e.kind()), " at step ",
                                    e.step(), ": ", e.message()),
                       EventColor(e.kind())});
    if (e.kind() == loom::v1::RecoveryEvent::ROLLBACK && e.skip().end() > e.skip().begin()) {
      bands.push_back({step_of_batch(e.skip().begin()), step_of_batch(e.skip().end()),
                       absl::StrCat("data batches [", e.skip().begin(), ", ", e.skip().end(),
                                    ") skipped")});
    }
  }
  for (const auto& r : job.spec().skip_batches()) {
    bands.push_back({step_of_batch(r.begin()), step_of_batch(r.end()),
                     absl::StrCat("data batches [", r.begin(), ", ", r.end(), ") skipped (spec)")});
  }

  const loom::v1::ModelSpec& model = job.spec().model();
  const loom::v1::GptModel& g = model.has_llama() ? model.llama() : model.gpt();
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>Loom report: ",
      HtmlEscape(job.id()), "</title>\n<style>", kStyle, "</style></head><body>\n<h1>",
      HtmlEscape(job.id()), "</h1>\n<p class=\"meta\">",
      HtmlEscape(absl::StrCat(loom::v1::JobState_Name(job.state()), " · ",
                              model.has_llama() ? "Llama-family" : "GPT-2", " model, ",
                              g.n_layer(), " layers, d_model ", g.d_model(), ", ", g.n_head(),
                              " heads, vocabulary ", g.vocab_size(), " · ",
                              by_step.empty() ? 0 : by_step.rbegin()->first, " of ",
                              job.spec().schedule().total_steps(), " steps · submitted by ",
                              job.submitted_by().empty() ? "?" : job.submitted_by(), " · ",
                              job.restarts(), " restart(s), ", job.events_size(), " event(s)")),
      "</p>\n<p id=\"self-check\"></p>\n<div id=\"readout\"></div>\n");
  // Where the job's wall time went (controller/progress/goodput.h).
  const controller::GoodputBuckets gp = controller::ComputeGoodput(job, steps_in, now);
  absl::StrAppend(&html, "<h2>Goodput</h2>\n<p>",
                  HtmlEscape(absl::StrFormat(
                      "%.1f s of %.1f s trained the model: ETTR (productive time over the time "
                      "not queued) %.2f; %d preemption(s), %d restart(s).",
                      gp.productive, gp.wall, gp.ettr(), job.preemptions(), job.restarts())),
                  "</p>\n");
  std::vector<std::vector<std::string>> buckets = {{"bucket", "seconds", "share of wall time"}};
  for (const controller::GoodputBuckets::Named& bucket : gp.List()) {
    const std::string name = bucket.description;
    const double seconds = bucket.seconds;
    buckets.push_back({name, absl::StrFormat("%.1f", seconds),
                       gp.wall > 0 ? absl::StrFormat("%.1f%%", 100 * seconds / gp.wall) : "-"});
  }
  html += Table(buckets);
  absl::StrAppend(&html, "<h2>Loss</h2>\n",
                  Chart("loss", "Train and validation loss (markers: recovery events; shaded: "
                                "skipped data)",
                        "nats/token", {loss, val}, markers, bands));
  absl::StrAppend(&html, "<h2>Throughput</h2>\n", Chart("tokens", "Tokens per second (job)",
                                                         "tokens/s", {tps}));
  absl::StrAppend(&html, Chart("mfu", "Model FLOPs utilisation", "% of peak", {mfu}));
  absl::StrAppend(&html, "<h2>Step time</h2>\n",
                  Chart("split", "Where a step's time goes (reporting rank, stacked)", "ms", split,
                        {}, {}, /*stacked=*/true));
  absl::StrAppend(&html, "<h2>Memory, power and energy</h2>\n",
                  Chart("memory", "Resident memory of the reporting rank", "MB", {rss, peak}),
                  Chart("power", "Power of the reporting rank", "W", {power}),
                  Chart("energy", "Energy of the reporting rank since it started", "kJ",
                        {energy}));

  absl::StrAppend(&html, "<h2>Plan and placement</h2>\n");
  if (job.has_plan()) {
    const auto& l = job.plan().layout();
    absl::StrAppend(&html, "<p>", HtmlEscape(absl::StrCat(job.plan().auto_() ? "Chosen by the planner"
                                                                             : "The spec's layout",
                                                          " for ", job.plan().topology(), ": ",
                                                          l.summary())),
                    "</p>\n",
                    Table({{"predicted step", "tokens/s", "MFU", "memory per device"},
                           {absl::StrFormat("%.3f s", l.step_seconds()), Num(l.tokens_per_second()),
                            absl::StrFormat("%.1f%%", 100 * l.mfu()),
                            absl::StrCat(Bytes(l.total_bytes()), " of ", Bytes(l.device_memory_bytes()))}}));
    if (job.plan().notes_size() > 0) {
      html += "<ul>";
      for (const auto& n : job.plan().notes()) absl::StrAppend(&html, "<li>", HtmlEscape(n), "</li>");
      html += "</ul>\n";
    }
  }
  std::vector<std::vector<std::string>> placement = {{"rank", "node", "zone/rack", "dp", "pp", "tp"}};
  for (const auto& r : job.ranks()) {
    placement.push_back({absl::StrCat(r.rank()), r.node(), r.rack(), absl::StrCat(r.dp()),
                         absl::StrCat(r.pp()), absl::StrCat(r.tp())});
  }
  html += Table(placement);

  absl::StrAppend(&html, "<h2>Recovery events</h2>\n");
  std::vector<std::vector<std::string>> events = {{"time", "kind", "step", "what"}};
  for (const auto& e : job.events()) {
    events.push_back({Time(e.time_unix_ms()), loom::v1::RecoveryEvent::Kind_Name(e.kind()),
                      absl::StrCat(e.step()), e.message()});
  }
  html += job.events_size() > 0 ? Table(events) : "<p>None: the run needed no recovery.</p>\n";

  absl::StrAppend(&html, "<h2>Checkpoints</h2>\n");
  std::vector<std::vector<std::string>> ckpts = {{"step", "attempt", "status", "size", "write s",
                                                  "path"}};
  for (const auto& c : checkpoints) {
    ckpts.push_back({absl::StrCat(c.step()), absl::StrCat(c.generation()), c.status(),
                     Bytes(static_cast<double>(c.bytes())), absl::StrFormat("%.3f", c.write_seconds()),
                     c.path()});
  }
  html += Table(ckpts);
  absl::StrAppend(&html, "<p class=\"meta\">Generated by loomctl report; self-contained (no "
                         "network requests).</p>\n<script>",
                  kScript, "</script>\n</body></html>\n");
  return html;
}

}  // namespace loom::cli
