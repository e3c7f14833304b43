// Each method's config section and model surgery behind TokenSelector (mod/select_*): the router parameters each
// method states for the planner (layer_costs) are the ones convert_to_mod really adds, and validate() keeps a
// method's problem lines where they were among the shared ones.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "mod/conversion.h"
#include "mod/fastv.h"
#include "mod/layer_costs.h"
#include "mod/method_registry.h"
#include "mod/pdrop.h"
#include "mod/pmod.h"
#include "mod/token_selection.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

int64_t parameter_count(const MultimodalLM& model) {
  std::set<const void*> seen;  // a tensor shared by two modules counts once
  int64_t n = 0;
  for (const auto& p : model.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

MoDConfig layers_config(RouterKind router, std::vector<int> layers) {
  MoDConfig c;
  c.router = router;
  c.mod_layers = std::move(layers);
  return c;
}

TEST(MethodConfig, RouterParametersAreWhatEachMethodStates) {
  const int n = 6;
  const std::vector<MoDConfig> configs = {
      layers_config(RouterKind::kGammaShared, {2, 4}), layers_config(RouterKind::kPerLayer, {2, 4}),
      layers_config(RouterKind::kAttention, {2, 4}),   fastv_config(2, 0.5, n),
      pmod_config(n),                                  pdrop_config({2, 4}, {0.5, 0.25}, n)};
  ASSERT_EQ(configs.size(), registered_methods().size());
  for (const MoDConfig& cfg : configs) {
    auto model = test::random_llava(n, 3);
    const int64_t hidden = model->config.text.hidden_size;
    const int64_t dense = parameter_count(*model);
    convert_to_mod(*model, cfg);
    const LayerCosts costs = layer_costs(cfg.router, hidden);
    EXPECT_EQ(parameter_count(*model) - dense,
              costs.shared_router_params + costs.layer_router_params * int64_t(cfg.mod_layers.size()))
        << to_string(cfg.router);
    EXPECT_EQ(mod_layers(*model).size(), cfg.mod_layers.size()) << to_string(cfg.router);
    EXPECT_EQ(shared_router(*model) != nullptr, costs.shared_router_params > 0) << to_string(cfg.router);
  }
}

TEST(MethodConfig, AMethodsProblemsStayWhereTheyWereAmongTheSharedOnes) {
  auto error_of = [](const MoDConfig& c) {
    try {
      validate(c, 32, "t");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // p-MoD's section after the shared capacity lines.
  MoDConfig p = pmod_config(32);
  p.capacity_rule = CapacityRule::kOfficialPrefix;
  p.official_prefix = 0;
  p.rope_positions = RopePositions::kCompacted;
  EXPECT_EQ(error_of(p),
            "t: invalid MoD config:\n"
            "  capacity_rule \"official_prefix\" reproduces γ-MoD's code; router pmod routes by its own capacity (use "
            "router gamma_shared or capacity_rule \"roles\")\n"
            "  official_prefix = 0, expected >= 1\n"
            "  router pmod: rope_positions must be \"original\" (p-MoD's kept tokens keep their positions)");
  // A-MoD's layer checks before them, and no thresholds to adapt.
  MoDConfig a = layers_config(RouterKind::kAttention, {0, 1});
  a.capacity_rule = CapacityRule::kOfficialPrefix;
  a.adaptive_threshold = AdaptiveThreshold::kARank;
  a.layer_arank = {1.0, 2.0};
  EXPECT_EQ(error_of(a),
            "t: invalid MoD config:\n"
            "  router attention (A-MoD) needs the previous layer's attention map, so layer 0 cannot be MoD\n"
            "  A-MoD layers 0 and 1 are consecutive: layer 1 would have no full attention map to route by (A-MoD "
            "interleaves MoD and dense layers); choose interleaved layers or set amod_skipped to \"carry\" or "
            "\"force_keep\" (adaptations)\n"
            "  capacity_rule \"official_prefix\" reproduces γ-MoD's code; router attention routes by its own "
            "capacity (use router gamma_shared or capacity_rule \"roles\")\n"
            "  adaptive_threshold = \"arank\" adapts the router thresholds; router attention has none");
  // γ-MoD: the original's positional capacity and adaptive thresholds are its own.
  MoDConfig g = layers_config(RouterKind::kGammaShared, {0, 1});
  g.capacity_rule = CapacityRule::kOfficialPrefix;
  g.adaptive_threshold = AdaptiveThreshold::kARank;
  g.layer_arank = {1.0, 2.0};
  EXPECT_EQ(error_of(g), "");
}

}  // namespace
