// Fault tolerance end to end: a worker killed mid-run under `hpm launch --max-restarts`, a
// preempted run (SIGTERM), corrupt backups and a full disk. Each run's final parameters are
// compared byte for byte with an uninterrupted run of the same seed: training is deterministic,
// so continuing from a backup must land exactly where never stopping does.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;
namespace fs = std::filesystem;

// The final model's bytes in a checkpoint root.
std::string final_model(const std::string& root) {
  std::string latest = read_text(root + "/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  return read_text(root + "/" + latest + "/model.safetensors");
}

struct Rig {
  TempDir dir;
  std::string cfg;
  // 640 examples at batch 16: 40 steps an epoch, 80 in all.
  explicit Rig(const std::string& extra = "") {
    write_synthetic_mnist(dir.path(), 640, 100);
    cfg = small_mlp_config(dir, dir.path(), extra);
  }
  std::string train(const std::string& args) const {
    return hpm_binary() + " train " + cfg + " " + args;
  }
  // Where an uninterrupted run ends.
  std::string reference(const std::string& args = "") const {
    const CommandResult r =
        run_shell(train(args + " --set train.checkpoint_dir=" + dir / "reference"));
    EXPECT_EQ(r.code, 0) << r.output;
    return final_model(dir / "reference");
  }
};

TEST(FaultTolerance, KilledWorkerRestartsAndEndsBitIdentical) {
  Rig rig("[strategy]\nkind = \"multi_worker_mirrored\"\ntimeout_s = 20\n");
  const std::string two = rig.dir / "two";
  // Two workers uninterrupted: the reference of the restart runs (two workers average in another
  // order than one).
  CommandResult base =
      run_shell(hpm_binary() + " launch -n 2 -- " + rig.train("--set train.checkpoint_dir=" + two));
  ASSERT_EQ(base.code, 0) << base.output;
  const std::string uninterrupted = final_model(two);
  EXPECT_FALSE(uninterrupted.empty());
  for (int kill_step : {7, 23, 45}) {
    SCOPED_TRACE("killed after step " + std::to_string(kill_step));
    const std::string name = "killed" + std::to_string(kill_step);
    const std::string report = rig.dir / (name + ".json");
    const CommandResult r =
        run_shell("HPM_FAULT_AT_STEP=1:" + std::to_string(kill_step) + " " + hpm_binary() +
                  " launch -n 2 --max-restarts 2 -- " +
                  rig.train("--set train.checkpoint_dir=" + rig.dir / name +
                            " --set train.backup_dir=" + rig.dir / (name + "-backup") +
                            " --set train.backup_every_steps=10 --report " + report));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("rank 1 killed by signal SIGKILL"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("restarting all 2 ranks (restart 1 of 2)"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("all ranks finished after 1 restart(s)"), std::string::npos)
        << r.output;
    EXPECT_EQ(final_model(rig.dir / name), uninterrupted)
        << "parameters differ from the uninterrupted run";
    // Redone work is at most one backup interval: the restart continued from the last backup.
    const auto restored =
        nlohmann::json::parse(read_text(report))["restored_from"].get<std::string>();
    // (Killed before the first backup, the group starts again from step 0.)
    const std::int64_t backup_step =
        restored.empty() ? 0 : std::stoll(restored.substr(restored.rfind("ckpt-") + 5));
    EXPECT_EQ(restored.empty(), kill_step < 10) << restored;
    EXPECT_LE(kill_step - backup_step, 10) << restored;
    EXPECT_GE(kill_step, backup_step);
    EXPECT_FALSE(fs::exists(rig.dir / (name + "-backup")))
        << "the backup outlived a successful finish";
  }
}

TEST(FaultTolerance, PreemptedRunResumesExactly) {
  Rig rig;
  const std::string reference = rig.reference();
  const std::string args = "--set train.checkpoint_dir=" + rig.dir / "ckpt" +
                           " --set train.backup_dir=" + rig.dir / "backup" +
                           " --set train.backup_every_steps=10";
  const CommandResult first = run_shell("HPM_FAULT_AT_STEP=0:25:TERM " + rig.train(args));
  EXPECT_EQ(first.code, 4) << first.output;
  EXPECT_NE(first.output.find("preempted after global step 26; backup written to"),
            std::string::npos)
      << first.output;
  ASSERT_TRUE(fs::exists(rig.dir / "backup/ckpt-26"));
  const CommandResult second = run_shell(rig.train(args + " --report " + rig.dir / "r.json"));
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("continuing from backup " + rig.dir / "backup/ckpt-26"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(report_number(rig.dir / "r.json", "steps_this_run"), 80 - 26);
  EXPECT_EQ(final_model(rig.dir / "ckpt"), reference);
}

// Two processes under `hpm launch`, the second preempted after global step 30: both stop after
// the same step, and the relaunch ends with the bytes of an uninterrupted run.
void preempt_one_of_two_and_relaunch(const Rig& rig) {
  CommandResult base = run_shell(hpm_binary() + " launch -n 2 -- " +
                                 rig.train("--set train.checkpoint_dir=" + rig.dir / "two"));
  ASSERT_EQ(base.code, 0) << base.output;
  const std::string launch = hpm_binary() + " launch -n 2 -- " +
                             rig.train("--set train.checkpoint_dir=" + rig.dir / "ckpt" +
                                       " --set train.backup_dir=" + rig.dir / "backup");
  const CommandResult first = run_shell("HPM_FAULT_AT_STEP=1:30:TERM " + launch);
  EXPECT_EQ(first.code, 4) << first.output;
  EXPECT_NE(first.output.find("[0] hpm: preempted after global step 31"), std::string::npos)
      << first.output;
  const CommandResult second = run_shell(launch);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_TRUE(final_model(rig.dir / "ckpt") == final_model(rig.dir / "two"))
      << "parameters differ from the uninterrupted run's";
}

TEST(FaultTolerance, PreemptingOneWorkerStopsAllAtTheSameStep) {
  preempt_one_of_two_and_relaunch(
      Rig("[strategy]\nkind = \"multi_worker_mirrored\"\ntimeout_s = 20\n"));
}

// A pipeline with one process per stage: process 0's backup holds every stage's weights and the
// optimizer's state of both (SGD's momentum), though each process updated only its own stage.
TEST(FaultTolerance, PipelineOnProcessesResumesExactly) {
  preempt_one_of_two_and_relaunch(
      Rig("[pipeline]\nstages = 2\nmicro_batches = 4\npartition = \"uniform\"\n"
          "[strategy]\ntimeout_s = 20\n"));
}

// Leaves two backups (steps 20 and 26) by preempting a run that keeps them.
void two_backups(const Rig& rig, const std::string& args) {
  const CommandResult r = run_shell("HPM_FAULT_AT_STEP=0:25:TERM " + rig.train(args));
  ASSERT_EQ(r.code, 4) << r.output;
  ASSERT_TRUE(fs::exists(rig.dir / "backup/ckpt-20"));
  ASSERT_TRUE(fs::exists(rig.dir / "backup/ckpt-26"));
}

void flip_byte(const std::string& path, std::uintmax_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST(FaultTolerance, CorruptNewestBackupFallsBackToThePreviousOne) {
  Rig rig;
  const std::string reference = rig.reference();
  const std::string args = "--set train.checkpoint_dir=" + rig.dir / "ckpt" +
                           " --set train.backup_dir=" + rig.dir / "backup" +
                           " --set train.backup_every_steps=10";
  for (const char* damage : {"flip", "truncate"}) {
    SCOPED_TRACE(damage);
    fs::remove_all(rig.dir / "backup");
    fs::remove_all(rig.dir / "ckpt");
    two_backups(rig, args);
    const std::string model = rig.dir / "backup/ckpt-26/model.safetensors";
    if (std::string(damage) == "flip")
      flip_byte(model, fs::file_size(model) / 2);
    else
      fs::resize_file(model, fs::file_size(model) / 3);
    const CommandResult r = run_shell(rig.train(args));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("warning: unusable backup skipped: " + rig.dir / "backup/ckpt-26"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("continuing from backup " + rig.dir / "backup/ckpt-20"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(final_model(rig.dir / "ckpt"), reference);
  }
}

TEST(FaultTolerance, AllBackupsCorruptIsAnErrorThatChangesNothing) {
  Rig rig;
  const std::string args = "--set train.checkpoint_dir=" + rig.dir / "ckpt" +
                           " --set train.backup_dir=" + rig.dir / "backup" +
                           " --set train.backup_every_steps=10";
  two_backups(rig, args);
  flip_byte(rig.dir / "backup/ckpt-26/optimizer.safetensors", 100);
  flip_byte(rig.dir / "backup/ckpt-20/trainer_state.json", 5);
  auto snapshot = [&] {
    std::string all;
    for (const auto& e : fs::recursive_directory_iterator(rig.dir / "backup"))
      if (e.is_regular_file()) all += e.path().string() + read_text(e.path().string());
    return all;
  };
  const std::string before = snapshot();
  const CommandResult r = run_shell(rig.train(args));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no usable checkpoint in " + rig.dir / "backup"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ckpt-26/optimizer.safetensors: checksum mismatch"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ckpt-20/trainer_state.json"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(), before) << "a failed restore changed the backups";
}

// A file-size limit stands in for a full disk: the backup cannot be written, the run stops with
// an error naming the file, and the previous backup is intact and still continues the run.
TEST(FaultTolerance, FullDiskWhileBackingUpKeepsThePreviousBackup) {
  Rig rig;
  const std::string reference = rig.reference();
  const std::string args = "--set train.checkpoint_dir=" + rig.dir / "ckpt" +
                           " --set train.backup_dir=" + rig.dir / "backup" +
                           " --set train.backup_every_steps=10";
  two_backups(rig, args);
  // 50 KiB: smaller than a backup's model file (~100 KB), larger than anything else written.
  const CommandResult full = run_shell("trap \"\" XFSZ; ulimit -f 50; exec " + rig.train(args));
  EXPECT_EQ(full.code, 1) << full.output;
  EXPECT_NE(full.output.find("File too large"), std::string::npos) << full.output;
  const CommandResult r = run_shell(rig.train(args));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("continuing from backup " + rig.dir / "backup/ckpt-26"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(final_model(rig.dir / "ckpt"), reference);
}

TEST(FaultTolerance, BackupKeysAreChecked) {
  Rig rig;
  const CommandResult r = run_shell(rig.train("--set train.backup_every_steps=-3"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("backup_every_steps must be 0 (each epoch) or positive"),
            std::string::npos)
      << r.output;
  const CommandResult bad = run_shell("HPM_FAULT_AT_STEP=zero " + rig.train(""));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("HPM_FAULT_AT_STEP must be RANK:STEP"), std::string::npos)
      << bad.output;
}

TEST(FaultTolerance, ABackupMidEpochIsNotContinuedWithAnotherBatchSize) {
  Rig rig;
  const std::string backup = rig.dir / "backup";
  // Killed after step 12: the backup of step 10 is mid-epoch (step 10 of 40, batches of 16).
  const CommandResult killed =
      run_shell("HPM_FAULT_AT_STEP=0:12 " + rig.train("--set train.backup_dir=" + backup +
                                                      " --set train.backup_every_steps=5"));
  ASSERT_NE(killed.code, 0) << killed.output;
  // Batches of 32 would restore an iterator whose position counts batches of 16.
  const CommandResult r = run_shell(rig.train("--set train.backup_dir=" + backup +
                                              " --set train.backup_every_steps=5"
                                              " --set data.batch_size=32"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("was saved at step 10 of epoch 1 with batch size 16, but this run's "
                          "batch size is 32: continue it with batch size 16, or start afresh"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("loss 0.0000"), std::string::npos) << r.output;
  // The backup is untouched: the same batch size continues from it.
  const CommandResult same = run_shell(
      rig.train("--set train.backup_dir=" + backup + " --set train.backup_every_steps=5"));
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_NE(same.output.find("step 10"), std::string::npos) << same.output;
}

}  // namespace
}  // namespace hpm
