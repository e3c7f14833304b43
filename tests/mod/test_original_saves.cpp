// Directories as the ORIGINAL codes' own training save paths write them (transformers' Trainer at each original's
// pinned version: PyTorch .bin up to 4.34, safetensors with shared tensors' aliases dropped from 4.35), loaded
// unedited (tests/fixtures/*/saved/, written by the fixture generators through the originals' own
// safe_save_model_for_hf_trainer):
//   gamma_mod/llava_clip_mod12/saved/trainer_bin          γ-MoD (transformers 4.31): pytorch_model.bin holding every
//                                                         MoD layer's router name (aliases of one tensor) and the
//                                                         Trainer's training_args.bin (a pickled Python object, never
//                                                         opened);
//   gamma_mod/llava_clip_mod12/saved/trainer_safetensors  the same with save_safetensors=True: transformers keeps
//                                                         model.layers.1.router.weight only;
//   gamma_mod/llava_clip_mod12/saved/sharded_bin          save_pretrained(safe_serialization=False), small shards +
//                                                         pytorch_model.bin.index.json (a 7B model's layout);
//   gamma_mod/llava_hr_arank/saved/trainer_bin            γ-MoD on the LLaVA-HR layout, towers named by relative paths;
//   llava_hr/hr384_frozen/saved/trainer_bin               LLaVA-HR's own train.py (4.31): pytorch_model.bin;
//   mgm/base_frozen/saved/trainer                         MGM's train.py (4.36): model.safetensors of the state dict;
//   pmod/official31/saved/trainer                              p-MoD's train.py (4.37): model.safetensors.
// Each loads into parameters bit-identical to the fixture's own directory (whose parity with the original is pinned
// by its parity test) and the γ-MoD ones reproduce the original's training logits. Also: the shared router's copies
// (any equal subset loads; unequal or none is a named error in the file's own names).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "model/checkpoint_files.h"
#include "model/llava.h"
#include "model/safetensors.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"
#include "tests/mod/gamma_mod_reference.h"

using gmod::test::error_of;

using namespace gmod;
using namespace gmod::test::gamma_mod_ref;

namespace {


// Every parameter of `got` bit-identical to `want`'s, and the same parameter names.
void expect_same_parameters(const MultimodalLM& want_model, const MultimodalLM& got_model) {
  const auto want = want_model.named_parameters();
  const auto got = got_model.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& p : want) {
    ASSERT_TRUE(got.contains(p.key())) << p.key();
    EXPECT_TRUE(at::equal(got[p.key()], p.value())) << p.key() << " differs from the fixture directory's";
  }
}

}  // namespace

TEST(GammaModSaved, DirectoriesAsTheOriginalSavesThemLoadUneditedAndMatch) {
  const auto base = load_mod_pretrained(fixture_dir());
  const auto mc = read_mod_config(fixture_dir());
  ASSERT_TRUE(mc);
  SafetensorsFile ref(fixture_dir() + "/reference.safetensors");
  for (const std::string variant : {"trainer_bin", "trainer_safetensors", "sharded_bin"}) {
    SCOPED_TRACE(variant);
    const auto dir = fixture_dir() + "/saved/" + variant;
    CheckpointFiles files(dir);
    EXPECT_EQ(files.pickled(), variant != "trainer_safetensors");
    // What the save wrote for the shared router: every alias (torch.save), or the first MoD layer's only.
    const bool one_copy = variant == "trainer_safetensors";
    EXPECT_TRUE(files.has("model.layers.1.router.weight"));
    EXPECT_EQ(files.has("model.layers.2.router.weight"), !one_copy);
    for (const auto& f : files.files()) EXPECT_EQ(f.find("training_args.bin"), std::string::npos) << f;
    if (variant == "sharded_bin") {
      EXPECT_EQ(files.files().size(), 3u);
    }

    const auto model = load_mod_pretrained(dir);
    expect_same_parameters(*base, *model);
    auto in = reference_inputs(ref, model->config.image_token_id, 2);
    const auto r = train_forward(*model, in, *mc);
    const double err = (r.out.logits - ref.tensor("logits")).abs().max().item<double>();
    EXPECT_LT(err, logit_tolerance(ref.tensor("logits")));
    std::cout << "γ-MoD " << variant << ": loaded " << files.names().size() << " tensors from " << files.files().size()
              << " file(s), max logit diff to the original " << err << "\n";
  }
}

// The LLaVA-HR layout (multipath CLIP + ConvNeXt tower, named by relative paths) as the original saves it with the
// transformers 4.31 defaults: pytorch_model.bin.
TEST(GammaModSaved, LlavaHrLayoutBinLoadsUneditedAndMatches) {
  const auto dir = test::fixture("gamma_mod/llava_hr_arank");
  const auto base = load_mod_pretrained(dir);
  const auto model = load_mod_pretrained(dir + "/saved/trainer_bin");
  ASSERT_TRUE(model->config.multipath.has_value());
  expect_same_parameters(*base, *model);
  const auto mc = read_mod_config(dir);
  ASSERT_TRUE(mc);
  SafetensorsFile ref(dir + "/reference.safetensors");
  std::ifstream f(dir + "/reference.json");
  nlohmann::json meta;
  f >> meta;
  const int repeat = meta.at("pixel_repeat").get<int>();
  const auto r = train_forward(*model, reference_inputs(ref, model->config.image_token_id, repeat), *mc);
  const double err = (r.out.logits - ref.tensor("logits")).abs().max().item<double>();
  EXPECT_LT(err, logit_tolerance(ref.tensor("logits")));
  std::cout << "γ-MoD-LLaVA-HR trainer_bin: max logit diff to the original " << err << "\n";
}

// LLaVA-HR (4.31: .bin), MGM (4.36) and p-MoD (4.37, its per-layer MoD routers) as their train.py saves them: every
// parameter bit-identical to the fixture directory's, whose logits and gradients their parity tests pin.
TEST(OriginalSaves, LlavaHrMgmAndPModTrainerSavesLoadUnedited) {
  for (const std::string name : {"llava_hr/hr384_frozen", "mgm/base_frozen", "pmod/official31"}) {
    SCOPED_TRACE(name);
    const auto dir = test::fixture(name);
    const std::string saved = dir + (name == "llava_hr/hr384_frozen" ? "/saved/trainer_bin" : "/saved/trainer");
    CheckpointFiles files(saved);
    EXPECT_EQ(files.pickled(), name == "llava_hr/hr384_frozen");
    const auto base = load_mod_pretrained(dir);
    const auto model = load_mod_pretrained(saved);
    expect_same_parameters(*base, *model);
    std::cout << name << ": " << files.names().size() << " tensors from " << files.files().front() << "\n";
  }
}

namespace {

// fixture_dir() rewritten with model.safetensors holding the tensors `edit` leaves (config.json and clip/ copied).
std::string rewritten(const test::TempDir& tmp, const std::string& name,
                      const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tmp.path) / name;
  fs::create_directories(dir / "clip");
  for (const char* f : {"config.json", "clip/config.json", "clip/preprocessor_config.json"})
    fs::copy_file(fs::path(fixture_dir()) / f, dir / f);
  SafetensorsFile src(fixture_dir() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& n : src.names()) ts.emplace_back(n, src.tensor(n).clone());
  edit(ts);
  save_safetensors((dir / "model.safetensors").string(), ts);
  return dir.string();
}

}  // namespace

// The shared router's copies: any non-empty subset loads (transformers' safetensors save keeps one), copies that
// differ or no copy at all are named errors, naming the tensors as the file does (model.layers.{i}.router.weight).
TEST(GammaModRouterCopies, AnyEqualSubsetLoadsUnequalOrNoCopyIsANamedError) {
  test::TempDir tmp;
  const std::string r1 = "model.layers.1.router.weight", r2 = "model.layers.2.router.weight";
  SafetensorsFile src(fixture_dir() + "/model.safetensors");
  const at::Tensor router = src.tensor(r1).clone();
  ASSERT_TRUE(at::equal(router, src.tensor(r2)));
  auto drop = [](const std::string& name) {
    return [name](std::vector<std::pair<std::string, at::Tensor>>& ts) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const auto& t) { return t.first == name; }), ts.end());
    };
  };
  for (const auto& kept : {r1, r2}) {  // either copy alone
    const auto dir = rewritten(tmp, "only_" + kept, drop(kept == r1 ? r2 : r1));
    const auto model = load_mod_pretrained(dir);
    EXPECT_TRUE(at::equal(shared_router(*model)->weight, router)) << kept;
  }
  const auto unequal = rewritten(tmp, "unequal", [&](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == r2) t = t + 1e-3;
  });
  const auto e1 = error_of([&] { load_mod_pretrained(unequal); });
  for (const auto& part : {r1, r2, std::string("differ"), std::string("model.safetensors")})
    EXPECT_NE(e1.find(part), std::string::npos) << part << " not in: " << e1;
  const auto none = rewritten(tmp, "none", [&](auto& ts) {
    drop(r1)(ts);
    drop(r2)(ts);
  });
  const auto e2 = error_of([&] { load_mod_pretrained(none); });
  for (const auto& part : {r1, r2, std::string("no copy of the shared router")})
    EXPECT_NE(e2.find(part), std::string::npos) << part << " not in: " << e2;
  EXPECT_EQ(e2.find("language_model."), std::string::npos) << "named in another layout than the file's: " << e2;
}
