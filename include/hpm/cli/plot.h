// Loss curves as SVG, for people to look at: `hpm plot` reads metrics CSVs ([train] metrics_csv)
// and draws one chart per column asked for, every run on it (trace::render_curves). Runs that share
// a label are one series (the same setting over several seeds): their mean as a line and their
// spread (min to max at each x) as a band, so a reader sees both the trend and how far seeds
// disagree.
//
//   hpm plot a.csv b.csv -o curves.svg                      # test_loss against epoch
//   hpm plot s1.csv s2.csv s3.csv t1.csv t2.csv t3.csv -o c.svg --x seconds
//       --label codistill,codistill,codistill,alone,alone,alone -y test_loss -y train_loss
//
// --x is "epoch" (default), "seconds" (wall clock: the running sum of each epoch's seconds) or any
// column; --x-scale multiplies it (eval_every, to get steps from a language model's evaluation
// stretches). Cells left empty (no evaluation that epoch) are skipped.
//
// Errors name the file and what is wrong: a file that cannot be read, a column it lacks (listing
// those it has), a cell that is not a number (line and column), a label count that matches
// neither one label nor one per file, a chart with nothing to draw, a value <= 0 with --log-y.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hpm::cli {

struct PlotCommandOptions {
  std::vector<std::string> files;
  std::string output;
  std::vector<std::string> columns;  // empty: test_loss where the files have it, else train_loss
  std::vector<std::string> labels;   // empty: each file's name without directory and extension
  std::string x = "epoch";
  double x_scale = 1.0;
  std::string title;
  std::string x_label;  // empty: named after --x
  bool log_y = false;
};

CLI::App* add_plot_command(CLI::App& app, PlotCommandOptions& options);
int run_plot(const PlotCommandOptions& options);

}  // namespace hpm::cli
