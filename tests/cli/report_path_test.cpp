// `--report PATH`: checked before any training (a missing directory, a FIFO, a directory are
// errors at once), written through a symbolic link (the link stays), never renamed over anything
// but a regular file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/hpm_cli.h"

namespace hpm::testing {
namespace {

namespace fs = std::filesystem;

struct ReportJob {
  TempDir dir;
  std::string config;
  ReportJob() {
    write_synthetic_mnist(dir.path(), 64, 16);
    config = small_mlp_config(dir, dir.path(), "");
  }
  CommandResult train(const std::string& report) const {
    return run_hpm("train " + config + " --set train.epochs=1 --report " + report);
  }
};

TEST(ReportPath, AMissingDirectoryIsAnErrorBeforeTraining) {
  ReportJob job;
  const CommandResult r = job.train(job.dir / "nope/report.json");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("hpm: error: cannot write " + job.dir / "nope/report.json" +
                          ": its directory " + job.dir / "nope" + " does not exist"),
            std::string::npos)
      << r.output;
  // Nothing was trained: the banner comes before training.
  EXPECT_EQ(r.output.find("parameters,"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("test accuracy"), std::string::npos) << r.output;
}

TEST(ReportPath, AFifoOrADirectoryIsRefusedAndLeftAlone) {
  ReportJob job;
  const std::string fifo = job.dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  CommandResult r = job.train(fifo);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write " + fifo +
                          ": is a FIFO, not a regular file: refusing "
                          "to replace it"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("parameters,"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_fifo(fifo));
  fs::create_directory(job.dir / "adir");
  r = job.train(job.dir / "adir");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("is a directory, not a regular file"), std::string::npos) << r.output;
  // A link to a FIFO is refused too, naming the link and its target.
  fs::create_symlink(fifo, job.dir / "to-fifo");
  r = job.train(job.dir / "to-fifo");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(
      r.output.find("cannot write " + job.dir / "to-fifo" + ": its target " + fifo + " is a FIFO"),
      std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::is_symlink(job.dir / "to-fifo"));
}

TEST(ReportPath, ASymlinkIsWrittenThrough) {
  ReportJob job;
  fs::create_directory(job.dir / "reports");
  std::ofstream(job.dir / "reports/real.json") << "old\n";
  fs::create_symlink("reports/real.json", job.dir / "link.json");  // relative to its directory
  const CommandResult r = job.train(job.dir / "link.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(job.dir / "link.json"));
  EXPECT_TRUE(fs::is_regular_file(job.dir / "reports/real.json"));
  EXPECT_NE(read_text(job.dir / "reports/real.json").find("\"test_accuracy\""), std::string::npos);
  // A dangling link is a new file at its target.
  fs::create_symlink("reports/new.json", job.dir / "dangling.json");
  ASSERT_EQ(job.train(job.dir / "dangling.json").code, 0);
  EXPECT_TRUE(fs::is_symlink(job.dir / "dangling.json"));
  EXPECT_NE(read_text(job.dir / "reports/new.json").find("\"test_accuracy\""), std::string::npos);
}

}  // namespace
}  // namespace hpm::testing
