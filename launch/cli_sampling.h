// The decoding options of the inference commands (generate, answer) from their shared flags: --max-new-tokens,
// --top-p / --temperature (either one turns greedy decoding into sampling; the other defaults to 1) and --seed;
// stop at the tokenizer's EOS, pad finished samples with the template's pad id. Header-only so the launch/ glob
// stays one file per subcommand.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "mod/generate.h"

namespace gmod::cli {

template <class CliOptions>
GenerateOptions sampling_options(const CliOptions& o, std::optional<int32_t> eos_id, int32_t pad_id) {
  GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  if (o.top_p && !(*o.top_p > 0.0 && *o.top_p <= 1.0))
    throw std::invalid_argument("--top-p " + std::to_string(*o.top_p) +
                                ": must be in (0, 1] (the share of probability mass sampled from; 1 = all)");
  if (o.top_p || o.temperature) {
    g.greedy = false;
    g.top_p = o.top_p.value_or(1.0);
    g.temperature = o.temperature.value_or(1.0);
  }
  g.seed = o.seed;
  if (eos_id) g.eos_token_id = *eos_id;
  g.pad_token_id = pad_id;
  return g;
}

}  // namespace gmod::cli
