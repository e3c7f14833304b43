// Fault injection for tests: faults a training run should survive (or abort on by name), injected on purpose,
// driven by the environment variable GMOD_FAULT_INJECT and parsed once per process. Not for production runs;
// docs/training.md ("Fault injection") describes the grammar.
//
//   GMOD_FAULT_INJECT="nonfinite_grad:step=3,rank=1"            step 3's gradient on rank 1 is NaN
//   GMOD_FAULT_INJECT="nonfinite_grad:step=2,rank=0,count=3"    steps 2, 3 and 4 on rank 0
//   GMOD_FAULT_INJECT="slow_arank:rank=0,seconds=8"             ARank on rank 0 takes 8 s longer (phase deadlines)
//   GMOD_FAULT_INJECT="slow_save:rank=2,seconds=60,step=4"      rank 2's save of step 4 waits 60 s once its files
//                                                               are written, before the ranks meet to commit (a
//                                                               node lost inside a save; step= optional: every save)
//   several faults: separated by ';'
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gmod {

struct Fault {
  std::string kind;   // "nonfinite_grad", "slow_arank" or "slow_save"
  int64_t step = 0;   // first step (1-based, as the metrics count) it fires at; slow_save: 0 = every save
  int rank = 0;       // the rank it fires on
  int64_t count = 1;  // consecutive steps it fires at
  int64_t seconds = 0;  // slow_arank, slow_save: the extra seconds
};

class FaultInjection {
 public:
  static constexpr const char* kEnv = "GMOD_FAULT_INJECT";

  // Throws std::invalid_argument naming GMOD_FAULT_INJECT, the spec and what is wrong with it.
  static FaultInjection parse(const std::string& spec);
  // GMOD_FAULT_INJECT of this process, parsed on the first call (unset or empty: no faults).
  static const FaultInjection& from_env();

  bool empty() const { return faults.empty(); }
  bool nonfinite_grad_due(int64_t step, int rank) const;
  int64_t slow_arank_seconds(int rank) const;  // 0 when none
  int64_t slow_save_seconds(int64_t step, int rank) const;  // 0 when none
  std::string describe() const;  // "" when empty

  std::vector<Fault> faults;
};

// The trainer's one injection point, applied to each micro-batch loss right before its backward: the loss
// times NaN when a nonfinite_grad fault is due at (step, rank) — every gradient of that rank becomes NaN
// before any of it is reduced, as an overflow in that rank's forward would make it — else the loss unchanged.
// Prints a line to stderr when it fires.
at::Tensor inject_faults_into_loss(const at::Tensor& loss, int64_t step, int rank);
// slow_arank: sleeps the injected seconds on `rank` (called inside the ARank phase).
void inject_arank_delay(int rank);
// slow_save: sleeps the injected seconds on `rank` in the save of `step` (called once this rank's files are written,
// also from an asynchronous save's thread).
void inject_save_delay(int64_t step, int rank);

}  // namespace gmod
