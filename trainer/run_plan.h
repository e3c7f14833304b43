// RunPlan: a training run's settings read, validated and resolved once, then only read.
//   read      read_train_config (trainer/config/train_config.h): JSON file -> `--set` overrides -> TrainConfig;
//   validate  check_train_config: every problem at once, each naming its key (files, ranges, combinations, the
//             model's own config.json and what does not fit it);
//   resolve   resolve_run_plan below: the derived settings every consumer would otherwise derive again (batch
//             arithmetic, dtypes, the data-parallel strategy's settings, activation checkpointing, the profiled
//             steps).
// `gmod train` (launch/cmd_train.cpp) does all three (read_run_plan) before MPI work starts and hands the plan to the
// Trainer, which does not validate again. `gmod plan` (launch/cmd_plan.cpp) checks a config against the model only
// (it needs no data files) and resolves it the same way, so both see the same batch and parallel settings. The MoD
// section is passed through as read (mod/ parses and resolves it).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/activation_checkpoint.h"
#include "parallel/dp_strategy.h"
#include "trainer/config/train_config.h"
#include "trainer/step_profiler.h"

namespace gmod {

struct RunPlan {
  TrainConfig config;  // as read (and, from read_run_plan, validated): what run_dir/config.json records
  int world = 1;       // ranks of the job
  at::ScalarType dtype = at::kFloat;  // model.dtype: parameters and activations
  int grad_accum = 1;                 // micro-batches per optimizer step and rank
  int64_t global_batch = 1;           // grad_accum x world x batch.micro_batch samples per step
  // The optimizer section as the data-parallel strategy takes it (parallel/dp_strategy.h); the per-parameter weight
  // decay flags and parameter groups are added once the model's trainable parameters are known.
  DpSettings data_parallel;
  ActivationCheckpointing checkpointing;  // model.activation_checkpointing
  StepRange profile_steps;                // metrics.profile_steps (empty: none)
};

// Resolves a config that has been checked (for `world` ranks) into its plan. Throws std::invalid_argument naming
// the key only for what check_train_config reports too.
RunPlan resolve_run_plan(TrainConfig config, int world);

// read -> validate -> resolve: every reading and validation problem of `path` in one std::invalid_argument naming it
// (read_valid_train_config's message), for a job of `world` ranks, `ranks_on_node` of them on this host.
RunPlan read_run_plan(const std::string& path, const std::vector<std::string>& overrides, int world,
                      int ranks_on_node = 1);

}  // namespace gmod
