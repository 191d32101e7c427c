// `loomctl report JOB --out report.html`: one self-contained HTML page of a
// job (no network fetch of any kind: styles, charts and the little script
// are inline), for reading a run as pictures and for attaching to a bug.
//
// Charts are inline SVG drawn here, not a charting library: the page has
// to open offline, from a file, years later, in any browser, and a line
// chart of a few thousand points is a polyline. Each chart is
// <svg class="chart" data-series="..."> holding one <polyline
// data-points="N"> per series (N the points drawn), axes with tick labels
// and, on the loss chart, a vertical marker per recovery event (spike,
// rollback, restart) and a shaded band per skipped data range mapped to
// steps. A short inline script adds a hover read-out and fills
// #self-check with the number of charts and points it found (what the
// headless-browser test reads).
//
// Sections: the job (state, model, submitter, steps), train and
// validation loss, tokens/s, MFU, the step-time split (data, forward,
// backward, pipeline wait, exposed communication, optimizer, checkpoint
// stall; stacked), memory (RSS, peak), power, energy, the plan and its
// notes, the placement of every rank, recovery events and the checkpoint
// catalog.
#ifndef LOOM_CLI_REPORT_H_
#define LOOM_CLI_REPORT_H_

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::cli {

// The page. `steps` in any order (several attempts may report a step: the
// latest report of each step is drawn); `checkpoints` as ListCheckpoints
// returns them. HTML-escapes every string that comes from the job. Its
// goodput buckets (controller/progress/goodput.h) end at `now` while the job has not
// ended.
std::string RenderJobReport(const loom::v1::Job& job,
                            const std::vector<loom::v1::StepMetrics>& steps,
                            const std::vector<loom::v1::CheckpointInfo>& checkpoints,
                            absl::Time now = absl::Now());

// Text with &, <, >, " and ' escaped for HTML.
std::string HtmlEscape(const std::string& text);

}  // namespace loom::cli

#endif  // LOOM_CLI_REPORT_H_
