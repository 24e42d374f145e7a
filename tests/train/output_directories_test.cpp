// What the Trainer may delete and overwrite in the directories it writes: only its own files, and
// never an earlier or concurrent run's checkpoints.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/blobs.h"
#include "common/temp_dir.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/paths.h"
#include "hpm/io/safetensors.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"
#include "hpm/train/directory_lock.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

namespace fs = std::filesystem;
using hpm::testing::blobs;
using hpm::testing::TempDir;

struct DirectoriesRig {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::SGD> opt;
  std::unique_ptr<Trainer> trainer;
};

DirectoriesRig directories_rig() {
  manual_seed(1);
  DirectoriesRig s;
  s.model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
  s.opt = std::make_shared<optim::SGD>(s.model->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  s.trainer = std::make_unique<Trainer>(s.model, s.opt);
  return s;
}

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string error_of(DirectoriesRig& s, const data::LabelledData& train, const FitOptions& o) {
  try {
    s.trainer->fit(train, nullptr, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A finished run removes its backups, and nothing else: the files and directories beside them,
// and the directory that holds them, stay.
TEST(OutputDirectories, AFinishedRunDeletesOnlyItsOwnBackups) {
  TempDir dir;
  const std::string runs = dir / "runs";
  write(runs + "/exp1/results.txt", "keep me");
  write(runs + "/notes.txt", "mine too");
  auto train = blobs(64, 1);
  DirectoriesRig s = directories_rig();
  FitOptions o;
  o.batch_size = 16;
  o.epochs = 2;
  o.backup_dir = runs;
  o.backup_every_steps = 1;
  s.trainer->fit(train, nullptr, o);
  EXPECT_TRUE(fs::exists(runs + "/exp1/results.txt"));
  EXPECT_TRUE(fs::exists(runs + "/notes.txt"));
  EXPECT_FALSE(fs::exists(runs + "/latest"));
  EXPECT_FALSE(fs::exists(runs + "/ckpt-8"));
  EXPECT_FALSE(fs::exists(runs + "/" + DirectoryLock::kFileName));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(runs)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"exp1", "notes.txt"}));

  // A directory the run made itself goes with its backups.
  DirectoriesRig t = directories_rig();
  o.backup_dir = dir / "fresh";
  t.trainer->fit(train, nullptr, o);
  EXPECT_FALSE(fs::exists(dir / "fresh"));
}

// "The working directory" as backup_dir: everything in it stays.
TEST(OutputDirectories, BackupDirDotKeepsTheWorkingDirectory) {
  TempDir dir;
  write(dir / "data.txt", "keep");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  auto train = blobs(64, 2);
  DirectoriesRig s = directories_rig();
  FitOptions o;
  o.batch_size = 16;
  o.backup_dir = ".";
  s.trainer->fit(train, nullptr, o);
  fs::current_path(cwd);
  EXPECT_TRUE(fs::exists(dir / "data.txt"));
  EXPECT_TRUE(fs::exists(dir.path()));
}

TEST(OutputDirectories, PathsCompareAsDirectoriesNotStrings) {
  TempDir dir;
  fs::create_directories(dir / "ck");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  for (const char* other : {"ck", "./ck", "ck/", "ck//", "../", "ck/inner"}) {
    EXPECT_TRUE(io::paths_overlap("ck", other)) << other;
  }
  EXPECT_TRUE(io::paths_overlap("ck", dir / "ck"));
  EXPECT_FALSE(io::paths_overlap("ck", "ck2"));
  EXPECT_FALSE(io::paths_overlap("ck", "backup"));
  fs::create_directory_symlink(dir / "ck", dir / "link");
  EXPECT_TRUE(io::paths_overlap("ck", "link/"));
  fs::current_path(cwd);
}

// backup_dir naming checkpoint_dir in another spelling used to pass, and the end-of-run cleanup
// deleted every checkpoint.
TEST(OutputDirectories, BackupDirThatIsTheCheckpointDirIsRefused) {
  TempDir dir;
  auto train = blobs(64, 3);
  for (const std::string& backup : {dir / "ck/", dir / "ck/./", dir / "ck/backup"}) {
    DirectoriesRig s = directories_rig();
    FitOptions o;
    o.batch_size = 16;
    o.checkpoint_dir = dir / "ck";
    o.backup_dir = backup;
    const std::string e = error_of(s, train, o);
    EXPECT_NE(e.find("are the same directory or one holds the other"), std::string::npos)
        << backup << ": " << e;
    EXPECT_FALSE(fs::exists(dir / "ck/latest"));
  }
}

// A fresh run into an earlier run's checkpoints is refused (they stay as they were); resuming
// from them continues into the same directory.
TEST(OutputDirectories, AFreshRunDoesNotOverwriteAnEarlierRunsCheckpoints) {
  TempDir dir;
  auto train = blobs(64, 4);
  FitOptions o;
  o.batch_size = 16;
  o.checkpoint_dir = dir / "ck";
  DirectoriesRig first = directories_rig();
  first.trainer->fit(train, nullptr, o);
  const std::string latest = io::read_file(dir / "ck/latest");
  const std::string weights = io::read_file(dir / "ck/ckpt-4/model.safetensors");

  DirectoriesRig second = directories_rig();
  const std::string e = error_of(second, train, o);
  EXPECT_NE(e.find("already holds checkpoints of an earlier run (latest " + dir / "ck/ckpt-4" +
                   "): resume from it"),
            std::string::npos)
      << e;
  EXPECT_EQ(io::read_file(dir / "ck/latest"), latest);
  EXPECT_EQ(io::read_file(dir / "ck/ckpt-4/model.safetensors"), weights);

  DirectoriesRig third = directories_rig();
  FitOptions resumed = o;
  resumed.resume_from = dir / "ck";
  resumed.epochs = 2;
  EXPECT_EQ(third.trainer->fit(train, nullptr, resumed).last_checkpoint, dir / "ck/ckpt-8");
}

// Resuming from an earlier checkpoint of checkpoint_dir than its newest is refused (the two
// histories would mix); one continued from its newest carries on. Before, each checkpoint the
// resumed run wrote was pruned at once as older than the earlier run's, and `latest` named a
// deleted directory.
TEST(OutputDirectories, ResumingFromAnOlderCheckpointOfTheSameDirectoryIsRefused) {
  TempDir dir;
  auto train = blobs(64, 4);  // 4 steps an epoch
  FitOptions o;
  o.batch_size = 16;
  o.epochs = 3;
  o.checkpoint_dir = dir / "ck";
  DirectoriesRig first = directories_rig();
  first.trainer->fit(train, nullptr, o);  // keeps ckpt-8 and ckpt-12
  ASSERT_TRUE(fs::exists(dir / "ck/ckpt-8"));
  const std::string weights = io::read_file(dir / "ck/ckpt-12/model.safetensors");

  DirectoriesRig second = directories_rig();
  FitOptions again = o;
  again.resume_from = dir / "ck/ckpt-8";
  const std::string e = error_of(second, train, again);
  EXPECT_NE(e.find("is at global step 8, but checkpoint_dir " + dir / "ck" +
                   " holds checkpoints of later steps (ckpt-12)"),
            std::string::npos)
      << e;
  EXPECT_EQ(io::read_file(dir / "ck/ckpt-12/model.safetensors"), weights);
  EXPECT_EQ(io::read_file(dir / "ck/latest"), "ckpt-12\n");
}

// An earlier run's checkpoint_dir given as backup_dir is refused: it would be restored from as
// this run's backup, pruned, and deleted when the run finished. Backups are marked as such.
TEST(OutputDirectories, ABackupDirHoldingCheckpointsThatAreNotBackupsIsRefused) {
  TempDir dir;
  auto train = blobs(64, 4);
  FitOptions o;
  o.batch_size = 16;
  o.epochs = 2;
  o.checkpoint_dir = dir / "a";
  DirectoriesRig first = directories_rig();
  first.trainer->fit(train, nullptr, o);
  const std::string weights = io::read_file(dir / "a/ckpt-8/model.safetensors");

  DirectoriesRig second = directories_rig();
  FitOptions mistaken;
  mistaken.batch_size = 16;
  mistaken.backup_dir = dir / "a";
  const std::string e = error_of(second, train, mistaken);
  EXPECT_NE(e.find("backup_dir " + dir / "a" + " holds checkpoints that are not backups (" +
                   dir / "a/ckpt-4 and 1 more"),
            std::string::npos)
      << e;
  EXPECT_EQ(io::read_file(dir / "a/ckpt-8/model.safetensors"), weights);
  EXPECT_TRUE(fs::exists(dir / "a/ckpt-4"));

  // A run's own backups are marked, restored from and, at its end, deleted.
  FitOptions backed = mistaken;
  backed.backup_dir = dir / "b";
  backed.backup_every_steps = 1;
  backed.keep_backup = true;
  DirectoriesRig third = directories_rig();
  third.trainer->fit(train, nullptr, backed);
  EXPECT_EQ(read_checkpoint_state(dir / "b").metadata.at(kCheckpointKind), kBackup);
  EXPECT_TRUE(checkpoints_not_of_kind(dir / "b", kBackup).empty());
}

// A periodic backup does not fall on an epoch's last step: the epoch's end backs it up as done
// after evaluation. A mid-epoch state there (all batches taken) restored, after a kill during the
// evaluation, into an epoch of no batches that reported a training loss of 0 to the monitors.
TEST(OutputDirectories, NoMidEpochBackupAtAnEpochsLastStep) {
  TempDir dir;
  struct NewestBackupAtEpochEnd : Callback {
    explicit NewestBackupAtEpochEnd(std::string d) : dir(std::move(d)) {}
    void on_epoch_end(Trainer&, const EpochLogs&) override {
      seen.push_back(read_checkpoint_state(dir).step_in_epoch);
    }
    std::string dir;
    std::vector<std::int64_t> seen;
  };
  auto watch = std::make_shared<NewestBackupAtEpochEnd>(dir / "bk");
  DirectoriesRig s = directories_rig();
  s.trainer->add_callback(watch);
  FitOptions o;
  o.batch_size = 16;  // 4 steps an epoch
  o.epochs = 2;
  o.backup_dir = dir / "bk";
  o.backup_every_steps = 2;
  s.trainer->fit(blobs(64, 4), nullptr, o);
  // Epoch 1 ends with the step-2 backup the newest, epoch 2 with the step-6 one (epoch 1's end
  // backup, step 4, is done: 0).
  EXPECT_EQ(watch->seen, (std::vector<std::int64_t>{2, 2}));
}

// The same command run again after an interruption continues from its backup, also when it names
// a checkpoint to resume from (it restarted from that checkpoint, redoing everything since).
TEST(OutputDirectories, ABackupWinsOverResumeFrom) {
  TempDir dir;
  auto train = blobs(64, 4);  // 4 steps an epoch
  FitOptions o;
  o.batch_size = 16;
  o.checkpoint_dir = dir / "ck";
  DirectoriesRig first = directories_rig();
  first.trainer->fit(train, nullptr, o);  // ck/ckpt-4

  struct StopAfter : Callback {
    void on_batch_end(Trainer& t, const BatchLogs& b) override {
      if (b.global_step == 6) t.stop_training();
    }
  };
  FitOptions run = o;
  run.checkpoint_dir = dir / "ck2";
  run.resume_from = dir / "ck";
  run.epochs = 3;
  run.backup_dir = dir / "bk";
  run.backup_every_steps = 1;
  run.keep_backup = true;  // as a killed run leaves it
  DirectoriesRig second = directories_rig();
  second.trainer->add_callback(std::make_shared<StopAfter>());
  EXPECT_EQ(second.trainer->fit(train, nullptr, run).steps, 2);

  DirectoriesRig again = directories_rig();
  const FitResult r = again.trainer->fit(train, nullptr, run);
  EXPECT_EQ(r.restored_from, dir / "bk/ckpt-6");
  EXPECT_EQ(r.steps, 12 - 6);
}

// save_checkpoint's pruning keeps the checkpoint it wrote and never deletes later steps (another
// history's), nor a directory that only looks like a checkpoint.
TEST(OutputDirectories, PruningKeepsTheNewCheckpointAndLaterSteps) {
  TempDir dir;
  DirectoriesRig s = directories_rig();
  const std::string root = dir / "ck";
  for (const std::int64_t step : {10, 20, 30}) {
    TrainerState st;
    st.global_step = step;
    save_checkpoint(root, *s.model, *s.opt, st, 2);
  }
  EXPECT_FALSE(fs::exists(root + "/ckpt-10"));
  write(root + "/ckpt-15.bak/note", "a copy of the user's");
  TrainerState st;
  st.global_step = 5;
  save_checkpoint(root, *s.model, *s.opt, st, 2);
  for (const char* kept : {"ckpt-5", "ckpt-20", "ckpt-30", "ckpt-15.bak/note"}) {
    EXPECT_TRUE(fs::exists(root + "/" + kept)) << kept;
  }
  EXPECT_EQ(io::read_file(root + "/latest"), "ckpt-5\n");
  st.global_step = 25;  // prunes below 25 down to one other: ckpt-20 stays, ckpt-5 goes
  save_checkpoint(root, *s.model, *s.opt, st, 2);
  EXPECT_FALSE(fs::exists(root + "/ckpt-5"));
  for (const char* kept : {"ckpt-20", "ckpt-25", "ckpt-30"})
    EXPECT_TRUE(fs::exists(root + "/" + kept)) << kept;
}

// A save at a step whose checkpoint is already there replaces it whole or not at all. It was
// rewritten file by file in place: a failure after the model's file (here the file-size limit, as
// a full disk would) left a checkpoint whose model did not match its record, and so none.
TEST(OutputDirectories, ASaveAtAnExistingStepReplacesItWholeOrNotAtAll) {
  TempDir dir;
  const std::string root = dir / "ck";
  DirectoriesRig s = directories_rig();
  FitOptions o;  // one step, so that SGD holds its momentum (a file larger than the model's)
  o.batch_size = 16;
  s.trainer->fit(blobs(16, 1), nullptr, o);
  TrainerState st;
  st.global_step = 5;
  save_checkpoint(root, *s.model, *s.opt, st, 1);
  write(root + "/ckpt-5/notes.txt", "the user's");
  const float before = s.model->named_parameters().at(0).second.data<float>()[0];
  for (auto& [name, p] : s.model->named_parameters()) {
    float* d = p.data<float>();
    for (std::int64_t i = 0; i < p.numel(); ++i) d[i] += 1.0f;
  }
  auto first_weight = [&](const std::string& ckpt) {
    DirectoriesRig fresh = directories_rig();
    load_checkpoint(ckpt, *fresh.model, fresh.opt.get());
    return fresh.model->named_parameters().at(0).second.data<float>()[0];
  };

  const auto model_bytes = io::encode_safetensors(s.model->state_dict(), {{"format", "pt"}}).size();
  const auto optimizer_bytes = io::encode_safetensors(s.opt->state(), {{"format", "pt"}}).size();
  ASSERT_GT(optimizer_bytes, model_bytes);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = model_bytes;  // the model's file is written, the optimizer's is refused
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  EXPECT_THROW(save_checkpoint(root, *s.model, *s.opt, st, 1), io::IoError);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(first_weight(root + "/ckpt-5"), before);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt-5", "latest"}));

  EXPECT_EQ(save_checkpoint(root, *s.model, *s.opt, st, 1), root + "/ckpt-5");
  EXPECT_EQ(first_weight(root + "/ckpt-5"), before + 1.0f);
  EXPECT_EQ(io::read_file(root + "/ckpt-5/notes.txt"), "the user's");
  left.clear();
  for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt-5", "latest"}));

  // A crash mid-replacement leaves the staged copy; the run's cleanup deletes it with the rest.
  fs::create_directories(root + "/ckpt-5.tmp.99999");
  write(root + "/ckpt-5.tmp.99999/model.safetensors", "partial");
  remove_checkpoints(root);
  EXPECT_FALSE(fs::exists(root + "/ckpt-5.tmp.99999"));
  EXPECT_TRUE(fs::exists(root + "/ckpt-5/notes.txt"));
}

// Two runs on one checkpoint_dir at once: the second is refused before it trains, naming the
// holder; the lock goes with the run that held it, even when that run is killed.
TEST(OutputDirectories, ASecondRunOnALockedDirectoryIsRefusedNamingTheHolder) {
  TempDir dir;
  auto train = blobs(64, 5);
  std::string e;
  {
    DirectoryLock held(dir / "ck", "checkpoint_dir");
    DirectoriesRig s = directories_rig();
    FitOptions o;
    o.batch_size = 16;
    o.checkpoint_dir = dir / "ck";
    e = error_of(s, train, o);
    EXPECT_FALSE(fs::exists(dir / "ck/latest"));
  }
  EXPECT_NE(e.find("checkpoint_dir " + dir / "ck" + " is in use by another run (pid " +
                   std::to_string(::getpid())),
            std::string::npos)
      << e;

  // A holder that dies without cleaning up (SIGKILL) leaves the file but not the lock.
  const pid_t child = ::fork();
  if (child == 0) {
    DirectoryLock held(dir / "dead", "checkpoint_dir");
    ::_exit(0);  // no destructors: the lock file stays
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_NO_THROW(DirectoryLock(dir / "dead", "checkpoint_dir"));
}

}  // namespace
}  // namespace hpm::train
