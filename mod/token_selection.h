// The token-selection interface: what one MoD method (γ-MoD's shared router, Raposo's per-layer router, A-MoD,
// FastV, p-MoD, PyramidDrop) decides in a MoD layer, behind one class per method (one file pair each,
// mod/select_*.{h,cpp}), registered by name (mod/method_registry.h). MoDDecoderLayer (mod/mod_layer.cpp) keeps
// the shared mechanics only — masks by role, per-sample / per-segment compaction, attention + MLP over the kept
// tokens, scatter back — and asks its method, in this order, for:
//   masks       which valid tokens may be skipped (the rest are forced);
//   score       the router's keep probabilities, output weights and routing logits (none for parameter-free ones);
//   capacity    for capacity-driven selections, the per-sample counts from the host role counts (no device sync)
//               and the same counts on the device;
//   select      the tokens this layer processes ([B, L] bool), unless the layer replays or is forced;
//   after_select what it leaves for the next layers (PyramidDrop's stage state);
//   aux_loss    its auxiliary loss on the selection (γ-MoD / per-layer routing CE);
//   skipped     what a skipped token leaves the layer as (p-MoD: w·x on image tokens), and
//   combine     how the kept tokens' attention and MLP deltas are weighted;
//   carry       what it hands the next layer after attention (A-MoD's column scores);
//   decode      its scores at a decode step (p-MoD: none, every decode token is processed).
// Methods are stateless singletons: every per-layer setting is read from the layer (its cfg, routers, pmod_ratio).
// Keeping the order of the floating-point operations of the code this replaced is part of the contract: parity
// and bitwise-resume tests compare exactly.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mod/layer_costs.h"
#include "mod/mod_layer.h"

namespace gmod {

class SegmentLayout;  // model/segments.h
class MultimodalLM;   // model/llava.h
class BlockStack;     // model/llama.h

// The options of `gmod convert` beside --rule, as a method whose rule decides its layers judges them
// (TokenSelector::check_convert_options / rule_config).
struct ConvertChoices {
  bool flag = false;               // a method's convert flag (TokenSelector::convert_flag, e.g. --direct) is given
  bool adaptive = false;           // --adaptive-threshold other than none
  std::string router;              // --router
  bool skip_frac_given = false;    // --skip-frac other than its default
  bool forced_given = false;       // --forced other than its default
  std::string router_init;         // --router-init
  bool router_init_given = false;  // ... other than its default
  uint64_t router_seed = 0;        // --router-seed
};

// What a layer's forward hands its method while routing a full sequence.
struct RoutingStep {
  MoDDecoderLayer& layer;
  const at::Tensor& h;  // [B, L, D] layer input
  ForwardState& st;
  int layer_idx;
  int64_t B, L;
  bool topk;                      // layer.uses_topk(): capacity top-k (training, or mode topk) rather than thresholds
  bool packed;                    // st.segments: routed per segment through the segment-major view
  const RoutingMasks& masks;      // [B, L]
  const RoutingMasks& seg_masks;  // [S, M] segment-major view (packed only)
  MoDDecoderLayer::Scores& sc;
  const HostCapacity& plan;  // capacity-driven selections only
  const at::Tensor& k_dev;   // [B|S] int64 on the device, the plan's counts
};

class TokenSelector {
 public:
  virtual ~TokenSelector() = default;
  // The registered name: the config's "router" value ("gamma_shared", "pmod", ...).
  virtual const char* name() const = 0;
  virtual RouterKind kind() const = 0;
  // The method's name in messages ("γ-MoD", "p-MoD", ...).
  virtual const char* display_name() const = 0;

  // Its config section (MoDConfig is one flat struct; mod/mod_config.cpp asks the method named by its router).
  // validate() appends "\n  <problem>" lines: check_layers before the shared capacity checks (where the method's
  // layers may be: A-MoD's dense layer before each, FastV's tail from fastv_k), check_section after them (p-MoD's
  // schedule, PyramidDrop's stages).
  virtual void check_layers(const MoDConfig& c, int num_layers, std::ostream& err) const {}
  virtual void check_section(const MoDConfig& c, int num_layers, std::ostream& err) const {}
  // Whether capacity_rule "official_prefix" (the original γ-MoD code's positional training capacity) applies.
  virtual bool official_prefix_capacity() const { return false; }
  // Whether the method routes by router thresholds at inference (which adaptive_threshold adapts).
  virtual bool has_thresholds() const { return false; }
  // mod_config_from_json: the method's defaults for the keys the object `j` does not set (p-MoD: original
  // positions, zero router init, no routing loss; PyramidDrop: no routing loss).
  virtual void apply_defaults(const nlohmann::json& j, MoDConfig& c) const {}
  // What a MoD layer of the method costs in training beyond a dense layer on its kept tokens (mod/layer_costs.h).
  virtual LayerCosts layer_costs(int64_t hidden) const = 0;

  // Construction by convert_to_mod (mod/conversion.h): the router the model owns and every MoD layer shares
  // (γ-MoD's "mod_router", registered on `model`; nullptr: none), built next to `first`, the first MoD layer's
  // dense layer.
  virtual std::shared_ptr<GammaRouterImpl> model_router(MultimodalLM& model, const MoDConfig& cfg,
                                                        const DenseDecoderLayer& first) const {
    return nullptr;
  }
  // Whether layer `layer_idx` leaves attention scores for the MoD layer after it (A-MoD: the layer before each MoD
  // layer; FastV: layer fastv_k - 1). A dense one becomes scoring_layer(dense); a MoD layer emits them itself.
  virtual bool scores_for_next(const MoDConfig& cfg, int layer_idx) const { return false; }
  virtual std::shared_ptr<DecoderBlock> scoring_layer(const MoDConfig& cfg, const DenseDecoderLayer& dense) const;
  // What a new MoD layer reads from its position in an LLM of num_layers layers (p-MoD: its image-token ratio).
  virtual void place(MoDDecoderLayer& layer, const MoDConfig& cfg, int layer_idx, int num_layers) const {}
  // Construction: the routers the method adds to a new layer (layer.register_router) and what it checks.
  virtual void attach(MoDDecoderLayer& layer, const DenseDecoderLayer& dense, int layer_idx) const;
  // Parameters the layer uses but the model owns (γ-MoD's shared router).
  virtual std::vector<at::Tensor> external_parameters(const MoDDecoderLayer& layer) const;
  // False: the method ranks by its own rule and never by the capacity top-k, whatever the routing mode.
  virtual bool uses_topk_mode() const { return true; }
  // Packed rows (data.pack_to) can be routed per segment.
  virtual bool routes_packed() const { return true; }
  // Its rule (mod.rule, gmod convert --rule) decides the layers and what they keep (p-MoD, PyramidDrop): a config
  // naming only the router and its layers does not describe it.
  virtual bool layers_from_rule() const { return false; }

  virtual RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                             at::Device device, int layer_idx, bool topk) const;
  virtual MoDDecoderLayer::Scores score(const MoDDecoderLayer& layer, const at::Tensor& h) const;
  // Counts follow from the roles alone (then capacity() fills them from the host, no device sync).
  virtual bool capacity_driven(bool topk) const { return topk; }
  virtual void capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                        const RoutingMasks& masks, bool topk, HostCapacity& plan, at::Tensor& k_dev) const;
  // The planner's view of the same: k_max of one batch's plan shared by every MoD layer, -1 when the counts are
  // data-dependent or differ per layer.
  virtual int64_t shared_kmax(const MoDDecoderLayer& layer, const at::Tensor& host_counts) const;
  virtual at::Tensor select(RoutingStep& s) const = 0;
  virtual void after_select(RoutingStep& s, const at::Tensor& sel) const;
  virtual at::Tensor aux_loss(const RoutingStep& s, const at::Tensor& sel) const;
  // What the layer returns on skipped tokens (may set s.sc.weight for combine).
  virtual at::Tensor skipped(RoutingStep& s) const { return s.h; }
  virtual at::Tensor combine(const MoDConfig& cfg, const at::Tensor& x, const at::Tensor& a, const at::Tensor& m,
                             const at::Tensor& w) const;
  // Carried to the next layer: whether attention must return its q/k (AttentionSide), what to leave when the layer
  // processes nothing, and what to leave after attention over the compacted rows.
  virtual bool wants_attention_side(const MoDDecoderLayer& layer) const { return false; }
  virtual void carry_empty(const MoDDecoderLayer& layer, ForwardState& st, int64_t B, int64_t L,
                           const at::Tensor& h) const {}
  virtual void carry(const MoDDecoderLayer& layer, ForwardState& st, const Compaction& c, const AttentionSide& side,
                     const SegmentLayout* kept_layout, int64_t B, int64_t L, const at::Tensor& h) const {}
  // The scores at a decode step (undefined keep_prob: every decode token is processed).
  virtual MoDDecoderLayer::Scores decode_scores(const MoDDecoderLayer& layer, const at::Tensor& h) const;
  // A training-free conversion of a dense model at inference (gmod forward / generate / eval --<flag> SPEC), when the
  // method has one: the flag, its value's name and help; config_from_spec reads SPEC for an LLM of num_layers
  // (validated; errors name the value).
  struct InferenceFlag {
    const char* flag = nullptr;  // e.g. "--fastv"; nullptr: none
    const char* type_name = nullptr;
    const char* help = nullptr;
  };
  virtual InferenceFlag inference_flag() const { return {}; }
  virtual MoDConfig config_from_spec(const std::string& spec, int num_layers) const;
  // Export in the method's original code's checkpoint layout (gmod export <flag>), when it has one; nullptr: none.
  virtual const char* original_layout_flag() const { return nullptr; }
  virtual std::string original_layout_help() const { return ""; }
  virtual void save_original_layout(const MultimodalLM& model, const MoDConfig& cfg, const std::string& out) const;
  // A kernel without a deterministic CUDA version that the method's settings use, for
  // trainer/deterministic_check.h (empty site when none).
  struct KernelUse {
    std::string site;    // what uses it, for the message
    std::string op;      // "float cumsum", as DeterministicUse names ops
    std::string remedy;  // the setting that avoids it
  };
  virtual KernelUse deterministic_use(const MoDConfig& cfg) const { return {}; }

  // gmod convert --rule RULE (launch/cmd_convert.cpp) for a method whose rule decides its layers (FastV, p-MoD,
  // PyramidDrop); the layer rules of mod/conversion.h serve the others.
  // Whether RULE is one of the method's (its prefix: it then reports a malformed RULE itself).
  virtual bool owns_rule(const std::string& rule) const { return false; }
  // The rule forms for --rule's help, e.g. "fastv:K:R (FastV: ...)"; empty: none.
  virtual std::string rule_help() const { return ""; }
  // The options that do not go with RULE: std::invalid_argument with the whole message (a usage error).
  virtual void check_convert_options(const std::string& rule, const ConvertChoices& given) const {}
  // Whether rule_config runs on config.json's depth before the weights are read (its std::invalid_argument then a
  // usage error, "--rule " + message); else after them, on the loaded model's depth.
  virtual bool rule_checked_before_weights() const { return false; }
  // The MoDConfig RULE gives an LLM of num_layers layers.
  virtual MoDConfig rule_config(const std::string& rule, int num_layers, const ConvertChoices& given) const;
  // The share of a sample's image tokens layer `layer` keeps, when the method keeps a share per layer (p-MoD,
  // PyramidDrop) rather than skip_frac of the routable tokens; gmod convert prints it, the planner plans by it.
  virtual std::optional<double> image_keep_ratio(const MoDConfig& cfg, int layer, int num_layers) const {
    return std::nullopt;
  }
  // A gmod convert flag that selects this method with fixed settings instead of --router (A-MoD: --direct, Direct
  // γ-MoD), with its help; nullptr: none. convert_flag_keys writes the "router" key and the settings it fixes.
  struct ConvertFlag {
    const char* flag = nullptr;
    const char* help = nullptr;
  };
  virtual ConvertFlag convert_flag() const { return {}; }
  virtual void convert_flag_keys(nlohmann::json& j) const;

  // A run's mod.rule (config_for_rule, mod/conversion.h): whether `rule` is one of the method's (p-MoD: exactly
  // "pmod" or "pmod:official_31"; PyramidDrop: "pdrop:..."), and the MoDConfig it gives an LLM of num_layers layers
  // from the run's mod.config `base` (validated; errors name the rule).
  virtual bool trains_by_rule(const std::string& rule) const { return false; }
  virtual MoDConfig run_rule_config(const std::string& rule, const MoDConfig& base, int num_layers) const;
  // A run's mod.config naming this method without its layers, when the method's own fields decide them
  // (PyramidDrop's stages; validated), whatever mod.rule says; nullopt: the rule decides.
  virtual std::optional<MoDConfig> layers_from_config(const MoDConfig& base, int num_layers) const {
    return std::nullopt;
  }
};

// Shared selections the methods compose.
// Capacity top-k of `score` [B, L] (per segment when packed), recording its topk_key when the layer records.
at::Tensor select_by_capacity(RoutingStep& s, const at::Tensor& score);
// Threshold routing of s.sc.keep_prob at `thr` (adaptive per sample / layer, mod/routing_rule.h).
at::Tensor select_by_threshold(RoutingStep& s, double thr);
// γ-MoD's and p-MoD's output weighting: only the MLP delta is scaled by the router weight w (a + w·m).
at::Tensor combine_mlp_delta(const MoDConfig& cfg, const at::Tensor& a, const at::Tensor& m, const at::Tensor& w);
// gmod convert with a parameter-free method's rule (FastV, PyramidDrop): it has no router, so no convert flag
// (--direct) and no adaptive thresholds; std::invalid_argument naming the rule and the method otherwise.
void refuse_router_options(const TokenSelector& method, const std::string& rule, const ConvertChoices& given);
// FastV, p-MoD and PyramidDrop: only the image tokens are routable.
void image_tokens_routable(RoutingMasks& m, const ForwardState& st);

}  // namespace gmod
