// The TOML run configuration: [model] (a layer stack, or kind = "gpt" / "resnet"), [data],
// [optimizer], [schedule], [train] and the rest (src/cli/config/ has one file per section, its
// schema beside its builders). Every key is checked: an unknown key, a wrong type, a value out of
// range or an unknown layer is a ConfigError "WHERE: message" naming the key and quoting the
// value, WHERE being FILE:LINE:COL, or the "--set section.key=value" that gave it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpm/data/input_pipeline.h"
#include "hpm/data/tokenizer.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"
#include "hpm/nn/resnet.h"
#include "hpm/optim/lr_schedule.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/device.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/trainer.h"

namespace hpm::config {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One layer as written in the config; `build_model` turns them into modules.
struct LayerSpec {
  std::string type;
  std::string where;  // "FILE:LINE:COL" for errors
  std::vector<std::pair<std::string, double>> numbers;
  std::vector<std::pair<std::string, std::string>> strings;
  std::vector<std::pair<std::string, bool>> flags;
  std::vector<std::int64_t> shape;  // LayerNorm's normalized shape
};

// One teacher of [distill] (hpm distill).
struct TeacherSpec {
  std::string config;      // its TOML config; a relative path is taken from the config's folder
  std::string checkpoint;  // its checkpoint; none there: trained first (and saved there if named)
  float weight = 1.0f;     // relative weight of its soft targets
  std::string where;       // "FILE:LINE:COL" for errors
};

// [distill]: ignored by hpm train, which then trains the student alone.
struct DistillSection {
  bool present = false;
  std::vector<TeacherSpec> teachers;  // teacher_config/teacher_checkpoint, or teachers = [...]
  float alpha = 0.9f, temperature = 4.0f;
  bool baseline = false;      // also train the student on labels alone (same seed and epochs)
  bool cache_teacher = true;  // remember the soft targets per input row (only without augment)
  bool m_on_m = false;        // also one student per teacher, then their ensemble
};

// [noisy_student] (hpm distill): self-training rounds. The training set's first `labelled` rows
// keep their labels; the rest, labels dropped, are the unlabelled set.
struct NoisyStudentSection {
  bool present = false;
  std::string teacher_config;       // the first teacher's model; empty: the config's own [model]
  std::int64_t teacher_epochs = 0;  // the first teacher's epochs on the labelled rows; 0: [train]
  std::int64_t rounds = 1;
  std::string pseudo_labels = "soft";  // soft | hard
  float confidence_threshold = 0.0f;
  bool balance_classes = false;
  std::int64_t per_class = 0;  // 0: the mean count over classes
  std::int64_t labelled = 0;   // 0: labelled_fraction of the rows
  float labelled_fraction = 0.1f;
  // Input noise for the students (their [model]'s dropout layers are the other noise).
  int crop_padding = 2;  // random crop of the padded image; 0: none
  bool flip = true;      // random horizontal flip
};

// [codistill] (hpm codistill): K copies of the model trained together (Anil et al. 2018).
struct CodistillSection {
  bool present = false;
  int copies = 2;
  std::int64_t exchange_every = 100, burn_in = 0;
  float alpha = 0.5f, temperature = 1.0f;
  std::string shards = "identical";  // identical | disjoint
};

// [cluster] and [ps]: parameter-server jobs (hpm ps ...). The launcher's HPM_PS_CLUSTER (JSON
// like TF_CONFIG's cluster) replaces the addresses.
struct PsSection {
  std::string coordinator = "127.0.0.1:7070";        // HOST:PORT
  std::vector<std::string> ps = {"127.0.0.1:7071"};  // HOST:PORT per parameter-server task
  int workers = 1;
  std::string bind = "127.0.0.1";  // servers listen on loopback unless told otherwise
  std::string token_file;          // else the environment's HPM_PS_TOKEN
  std::string tls_cert, tls_key, tls_ca;
  double max_message_mb = 256;
  double rpc_timeout_s = 30;
  // [ps]
  std::string mode = "async";  // async | ssp | sync
  int staleness = 2;           // ssp: how many tasks a worker may run ahead of the slowest
  std::string checkpoint_dir;  // all shards at once, with a manifest; restored on a lost PS
  std::int64_t checkpoint_every_tasks = 0;  // 0: each epoch
  double heartbeat_timeout_s = 10;          // a silent worker's tasks go to the others
  double ps_wait_s = 60;                    // how long to wait for a lost PS task to come back
  int slow_worker = -1;                     // benchmarks: this worker computes slow_factor x slower
  double slow_factor = 1.0;
};

// [pipeline]: present = the model (a Sequential) is cut into stages that run as a pipeline.
struct PipelineSection {
  bool present = false;
  int stages = 2;
  int micro_batches = 4;
  std::string schedule = "1f1b";       // gpipe | 1f1b | interleaved | zb-h1
  int chunks_per_stage = 1;            // interleaved: model chunks per stage (>= 2)
  std::string partition = "balanced";  // uniform | parameters | balanced (profiled time)
  int profile_repeats = 3;
};

struct Config {
  std::string path;
  // The configuration as resolved: the file with its --set overrides applied, in TOML. Checkpoints
  // record it (with the file's absolute path, which relative paths in it are taken from), so that
  // they describe their model.
  std::string resolved;
  // Where the file (or a --set) gave each section and key: "train" and "train.backup_dir" ->
  // "FILE:LINE:COL" or "--set train.backup_dir=...". What refuse_setting names.
  std::map<std::string, std::string> given;
  // [model]
  std::string model_kind = "layers";  // layers | gpt | resnet
  std::vector<LayerSpec> layers;
  nn::GPTConfig gpt;
  nn::ResNetConfig resnet;
  // Weights to start from (a safetensors file, e.g. a PyTorch state dict; F16, BF16 and F64
  // tensors are cast): every entry must match unless init_strict = false.
  std::string init_from;
  bool init_strict = true;

  // [data]
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string dataset = "fashion-mnist";
  // idx (dir's IDX files) | tfrecord (files, test_files) | text (files: a glob of text files,
  // split 90/10 per file as ../shared/peers/torch_gpt.py, byte tokens or the tokenizer's) |
  // tokens (files, test_files: globs of token shards). The last two for [model] kind = "gpt".
  std::string source = "idx";
  std::string files, test_files, compression = "none";
  // text and tokens: a SentencePiece model file (empty: bytes), loaded into `text_tokenizer`
  // (bytes when empty); its vocabulary is the GPT's vocab_size.
  std::string tokenizer;
  std::shared_ptr<const data::Tokenizer> text_tokenizer = data::byte_tokenizer();
  // A language model's data: [data] source = "text", "tokens" or "random_tokens" (uniform ids
  // in [0, vocab_size) from the run's seed: for timing a vocabulary no corpus here is encoded
  // in, such as GPT-2's; the losses mean nothing). Trained by steps.
  bool token_source() const {
    return source == "text" || source == "tokens" || source == "random_tokens";
  }
  std::int64_t batch_size = 64;
  bool shuffle = true;
  std::int64_t train_limit = 0;  // use only the first N training examples (0 = all)
  std::int64_t test_limit = 0;
  std::int64_t shuffle_buffer = -1;  // -1: the whole training set
  std::vector<data::AugmentOp> augment;
  int parallel_calls = data::kAutotune;
  bool deterministic = true;
  std::int64_t prefetch = 0;  // 0: none; data::kAutotune
  bool cache = false;
  std::string cache_path;  // cache = "PATH": on disk
  bool drop_remainder = true;

  // [optimizer]
  std::string optimizer = "sgd";
  float lr = 0.01f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false, amsgrad = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  // Adam/AdamW: weight decay only for parameters of at least this rank (2: nanoGPT's groups).
  int weight_decay_min_rank = 0;

  // [schedule]
  std::string schedule = "constant";    // constant | step | cosine | warmup | warmup_cosine
  std::string schedule_unit = "epoch";  // epoch | step
  std::int64_t step_size = 1, t_max = 1, warmup = 0;
  float gamma = 0.1f, eta_min = 0.0f, warmup_start_factor = 0.1f;

  // [train]
  // Where the model trains: "cpu", "cuda" (cuda:0) or "cuda:N" (--device overrides it).
  std::string device = "cpu";
  std::int64_t epochs = 1;
  std::uint64_t seed = 0;
  int threads = 1;
  float label_smoothing = 0.0f, clip_grad_norm = 0.0f;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 1;
  std::string metrics_csv;
  std::string tensorboard_dir;  // TensorBoard event files (train/, validation/) under this run dir
  std::string backup_dir;       // BackupAndRestore (empty: off)
  std::int64_t backup_every_steps = 0;  // 0: at each epoch end
  bool keep_backup = false;             // keep it after a successful finish
  std::string best_checkpoint_dir;      // empty = off; else the best epoch's checkpoint, kept alone
  std::string best_checkpoint_monitor = "test_accuracy";  // its mode is auto
  int accumulation_steps = 1;  // micro-batches per batch (gradient accumulation)
  // "f32" or "bf16": mixed precision of training steps (autograd/autocast.h); evaluation stays f32.
  std::string precision = "f32";
  // Training by steps (a language model always; any model given max_steps): max_steps in all,
  // evaluated every eval_every steps and at the last one (0: once, at the end; each stretch
  // between evaluations is one of the Trainer's epochs), a language model on eval_iters batches
  // of the validation split's sweep (0: all of it).
  std::int64_t max_steps = 0, eval_every = 0, eval_iters = 0;
  bool by_steps() const { return max_steps > 0; }

  // [early_stopping]: on when the section is present (keys as train::EarlyStoppingOptions)
  bool early_stopping = false;
  std::string early_stopping_monitor = "test_loss";
  std::string early_stopping_mode = "auto";
  double early_stopping_min_delta = 0.0;
  std::int64_t early_stopping_patience = 0;
  bool early_stopping_restore_best_weights = false;

  // [strategy]
  std::string strategy =
      "one_device";         // one_device | mirrored | multi_worker_mirrored | central_storage
  int replicas = 1;         // local replicas (per process for multi_worker_mirrored)
  double bucket_mb = 25.0;  // gradient bucket cap
  bool overlap = true;      // all-reduce buckets during backward (false: after it)
  std::string allreduce_dtype = "f32";  // f32 | bf16: what gradient buckets travel as
  std::string algorithm = "auto";       // auto | direct | ring | recursive_doubling
  int timeout_s = 60;                   // collectives fail after this long
  std::string timeline;  // Chrome trace JSON of the run (per rank: compute and all-reduce)
  // How workers share the data: "batch" (each reads every global batch and trains on its slice of
  // the rows: the single-device arithmetic), "elements" or "files" (each reads only its shard,
  // batches of batch_size / workers).
  std::string shard = "batch";

  // [memory]: fitting a training step into the device (see nn/recompute.h, nn/offload.h)
  std::string recompute = "never";  // never | always | except_last
  int recompute_every = 1;          // layers per recomputed segment
  bool offload = false;             // saved activations to host memory between forward and backward
  double offload_threshold_kb = 64;  // smaller ones stay
  double device_budget_mb = 0;       // the training device's budget; 0: unlimited

  DistillSection distill;
  NoisyStudentSection noisy_student;
  CodistillSection codistill;
  PipelineSection pipeline;
  PsSection ps;
};

// Parses `path`, then applies `overrides` ("section.key=value", value in TOML syntax, or a bare
// string).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same for TOML `text` read as if it were the file at `path` (its relative paths and the
// locations in its errors are that file's).
Config load_config_text(const std::string& text, const std::string& path,
                        const std::vector<std::string>& overrides = {});

// The configuration of a command that reads a checkpoint (hpm sample, hpm evaluate): `path` with
// `overrides` when a path is given, else the configuration the checkpoint recorded, with
// `overrides` applied. Either way a [model] setting whose value differs from the checkpoint's is a
// ConfigError naming where it was given and both values (dropout excepted: it changes no weight).
// Without a path, a checkpoint that recorded no configuration (saved by an older hpm) is a
// ConfigError asking for it.
Config config_for_checkpoint(const std::string& path, const std::string& checkpoint,
                             const std::vector<std::string>& overrides);
// The same for a weights file `hpm export` wrote (its safetensors metadata "hpm_config").
Config config_for_weights(const std::string& path, const std::string& weights,
                          const std::vector<std::string>& overrides);

// A setting the running command cannot honour: throws ConfigError "WHERE: [section] key why"
// (key empty: "WHERE: [section] why"), WHERE being where the config gave it (config.given), else
// its path.
// The Device [train] device names, made on first use and kept for the process: the CPU's, or a
// GPU's. A GPU this machine lacks (no driver, no device, a higher index than it has; a build
// without CUDA) is a ConfigError naming the setting and what was found.
Device& config_device(const Config& config);

[[noreturn]] void refuse_setting(const Config& config, const std::string& section,
                                 const std::string& key, const std::string& why);

// [early_stopping], [train] best_checkpoint_dir and [memory] device_budget_mb are hpm train's
// callbacks and budget: `command` ("hpm distill", ...) refuses them rather than ignore them.
void refuse_train_only_settings(const Config& config, const std::string& command);
// [train] device other than the CPU, for a command whose models train on the CPU only (it was
// ignored by some: the run trained on the CPU, timed as if on the device): "<command> yet: <why>".
void refuse_device_but_cpu(const Config& config, const std::string& command,
                           const std::string& why);

// The CPUs this process may run on (sched_getaffinity; else std::thread::hardware_concurrency).
int available_cpus();
// Warns on stderr, naming both numbers, when `threads` exceed available_cpus(): threads beyond
// the cores wait for one another at every parallel kernel, and run many times slower.
void warn_if_oversubscribed(int threads);
// The kernels' threads for this process, as every command sets them: warn_if_oversubscribed, then
// the OpenMP pool (set_num_threads) and the CPU device's count.
void use_threads(int threads);

// The model [model] describes; with init_from, holding those weights (the first load in this
// process prints what was loaded, missing or unexpected).
std::shared_ptr<nn::Module> build_model(const Config& config);
// The model as [memory] trains it: `model` itself, or its blocks wrapped for recomputation or
// offload (the same modules and parameters).
std::shared_ptr<nn::Module> with_memory_options(const Config& config,
                                                std::shared_ptr<nn::Module> model);
// The training input pipeline the [data] section describes (seeded by [train] seed).
data::InputPipelineSpec pipeline_spec(const Config& config);
// The [train] and [schedule] settings every training run shares (epochs, seed, smoothing,
// clipping, schedule unit, checkpoints), as Trainer::fit takes them.
train::FitOptions fit_options(const Config& config);
// What a checkpoint records to describe its run (config_for_checkpoint reads it back): "config",
// the resolved configuration with its [data] paths made absolute (so that it reads the same
// files from any working directory), and "config_path".
std::map<std::string, std::string> checkpoint_description(const Config& config);
// How progress reads: epochs, or (training by steps) "step N/M" with tokens/s for a language
// model.
train::ProgressOptions progress_options(const Config& config);
// The tokenizer as checkpoints record it ("bytes", or "sentencepiece:" and the CRC32C of its
// model file): the same text encodes to the same ids exactly when these agree.
std::string tokenizer_id(const data::Tokenizer& tokenizer);
// A language model's checkpoint at `where`, whose state is `saved`, was trained with the
// tokenizer `config` names (when the checkpoint records one): else a ConfigError naming both.
void check_checkpoint_tokenizer(const train::TrainerState& saved, const Config& config,
                                const std::string& where);

// What a run of `config` learns: next-token language modelling for a GPT, else classification,
// either with [train] label_smoothing (evaluation measures without it).
std::shared_ptr<const nn::Objective> build_objective(const Config& config);
std::shared_ptr<optim::Optimizer> build_optimizer(const Config& config, const nn::Module& model);
std::shared_ptr<optim::LrSchedule> build_schedule(const Config& config);

}  // namespace hpm::config
