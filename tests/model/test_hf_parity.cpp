// gmod's model against transformers on committed fixtures (tests/fixtures/make_hf_fixtures.py): logits within
// 1e-5 max abs (fp32) on real tokens, loss within 1e-5, and the gradient of every parameter within 1e-4
// relative. Every transformers parameter is either compared by name or listed as unused by the forward (then
// gmod must give it no gradient); a name that does not map, or a gmod parameter no entry covers, fails the
// test. The cases cover MHA and GQA, head_dim != hidden/heads, rms_norm_eps 1e-6, rope_theta 1e4/1e5/1e6,
// random norm weights and biases, right/left/no padding, vision feature layer -2/-1, 'default'/'full'
// strategies, and the 336-px CLIP grid; and the other LLM families: LLaMA-3.1 (llama3 RoPE), linear RoPE, Qwen2
// (q/k/v biases, tied), Mistral (sliding window shorter than the rows), LLaVA on Qwen2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/fp32_precision.h"
#include "model/hf_names.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

ModelInputs inputs_from(const SafetensorsFile& ref) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  // llava_336 stores its pixels in fp16 (the values transformers saw, exactly).
  if (ref.has("input.pixel_values")) in.pixel_values = ref.tensor("input.pixel_values").to(at::kFloat);
  return in;
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

std::string sci(double v) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(1) << v;
  return os.str();
}

nlohmann::json reference_json(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  if (!f) throw std::runtime_error(dir + "/reference.json: missing (re-run make_hf_fixtures.py)");
  nlohmann::json j;
  f >> j;
  return j;
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsLossAndEveryGradientMatchTransformersFp32) {
  const auto dir = test::fixture("hf/" + GetParam());
  auto model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  const auto meta = reference_json(dir);
  auto in = inputs_from(ref);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  RecordProperty("max_logit_diff", sci(logit_err));  // --gtest_output=xml lists the measured figures
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  std::map<std::string, bool> covered;  // gmod name -> seen
  for (const auto& p : params) covered[p.key()] = false;
  auto cover = [&](const std::string& hf) -> std::string {
    const auto gname = hf_to_gmod(hf);
    if (!gname) {
      ADD_FAILURE() << "transformers parameter " << hf << " does not map to a gmod name";
      return "";
    }
    if (!params.contains(*gname)) {
      ADD_FAILURE() << "transformers parameter " << hf << " maps to " << *gname
                    << ", which gmod does not have";
      return "";
    }
    EXPECT_FALSE(covered[*gname]) << *gname << " covered twice";
    covered[*gname] = true;
    return *gname;
  };
  int compared = 0;
  double worst_rel = 0;
  std::string worst_name;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto gname = cover(name.substr(5));
    if (gname.empty()) continue;
    auto g = params[gname].grad();
    if (!g.defined()) {
      ADD_FAILURE() << gname << " has no gradient in gmod but has one in transformers";
      continue;
    }
    auto r = ref.tensor(name);
    const double rel = (g - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
    auto worst = (g - r).abs().reshape({g.size(0), -1}).amax(1).argmax().item<int64_t>();
    // 1e-8 absolute floor: the key-projection biases of softmax attention have an exactly-zero true gradient
    // (they add a per-query constant to the scores); both sides return rounding noise of ~1e-10 there.
    EXPECT_TRUE(rel < 1e-4 || (g - r).norm().item<double>() < 1e-8)
        << "gradient of " << gname << " (relative L2 difference; |ref| " << r.norm().item<double>()
        << ", |gmod| " << g.norm().item<double>() << ", worst row " << worst << ")";
    if (rel > worst_rel && (g - r).norm().item<double>() >= 1e-8) worst_rel = rel, worst_name = gname;
    ++compared;
  }
  RecordProperty("worst_relative_gradient_diff", sci(worst_rel) + " " + worst_name);
  for (const auto& hf : meta.at("no_grad")) {
    const auto gname = cover(hf.get<std::string>());
    if (gname.empty()) continue;
    auto g = params[gname].grad();
    EXPECT_TRUE(!g.defined() || g.abs().max().item<double>() == 0.0)
        << gname << " is not used by the transformers forward but has a gradient in gmod";
  }
  for (const auto& [gname, seen] : covered)
    EXPECT_TRUE(seen) << "gmod parameter " << gname << " has no reference";
  EXPECT_EQ(compared, meta.at("gradients").get<int>());
  EXPECT_EQ(compared + static_cast<int>(meta.at("no_grad").size()), static_cast<int>(params.size()));
}

TEST_P(HfParity, Bf16LogitsTrackTransformersBf16) {
  const auto dir = test::fixture("hf/" + GetParam());
  auto model = load_pretrained(dir, at::kBFloat16);
  SafetensorsFile ref(dir + "/reference.safetensors");
  SafetensorsFile ref16(dir + "/reference_bf16.safetensors");
  auto in = inputs_from(ref);
  in.pixel_values = in.pixel_values.defined() ? in.pixel_values.to(at::kBFloat16) : in.pixel_values;
  at::NoGradGuard ng;
  auto out = model->forward(in);
  // Both sides round differently inside bf16 kernels; what matters is that gmod in bf16 is as close to
  // the fp32 truth as transformers in bf16 is.
  const double ours = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  const double theirs = max_abs_on_valid(ref16.tensor("logits"), ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(ours, 2.0 * theirs + 1e-3)
      << "gmod bf16 error " << ours << " vs transformers bf16 error " << theirs;
  EXPECT_EQ(out.logits.dtype(), at::kFloat);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("llama_untied_gqa", "llama_tied", "llava_layer_m2",
                                           "llama_mha_headdim", "llama_gqa_theta1e5", "llava_full_m1",
                                           "llava_336",
                                           // tests/fixtures/make_llm_family_fixtures.py (test_llm_families.cpp)
                                           "llama31_rope", "llama_rope_linear", "qwen2_tied", "mistral_window",
                                           "llava_qwen2",
                                           // tests/fixtures/make_siglip_fixtures.py: LLaVA on a SigLIP tower
                                           "llava_siglip_full_m1", "llava_siglip_default_m2"));

// What the fixtures are meant to exercise is really in them (a regenerated fixture cannot quietly lose a
// case).
TEST(HfParityFixtures, CoverTheConfigurationsTheyClaim) {
  auto text = [](const std::string& name) { return load_model_config(test::fixture("hf/" + name)); };
  const auto mha = text("llama_mha_headdim");
  EXPECT_EQ(mha.text.num_key_value_heads, mha.text.num_attention_heads);
  EXPECT_NE(mha.text.dim_per_head(), mha.text.hidden_size / mha.text.num_attention_heads);
  EXPECT_EQ(mha.text.rms_norm_eps, 1e-6);
  EXPECT_EQ(mha.text.rope_theta, 1e6);
  EXPECT_EQ(text("llama_gqa_theta1e5").text.rope_theta, 1e5);
  const auto full = text("llava_full_m1");
  EXPECT_EQ(full.vision_feature_layer, -1);
  EXPECT_EQ(full.vision_feature_select_strategy, "full");
  const auto big = text("llava_336");
  EXPECT_EQ(big.vision->image_size, 336);
  EXPECT_EQ(big.image_seq_length(), 576);
  for (const char* name : {"llama_mha_headdim", "llava_full_m1"}) {  // left padding: the explicit-mask path
    SafetensorsFile ref(test::fixture(std::string("hf/") + name + "/reference.safetensors"));
    auto m = ref.tensor("input.attention_mask");
    EXPECT_EQ(m.select(1, 0).min().item<int64_t>(), 0) << name << " has a left-padded row";
  }
}

}  // namespace

namespace {

// The same fixtures on the GPU (skipped without one): fp32 logits and loss as on the CPU reference.
// LibTorch allows TF32 in cuDNN convolutions by default; gmod's fp32 (every command, and this parity test)
// turns it off so the CLIP patch embedding and ConvNeXt run in IEEE fp32. Checkable without a GPU: the flags.
TEST(Fp32Precision, UseIeeeFp32TurnsTf32OffForCudnnAndCublas) {
  use_ieee_fp32();
  EXPECT_FALSE(at::globalContext().allowTF32CuDNN()) << "cuDNN convolutions may still use TF32";
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  EXPECT_NE(at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV),
            at::Float32Precision::TF32);
  EXPECT_TRUE(ieee_fp32_in_force());
}

TEST(HfParityCuda, LlavaFp32OnCudaMatchesTransformers) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  use_ieee_fp32();
  for (const char* name : {"llava_layer_m2", "llava_full_m1"}) {
    const auto dir = test::fixture(std::string("hf/") + name);
    auto model = load_pretrained(dir, at::kFloat, at::Device(at::kCUDA, 0));
    SafetensorsFile ref(dir + "/reference.safetensors");
    auto in = inputs_from(ref);
    in.input_ids = in.input_ids.cuda();
    in.attention_mask = in.attention_mask.cuda();
    in.labels = in.labels.cuda();
    in.pixel_values = in.pixel_values.cuda();
    auto out = model->forward(in);
    // TF32 off (matmuls and cuDNN convolutions, use_ieee_fp32), so fp32 on the GPU stays close to the CPU reference.
    EXPECT_LT(max_abs_on_valid(out.logits.cpu(), ref.tensor("logits"), in.attention_mask.cpu()), 1e-4)
        << name;
    EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-4) << name;
    out.lm_loss.backward();
    auto g = model->named_parameters()["llm.layers.0.self_attn.q_proj.weight"].grad();
    ASSERT_TRUE(g.defined()) << name;
    auto r = ref.tensor("grad.model.language_model.layers.0.self_attn.q_proj.weight");
    EXPECT_LT((g.cpu() - r).norm().item<double>() / r.norm().item<double>(), 1e-3) << name;
  }
}

}  // namespace
