// The worker's side of `hpm launch`, for any program the launcher starts (hpm itself, or a C++
// program on the library): preemption signals turned into a flag the Trainer stops on, and the
// launcher's lifeline watched so a rank never trains on after its launcher is gone.
#pragma once
#include <atomic>

namespace hpm::launch {

// Installs SIGTERM and SIGINT handlers that set the returned flag (once; the second signal of
// either kind kills as usual, for a user who really means it). They run on an alternate signal
// stack of the calling thread (call it on the thread that trains, the main one), never on the
// stack of the code they interrupt: oneDNN's GEMM kernels point that into the heap.
const std::atomic<bool>* install_preemption_handlers();

// `hpm launch` passes each rank the read end of a pipe whose write end only the launcher holds
// (kLauncherFdVariable). A rank's command may be a script that starts hpm, which the launcher's
// PR_SET_PDEATHSIG does not reach: when the launcher dies, even by SIGKILL, this process sees the
// pipe close and stops itself (SIGTERM to the calling thread, so a run with a backup_dir backs up
// first). Nothing when the variable is unset.
void watch_launcher_from_env();

}  // namespace hpm::launch
