// The samples ARank is measured on. γ-MoD's protocol (the official arank_analysis driver): image samples only, each
// reduced to its first prompt — system message and first question, ending at the assistant's turn marker, with no
// answer — and run as a prefill. The older gmod behaviour (whole conversations, text-only samples included, as
// training sees them) stays available for comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"

namespace gmod {

struct ARankSampling {
  int64_t samples = 50;     // samples to collect (the paper finds ~50 enough)
  int batch = 4;            // rows per collated batch
  bool prompt_only = true;  // cut each sample before its first supervised token
  bool images_only = true;  // skip text-only samples
};

struct ARankSamplingStats {
  int64_t taken = 0, text_only = 0, bad = 0, no_prompt = 0;
  std::string first_bad;  // BadRecord::message of the first bad record (file, record, id, what was wrong)
  std::string summary() const;  // "50 samples (3 text-only, 1 bad, 0 without a usable prompt skipped)"
};

// Cuts `s` to the tokens before its first supervised one. False (s unchanged) when it has no supervised token or
// an image token after the cut (its pixels would not match).
bool cut_to_first_prompt(TokenizedSample& s);

// Walks `order` (record indices of `ds`) and collates the first `opt.samples` usable samples into batches. Throws
// naming the dataset when none is usable.
std::vector<Batch> arank_batches(const Dataset& ds, const std::vector<size_t>& order, const ARankSampling& opt,
                                 ARankSamplingStats& stats);

// The mean number of real tokens per sample of `batches` (attention_mask true: text and image tokens,
// padding not counted). Over first prompts this is the `seqlen` adaptive thresholds (mod/routing_rule.h)
// count at prefill, so over calibration samples it is their avg_seqlen. Throws when there is no sample.
struct SeqLenMean {
  double mean = 0.0;
  int64_t samples = 0;
};
SeqLenMean mean_seqlen(const std::vector<Batch>& batches);

}  // namespace gmod
