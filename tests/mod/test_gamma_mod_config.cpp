// γ-MoD's own config.json loads as its code saves it: model_type mod_llava_llama and the config.mod dict of
// its MoDLLaVALlamaConfig (mod_enable, mod_mode, mod_layers_idx, capacity_factor, router_aux_loss_coef).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "mod/mod_checkpoint.h"
#include "model/config.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

void write_config(const std::string& dir, const nlohmann::json& j) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump();
}

}  // namespace

TEST(TowerRefs, GammaModModelTypeAndModDictLoad) {
  test::TempDir tmp;
  nlohmann::json j;
  std::ifstream(test::fixture("llava_hr/hr384_frozen/config.json")) >> j;
  j["model_type"] = "mod_llava_llama";
  j["mod"] = {{"mod_enable", true},
              {"mod_mode", "arank_mod"},
              {"mod_layers_idx", {1}},
              {"capacity_factor", 0.5},
              {"router_aux_loss_coef", 0.01}};
  write_config(tmp.str("gamma"), j);
  EXPECT_NO_THROW(load_model_config(tmp.str("gamma")));
  const auto mc = read_mod_config(tmp.str("gamma"));
  ASSERT_TRUE(mc);
  EXPECT_EQ(mc->mod_layers, std::vector<int>({1}));
  EXPECT_EQ(mc->selection, "arank_mod");
  j["mod"]["capacity_factor"] = "half";
  write_config(tmp.str("bad"), j);
  EXPECT_THROW(read_mod_config(tmp.str("bad")), std::invalid_argument);
}
