// PyramidDrop (Xing et al., CVPR 2025, "PyramidDrop: Accelerating Your Large Vision-Language Models via Pyramid
// Visual Redundancy Reduction"; code Cooperx521/PyramidDrop) as a router kind of gmod's MoD layer
// (RouterKind::kPDrop, config router "pdrop"), in training and training-free at inference:
//  - stages: pdrop_layers = [l_1 < l_2 < ...] split the LLM; layers [0, l_1) see every token, layers [l_s, l_s+1)
//    keep trunc(n_img·pdrop_ratios[s-1]) of a sample's n_img image tokens (ratios of the ORIGINAL count,
//    non-increasing, so the selections are nested). Every layer from l_1 on is a MoD layer;
//  - ranking: at a stage boundary l_s the layer's own input_layernorm, q_proj and k_proj (no gradient) score the
//    tokens still in the sequence: the attention, averaged over heads, of the last *instruction* token — in
//    training the token before each answer span (one query per turn, averaged over queries), without answers the
//    last token (inference: the last prompt token) — on the image tokens still kept; the top ones stay;
//  - positions: after a drop the kept tokens are renumbered 0..k-1 (rope_positions "compacted"), at the ranking
//    too, as the original re-pads and rebuilds position_ids; dropped tokens leave every later layer unchanged
//    (the original removes them from the sequence; only image tokens are dropped, which carry no label);
//  - KV cache: each layer of a dropped stage caches only its kept tokens; a decode token is processed by every
//    layer at the position its layer's cache length gives (the original's position_ids shifted by the drops).
// State between layers: ForwardState::routing_scores holds 0 on the tokens still in the sequence and -inf on
// dropped ones (a boundary layer narrows it; the other layers of the stage read it).
#pragma once

#include <ATen/ATen.h>

#include <ostream>
#include <string>
#include <vector>

#include "mod/mod_config.h"
#include "mod/mod_layer.h"

namespace gmod {

// A MoDConfig for PyramidDrop (validated): stages starting at `layers`, keeping `ratios` of the image tokens.
MoDConfig pdrop_config(const std::vector<int>& layers, const std::vector<double>& ratios, int num_layers);
// "L1,L2,..:R1,R2,.." (e.g. "8,16,24:0.5,0.25,0.125", the official LLaVA-1.5 setting) -> pdrop_config; errors
// name the option and the value.
MoDConfig parse_pdrop(const std::string& spec, int num_layers);
// mod.rule / gmod convert --rule "pdrop:<spec>".
bool is_pdrop_rule(const std::string& rule);

// Appends "\n  <problem>" lines for bad PyramidDrop fields (validate() asks PDropSelector::check_section when router
// is pdrop).
void validate_pdrop(const MoDConfig& c, int num_layers, std::ostream& err);

// trunc(n_img · ratio) in double, as the original's int(n * ratio).
int64_t pdrop_kept_images(int64_t n_img, double ratio);
// Stage s (1-based) whose first layer is `layer`, or 0 when `layer` is not a stage boundary.
int pdrop_boundary(const MoDConfig& c, int layer);
// The share of the image tokens layer `layer` keeps (1 before the first boundary).
double pdrop_ratio(const MoDConfig& c, int layer);

// Per sample, the compacted slots whose attention ranks the image tokens ([B, K] bool): the token before each
// answer span (roles_c [B, K] TokenRole of the compacted tokens, valid_c [B, K]); a sample without an answer uses
// its last valid slot, unless `keep_unanswered` (then none: the sample is not ranked). has_query [B] bool out.
at::Tensor pdrop_queries(const at::Tensor& roles_c, const at::Tensor& valid_c, bool keep_unanswered,
                         at::Tensor* has_query = nullptr);
// Mean over heads and over a sample's query rows of the softmax attention of those rows (each sees the valid
// keys up to itself): q [B, H, K, Dh], k [B, Hkv, K, Dh] (rotary applied), queries / valid [B, K] bool.
// Returns [B, K] fp32 (0 for a sample without queries).
// qmax: the most query tokens of a sample (< 0: read from `queries`, a host sync).
at::Tensor pdrop_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& queries, const at::Tensor& valid,
                        int64_t qmax = -1);

// The ranking at stage boundary `layer_idx` (layer: its modules): of `present` [B, L] bool (the tokens still in
// the sequence, valid ones), every non-image token and each sample's top pdrop_kept_images(n_img, ratio) image
// tokens stay; n_img counts the sample's image tokens in the full sequence. Throws std::invalid_argument when a
// sample with image tokens to rank has no instruction token (its query would be an image token).
at::Tensor pdrop_rank(const MoDDecoderLayer& layer, const at::Tensor& h, const ForwardState& st,
                      const at::Tensor& present, int layer_idx);

}  // namespace gmod
